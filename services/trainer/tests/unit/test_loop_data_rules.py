"""The loop's training-data rules, with a recording backend (no torch) and a scripted
orchestrator/store whose groups go through ``group_from_proto`` as the store's messages do:

* rollouts without a verifier reward never reach the backend, and are counted by reason;
* zero-variance groups are counted and, with dynamic sampling (DAPO, arXiv:2503.14476), set
  aside and replaced by refills, at most ``max_zero_variance_refills`` per step;
* a run is reproducible: each submission carries a seed derived from the run seed and its key,
  and a step's batch is in request order whatever order its groups and samples arrive in.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from loop_fakes import MemoryCheckpoints, RecordingBackend, completed_after

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core.run_config import RunConfig
from openforge_core.seeds import EVAL_SEED_KEY, request_seed
from openforge_trainer.adapters.clients import group_from_proto
from openforge_trainer.domain.loop import LoopDeps, TrainingLoop
from openforge_trainer.domain.ports import RolloutRequest
from openforge_trainer.domain.samples import CompletedGroup, TrainBatch

FAILED = common_pb2.ROLLOUT_STATUS_FAILED
CANCELLED = common_pb2.ROLLOUT_STATUS_CANCELLED
TIMED_OUT = common_pb2.ROLLOUT_STATUS_TIMED_OUT


@dataclass(frozen=True)
class R:
    """One scripted rollout.

    Attributes:
        reward: Verifier reward (None = unset).
        status: Terminal status.
        failure_reason: Why it failed.
        samples: Samples the store assembled for it.
        roles: The ``CallRole`` of each sample (empty: none recorded); sample k then merged k + 1
            calls.
    """

    reward: float | None = None
    status: int = common_pb2.ROLLOUT_STATUS_SUCCEEDED
    failure_reason: str = ""
    samples: int = 1
    roles: tuple[int, ...] = ()


def ok(*rewards: float) -> list[R]:
    """A group of succeeded rollouts with these rewards, one sample each."""
    return [R(reward=r) for r in rewards]


class ScriptedWorld:
    """Orchestrator + store + inference in one: the n-th group requested (any request) is made of
    ``script[n]`` (then ``default``) and completes at once.

    Args:
        script: Rollouts of the first groups, in request order.
        default: Rollouts of every later group.
    """

    def __init__(self, script: list[list[R]], default: list[R], *, reverse: bool = False) -> None:
        self.reverse = reverse  # each request's groups complete last first, their samples too
        self.script = list(script)
        self.default = default
        self.requests: list[RolloutRequest] = []
        self.completed: list[CompletedGroup] = []
        self.cancelled: list[tuple[str, str]] = []  # (group id, reason) of CancelGroup calls
        self.changed = asyncio.Condition()
        self.version = 0

    async def submit(self, request: RolloutRequest) -> list[str]:
        self.requests.append(request)
        ids = []
        groups: list[CompletedGroup] = []
        for task in request.task_ids:
            seq = len(self.completed) + len(groups) + 1
            spec = self.script.pop(0) if self.script else self.default
            msg = self.message(f"g{seq}", task, spec, seq)
            if self.reverse:
                samples = list(msg.samples)[::-1]
                del msg.samples[:]
                msg.samples.extend(samples)
            groups.append(group_from_proto(msg))
            ids.append(groups[-1].group_id)
        self.completed.extend(groups[::-1] if self.reverse else groups)
        async with self.changed:
            self.changed.notify_all()
        return ids

    async def cancel_group(self, group_id: str, reason: str) -> None:
        self.cancelled.append((group_id, reason))

    def message(self, gid: str, task: str, spec: list[R], seq: int) -> trajectory_pb2.WatchCompletedGroupsResponse:
        """The store's message of one group (``Sample.reward`` left unset without a reward)."""
        msg = trajectory_pb2.WatchCompletedGroupsResponse(group_id=gid, task_id=task, cursor=f"c{seq:04d}")
        for i, r in enumerate(spec):
            rid = f"{gid}-r{i}"
            rollout = msg.rollouts.add(
                rollout_id=rid,
                task_id=task,
                group_id=gid,
                group_index=i,
                status=r.status,
                failure_reason=r.failure_reason,
            )
            if r.reward is not None:
                rollout.reward = r.reward
            for k in range(r.samples):
                msg.samples.add(
                    sample_id=f"{rid}/{k}",
                    rollout_id=rid,
                    index=k,
                    prompt_token_ids=[1, 2, 3 + k],
                    response_token_ids=[10 + k, 11, 9],
                    loss_mask=[1, 1, 0],
                    rollout_logprobs=[-1.0, -0.5, 0.0],
                    policy_versions=[self.version, self.version, 0],
                    reward=r.reward or 0.0,
                    role=r.roles[k] if r.roles else 0,
                    call_ids=[f"{rid}-c{k}-{j}" for j in range(k + 1)] if r.roles else [],
                )
        return msg

    def watch(self, run_id: str, cursor: str) -> AsyncIterator[CompletedGroup]:
        return completed_after(self.completed, self.changed, cursor)

    async def update_weights(self, request_id: str, uri: str, version: int, checksum: str) -> int:
        self.version = version
        return version

    async def serving_version(self) -> int:
        return self.version

    @property
    def refilled_groups(self) -> int:
        """Groups requested by refills (beyond the steps' own requests)."""
        return sum(len(r.task_ids) for r in self.requests if "/refill/" in r.request_id)


