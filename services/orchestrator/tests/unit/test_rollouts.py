"""Rollout registry: groups, idempotency, validation, cancel, watch, and the facts it reports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openforge_core.errors import InvalidArgument, NotFound
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry, RolloutStatus, TaskRef


class Recorder:
    def __init__(self) -> None:
        self.submitted: list[tuple[str, list[Rollout]]] = []
        self.finished: list[Rollout] = []
        self.started: list[Rollout] = []

    async def submitted_(self, request_id: str, rollouts: list[Rollout]) -> None:
        self.submitted.append((request_id, rollouts))

    async def finished_(self, rollout: Rollout) -> None:
        self.finished.append(rollout)

    async def started_(self, rollout: Rollout) -> None:
        self.started.append(rollout)


class Events:
    def __init__(self, rec: Recorder) -> None:
        self.submitted = rec.submitted_
        self.finished = rec.finished_
        self.started = rec.started_


async def _submit(reg: RolloutRegistry, request_id: str = "q1", **kw: Any) -> list[Rollout]:
    args: dict[str, object] = {
        "request_id": request_id,
        "run_id": "run",
        "tasks": [TaskRef("t1", "train"), TaskRef("t2", "train")],
        "group_size": 3,
        "harness": "mini-swe-agent",
        "model_name": "tiny",
        "min_policy_version": 0,
        "timeout_s": 0.0,
    }
    args.update(kw)
    return await reg.submit(**args)  # type: ignore[arg-type]


async def test_one_group_per_task_and_idempotent_retry() -> None:
    rec = Recorder()
    reg = RolloutRegistry(Events(rec))
    first = await _submit(reg)
    again = await _submit(reg)
    assert [r.rollout_id for r in first] == [r.rollout_id for r in again]
    assert len(first) == 6
    groups = {r.group_id for r in first}
    assert len(groups) == 2
    assert [(r.task_id, r.group_index) for r in first] == [(t, i) for t in ("t1", "t2") for i in range(3)]
    assert all(r.status is RolloutStatus.PENDING for r in first)
    assert len(rec.submitted) == 1 and rec.submitted[0][0] == "q1"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"tasks": []}, "tasks"),
        ({"tasks": [TaskRef("", "x")]}, "tasks[0].task_id"),
        ({"group_size": 0}, "group_size"),
        ({"harness": "nope"}, "harness"),
        ({"timeout_s": -1.0}, "timeout"),
    ],
)
async def test_invalid_requests_name_the_field(override: dict[str, Any], field: str) -> None:
    reg = RolloutRegistry(Events(Recorder()))
    with pytest.raises(InvalidArgument) as info:
        await _submit(reg, **override)
    assert info.value.violations[0].field == field


async def test_cancel_reports_once_and_watch_sees_changes() -> None:
    rec = Recorder()
    reg = RolloutRegistry(Events(rec))
    rollouts = await _submit(reg, group_size=1, tasks=[TaskRef("t1", "s")])
    seen: list[Rollout] = []

    async def watch() -> None:
        async for r in reg.watch(run_id="run"):
            seen.append(r)
            if r.status is RolloutStatus.CANCELLED:
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0)
    cancelled = await reg.cancel(rollouts[0].rollout_id, "user asked")
    await asyncio.wait_for(task, 2)
    assert cancelled.status is RolloutStatus.CANCELLED and cancelled.failure_reason == "user asked"
    assert (await reg.cancel(rollouts[0].rollout_id, "again")).failure_reason == "user asked"
    assert [r.status for r in seen] == [RolloutStatus.PENDING, RolloutStatus.CANCELLED]
    assert len(rec.finished) == 1
    with pytest.raises(NotFound):
        reg.get("nope")
