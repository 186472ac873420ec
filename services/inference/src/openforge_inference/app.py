"""The inference service's composition root."""

from __future__ import annotations

import uuid

import grpc
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.inference.v1 import events_pb2, inference_pb2, inference_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_inference.engines import create_engine
from openforge_inference.engines.base import Engine, EngineConfig
from openforge_inference.pushed_weights import PushStaging
from openforge_inference.servicer import InferenceServicer
from openforge_inference.settings import InferenceSettings

log = structlog.get_logger(__name__)

WEIGHTS_LOADED = subject_for("inference", "weights_loaded")


class InferenceApp:
    """Builds the engine chosen by settings (imported lazily) and the event publisher.

    Ready once NATS is connected and the model is loaded (or no model is configured);
    health follows :meth:`healthy` afterwards.
    """

    def __init__(self, settings: InferenceSettings) -> None:
        self.service_names = [inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name]
        self.settings = settings
        self.events = EventBus(settings.nats)
        self.engine: Engine | None = None
        if settings.model_path is not None:
            self.engine = create_engine(
                settings.engine,
                EngineConfig(
                    model_path=settings.model_path,
                    model_name=settings.model_name,
                    max_model_len=settings.max_model_len,
                    max_num_seqs=settings.max_num_seqs,
                    seed=settings.seed,
                    kv_cache_gib=settings.kv_cache_gib,
                    threads=settings.threads,
                    tasks_root=settings.scripted_tasks_root,
                    scripted_error_rate=settings.scripted_error_rate,
                    scripted_error_kind=settings.scripted_error_kind,
                    vllm=settings.vllm,
                ),
            )
        pushes = PushStaging(settings.push_dir, int(settings.push_max_gib * 1024**3))
        self.servicer = InferenceServicer(self.engine, self._weights_loaded, pushes)

    def register(self, server: grpc.aio.Server) -> None:
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        await self.events.connect()
        await self.events.ensure_stream("inference")
        if self.engine is None:
            log.warning("model.none_configured")
            return
        await self.engine.start()
        info = await self.engine.model_info()
        log.info("model.loaded", engine=info.engine, path=info.model_path, vocab_size=info.vocab_size)

    async def healthy(self) -> bool:
        """NATS connected and, when a model is configured, the engine able to generate."""
        return self.events.connected and (self.engine is None or await self.engine.healthy())

    async def _weights_loaded(self, uri: str, version: int, checksum: str) -> None:
        now = Timestamp()
        now.GetCurrentTime()
        event_id = f"weights/{version}/{uuid.uuid4().hex[:8]}"
        event = events_pb2.WeightsLoaded(event_id=event_id, version=version, uri=uri, checksum=checksum, load_time=now)
        await self.events.publish(WEIGHTS_LOADED, event, event_id=event_id)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
        self.servicer.close()
        await self.events.close()
