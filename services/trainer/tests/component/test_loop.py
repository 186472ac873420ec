"""The training loop with the real ``torch`` backend and checkpoint store, against an in-memory
fake orchestrator/store/inference (``FakeWorld`` in conftest)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from openforge_core.run_config import RunConfig
from openforge_trainer.adapters.storage import FileCheckpointStore
from openforge_trainer.backends.base import create_backend
from openforge_trainer.domain.loop import LoopDeps, TrainingLoop


class RecordingSink:
    """Keeps every step's metrics."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.two_steps = asyncio.Event()

    async def write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        self.steps.append((step, dict(metrics)))
        if len(self.steps) >= 2:
            self.two_steps.set()

    async def close(self) -> None:
        return None


def make_loop(world: Any, root: Path, config: RunConfig, sink: RecordingSink, run_id: str = "run-1") -> TrainingLoop:
    deps = LoopDeps(
        backend_factory=lambda cfg: create_backend(cfg.backend, cfg),
        submitter=world,
        groups=world,
        weights=world,
        checkpoints=FileCheckpointStore(root),
        sinks=[sink],
    )
    return TrainingLoop(run_id, config, deps)


def config(model_dir: Path, **over: Any) -> RunConfig:
    base: dict[str, Any] = {
        "model": str(model_dir),
        "task_split": "toy",
        "tasks": ["a", "b", "c", "d"],
        "group_size": 8,
        "groups_per_step": 4,
        "learning_rate": 1e-2,
        "max_staleness": 0,
        "steps": 8,
        "pass_k": [1, 2],
        "pass_threshold": 0.75,
    }
    base.update(over)
    return RunConfig.model_validate(base)


