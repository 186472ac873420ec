"""Sample rewards: a rollout's verifier reward on each of its samples, and no reward written for a
rollout without one (``Sample.reward`` has no presence, so it reads 0.0; consumers go by
``Rollout.reward``)."""

from __future__ import annotations

import pytest
from store_builders import conversation, make_call, make_rollout

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core.protowire import fields
from openforge_trajectory_store.domain.assembly import assemble
from openforge_trajectory_store.domain.wire import CallView

REWARD_FIELD = trajectory_pb2.Sample.DESCRIPTOR.fields_by_name["reward"].number


def samples_of(rollout: common_pb2.Rollout) -> list[bytes]:
    """The serialized samples of a rollout split in two (the second call does not extend the first)."""
    calls = conversation(rollout.rollout_id, turns=2)
    calls.append(make_call(rollout.rollout_id, "other", [7, 7, 7], [601, 602], t=9000))
    return assemble(rollout, [CallView.parse(c.SerializeToString()) for c in calls])


@pytest.mark.parametrize(
    ("status", "reward"),
    [(common_pb2.ROLLOUT_STATUS_SUCCEEDED, 0.75), (common_pb2.ROLLOUT_STATUS_TIMED_OUT, 0.5)],
)
def test_every_sample_carries_the_rollout_reward(status: int, reward: float) -> None:
    data = samples_of(make_rollout("r1", status=status, reward=reward))
    assert len(data) == 2
    for raw in data:
        assert [n for n, *_ in fields(raw)].count(REWARD_FIELD) == 1
        assert trajectory_pb2.Sample.FromString(raw).reward == reward


@pytest.mark.parametrize(
    "status",
    [common_pb2.ROLLOUT_STATUS_FAILED, common_pb2.ROLLOUT_STATUS_CANCELLED, common_pb2.ROLLOUT_STATUS_TIMED_OUT],
)
def test_a_rollout_without_reward_leaves_the_sample_reward_unset(status: int) -> None:
    data = samples_of(make_rollout("r1", status=status))
    assert len(data) == 2
    for raw in data:
        assert REWARD_FIELD not in [n for n, *_ in fields(raw)]
        sample = trajectory_pb2.Sample.FromString(raw)
        assert sample.reward == 0.0 and sample.partial
        # Written as protobuf itself writes an unset field: the canonical encoding.
        assert sample.SerializeToString() == raw


def test_the_export_writes_no_reward_for_a_rollout_without_one() -> None:
    # The Parquet/JSONL export in veRL's layout: a sample of an unrewarded rollout has a null
    # reward (a veRL user of the file must not train it as 0), a rewarded one its reward.
    from openforge_trajectory_store.adapters.export import rows

    scored = make_rollout("r1", status=common_pb2.ROLLOUT_STATUS_SUCCEEDED, reward=0.0)
    failed = make_rollout("r2", status=common_pb2.ROLLOUT_STATUS_FAILED)
    items = [(r, trajectory_pb2.Sample.FromString(raw)) for r in (scored, failed) for raw in samples_of(r)]
    assert [(row["rollout_id"], row["reward"]) for row in rows(items, None)] == [
        ("r1", 0.0),
        ("r1", 0.0),
        ("r2", None),
        ("r2", None),
    ]