async def run_loop(world: ScriptedWorld, **over: Any) -> tuple[list[TrainBatch], list[dict[str, float]]]:
    """Runs the loop to its step count; returns the batches trained and each step's metrics."""
    base: dict[str, Any] = {"model": "m", "tasks": ["t"], "group_size": 2, "max_staleness": 4, "steps": 1}
    cfg = RunConfig.model_validate({**base, **over})
    backend = RecordingBackend()
    metrics: list[dict[str, float]] = []
    deps = LoopDeps(
        backend_factory=lambda _cfg: backend,
        submitter=world,
        groups=world,
        weights=world,
        checkpoints=MemoryCheckpoints(),
    )
    loop = TrainingLoop("run", cfg, deps, on_metrics=lambda step, m, t: metrics.append(m))
    assert await asyncio.wait_for(loop.run(asyncio.Event()), timeout=30)
    return backend.batches, metrics


def trained_groups(batch: TrainBatch) -> list[str]:
    """Group ids of a batch, in order."""
    return list(dict.fromkeys(s.group_id for s in batch.samples))


# ---- rollouts without a reward ----


async def test_rollouts_without_reward_never_reach_the_backend_and_are_counted_by_reason() -> None:
    group = [
        R(reward=1.0),
        R(reward=0.0, samples=2),  # a verifier reward of 0 is a reward: trained
        R(status=FAILED, failure_reason="verifier: exited 2", samples=2),
        R(status=CANCELLED),
        R(status=FAILED, failure_reason="bypass: no call reached the proxy", samples=0),
        R(status=TIMED_OUT, failure_reason="harness timed out after 60s; verifier: timeout"),
        R(status=TIMED_OUT, reward=0.5, failure_reason="harness timed out after 60s"),  # scored: trained
    ]
    world = ScriptedWorld([group], default=ok(1.0, 0.0))
    [batch], [metrics] = await run_loop(world, group_size=7)
    assert {s.sample_id: s.reward for s in batch.samples} == {
        "g1-r0/0": 1.0,
        "g1-r1/0": 0.0,
        "g1-r1/1": 0.0,
        "g1-r6/0": 0.5,
    }
    assert metrics["rollouts/trained"] == 3.0
    assert metrics["rollouts/excluded"] == 4.0
    by_reason = {
        k.removeprefix("rollouts/excluded/"): v for k, v in metrics.items() if k.startswith("rollouts/excluded/")
    }
    assert by_reason == {"failed": 1.0, "cancelled": 1.0, "bypass": 1.0, "timed_out": 1.0, "no_reward": 0.0}
    # Rewards average the three scored rollouts only (an excluded one is not a 0).
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert metrics["samples/trained"] == 4.0


