"""Consumes call, rollout, run and training-step events into the repository (durable JetStream consumers).

Each fetch of events is committed in one transaction and acked after the
commit; completed groups are announced with ``GroupCompleted`` afterwards and
marked published only once JetStream acknowledged the event (retried with
growing pauses until it is, and on restart; the ``Nats-Msg-Id`` "group/<id>"
drops a duplicate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog
from google.protobuf.message import Message

from openforge.orchestrator.v1 import events_pb2 as orchestrator_events
from openforge.proxy.v1 import events_pb2 as proxy_events
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import events_pb2 as trajectory_events
from openforge_core.events import Delivery, EventBus, subject_for
from openforge_core.telemetry import use_context
from openforge_trajectory_store.domain.ports import CompletedGroup, IngestStore

log = structlog.get_logger(__name__)

SUBJECTS = [
    subject_for("orchestrator", "run_registered"),
    subject_for("orchestrator", "rollouts_submitted"),
    subject_for("orchestrator", "rollout_started"),
    subject_for("orchestrator", "rollout_finished"),
    subject_for("proxy", "call_recorded"),
    subject_for("trainer", "step_completed"),
]
TYPES: list[type[Message]] = [
    orchestrator_events.RunRegistered,
    orchestrator_events.RolloutsSubmitted,
    orchestrator_events.RolloutStarted,
    orchestrator_events.RolloutFinished,
    proxy_events.CallRecorded,
    trainer_events.StepCompleted,
]
GROUP_COMPLETED = subject_for("trajectory", "group_completed")


class EventIngestor:
    """Applies batches of events to the repository and announces completed groups.

    Args:
        repo: The repository (its calls run in a worker thread).
        bus: Where GroupCompleted is published.
        on_group: Called (in the event loop) for every group that completed.
    """

    def __init__(self, repo: IngestStore, bus: EventBus, on_group: Callable[[], None]) -> None:
        self._repo = repo
        self._bus = bus
        self._on_group = on_group
        self._publish_lock = asyncio.Lock()
        self._republish: asyncio.Task[None] | None = None

    async def handle_batch(self, batch: Sequence[tuple[Message, Delivery]]) -> None:
        """Commits a batch (idempotent per event id); raises to have it redelivered."""
        result = await asyncio.to_thread(self._repo.ingest, [(d.event_id, e, d.data) for e, d in batch])
        for event, delivery in batch:
            with use_context(delivery.context):
                if isinstance(event, orchestrator_events.RolloutsSubmitted):
                    log.info("rollouts.ingested", event_id=delivery.event_id, rollouts=len(event.rollouts))
                elif isinstance(event, proxy_events.CallRecorded):
                    log.debug("call.ingested", event_id=delivery.event_id, rollout_id=event.record.rollout_id)
                else:
                    log.info("event.ingested", event_id=delivery.event_id, type=event.DESCRIPTOR.name)
        if result.duplicates:
            log.info("events.duplicates_skipped", count=result.duplicates)
        if result.completed_groups:
            self._on_group()
            try:
                await self.publish_completed(result.completed_groups)
            except Exception as exc:  # committed: redelivering the batch would not announce them again
                log.error("group.publish_failed", error=type(exc).__name__, groups=len(result.completed_groups))
                self._retry_publish()

    def _retry_publish(self) -> None:
        """Announces every unpublished group again, with growing pauses, until it succeeds."""
        if self._republish is not None and not self._republish.done():
            return

        async def retry() -> None:
            delay = 1.0
            while True:
                await asyncio.sleep(delay)
                try:
                    await self.publish_completed()
                    return
                except Exception as exc:
                    log.error("group.publish_failed", error=type(exc).__name__, retry_in_s=delay)
                    delay = min(delay * 2, 60.0)

        self._republish = asyncio.create_task(retry(), name="republish-groups")

    async def publish_completed(self, groups: Sequence[CompletedGroup] | None = None) -> None:
        """Publishes GroupCompleted for the given groups (default: every unpublished one)."""
        async with self._publish_lock:
            todo = groups if groups is not None else await asyncio.to_thread(self._repo.unpublished_groups)
            for g in todo:
                rollouts, samples = await asyncio.to_thread(self._repo.group_contents, g.group_id)
                event_id = f"group/{g.group_id}"
                msg = trajectory_events.GroupCompleted(
                    event_id=event_id,
                    run_id=g.run_id,
                    group_id=g.group_id,
                    task_id=g.task_id,
                    rollouts=len(rollouts),
                    samples=len(samples),
                )
                await self._bus.publish(GROUP_COMPLETED, msg, event_id=event_id)
                await asyncio.to_thread(self._repo.mark_published, g.group_id)

    async def start(self, durable: str, batch: int) -> None:
        """Re-announces groups left unpublished by a crash, then starts the durable consumers."""
        await self.publish_completed()
        await self._bus.consume(
            durable,
            SUBJECTS,
            TYPES,
            batch_handler=self.handle_batch,
            dead_letter_domain="trajectory",
            batch=batch,
        )
