"""The trainer's composition root."""

from __future__ import annotations

import grpc

from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_core.events import EventBus
from openforge_trainer.domain.runs import RunRegistry
from openforge_trainer.servicer import TrainerServicer
from openforge_trainer.settings import TrainerSettings


class TrainerApp:
    """Builds the run registry; ready once NATS is connected (weights events go there)."""

    def __init__(self, settings: TrainerSettings) -> None:
        self.service_names = [trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name]
        self.settings = settings
        self.runs = RunRegistry()
        self.events = EventBus(settings.nats)

    def register(self, server: grpc.aio.Server) -> None:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(self.runs), server)

    async def start(self) -> None:
        await self.events.connect()
        await self.events.ensure_stream("trainer")

    async def close(self) -> None:
        await self.events.close()
