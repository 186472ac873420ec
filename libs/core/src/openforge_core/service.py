"""The one ``main`` every service runs: settings → telemetry → app → serve.

A service provides an :class:`App` (its composition root) and calls
:func:`run_service` from ``__main__``. Health reports SERVING only after
``App.start`` returned (dependencies connected, model loaded...).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

import grpc
import structlog

from openforge_core.metrics import start_metrics_endpoint
from openforge_core.rpc.server import GrpcServer, install_signal_handlers
from openforge_core.settings import ServiceSettings
from openforge_core.telemetry import configure_logging, configure_tracing

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=ServiceSettings)


class App(Protocol):
    """A service's composition root."""

    #: Full names of the gRPC services it registers, e.g. ``openforge.proxy.v1.ProxyService``.
    service_names: list[str]

    def register(self, server: grpc.aio.Server) -> None:
        """Adds the servicers to ``server``."""

    async def start(self) -> None:
        """Connects dependencies; when it returns the service is ready."""

    async def close(self) -> None:
        """Releases everything ``start`` acquired."""


@runtime_checkable
class HealthReporting(Protocol):
    """An app that can say whether it is able to serve (an engine up, a connection alive)."""

    async def healthy(self) -> bool:
        """Whether the service can serve now."""


@runtime_checkable
class Draining(Protocol):
    """An app with work in flight to let finish before its server stops (running rollouts)."""

    async def drain(self) -> None:
        """Accepts no new work and waits, within the app's own grace period, for the work it has."""


async def _watch_health(server: GrpcServer, app: HealthReporting, interval_s: float) -> None:
    serving = True
    while True:
        await asyncio.sleep(interval_s)
        try:
            ok = await app.healthy()
        except Exception:
            log.exception("health.check_failed")
            ok = False
        if ok != serving:
            serving = ok
            await server.set_serving(ok)


async def serve(settings: ServiceSettings, app: App, stop: asyncio.Event, health_check_s: float = 5.0) -> None:
    """Serves ``app`` until ``stop`` is set, then shuts down gracefully.

    Health turns SERVING once ``app.start()`` returned; for an app that is also
    :class:`HealthReporting` it then follows ``app.healthy()`` (checked every
    ``health_check_s`` seconds): NOT_SERVING while it is false. On ``stop``, an app that is
    :class:`Draining` drains first (health NOT_SERVING, the server still answering), then the
    server stops and the app closes. With ``settings.metrics.port`` set, its Prometheus
    metrics are served meanwhile (:mod:`openforge_core.metrics`).

    Args:
        settings: The service's settings (gRPC bind address and grace period).
        app: The composition root.
        stop: Set it to begin shutdown (the signal handlers do).
        health_check_s: Seconds between health checks.
    """
    server = GrpcServer(settings.grpc, app.service_names, [app.register])
    await server.start()
    metrics = start_metrics_endpoint(settings.metrics)
    watcher: asyncio.Task[None] | None = None
    try:
        await app.start()
        await server.set_serving(True)
        log.info("service.ready", port=server.port)
        if isinstance(app, HealthReporting):
            watcher = asyncio.create_task(_watch_health(server, app, health_check_s))
        await stop.wait()
        log.info("service.stopping")
        if watcher is not None:
            watcher.cancel()
        if isinstance(app, Draining):
            await server.set_serving(False)
            await app.drain()
    finally:
        if watcher is not None:
            watcher.cancel()
        await server.stop()
        await app.close()
        if metrics is not None:
            metrics.close()
    log.info("service.stopped")


def run_service(settings_cls: type[S], build_app: Callable[[S], App]) -> None:
    """Entry point for ``python -m openforge_<service>``.

    Reads settings from the environment once, configures logging and tracing,
    builds the app and serves it until SIGTERM or SIGINT.

    Args:
        settings_cls: The service's settings class.
        build_app: Builds the composition root from the settings.
    """
    settings = settings_cls()
    configure_logging(settings_cls.service_name, settings.log.level, json_output=settings.log.format == "json")
    provider = configure_tracing(settings_cls.service_name)

    async def main() -> None:
        stop = asyncio.Event()
        install_signal_handlers(stop)
        await serve(settings, build_app(settings), stop, getattr(settings, "health_check_s", 5.0))

    try:
        asyncio.run(main())
    finally:
        provider.shutdown()
