"""One server interceptor that maps exceptions to gRPC status codes with details.

A handler raises :class:`openforge_core.errors.OpenForgeError` (or a subclass);
the interceptor aborts the call with the matching status code, the error's
message, and a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer carrying an ``ErrorInfo`` (reason, domain ``openforge.dev``, metadata)
and, for field violations, a ``BadRequest`` (https://google.aip.dev/193).
Any other exception becomes INTERNAL with its type name only (no internals
leak to callers) and is logged with its traceback.

Modeled on text-generation-inference's ``server/text_generation_server/interceptor.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from openforge_core.errors import OpenForgeError

log = structlog.get_logger(__name__)

ERROR_DOMAIN = "openforge.dev"


def to_status(err: OpenForgeError) -> status_pb2.Status:
    """Builds the rich ``google.rpc.Status`` for a domain error."""
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata)
    details = [info]
    packed: list[any_pb2.Any] = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    if err.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in err.violations
            ]
        )
        a = any_pb2.Any()
        a.Pack(bad)
        packed.append(a)
    return status_pb2.Status(code=err.code.value, message=err.message, details=packed)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException, method: str) -> None:
    if isinstance(exc, OpenForgeError):
        status = rpc_status.to_status(to_status(exc))
        log.info("rpc.error", method=method, code=exc.code.name, reason=exc.reason, message=exc.message)
    elif isinstance(exc, NotImplementedError):
        # The generated servicer base raises this for methods no issue has built yet.
        status = rpc_status.to_status(
            status_pb2.Status(code=code_pb2.UNIMPLEMENTED, message=f"{method} is not implemented yet")
        )
    else:
        log.exception("rpc.internal_error", method=method, error_type=type(exc).__name__)
        status = rpc_status.to_status(
            status_pb2.Status(code=code_pb2.INTERNAL, message=f"internal error ({type(exc).__name__})")
        )
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler so a raised exception becomes a proper status."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method
        if handler.unary_unary is not None:
            inner_uu: Any = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    return await inner_uu(request, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as exc:
                    await _abort(context, exc, method)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_us: Any = handler.unary_stream
            stream_handler: Any
            if inspect.isasyncgenfunction(inner_us):

                async def unary_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                    try:
                        async for item in inner_us(request, context):
                            yield item
                    except (grpc.aio.AbortError, grpc.aio.UsageError):
                        raise
                    except Exception as exc:
                        await _abort(context, exc, method)

                stream_handler = unary_stream
            else:
                # A coroutine handler that streams with context.write() (e.g. Health.Watch).
                async def unary_stream_writer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                    try:
                        await inner_us(request, context)
                    except (grpc.aio.AbortError, grpc.aio.UsageError):
                        raise
                    except Exception as exc:
                        await _abort(context, exc, method)

                stream_handler = unary_stream_writer
            return grpc.unary_stream_rpc_method_handler(
                stream_handler,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
