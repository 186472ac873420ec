"""One way for a server interceptor to run code around every handler: a guard.

A guard is an async context manager factory called with the request and the servicer context;
the handler runs inside it (for a server stream, the whole stream), so it sees the handler's
exception, if any, and may replace it (``context.abort`` raises ``AbortError``). Unary,
server-streaming (both forms: an async generator, or a coroutine that writes with
``context.write()``, as ``Health.Watch``) and client-streaming handlers are wrapped; a client
stream's guard gets ``None`` as its request (the messages arrive while the handler runs).
Bidirectional streams pass through unwrapped (no service has one).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

#: Builds the context the handler of one call runs in, from its request and servicer context.
Guard = Callable[[Any, "grpc.aio.ServicerContext[Any, Any]"], AbstractAsyncContextManager[None]]


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], guard: Guard, request_deserializer: Any = None
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` run inside ``guard``; ``request_deserializer`` replaces its own when given."""
    deserializer = request_deserializer or handler.request_deserializer
    if handler.unary_unary is not None:
        inner_uu: Any = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with guard(request, context):
                return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, request_deserializer=deserializer, response_serializer=handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_us: Any = handler.unary_stream
        stream: Any
        if inspect.isasyncgenfunction(inner_us):

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                async with guard(request, context):
                    async for item in inner_us(request, context):
                        yield item

            stream = unary_stream
        else:

            async def unary_stream_writer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                async with guard(request, context):
                    await inner_us(request, context)

            stream = unary_stream_writer
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=deserializer, response_serializer=handler.response_serializer
        )
    if handler.stream_unary is not None:
        inner_su: Any = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with guard(None, context):
                return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, request_deserializer=deserializer, response_serializer=handler.response_serializer
        )
    return handler


class GuardingInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that rewraps each method's handler (:meth:`wrap`, usually with
    :func:`wrap_handler`); an unknown method (no handler) passes through."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler to serve ``method`` (``/package.Service/Method``) with."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        return None if handler is None else self.wrap(handler_call_details.method, handler)
