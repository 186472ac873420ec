"""Consumes call and rollout events into the record (durable JetStream consumers)."""

from __future__ import annotations

import structlog
from google.protobuf.message import Message

from openforge.orchestrator.v1 import events_pb2 as orchestrator_events
from openforge.proxy.v1 import events_pb2 as proxy_events
from openforge_core.events import Delivery, EventBus, subject_for
from openforge_trajectory_store.domain.record import Record

log = structlog.get_logger(__name__)

SUBJECTS = [
    subject_for("orchestrator", "rollouts_submitted"),
    subject_for("orchestrator", "rollout_started"),
    subject_for("orchestrator", "rollout_finished"),
    subject_for("proxy", "call_recorded"),
]
TYPES: list[type[Message]] = [
    orchestrator_events.RolloutsSubmitted,
    orchestrator_events.RolloutStarted,
    orchestrator_events.RolloutFinished,
    proxy_events.CallRecorded,
]


class EventIngestor:
    """Applies each event to the record; acked by the bus only after this returns."""

    def __init__(self, record: Record) -> None:
        self._record = record

    async def handle(self, event: Message, delivery: Delivery) -> None:
        """Applies one event (idempotent on ``delivery.event_id``)."""
        event_id = delivery.event_id
        if isinstance(event, orchestrator_events.RolloutsSubmitted):
            applied = self._record.apply_rollouts(event_id, list(event.rollouts))
            log.info("rollouts.ingested", event_id=event_id, rollouts=len(event.rollouts), applied=applied)
        elif isinstance(event, orchestrator_events.RolloutStarted | orchestrator_events.RolloutFinished):
            applied = self._record.apply_rollouts(event_id, [event.rollout])
            log.info(
                "rollout.ingested", event_id=event_id, rollout_id=event.rollout.rollout_id, applied=applied
            )
        elif isinstance(event, proxy_events.CallRecorded):
            applied = self._record.apply_call(event_id, event.record)
            log.info("call.ingested", event_id=event_id, rollout_id=event.record.rollout_id, applied=applied)
        else:  # pragma: no cover - the bus only decodes TYPES
            raise TypeError(f"unexpected event {type(event).__name__}")

    async def start(self, bus: EventBus, durable: str) -> None:
        """Starts the durable consumers of every subject the store records."""
        await bus.consume(durable, SUBJECTS, TYPES, self.handle)
