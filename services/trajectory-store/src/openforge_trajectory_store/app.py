"""The trajectory store's composition root."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import structlog

from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus
from openforge_trajectory_store.adapters.consumer import EventIngestor
from openforge_trajectory_store.adapters.sql import SqlRepository
from openforge_trajectory_store.servicer import GroupNotifier, TrajectoryServicer
from openforge_trajectory_store.settings import StoreSettings

log = structlog.get_logger(__name__)


class StoreApp:
    """Builds the repository, the event consumers and the retention sweep.

    Ready once the database is open (migrated), unpublished groups are
    re-announced and the consumers run.
    """

    def __init__(self, settings: StoreSettings) -> None:
        self.service_names = [trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name]
        self.settings = settings
        self.repo = SqlRepository(settings.store.dsn)
        self.events = EventBus(settings.nats)
        self.notifier = GroupNotifier()
        self.ingestor = EventIngestor(self.repo, self.events, self.notifier.notify)
        self._retention: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> None:
        trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(
            TrajectoryServicer(self.repo, self.notifier, self.settings.exports_folder()), server
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.repo.open)
        await self.events.connect()
        await self.events.ensure_stream("trajectory")  # GroupCompleted and dead letters go there
        await self.ingestor.start(self.settings.consumer_name, self.settings.ingest_batch)
        if self.settings.store.retention_days > 0:
            self._retention = asyncio.create_task(self._retention_loop())

    async def _retention_loop(self) -> None:
        days = self.settings.store.retention_days
        while True:
            cutoff = time.time() - days * 86400
            deleted = await asyncio.to_thread(self.repo.delete_runs_older_than, cutoff)
            log.info("retention.swept", deleted_runs=len(deleted), retention_days=days)
            await asyncio.sleep(self.settings.store.retention_check_s)

    async def close(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
        await self.events.close()
        await asyncio.to_thread(self.repo.close)
