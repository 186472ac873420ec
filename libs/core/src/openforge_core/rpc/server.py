"""The gRPC server every service runs: health, reflection, errors, tracing, shutdown.

* ``grpc.health.v1.Health`` (https://github.com/grpc/grpc/blob/master/doc/health-checking.md):
  the overall status ("") and each service name report NOT_SERVING until
  :meth:`GrpcServer.set_serving` is called once the service is ready (model
  loaded, NATS connected...), and again NOT_SERVING from the first moment of
  shutdown or when the service reports itself unhealthy.
* Server reflection (``grpc.reflection.v1alpha``) for grpcurl and friends.
* :class:`~openforge_core.rpc.interceptor.ErrorMappingInterceptor` for errors,
  :class:`~openforge_core.rpc.validation.RequestValidationInterceptor` so a request that does
  not decode, or whose string fields break :mod:`openforge_core.field_rules`, is
  INVALID_ARGUMENT with a field violation before any handler runs, and the OpenTelemetry aio
  server interceptor for traces.
* :class:`~openforge_core.metrics.MetricsInterceptor` (outermost) counts and times every call
  for Prometheus (:mod:`openforge_core.metrics`).
* Graceful shutdown: on SIGTERM or SIGINT, health turns NOT_SERVING
  (``enter_graceful_shutdown``), then ``stop(grace)`` lets in-flight RPCs finish
  for ``graceful_shutdown_s`` seconds.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from openforge_core.metrics import GrpcServerMetrics, MetricsInterceptor, default_grpc_metrics
from openforge_core.rpc.interceptor import ErrorMappingInterceptor
from openforge_core.rpc.validation import RequestValidationInterceptor
from openforge_core.settings import GrpcServerSettings

log = structlog.get_logger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

Registrar = Callable[[grpc.aio.Server], None]


class GrpcServer:
    """An asyncio gRPC server with the standard health and reflection services.

    Args:
        settings: Bind address, shutdown grace and message size limit.
        service_names: Full names of the services registered (for health and
            reflection), e.g. ``"openforge.proxy.v1.ProxyService"``.
        register: Callables that add servicers to the server.
        metrics: Where its calls are counted (default: the process's
            :func:`~openforge_core.metrics.default_grpc_metrics`).
    """

    def __init__(
        self,
        settings: GrpcServerSettings,
        service_names: Iterable[str],
        register: Iterable[Registrar],
        metrics: GrpcServerMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._names = list(service_names)
        self._health = health.aio.HealthServicer()
        options = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        interceptors: list[grpc.aio.ServerInterceptor] = [
            MetricsInterceptor(metrics or default_grpc_metrics()),
            # Health checks are not traced (and Health.Watch streams with context.write,
            # which the OpenTelemetry stream wrapper does not support).
            aio_server_interceptor(filter_=filters.negate(filters.service_name(HEALTH_SERVICE))),
            ErrorMappingInterceptor(),
            # Innermost: its InvalidArgument is mapped by the interceptor above.
            RequestValidationInterceptor(),
        ]
        self._server = grpc.aio.server(interceptors=interceptors, options=options)
        for reg in register:
            reg(self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            [
                *self._names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self._server,
        )
        self.port = 0

    async def start(self) -> int:
        """Binds and starts serving (health NOT_SERVING until ready).

        Returns:
            The bound port (useful when the configured port is 0).

        Raises:
            RuntimeError: The address could not be bound.
        """
        for name in ["", *self._names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self._settings.host}:{self._settings.port}"
        self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"could not bind gRPC server to {address}")
        await self._server.start()
        log.info("grpc.started", address=f"{self._settings.host}:{self.port}", services=self._names)
        return self.port

    async def set_serving(self, serving: bool = True) -> None:
        """Reports SERVING (ready) or NOT_SERVING on the overall and every service status."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._names]:
            await self._health.set(name, status)
        log.info("health.changed", serving=serving)

    async def stop(self) -> None:
        """NOT_SERVING at once, then waits up to the grace period for in-flight RPCs."""
        await self._health.enter_graceful_shutdown()
        await self._server.stop(self._settings.graceful_shutdown_s)
        log.info("grpc.stopped")


def install_signal_handlers(stop: asyncio.Event) -> None:
    """Sets ``stop`` on SIGTERM and SIGINT (PID 1 in a container gets SIGTERM)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
