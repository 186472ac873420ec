"""gRPC client kit: a deadline on every call, retries only for idempotent methods.

* Every unary call gets ``default_timeout_s`` as its deadline unless the caller
  passes ``timeout=``; streaming calls get ``stream_timeout_s`` unless given
  (pass ``timeout=None`` explicitly only for watches meant to live long).
* Retries use gRPC's own retry policy from the channel's service config
  (https://github.com/grpc/proposal/blob/master/A6-client-retries.md), applied
  only to the methods named idempotent (reads, and mutations carrying a
  ``request_id`` idempotency key), on UNAVAILABLE only.
* Trace context travels in metadata by the OpenTelemetry aio client interceptors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

_UNSET: Any = object()


def retry_service_config(
    service: str,
    idempotent_methods: Iterable[str],
    *,
    max_attempts: int = 4,
    initial_backoff_s: float = 0.1,
    max_backoff_s: float = 2.0,
) -> str:
    """Builds a gRPC service config (JSON) retrying only the given methods.

    Args:
        service: Full service name, e.g. ``"openforge.proxy.v1.ProxyService"``.
        idempotent_methods: Method names safe to retry, e.g. ``["GetSession"]``.
        max_attempts: Attempts including the first (gRPC caps this at 5).
        initial_backoff_s: First backoff, seconds.
        max_backoff_s: Largest backoff, seconds.

    Returns:
        The JSON text for the ``grpc.service_config`` channel option.
    """
    names = [{"service": service, "method": m} for m in idempotent_methods]
    config: dict[str, Any] = {"methodConfig": []}
    if names:
        config["methodConfig"].append(
            {
                "name": names,
                "retryPolicy": {
                    "maxAttempts": max_attempts,
                    "initialBackoff": f"{initial_backoff_s}s",
                    "maxBackoff": f"{max_backoff_s}s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        )
    return json.dumps(config)


class _DefaultDeadline:
    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None:
            return details
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=self._timeout_s,
            metadata=details.metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


class _UnaryUnaryDeadline(_DefaultDeadline, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStreamDeadline(_DefaultDeadline, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


def open_channel(
    target: str,
    *,
    service: str = "",
    idempotent_methods: Iterable[str] = (),
    default_timeout_s: float = 10.0,
    stream_timeout_s: float = 3600.0,
    max_message_bytes: int = 64 * 1024 * 1024,
) -> grpc.aio.Channel:
    """Opens an insecure asyncio channel with deadlines, retries and tracing.

    Args:
        target: ``host:port`` of the server.
        service: Full service name the retry policy applies to.
        idempotent_methods: Methods of ``service`` that may be retried.
        default_timeout_s: Deadline of unary calls that pass no ``timeout``, seconds.
        stream_timeout_s: Deadline of server-streaming calls that pass no ``timeout``, seconds.
        max_message_bytes: Largest message sent or received, bytes.

    Returns:
        The channel; close it with ``await channel.close()``.
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry_service_config(service, idempotent_methods)),
    ]
    interceptors: list[Any] = [
        _UnaryUnaryDeadline(default_timeout_s),
        _UnaryStreamDeadline(stream_timeout_s),
        *aio_client_interceptors(),
    ]
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


async def wait_serving(target: str, *, service: str = "", timeout_s: float = 60.0) -> None:
    """Waits until ``target`` reports SERVING on the standard health service.

    Uses ``Health.Watch`` with ``wait_for_ready`` so it neither polls nor
    fails while the server is still starting.

    Args:
        target: ``host:port``.
        service: Service name to check ("" = the overall status).
        timeout_s: How long to wait, seconds.

    Raises:
        TimeoutError: Not SERVING within ``timeout_s``.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(  # type: ignore[attr-defined]  # the stubs omit Watch
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s, wait_for_ready=True
        )
        try:
            async for resp in call:
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{target} not SERVING after {timeout_s:.0f}s") from exc
            raise
        finally:
            call.cancel()
    raise TimeoutError(f"{target} closed its health watch before SERVING")
