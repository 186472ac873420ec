"""Publishes rollout facts on NATS JetStream (``openforge.orchestrator.v1.*``).

The orchestrator is the producer of ``RunRegistered`` (``events.proto``), twice per run:

* at the first submission of a run this process sees, the manifest known then (run id,
  harness, model, sampling, the minimum policy version, creation time), before its
  ``RolloutsSubmitted``; event id ``run/<run_id>``;
* at the run's first launched rollout, the complete manifest (that one completed with
  :class:`~openforge_orchestrator.domain.manifest.LaunchManifest`); event id
  ``run/<run_id>/launched``. The store keeps a run's latest manifest, so it replaces the first.

Each event id de-duplicates its event across restarts and replicas (JetStream's duplicate
window, and the store's record of the event ids it applied).
"""

from __future__ import annotations

import structlog

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2
from openforge_core.events import EventBus, subject_for
from openforge_orchestrator.convert import rollout_to_proto
from openforge_orchestrator.domain.manifest import LaunchManifest
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
    if rollout.sampling is not None:
        manifest.sampling.CopyFrom(rollout.sampling)
    manifest.create_time.FromNanoseconds(int(rollout.create_time * 1e9))
    return manifest


def complete_manifest(manifest: common_pb2.RunManifest, launched: LaunchManifest) -> common_pb2.RunManifest:
    """A copy of ``manifest`` (the one at submission) with the fields known at the first launch."""
    complete = common_pb2.RunManifest()
    complete.CopyFrom(manifest)
    complete.harness_version = launched.harness_version
    complete.harness_config_hash = launched.harness_config_hash
    complete.tokenizer_hash = launched.served.tokenizer_hash
    complete.chat_template_hash = launched.served.chat_template_hash
    complete.parsers[:] = launched.served.parsers
    complete.sandbox_image_digest = launched.sandbox_image_digest
    complete.verifier_version = launched.verifier_version
    return complete


class NatsRolloutEvents:
    """:class:`~openforge_orchestrator.domain.rollouts.RolloutEvents` and
    :class:`~openforge_orchestrator.domain.manifest.RunManifests` over an :class:`EventBus`."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        #: run id → the manifest published at its first submission (by this process).
        self._registered: dict[str, common_pb2.RunManifest] = {}

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        """Publishes ``RunRegistered`` for a run not seen yet, then ``RolloutsSubmitted``."""
        for rollout in rollouts:
            if rollout.run_id and rollout.run_id not in self._registered:
                run_event = f"run/{rollout.run_id}"
                manifest = run_manifest(rollout)
                await self._bus.publish(
                    RUN_REGISTERED, events_pb2.RunRegistered(event_id=run_event, manifest=manifest), event_id=run_event
                )
                self._registered[rollout.run_id] = manifest
                log.info("run.registered", run_id=rollout.run_id, harness=rollout.harness)
        # The first rollout id tells apart a new acceptance of the same request id (an orchestrator
        # restarted since has no memory of it and creates new rollouts) from a re-publish.
        first = rollouts[0].rollout_id if rollouts else ""
        event_id = f"submitted/{request_id}/{first}"
        msg = events_pb2.RolloutsSubmitted(event_id=event_id, rollouts=[rollout_to_proto(r) for r in rollouts])
        await self._bus.publish(ROLLOUTS_SUBMITTED, msg, event_id=event_id)
        log.info("rollouts.submitted", request_id=request_id, rollouts=len(rollouts))

    async def launched(self, rollout: Rollout, manifest: LaunchManifest) -> None:
        """Publishes the complete manifest of ``rollout``'s run (``run/<run_id>/launched``): the one
        published at submission (rebuilt from ``rollout`` after a restart) completed."""
        first = self._registered.get(rollout.run_id) or run_manifest(rollout)
        event_id = f"run/{rollout.run_id}/launched"
        msg = events_pb2.RunRegistered(event_id=event_id, manifest=complete_manifest(first, manifest))
        await self._bus.publish(RUN_REGISTERED, msg, event_id=event_id)
        log.info("run.launched", run_id=rollout.run_id, harness_version=manifest.harness_version)

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
