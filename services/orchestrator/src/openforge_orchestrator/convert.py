"""Domain rollout ↔ ``openforge.common.v1.Rollout``."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.common.v1 import common_pb2
from openforge_core.timestamps import to_timestamp
from openforge_orchestrator.domain.rollouts import Rollout, RolloutStatus

STATUS_TO_PROTO = {
    RolloutStatus.PENDING: common_pb2.ROLLOUT_STATUS_PENDING,
    RolloutStatus.RUNNING: common_pb2.ROLLOUT_STATUS_RUNNING,
    RolloutStatus.SUCCEEDED: common_pb2.ROLLOUT_STATUS_SUCCEEDED,
    RolloutStatus.FAILED: common_pb2.ROLLOUT_STATUS_FAILED,
    RolloutStatus.TIMED_OUT: common_pb2.ROLLOUT_STATUS_TIMED_OUT,
    RolloutStatus.CANCELLED: common_pb2.ROLLOUT_STATUS_CANCELLED,
}


def _ts(unix_s: float) -> Timestamp | None:
    return to_timestamp(unix_s) if unix_s else None


def rollout_to_proto(r: Rollout) -> common_pb2.Rollout:
    """Domain rollout → proto (unset times and unaccounted sandbox figures stay unset)."""
    msg = common_pb2.Rollout(
        rollout_id=r.rollout_id,
        run_id=r.run_id,
        task_id=r.task_id,
        group_id=r.group_id,
        group_index=r.group_index,
        harness=r.harness,
        status=STATUS_TO_PROTO[r.status],
        failure_reason=r.failure_reason,
        min_policy_version=r.min_policy_version,
        verifier_output=r.verifier_output,
    )
    if r.reward is not None:
        msg.reward = r.reward
    for name, value in (
        ("create_time", r.create_time),
        ("start_time", r.start_time),
        ("end_time", r.end_time),
    ):
        ts = _ts(value)
        if ts is not None:
            getattr(msg, name).CopyFrom(ts)
    if r.sandbox_cpu_s is not None:
        cpu = Duration()
        cpu.FromNanoseconds(round(r.sandbox_cpu_s * 1e9))
        msg.sandbox_usage.cpu_time.CopyFrom(cpu)
    if r.sandbox_peak_memory_bytes is not None:
        msg.sandbox_usage.peak_memory_bytes = r.sandbox_peak_memory_bytes
    return msg