async def test_excluded_rollouts_are_counted_once_over_every_group_a_step_consumes() -> None:
    """A group whose only sampled tokens belong to excluded rollouts is consumed without being
    trained on; its excluded rollouts still count, in the step that consumed it."""
    all_failed = [R(status=FAILED, failure_reason="infrastructure: sandbox"), R(status=CANCELLED)]
    world = ScriptedWorld([all_failed], default=[R(reward=1.0), R(status=FAILED, failure_reason="x")])
    batches, metrics = await run_loop(world, steps=2)
    assert [trained_groups(b) for b in batches] == [["g2"], ["g3"]]
    assert [m["rollouts/excluded"] for m in metrics] == [3.0, 1.0]
    assert [m["rollouts/excluded/failed"] for m in metrics] == [2.0, 1.0]
    assert [m["rollouts/excluded/cancelled"] for m in metrics] == [1.0, 0.0]
    assert [m["rollouts/trained"] for m in metrics] == [1.0, 1.0]


# ---- zero-variance groups ----


async def test_zero_variance_fraction_counts_groups_whose_trained_rollouts_share_a_reward() -> None:
    script = [
        ok(1.0, 1.0),  # zero variance
        ok(0.0, 0.0),  # zero variance
        ok(1.0, 0.0),
        ok(1.0),  # one rollout: never zero variance (veRL's DAPO filter keeps it)
        [R(reward=1.0), R(reward=1.0), R(status=FAILED, failure_reason="x")],  # zero variance among trained
    ]
    world = ScriptedWorld(script, default=ok(1.0, 0.0))
    [batch], [metrics] = await run_loop(world, groups_per_step=5, tasks=["a", "b", "c", "d", "e"])
    assert trained_groups(batch) == ["g1", "g2", "g3", "g4", "g5"]
    assert metrics["groups/zero_variance_fraction"] == pytest.approx(3 / 5)
    assert metrics["groups/zero_variance_dropped"] == 0.0
    assert world.refilled_groups == 0


async def test_dropping_zero_variance_groups_requests_one_group_in_place_of_each() -> None:
    world = ScriptedWorld([ok(1.0, 1.0), ok(1.0, 0.0), ok(0.0, 0.0), ok(0.5, 0.0)], default=ok(1.0, 0.0))
    [batch], [metrics] = await run_loop(world, groups_per_step=2, tasks=["a", "b"], drop_zero_variance_groups=True)
    assert trained_groups(batch) == ["g2", "g4"]
    assert metrics["groups/zero_variance_dropped"] == 2.0
    assert metrics["groups/zero_variance_fraction"] == pytest.approx(2 / 4)
    assert world.refilled_groups == 2
    assert metrics["reward/mean"] == pytest.approx(1.5 / 4)  # the trained groups' rollouts


async def test_zero_variance_refills_are_bounded_per_step() -> None:
    """After ``max_zero_variance_refills`` groups were set aside, the next zero-variance group
    ends the collection and the step trains on the groups it has (fewer than groups_per_step)."""
    script = [ok(1.0, 1.0), ok(0.0, 0.0), ok(1.0, 0.0), ok(1.0, 1.0)]
    world = ScriptedWorld(script, default=ok(0.0, 0.0))
    [batch], [metrics] = await run_loop(
        world, groups_per_step=2, tasks=["a", "b"], drop_zero_variance_groups=True, max_zero_variance_refills=2
    )
    assert trained_groups(batch) == ["g3"]
    assert world.refilled_groups == 2
    assert metrics["groups/zero_variance_dropped"] == 3.0
    assert metrics["groups/zero_variance_fraction"] == pytest.approx(3 / 4)
    assert metrics["groups/trained"] == 1.0


