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

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from openforge_core.errors import OpenForgeError
from openforge_core.rpc.wrap import GuardingInterceptor, wrap_handler

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


class ErrorMappingInterceptor(GuardingInterceptor):
    """Wraps every handler so a raised exception becomes a proper status."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        @contextlib.asynccontextmanager
        async def mapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            try:
                yield
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as exc:
                await _abort(context, exc, method)

        return wrap_handler(handler, mapped)
