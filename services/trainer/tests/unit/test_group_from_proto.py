"""``group_from_proto``: a rollout is trainable iff its ``Rollout.reward`` is set; every other
rollout is excluded with a reason from its status and failure reason, its samples left out."""

from __future__ import annotations

import pytest

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.adapters.clients import exclusion_reason, group_from_proto
from openforge_trainer.domain.samples import ExcludedRollout


def message(*rollouts: common_pb2.Rollout, samples_of: dict[str, int]) -> trajectory_pb2.WatchCompletedGroupsResponse:
    """A completed group holding ``rollouts`` and ``samples_of[rollout_id]`` samples of each id
    (an id may name no rollout of the group)."""
    msg = trajectory_pb2.WatchCompletedGroupsResponse(group_id="g", task_id="t", cursor="c1")
    msg.rollouts.extend(rollouts)
    for rid, n in samples_of.items():
        for k in range(n):
            msg.samples.add(
                sample_id=f"{rid}/{k}",
                rollout_id=rid,
                index=k,
                prompt_token_ids=[1, 2],
                response_token_ids=[5, 6],
                loss_mask=[1, 1],
                rollout_logprobs=[-0.5, -0.25],
                policy_versions=[3, 3],
                call_ids=[f"{rid}-c{i}" for i in range(k + 1)],  # sample k merged k + 1 calls
            )
    return msg


def rollout(rid: str, status: int, reward: float | None = None, failure_reason: str = "") -> common_pb2.Rollout:
    r = common_pb2.Rollout(
        rollout_id=rid,
        task_id="t",
        group_id="g",
        status=status,  # type: ignore[arg-type]
        failure_reason=failure_reason,
    )
    if reward is not None:
        r.reward = reward
    return r


def test_failed_cancelled_bypass_and_unscored_rollouts_are_excluded_with_their_reason() -> None:
    msg = message(
        rollout("ok", common_pb2.ROLLOUT_STATUS_SUCCEEDED, reward=1.0),
        rollout("zero", common_pb2.ROLLOUT_STATUS_SUCCEEDED, reward=0.0),
        rollout("late", common_pb2.ROLLOUT_STATUS_TIMED_OUT, reward=0.25, failure_reason="harness timed out"),
        rollout("failed", common_pb2.ROLLOUT_STATUS_FAILED, failure_reason="verifier: exited 1"),
        rollout("cancelled", common_pb2.ROLLOUT_STATUS_CANCELLED, failure_reason="cancelled by the trainer"),
        rollout("bypass", common_pb2.ROLLOUT_STATUS_TIMED_OUT, failure_reason="bypass: other destinations: x"),
        rollout("unscored", common_pb2.ROLLOUT_STATUS_TIMED_OUT, failure_reason="harness timed out; verifier: boom"),
        samples_of={"ok": 1, "zero": 2, "late": 1, "failed": 2, "cancelled": 1, "bypass": 1, "unknown": 1},
    )
    group = group_from_proto(msg)
    assert group.rewards == {"ok": 1.0, "zero": 0.0, "late": 0.25}
    assert [(s.sample_id, s.reward, s.calls) for s in group.samples] == [
        ("ok/0", 1.0, 1),
        ("zero/0", 0.0, 1),
        ("zero/1", 0.0, 2),
        ("late/0", 0.25, 1),
    ]
    assert group.excluded == (
        ExcludedRollout("failed", "failed", 2),
        ExcludedRollout("cancelled", "cancelled", 1),
        ExcludedRollout("bypass", "bypass", 1),
        ExcludedRollout("unscored", "timed_out", 0),
        ExcludedRollout("unknown", "no_reward", 1),
    )
    assert group.has_samples


def test_a_group_whose_rollouts_all_failed_keeps_no_sample_but_still_had_some() -> None:
    msg = message(
        rollout("a", common_pb2.ROLLOUT_STATUS_FAILED, failure_reason="infrastructure: sandbox died"),
        rollout("b", common_pb2.ROLLOUT_STATUS_FAILED, failure_reason="bypass: no proxy call"),
        samples_of={"a": 1},
    )
    group = group_from_proto(msg)
    assert group.samples == () and group.rewards == {}
    assert [x.reason for x in group.excluded] == ["failed", "bypass"]
    assert group.has_samples
    assert not group_from_proto(message(rollout("b", common_pb2.ROLLOUT_STATUS_CANCELLED), samples_of={})).has_samples


@pytest.mark.parametrize(
    ("status", "failure_reason", "want"),
    [
        (common_pb2.ROLLOUT_STATUS_FAILED, "bypass: no proxy call", "bypass"),
        (common_pb2.ROLLOUT_STATUS_FAILED, "verifier: exited 2", "failed"),
        (common_pb2.ROLLOUT_STATUS_CANCELLED, "", "cancelled"),
        (common_pb2.ROLLOUT_STATUS_TIMED_OUT, "harness timed out after 9s", "timed_out"),
        (common_pb2.ROLLOUT_STATUS_SUCCEEDED, "", "no_reward"),
        (common_pb2.ROLLOUT_STATUS_FAILED, "not a bypass: verifier", "failed"),
    ],
)
def test_exclusion_reason(status: int, failure_reason: str, want: str) -> None:
    assert exclusion_reason(rollout("r", status, failure_reason=failure_reason)) == want