@pytest.mark.parametrize(("refills", "want"), [(1, ["g1", "g2"]), (0, ["g1"])])
async def test_with_only_zero_variance_groups_the_step_trains_on_them(refills: int, want: list[str]) -> None:
    world = ScriptedWorld([], default=ok(1.0, 1.0))
    [batch], [metrics] = await run_loop(
        world, groups_per_step=2, tasks=["a", "b"], drop_zero_variance_groups=True, max_zero_variance_refills=refills
    )
    assert trained_groups(batch) == want
    assert metrics["groups/zero_variance_dropped"] == 0.0
    assert metrics["groups/zero_variance_fraction"] == 1.0
    assert world.refilled_groups == refills


async def test_groups_requested_but_never_trained_on_are_cancelled_once_the_run_completes() -> None:
    """The refill asked for g3 in place of g1, then g2 ended the step: no step will take g3."""
    from openforge_trainer.domain.loop import UNNEEDED_REASON

    world = ScriptedWorld([], default=ok(1.0, 1.0))
    [batch], _ = await run_loop(
        world, groups_per_step=2, tasks=["a", "b"], drop_zero_variance_groups=True, max_zero_variance_refills=1
    )
    assert trained_groups(batch) == ["g1", "g2"] and world.refilled_groups == 1
    assert world.cancelled == [("g3", UNNEEDED_REASON)]


async def test_a_run_that_consumed_every_group_it_requested_cancels_nothing() -> None:
    world = ScriptedWorld([], default=ok(1.0, 0.0))
    await run_loop(world, groups_per_step=2, tasks=["a", "b"], steps=2, max_staleness=1)
    assert world.cancelled == []


# ---- the shuffled-rewards negative control ----


async def test_shuffle_rewards_permutes_rewards_within_each_group_and_keeps_true_metrics() -> None:
    script = [ok(1.0, 0.0, 0.5, 0.25), [R(reward=1.0, samples=2), R(reward=0.0)]]
    runs = []
    for seed in (0, 1, 2, 3):
        world = ScriptedWorld(script, default=ok(1.0, 0.0))
        [batch], [metrics] = await run_loop(
            world, groups_per_step=2, group_size=4, tasks=["a", "b"], shuffle_rewards=True, seed=seed
        )
        by_rollout = {s.rollout_id: s.reward for s in batch.samples}
        # Every sample of a rollout carries that rollout's (new) reward.
        assert all(s.reward == by_rollout[s.rollout_id] for s in batch.samples)
        # Within each group, the rewards are the same multiset, over the same rollouts.
        assert sorted(r for k, r in by_rollout.items() if k.startswith("g1-")) == [0.0, 0.25, 0.5, 1.0]
        assert sorted(r for k, r in by_rollout.items() if k.startswith("g2-")) == [0.0, 1.0]
        assert metrics["reward/mean"] == pytest.approx((1.75 + 1.0) / 6)  # the true rewards
        runs.append(by_rollout)
    truth = {"g1-r0": 1.0, "g1-r1": 0.0, "g1-r2": 0.5, "g1-r3": 0.25, "g2-r0": 1.0, "g2-r1": 0.0}
    assert any(run != truth for run in runs)  # some seed moves a reward
    world = ScriptedWorld(script, default=ok(1.0, 0.0))
    [batch], _ = await run_loop(world, groups_per_step=2, group_size=4, tasks=["a", "b"])
    assert {s.rollout_id: s.reward for s in batch.samples} == truth  # off: untouched


async def test_groups_whose_rollouts_all_lack_a_reward_stop_the_run_instead_of_refilling_forever() -> None:
    from openforge_core.errors import FailedPrecondition
    from openforge_trainer.domain.loop import MAX_EMPTY_GROUPS_IN_A_ROW

    unscored = [R(status=FAILED, failure_reason="verifier: test.sh exited 2", samples=2)] * 2
    world = ScriptedWorld([], default=unscored)
    with pytest.raises(FailedPrecondition) as err:
        await run_loop(world)
    assert err.value.reason == "ROLLOUTS_PRODUCE_NO_SAMPLES"
    assert "no rollout earns a verifier reward (excluded: failed)" in str(err.value)
    assert len(world.completed) == MAX_EMPTY_GROUPS_IN_A_ROW


# ---- call roles ----

