"""The proxy's composition root."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path

import grpc
import structlog

from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.events import EventBus
from openforge_core.manifest import ServedModel
from openforge_proxy.adapters.body_parser import ProcessBodyParser
from openforge_proxy.adapters.inference import GrpcEngine
from openforge_proxy.adapters.publisher import NatsRecorder
from openforge_proxy.domain.admission import Admission
from openforge_proxy.domain.handler import CallHandler
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.sessions import SessionRegistry
from openforge_proxy.http.metrics import default_session_collector
from openforge_proxy.http.server import HttpServer
from openforge_proxy.servicer import ProxyServicer
from openforge_proxy.settings import ProxySettings

log = structlog.get_logger(__name__)

EV_MODEL_LOADED = "model.loaded"
EV_MODEL_UNAVAILABLE = "model.unavailable"

#: Seconds between sweeps that expire sessions (and free their splice state).
SWEEP_INTERVAL_S = 30.0

#: Cyclic-GC thresholds while serving. A call allocates tens of thousands of short-lived
#: objects (the parsed body, canonical messages, template dicts); with CPython's default
#: (700, 10, 10) that triggers several young collections per call and frequent full ones
#: that walk every session's state (the p99 latency spikes). Almost nothing the proxy
#: allocates is cyclic: reference counting frees it, so collecting rarely costs no memory.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Moves everything alive now (modules, the model runtime) out of the collector's reach and
    makes collections rarer (:data:`GC_THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class ModelLoader:
    """Loads the served model's runtime once, on first need (retrying while inference is down).

    Args:
        engine: The inference client.
        settings: The proxy's settings.
    """

    def __init__(self, engine: GrpcEngine, settings: ProxySettings) -> None:
        self._engine = engine
        self._settings = settings
        self._runtime: ModelRuntime | None = None
        self._lock = asyncio.Lock()

    def served(self) -> ServedModel | None:
        """What the loaded model serves with; None until it is loaded (never waits)."""
        return self._runtime.served if self._runtime is not None else None

    async def __call__(self) -> ModelRuntime:
        if self._runtime is not None:
            return self._runtime
        async with self._lock:
            if self._runtime is None:
                info = await self._engine.model_info()
                m = self._settings.model
                self._runtime = ModelRuntime.load(
                    info,
                    model_dir=Path(m.path) if m.path else None,
                    family=m.family,
                    template_kwargs=m.template_kwargs,
                    check_hash=m.check_tokenizer_hash,
                )
                log.info(
                    EV_MODEL_LOADED,
                    model=info.model_name,
                    family=self._runtime.family.name,
                    template_hash=info.chat_template_hash,
                )
            return self._runtime


class ProxyApp:
    """Builds the proxy's dependencies: sessions, the event bus, inference, the HTTP server.

    Ready once NATS is connected, the proxy's stream exists and the HTTP port
    is bound. Inference need not be up: the model is loaded on the first call
    (503 in the caller's shape until it can be).
    """

    def __init__(self, settings: ProxySettings) -> None:
        self.service_names = [proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"].full_name]
        self.settings = settings
        self.sessions = SessionRegistry(
            settings.session_ttl_s, settings.max_sessions, max_ended=settings.max_ended_sessions
        )
        default_session_collector().watch(self.sessions)
        self.events = EventBus(settings.nats)
        self.engine = GrpcEngine(settings.services.inference, generate_timeout_s=settings.generate_timeout_s)
        self.loader = ModelLoader(self.engine, settings)
        large = settings.large_body
        self.body_parser = ProcessBodyParser(large.min_bytes, large.timeout_s) if large.process else None
        admission = Admission(
            self.sessions,
            self.loader,
            max_heads=settings.max_heads,
            default_max_tokens=settings.default_max_tokens,
            body_parser=self.body_parser,
            memos=settings.memos,
        )
        recorder = NatsRecorder(self.events, structs=settings.record.structs)
        self.handler = CallHandler(self.sessions, self.engine, recorder, admission)
        http = settings.http
        self.http = HttpServer(
            self.handler,
            http.host,
            http.port,
            http.max_body_bytes,
            header_timeout_s=http.header_timeout_s,
            body_timeout_s=http.body_timeout_s,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._warm: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> None:
        proxy_pb2_grpc.add_ProxyServiceServicer_to_server(ProxyServicer(self.sessions, self.loader.served), server)

    async def start(self) -> None:
        await self.events.connect()
        await self.events.ensure_stream("proxy")
        await self.http.start()
        if self.body_parser is not None:  # its process is ready before the first large body
            await asyncio.to_thread(self.body_parser.warm)
        self._sweeper = asyncio.create_task(self._sweep(), name="session-sweeper")
        self._warm = asyncio.create_task(self._warm_up(), name="model-warm-up")

    async def _warm_up(self) -> None:
        try:
            await self.loader()
        except Exception as exc:  # inference may start later; calls retry the load
            log.warning(EV_MODEL_UNAVAILABLE, error=str(exc))
        if self.settings.gc_tuning:
            tune_gc()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sessions.sweep()

    async def close(self) -> None:
        for task in (self._sweeper, self._warm):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.http.stop()
        if self.body_parser is not None:
            await asyncio.to_thread(self.body_parser.close)
        await self.engine.close()
        await self.events.close()
