"""A run that stalls because a service restarted goes on: lost groups are requested again, and
inference back on an older policy version gets the latest checkpoint again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from loop_fakes import MemoryCheckpoints, RecordingBackend, completed_after

from openforge_core.errors import Unavailable
from openforge_core.run_config import RunConfig
from openforge_core.seeds import request_seed
from openforge_trainer.domain.loop import LoopDeps, TrainingLoop
from openforge_trainer.domain.ports import RolloutRequest
from openforge_trainer.domain.samples import CompletedGroup, TrainSample


class RestartingWorld:
    """A fake orchestrator + store + inference whose orchestrator and inference can "restart".

    A group completes once inference serves its request's ``min_policy_version`` (as the
    orchestrator's rollouts wait for it) and the world is not ``frozen``; a restarted
    orchestrator forgets its requests and the groups it was running (they never complete); a
    restarted inference serves version 0.
    """

    def __init__(self) -> None:
        self.version = 0
        self.frozen = False
        self.requests: dict[str, list[str]] = {}
        self.running: dict[str, tuple[str, int]] = {}  # group id -> (task, min policy version)
        self.completed: list[CompletedGroup] = []
        self.submitted: list[str] = []
        self.updates: list[int] = []
        self.changed = asyncio.Condition()
        self.inference_down = False
        self.held: set[str] = set()  # groups that do not complete (still running)
        self.task_counts: list[tuple[str, int]] = []  # (request id, tasks asked for)
        self.seeds: list[int | None] = []  # each request's sampling seed
        self.run_of: dict[str, str] = {}  # group id -> run id
        self.cancelled: list[str] = []  # groups cancelled
        self._seq = 0

    async def submit(self, request: RolloutRequest) -> list[str]:
        self.submitted.append(request.request_id)
        self.task_counts.append((request.request_id, len(request.task_ids)))
        self.seeds.append(request.seed)
        if request.request_id in self.requests:
            return self.requests[request.request_id]
        ids = []
        for task in request.task_ids:
            self._seq += 1
            gid = f"g{self._seq}"
            self.running[gid] = (task, request.min_policy_version)
            self.run_of[gid] = request.run_id
            ids.append(gid)
        self.requests[request.request_id] = ids
        await self._advance()
        return ids

    async def cancel_group(self, group_id: str, reason: str) -> None:
        self.cancelled.append(group_id)

    async def _advance(self) -> None:
        if self.frozen:
            return
        for gid, (task, version) in list(self.running.items()):
            if self.version >= version and gid not in self.held:
                del self.running[gid]
                self.completed.append(_group(gid, task, len(self.completed) + 1, self.version))
        async with self.changed:
            self.changed.notify_all()

    async def unfreeze(self) -> None:
        self.frozen = False
        await self._advance()

    def restart_orchestrator(self) -> None:
        self.requests.clear()
        self.running.clear()

    async def watch(self, run_id: str, cursor: str) -> AsyncIterator[CompletedGroup]:
        async for group in completed_after(self.completed, self.changed, cursor):
            if self.run_of[group.group_id] == run_id:
                yield group

    async def serving_version(self) -> int:
        if self.inference_down:
            raise Unavailable("inference GetModelInfo failed: UNAVAILABLE")
        return self.version

    async def update_weights(self, request_id: str, uri: str, version: int, checksum: str) -> int:
        self.updates.append(version)
        self.version = version
        await self._advance()
        return version


def _group(gid: str, task: str, seq: int, version: int) -> CompletedGroup:
    samples = tuple(
        TrainSample(
            sample_id=f"{gid}-r{i}/0",
            rollout_id=f"{gid}-r{i}",
            group_id=gid,
            task_id=task,
            prompt_ids=(1, 2),
            response_ids=(10 + i, 11),
            loss_mask=(1, 1),
            behaviour_logprobs=(-1.0, -0.5),
            policy_versions=(version, version),
            reward=float(i),
        )
        for i in range(2)
    )
    return CompletedGroup(
        group_id=gid,
        task_id=task,
        rewards={s.rollout_id: s.reward for s in samples},
        samples=samples,
        cursor=f"c{seq:04d}",
    )


def _loop(world: RestartingWorld, checkpoints: MemoryCheckpoints, metrics: list[dict[str, float]], **over: Any) -> Any:
    cfg = RunConfig.model_validate(
        {"model": "m", "tasks": ["a", "b"], "group_size": 2, "groups_per_step": 2, "max_staleness": 0, **over}
    )
    deps = LoopDeps(
        backend_factory=lambda _cfg: RecordingBackend(),
        submitter=world,
        groups=world,
        weights=world,
        checkpoints=checkpoints,
        stall_check_s=0.05,
    )
    return TrainingLoop("run", cfg, deps, on_metrics=lambda step, m, t: metrics.append(m))


async def test_groups_an_orchestrator_lost_in_a_restart_are_requested_again() -> None:
    world = RestartingWorld()
    world.frozen = True  # step 1's groups are running when the orchestrator goes down
    metrics: list[dict[str, float]] = []
    loop = _loop(world, MemoryCheckpoints(), metrics, steps=2)
    run = asyncio.ensure_future(loop.run(asyncio.Event()))
    for _ in range(200):
        if world.running:
            break
        await asyncio.sleep(0.01)
    lost = sorted(world.running)
    world.restart_orchestrator()
    await world.unfreeze()
    assert await asyncio.wait_for(run, timeout=10)
    # the request was sent again under its key; the restarted orchestrator made new groups
    assert world.submitted.count("run/step/1") >= 2
    trained = [g.group_id for g in world.completed]
    assert lost == ["g1", "g2"] and not set(lost) & set(trained)
    assert [m["groups/resubmitted"] for m in metrics] == [2.0, 0.0]
    assert loop.state.step == 2 and loop.state.pending_groups == [] and loop.state.requests == {}


async def test_a_request_the_orchestrator_still_holds_is_not_replaced() -> None:
    """A stall with a live orchestrator (slow rollouts): the same request returns the same groups."""
    world = RestartingWorld()
    world.frozen = True
    metrics: list[dict[str, float]] = []
    loop = _loop(world, MemoryCheckpoints(), metrics, steps=1)
    run = asyncio.ensure_future(loop.run(asyncio.Event()))
    for _ in range(200):
        if world.submitted.count("run/step/1") >= 3:  # two stall checks
            break
        await asyncio.sleep(0.01)
    await world.unfreeze()
    assert await asyncio.wait_for(run, timeout=10)
    assert world.submitted.count("run/step/1") >= 3
    assert [g.group_id for g in world.completed] == ["g1", "g2"]
    assert metrics[0]["groups/resubmitted"] == 0.0


async def test_inference_restarted_on_an_older_version_gets_the_latest_checkpoint_again() -> None:
    world = RestartingWorld()
    checkpoints = MemoryCheckpoints()
    metrics: list[dict[str, float]] = []
    loop = _loop(world, checkpoints, metrics, steps=3)
    restarted: list[int] = []
    tasks: list[asyncio.Future[None]] = []

    def on_progress(step: int, version: int, uri: str) -> None:
        if step == 1 and not restarted:  # inference restarts on the initial model after step 1
            restarted.append(step)
            world.version = 0
            world.inference_down = True  # and is not reachable at the first check

            async def back() -> None:
                await asyncio.sleep(0.08)
                world.inference_down = False

            tasks.append(asyncio.ensure_future(back()))

    loop._on_progress = on_progress
    assert await asyncio.wait_for(loop.run(asyncio.Event()), timeout=10)
    # 1 after step 1; 1 again once inference is back on version 0 (step 2's rollouts wait for
    # version 1); then 2 and 3
    assert world.updates == [1, 1, 2, 3]
    assert loop.state.step == 3 and world.version == 3


async def test_a_lost_request_partly_consumed_is_asked_again_for_its_pending_groups_only() -> None:
    world = RestartingWorld()
    world.held = {"g2"}  # step 1's first group completes, its second is still running
    metrics: list[dict[str, float]] = []
    loop = _loop(world, MemoryCheckpoints(), metrics, steps=1)
    run = asyncio.ensure_future(loop.run(asyncio.Event()))
    for _ in range(300):  # a stall check against the live orchestrator: same groups, nothing replaced
        if world.submitted.count("run/step/1") >= 2:
            break
        await asyncio.sleep(0.01)
    assert world.task_counts[:2] == [("run/step/1", 2), ("run/step/1", 1)]
    world.restart_orchestrator()  # g2 is lost
    world.held = set()
    assert await asyncio.wait_for(run, timeout=10)
    assert [g.group_id for g in world.completed] == ["g1", "g3"]  # one group made anew, not two
    assert metrics[0]["groups/resubmitted"] == 1.0
    # asked again, the request carries another seed (an orchestrator that holds it answers with
    # its groups as they are), so groups made anew cannot repeat one already trained on
    assert world.seeds[0] == request_seed(0, "step/1")
    assert len(world.seeds) >= 3 and all(s is not None and s != world.seeds[0] for s in world.seeds[1:])


async def test_a_mid_run_evaluation_whose_group_an_orchestrator_lost_is_asked_again_for_its_task() -> None:
    world = RestartingWorld()
    world.held = {"g4"}  # the evaluation after step 1: task x's group completes, task y's runs
    metrics: list[dict[str, float]] = []
    loop = _loop(world, MemoryCheckpoints(), metrics, steps=1, eval_interval=1, eval_tasks=["x", "y"])
    run = asyncio.ensure_future(loop.run(asyncio.Event()))
    for _ in range(300):  # a stall check against the live orchestrator: same groups
        if world.submitted.count("run/eval/1") >= 2:
            break
        await asyncio.sleep(0.01)
    world.restart_orchestrator()  # g4 is lost
    world.held = set()
    assert await asyncio.wait_for(run, timeout=10)
    evals = [(rid, n) for rid, n in world.task_counts if rid == "run/eval/1"]
    assert evals[0] == ("run/eval/1", 2) and set(evals[1:]) == {("run/eval/1", 1)}
    made = [(g.group_id, g.task_id) for g in world.completed if world.run_of[g.group_id] != "run"]
    assert made == [("g3", "x"), ("g5", "y")]  # y made anew, x not run twice
    assert metrics[0]["eval/reward/mean"] == 0.5  # both tasks' groups (rewards 0 and 1 each)


async def test_a_run_stopped_early_keeps_its_pending_groups_for_its_resume() -> None:
    world = RestartingWorld()
    world.frozen = True  # step 1's groups are still running
    loop = _loop(world, MemoryCheckpoints(), [], steps=2)
    stop = asyncio.Event()
    run = asyncio.ensure_future(loop.run(stop))
    for _ in range(200):
        if world.running:
            break
        await asyncio.sleep(0.01)
    stop.set()
    assert await asyncio.wait_for(run, timeout=5) is False
    assert world.running and world.cancelled == []