_ROLES = (
    common_pb2.CALL_ROLE_MAIN,
    common_pb2.CALL_ROLE_SUB_AGENT,
    common_pb2.CALL_ROLE_COMPACTION,
    common_pb2.CALL_ROLE_SIDE,
)


async def test_side_calls_are_not_trained_by_default_and_roles_are_counted_per_rollout() -> None:
    world = ScriptedWorld([[R(reward=1.0, samples=4, roles=_ROLES), R(reward=0.0, samples=4, roles=_ROLES)]], [])
    [batch], [metrics] = await run_loop(world)
    assert sorted({s.role for s in batch.samples}) == ["compaction", "main", "sub_agent"]
    assert len(batch.samples) == 6
    assert metrics["samples/per_rollout/main"] == metrics["samples/per_rollout/sub_agent"] == 1.0
    assert metrics["samples/per_rollout/compaction"] == 1.0
    assert metrics["samples/per_rollout/side"] == 0.0 and metrics["samples/skipped_role/side"] == 2.0
    # sample k merged k + 1 calls: main 1, sub-agent 2, compaction 3
    assert [metrics[f"samples/merge_ratio/{r}"] for r in ("main", "sub_agent", "compaction")] == [1.0, 2.0, 3.0]
    # each rollout counts once in its group, however many samples it has
    assert metrics["rollouts/trained"] == 2.0


async def test_the_role_policy_is_the_run_config_s() -> None:
    world = ScriptedWorld([[R(reward=1.0, samples=4, roles=_ROLES), R(reward=0.0, samples=4, roles=_ROLES)]], [])
    [batch], [metrics] = await run_loop(world, roles={"compaction": "skip", "side": "train"})
    assert sorted({s.role for s in batch.samples}) == ["main", "side", "sub_agent"]
    assert metrics["samples/skipped_role/compaction"] == 2.0 and metrics["samples/skipped_role/side"] == 0.0


# ---- reproducible runs ----


async def test_each_submission_is_seeded_from_the_run_seed_and_its_key() -> None:
    world = ScriptedWorld([], default=ok(1.0, 0.0))
    await run_loop(world, steps=2, groups_per_step=1, seed=5, max_staleness=0)
    assert [r.request_id for r in world.requests] == ["run/step/1", "run/step/2"]
    assert [r.seed for r in world.requests] == [request_seed(5, "step/1"), request_seed(5, "step/2")]
    assert request_seed(5, "step/1") != request_seed(6, "step/1")
    world = ScriptedWorld([], default=ok(1.0, 0.0))
    await run_loop(world, steps=2, seed=5, seeded_sampling=False)
    assert [r.seed for r in world.requests] == [None, None]


async def test_every_evaluation_samples_with_the_same_seed() -> None:
    world = ScriptedWorld([], default=ok(1.0, 0.0))
    await run_loop(world, steps=2, eval_interval=1, eval_split="test", eval_tasks=["e"], seed=3, max_staleness=0)
    evals = [r for r in world.requests if "/eval/" in r.request_id]
    assert len(evals) >= 2 and len({r.request_id for r in evals}) == len(evals)
    assert {r.seed for r in evals} == {request_seed(3, EVAL_SEED_KEY)}


async def test_a_step_trains_its_groups_and_samples_in_request_order_whatever_order_they_complete_in() -> None:
    script = [[R(reward=1.0, samples=2), R(reward=0.0)], ok(0.0, 1.0), ok(0.5, 0.0)]
    batches = []
    for reverse in (False, True):
        world = ScriptedWorld(script, default=ok(1.0, 0.0), reverse=reverse)
        [batch], _ = await run_loop(world, groups_per_step=3, tasks=["a", "b", "c"], shuffle_rewards=True, seed=1)
        batches.append(batch)
    in_order, reversed_ = ([(s.sample_id, s.reward) for s in b.samples] for b in batches)
    assert in_order == reversed_
    assert [sid for sid, _ in in_order] == ["g1-r0/0", "g1-r0/1", "g1-r1/0", "g2-r0/0", "g2-r1/0", "g3-r0/0", "g3-r1/0"]