async def test_grpo_raises_the_mean_reward_over_steps(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    """On-policy GRPO (PPO-clip, TIS) on a task the micro model can learn (emit tokens of a
    fixed set): the mean reward of the last two steps exceeds that of the first two."""
    world = fake_world_factory(micro_model_dir, sample=True, seed=0)
    sink = RecordingSink()
    loop = make_loop(world, tmp_path, config(micro_model_dir), sink)
    assert await loop.run(asyncio.Event())
    rewards = [m["reward/mean"] for _, m in sink.steps]
    assert [s for s, _ in sink.steps] == list(range(1, 9))
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    # Every step pushed its weights to inference, in version order.
    assert [v for _, v in world.weight_updates] == list(range(1, 9))
    last = sink.steps[-1][1]
    for name in (
        "entropy",
        "kl/behaviour",
        "actor/pg_clipfrac",
        "is/mean",
        "staleness/max",
        "samples/dropped",
        "pass@1/mean",
        "pass^2/mean",
        "pass@2/a",
        "response/length_mean",
        "samples/per_rollout",
        "calls/per_sample",
        "tokens/per_s",
        "time/wait_rollouts_s",
        "time/train_s",
        "time/weight_sync_s",
        "reward/std",
    ):
        assert name in last, name


async def test_stale_samples_are_dropped_counted_and_replaced(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    """With max_staleness 0 and rollouts requested one step ahead... of the policy: groups
    sampled at an older version are dropped, counted, and replaced by new requests."""
    world = fake_world_factory(sample=False)
    sink = RecordingSink()
    cfg = config(micro_model_dir, groups_per_step=1, group_size=2, steps=3, max_staleness=0)
    loop = make_loop(world, tmp_path, cfg, sink)
    # Complete two groups at version 0 before the run starts: the first trains step 1, the
    # second is stale by then (version 1) and must be dropped.
    from openforge_trainer.domain.ports import RolloutRequest

    for key in ("step/1", "step/2"):
        await world.submit(RolloutRequest(f"run-1/{key}", "run-1", "toy", ("a",), 2, "command", "policy", 0))
    assert await loop.run(asyncio.Event())
    dropped = [m["samples/dropped"] for _, m in sink.steps]
    assert dropped == [0.0, 2.0, 0.0]
    assert sink.steps[-1][1]["samples/dropped_total"] == 2.0
    assert any(rid.startswith("run-1/refill/") for rid, _ in world.submissions)
    assert all(m["staleness/max"] == 0.0 for _, m in sink.steps)


async def test_stop_while_waiting_then_resume_repeats_and_skips_no_step(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    """A run stopped while waiting for rollouts (its step uncommitted) and started again from
    its checkpoint trains steps 1..N exactly once, each on the next group in completion order."""
    world = fake_world_factory(sample=False)
    cfg = config(micro_model_dir, groups_per_step=1, group_size=2, steps=4, max_staleness=1)
    first = RecordingSink()
    stop = asyncio.Event()
    world.limit = 2  # the store streams two groups; step 3 waits for its group
    loop = make_loop(world, tmp_path, cfg, first)
    task = asyncio.create_task(loop.run(stop))
    await asyncio.wait_for(first.two_steps.wait(), timeout=120)
    await asyncio.sleep(0.2)
    stop.set()
    assert await task is False
    latest = FileCheckpointStore(tmp_path).latest("run-1")
    assert latest is not None and latest.state.step == 2
    done = latest.state.step

    second = RecordingSink()
    await world.release()
    assert await make_loop(world, tmp_path, cfg, second).run(asyncio.Event())
    steps = [s for s, _ in first.steps[:done]] + [s for s, _ in second.steps]
    assert steps == [1, 2, 3, 4]
    # Group n (reward n/100) trained step n: no group repeated or skipped across the restart.
    rewards = [m["reward/mean"] for _, m in first.steps[:done] + second.steps]
    assert rewards == pytest.approx([0.01, 0.02, 0.03, 0.04])
    # The restart re-read the store from the checkpoint's cursor and re-pushed its weights.
    assert world.watch_cursors[-1] == latest.state.cursor
    assert [v for _, v in world.weight_updates] == [1, 2, 3, 4]


async def test_sft_trains_only_on_rollouts_that_pass(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    """Rejection-sampling fine-tuning from a recorded run: only samples with reward >= the bar
    are trained on, and the NLL of their sampled tokens falls."""
    world = fake_world_factory(sample=False)
    from openforge_trainer.domain.ports import RolloutRequest

    for i in range(6):  # groups 1..6 earn 0.01..0.06
        await world.submit(RolloutRequest(f"rec/{i}", "recorded", "toy", ("a",), 2, "command", "policy", 0))
    sink = RecordingSink()
    cfg = config(
        micro_model_dir,
        mode="sft",
        sft={"min_reward": 0.04, "source_run_id": "recorded"},
        groups_per_step=1,
        steps=3,
        learning_rate=1e-2,
    )
    assert await make_loop(world, tmp_path, cfg, sink).run(asyncio.Event())
    assert [m["reward/mean"] for _, m in sink.steps] == pytest.approx([0.04, 0.05, 0.06])
    losses = [m["loss/sft"] for _, m in sink.steps]
    assert losses[-1] < losses[0]
    assert world.submissions[-1][0] == "rec/5"  # SFT from a recorded run requests no rollouts


async def test_run_fails_instead_of_refilling_forever_when_rollouts_produce_no_samples(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    """Every rollout ends before its first model call (e.g. the harness crashes at start): the
    groups complete with no sample. The loop must not ask for replacements forever; it fails the
    run with FAILED_PRECONDITION after ``MAX_EMPTY_GROUPS_IN_A_ROW`` such groups."""
    from openforge_core.errors import FailedPrecondition
    from openforge_trainer.domain.loop import MAX_EMPTY_GROUPS_IN_A_ROW
    from openforge_trainer.domain.samples import CompletedGroup

    world = fake_world_factory(sample=False)

    async def no_samples(run_id: str, gid: str, task: str, n: int, seq: int) -> CompletedGroup:
        return CompletedGroup(group_id=gid, task_id=task, rewards={}, samples=(), cursor=f"c{seq}")

    world._run_group = no_samples
    sink = RecordingSink()
    loop = make_loop(world, tmp_path, config(micro_model_dir, groups_per_step=1, group_size=2, steps=2), sink)
    with pytest.raises(FailedPrecondition) as err:
        await asyncio.wait_for(loop.run(asyncio.Event()), 120)
    assert err.value.reason == "ROLLOUTS_PRODUCE_NO_SAMPLES"
    assert sink.steps == []
    assert len(world.requests) <= MAX_EMPTY_GROUPS_IN_A_ROW + 2  # the step's request, its refills, no more
