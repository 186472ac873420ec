"""Publishes rollout facts on NATS JetStream (``openforge.orchestrator.v1.*``).

The orchestrator is the producer of ``RunRegistered`` (``events.proto``: "published once per
run, before its first rollouts"): the first submission of a run this process sees publishes
the run's manifest (run id, harness, model, sampling, the minimum policy version, creation
time) before its ``RolloutsSubmitted``. Its event id ``run/<run_id>`` de-duplicates it across
restarts and replicas (JetStream's duplicate window, and the store's upsert).
"""

from __future__ import annotations

import structlog
from google.protobuf import json_format

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2
from openforge_core.events import EventBus, subject_for
from openforge_orchestrator.convert import rollout_to_proto
from openforge_orchestrator.domain.rollouts import Rollout

log = structlog.get_logger(__name__)

ROLLOUTS_SUBMITTED = subject_for("orchestrator", "rollouts_submitted")
ROLLOUT_STARTED = subject_for("orchestrator", "rollout_started")
ROLLOUT_FINISHED = subject_for("orchestrator", "rollout_finished")
RUN_REGISTERED = subject_for("orchestrator", "run_registered")


def run_manifest(rollout: Rollout) -> common_pb2.RunManifest:
    """The manifest of ``rollout``'s run as the orchestrator knows it at submission.

    Fields set: ``run_id``, ``harness``, ``model`` (the model name harnesses send),
    ``sampling``, ``policy_version`` (the minimum policy version asked for) and ``create_time``;
    the tokenizer, chat template and parser fields belong to the proxy and stay empty.
    """
    manifest = common_pb2.RunManifest(
        run_id=rollout.run_id,
        harness=rollout.harness,
        model=rollout.model_name,
        policy_version=rollout.min_policy_version,
    )
    if rollout.sampling:
        manifest.sampling.CopyFrom(json_format.ParseDict(dict(rollout.sampling), common_pb2.SamplingParams()))
    manifest.create_time.FromNanoseconds(int(rollout.create_time * 1e9))
    return manifest


class NatsRolloutEvents:
    """:class:`~openforge_orchestrator.domain.rollouts.RolloutEvents` over an :class:`EventBus`."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._registered: set[str] = set()

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        """Publishes ``RunRegistered`` for a run not seen yet, then ``RolloutsSubmitted``."""
        for rollout in rollouts:
            if rollout.run_id and rollout.run_id not in self._registered:
                run_event = f"run/{rollout.run_id}"
                await self._bus.publish(
                    RUN_REGISTERED,
                    events_pb2.RunRegistered(event_id=run_event, manifest=run_manifest(rollout)),
                    event_id=run_event,
                )
                self._registered.add(rollout.run_id)
                log.info("run.registered", run_id=rollout.run_id, harness=rollout.harness)
        # The first rollout id tells apart a new acceptance of the same request id (an orchestrator
        # restarted since has no memory of it and creates new rollouts) from a re-publish.
        first = rollouts[0].rollout_id if rollouts else ""
        event_id = f"submitted/{request_id}/{first}"
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
