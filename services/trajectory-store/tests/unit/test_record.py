"""The record: idempotent ingestion, status ordering, filters and paging."""

from __future__ import annotations

import pytest

from openforge.common.v1 import common_pb2
from openforge_core.errors import InvalidArgument, NotFound
from openforge_trajectory_store.domain.record import Record, RolloutFilter


def _rollout(
    i: int,
    status: common_pb2.RolloutStatus.ValueType = common_pb2.ROLLOUT_STATUS_PENDING,
    reward: float | None = None,
) -> common_pb2.Rollout:
    r = common_pb2.Rollout(
        rollout_id=f"r{i}", run_id="run" if i % 2 else "other", task_id=f"t{i % 3}", status=status
    )
    r.create_time.FromSeconds(1000 + i)
    if reward is not None:
        r.reward = reward
    return r


def test_events_apply_once_and_terminal_state_wins() -> None:
    rec = Record()
    assert rec.apply_rollouts("e1", [_rollout(1)])
    assert not rec.apply_rollouts("e1", [_rollout(1, common_pb2.ROLLOUT_STATUS_FAILED)])
    assert rec.apply_rollouts("e2", [_rollout(1, common_pb2.ROLLOUT_STATUS_SUCCEEDED, 1.0)])
    assert rec.apply_rollouts("e3", [_rollout(1, common_pb2.ROLLOUT_STATUS_RUNNING)])  # late, older state
    assert rec.rollout("r1").status == common_pb2.ROLLOUT_STATUS_SUCCEEDED
    call = common_pb2.CallRecord(rollout_id="r1", call_id="c1", attempt=1, prompt_token_ids=[1, 2])
    assert rec.apply_call("c/1", call)
    assert not rec.apply_call("c/1", call)
    assert [c.call_id for c in rec.calls("r1")] == ["c1"]
    with pytest.raises(NotFound):
        rec.rollout("nope")
    with pytest.raises(NotFound):
        rec.calls("nope")


def test_filters_and_paging_newest_first() -> None:
    rec = Record()
    rec.apply_rollouts(
        "e", [_rollout(i, common_pb2.ROLLOUT_STATUS_SUCCEEDED, reward=i / 10) for i in range(10)]
    )
    ids: list[str] = []
    token = ""
    while True:
        page, token = rec.list_rollouts(RolloutFilter(run_id="run"), 2, token)
        ids += [r.rollout_id for r in page]
        if not token:
            break
    assert ids == ["r9", "r7", "r5", "r3", "r1"]
    page, _ = rec.list_rollouts(RolloutFilter(min_reward=0.5, max_reward=0.7), 0, "")
    assert [r.rollout_id for r in page] == ["r7", "r6", "r5"]
    with pytest.raises(InvalidArgument):
        rec.list_rollouts(RolloutFilter(), 0, "garbage!")
    with pytest.raises(InvalidArgument):
        rec.list_rollouts(RolloutFilter(), -1, "")
