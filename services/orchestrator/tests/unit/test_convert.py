"""Domain rollout → ``openforge.common.v1.Rollout``: the sandbox's figures and unset fields."""

from __future__ import annotations

from dataclasses import replace

from openforge_orchestrator.convert import rollout_to_proto
from openforge_orchestrator.domain.rollouts import Rollout, RolloutStatus

_ROLLOUT = Rollout(
    rollout_id="r1",
    run_id="run",
    task_id="t",
    task_set="train",
    group_id="g",
    group_index=0,
    harness="command",
    model_name="m",
    status=RolloutStatus.SUCCEEDED,
    min_policy_version=0,
    timeout_s=0.0,
    create_time=1_700_000_000.5,
)


def test_sandbox_usage_is_carried_in_its_units() -> None:
    msg = rollout_to_proto(replace(_ROLLOUT, sandbox_cpu_s=1.25, sandbox_peak_memory_bytes=3 * 2**20))
    assert msg.sandbox_usage.cpu_time.ToNanoseconds() == 1_250_000_000
    assert msg.sandbox_usage.peak_memory_bytes == 3 * 2**20


def test_what_was_not_accounted_stays_unset() -> None:
    msg = rollout_to_proto(_ROLLOUT)
    assert not msg.HasField("sandbox_usage") and not msg.HasField("start_time") and not msg.HasField("reward")
    only_cpu = rollout_to_proto(replace(_ROLLOUT, sandbox_cpu_s=0.5)).sandbox_usage
    assert only_cpu.HasField("cpu_time") and not only_cpu.HasField("peak_memory_bytes")
    assert rollout_to_proto(_ROLLOUT).create_time.ToNanoseconds() == 1_700_000_000_500_000_000
