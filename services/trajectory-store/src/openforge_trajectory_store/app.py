"""The trajectory store's composition root."""

from __future__ import annotations

import grpc

from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus
from openforge_trajectory_store.adapters.consumer import EventIngestor
from openforge_trajectory_store.domain.record import Record
from openforge_trajectory_store.servicer import TrajectoryServicer
from openforge_trajectory_store.settings import StoreSettings


class StoreApp:
    """Builds the record and its event consumers; ready once the consumers run."""

    def __init__(self, settings: StoreSettings) -> None:
        self.service_names = [trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name]
        self.settings = settings
        self.record = Record()
        self.events = EventBus(settings.nats)

    def register(self, server: grpc.aio.Server) -> None:
        trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(TrajectoryServicer(self.record), server)

    async def start(self) -> None:
        await self.events.connect()
        await EventIngestor(self.record).start(self.events, self.settings.consumer_name)

    async def close(self) -> None:
        await self.events.close()
