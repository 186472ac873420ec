"""Publishes rollout facts on NATS JetStream (``openforge.orchestrator.v1.*``)."""

from __future__ import annotations

import structlog

from openforge.orchestrator.v1 import events_pb2
from openforge_core.events import EventBus, subject_for
from openforge_orchestrator.convert import rollout_to_proto
from openforge_orchestrator.domain.rollouts import Rollout

log = structlog.get_logger(__name__)

ROLLOUTS_SUBMITTED = subject_for("orchestrator", "rollouts_submitted")
ROLLOUT_STARTED = subject_for("orchestrator", "rollout_started")
ROLLOUT_FINISHED = subject_for("orchestrator", "rollout_finished")


class NatsRolloutEvents:
    """:class:`~openforge_orchestrator.domain.rollouts.RolloutEvents` over an :class:`EventBus`."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        event_id = f"submitted/{request_id}"
        msg = events_pb2.RolloutsSubmitted(event_id=event_id, rollouts=[rollout_to_proto(r) for r in rollouts])
        await self._bus.publish(ROLLOUTS_SUBMITTED, msg, event_id=event_id)
        log.info("rollouts.submitted", request_id=request_id, rollouts=len(rollouts))

    async def started(self, rollout: Rollout) -> None:
        event_id = f"started/{rollout.rollout_id}"
        msg = events_pb2.RolloutStarted(event_id=event_id, rollout=rollout_to_proto(rollout))
        await self._bus.publish(ROLLOUT_STARTED, msg, event_id=event_id)
        log.info("rollout.started", rollout_id=rollout.rollout_id, task=f"{rollout.task_set}/{rollout.task_id}")

    async def finished(self, rollout: Rollout) -> None:
        event_id = f"finished/{rollout.rollout_id}"
        msg = events_pb2.RolloutFinished(
            event_id=event_id,
            rollout=rollout_to_proto(rollout),
            harness_exit_code=rollout.harness_exit_code,
            calls=rollout.calls,
            bypass_reason=rollout.bypass_reason,
            blocked_destinations=list(rollout.blocked_destinations),
            attempts=rollout.attempts,
            harness_timed_out=rollout.timed_out,
        )
        msg.start_latency.FromNanoseconds(int(rollout.start_latency_s * 1e9))
        await self._bus.publish(ROLLOUT_FINISHED, msg, event_id=event_id)
        log.info(
            "rollout.finished",
            rollout_id=rollout.rollout_id,
            status=rollout.status.value,
            reward=rollout.reward,
            calls=rollout.calls,
            reason=rollout.failure_reason,
        )
