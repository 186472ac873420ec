"""The orchestrator's composition root."""

from __future__ import annotations

import grpc

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.events import EventBus
from openforge_orchestrator.adapters.events import NatsRolloutEvents
from openforge_orchestrator.domain.rollouts import RolloutRegistry
from openforge_orchestrator.servicer import OrchestratorServicer
from openforge_orchestrator.settings import OrchestratorSettings


class OrchestratorApp:
    """Builds the rollout registry and its event publisher; ready once NATS is connected."""

    def __init__(self, settings: OrchestratorSettings) -> None:
        self.service_names = [orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name]
        self.settings = settings
        self.events = EventBus(settings.nats)
        self.rollouts = RolloutRegistry(NatsRolloutEvents(self.events))

    def register(self, server: grpc.aio.Server) -> None:
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(OrchestratorServicer(self.rollouts), server)

    async def start(self) -> None:
        await self.events.connect()
        await self.events.ensure_stream("orchestrator")

    async def close(self) -> None:
        await self.events.close()
