"""The trainer's composition root: builds the loop's collaborators and the run manager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import structlog

from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_core.events import EventBus
from openforge_core.run_config import RunConfig
from openforge_trainer.adapters.clients import InferenceClient, OrchestratorClient, StoreClient
from openforge_trainer.adapters.sinks import EventSink, TensorBoardSink, default_prometheus_sink
from openforge_trainer.adapters.storage import FileCheckpointStore
from openforge_trainer.backends.base import TrainerBackend, create_backend
from openforge_trainer.domain.config import read_config_file
from openforge_trainer.domain.loop import LoopDeps
from openforge_trainer.domain.ports import MetricsSink
from openforge_trainer.domain.runs import RunManager
from openforge_trainer.servicer import TrainerServicer
from openforge_trainer.settings import TrainerSettings

log = structlog.get_logger(__name__)


def _backend_for(config: RunConfig) -> TrainerBackend:
    return create_backend(config.backend, config)


def _read_config(path: str) -> dict[str, Any]:
    return read_config_file(Path(path))


class TrainerApp:
    """Ready once NATS is connected (when events are published) and recorded runs are restored."""

    def __init__(self, settings: TrainerSettings) -> None:
        self.service_names = [trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name]
        self.settings = settings
        addresses = settings.services
        self.orchestrator = OrchestratorClient(addresses.orchestrator, timeout_s=settings.submit_timeout_s)
        self.store = StoreClient(addresses.trajectory_store)
        self.inference = InferenceClient(
            addresses.inference, timeout_s=settings.weight_sync_timeout_s, weight_sync=settings.weight_sync
        )
        self.checkpoints = FileCheckpointStore(settings.checkpoint_dir, keep=settings.keep_checkpoints)
        self.events = EventBus(settings.nats) if settings.publish_events else None
        sinks: list[MetricsSink] = [default_prometheus_sink()]
        try:
            sinks.append(TensorBoardSink(settings.tensorboard_dir or settings.checkpoint_dir / "tensorboard"))
        except ImportError:
            log.warning("trainer.tensorboard_unavailable", reason="tensorboardX is not installed")
        if self.events is not None:
            sinks.append(EventSink(self.events))
        self.sinks = sinks
        deps = LoopDeps(
            backend_factory=_backend_for,
            submitter=self.orchestrator,
            groups=self.store,
            weights=self.inference,
            checkpoints=self.checkpoints,
            sinks=sinks,
            stall_check_s=settings.stall_check_s,
        )
        self.runs = RunManager(deps, self.checkpoints, _read_config)

    def register(self, server: grpc.aio.Server) -> None:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(self.runs), server)

    async def start(self) -> None:
        if self.events is not None:
            await self.events.connect()
            await self.events.ensure_stream("trainer")
        resume = self.runs.restore()
        if self.settings.resume_on_start:
            for run_id in resume:
                log.info("run.resuming", run_id=run_id)
                self.runs.resume(run_id)

    async def close(self) -> None:
        await self.runs.close()
        for sink in self.sinks:
            await sink.close()
        await self.orchestrator.close()
        await self.store.close()
        await self.inference.close()
        if self.events is not None:
            await self.events.close()
