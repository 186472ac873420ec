"""The demo's ``lines`` task family (``examples/demo/tasks``) in real sandboxes: every oracle
earns 1.0, an ``answer.txt`` with the wrong content 0.2, no ``answer.txt`` 0; and the checked-in
folders are exactly what ``openforge tasks lines`` generates."""

from __future__ import annotations

import asyncio
import filecmp
import shutil
from pathlib import Path

import pytest

from openforge_cli.task_family import KINDS, generate, instances, split
from openforge_orchestrator.backends.local import LocalBackend
from openforge_orchestrator.domain.sandbox import ExecutionPlan, HarnessLaunch
from openforge_orchestrator.domain.tasks import Task, TaskCatalog
from openforge_orchestrator.settings import LocalSandboxSettings

ROOT = Path(__file__).resolve().parents[4]
TASKS = ROOT / "examples" / "demo" / "tasks"
CATALOG = TaskCatalog(TASKS)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_the_checked_in_tasks_are_the_generated_ones(tmp_path: Path) -> None:
    ids = generate(tmp_path / "tasks")
    assert _same_tree(tmp_path / "tasks", TASKS)
    assert sorted(ids["train"]) == CATALOG.ids("train") and sorted(ids["test"]) == CATALOG.ids("test")


def test_the_split_is_disjoint_and_both_sides_hold_every_kind() -> None:
    for seed in range(5):
        items = instances(seed=seed)
        sets = split(items, seed)
        train, test = sets["train"], sets["test"]
        assert not set(train) & set(test) and len(train) + len(test) == len(items)
        assert {i.kind for i in test} == set(KINDS) == {i.kind for i in train}
        assert len({i.answer for i in items if i.kind == "sort"}) > 1  # answers differ by instance
        checks = [i for i in items if i.kind == "check"]
        assert len({i.instruction for i in checks}) == len(checks)  # the oracle finds each


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(
        LocalSandboxSettings(root=str(tmp_path / "sb"), cache=str(tmp_path / "cache"), artifacts=""),
        "127.0.0.1:9",
    )


def _plan(task: Task, launch: HarnessLaunch | None, name: str) -> ExecutionPlan:
    return ExecutionPlan(
        rollout_id=f"ro-{task.task_id}-{name}",
        task=task,
        launch=launch,
        agent_timeout_s=30,
        verifier_timeout_s=30,
        with_proxy=False,
        run_verifier=True,
    )


async def test_rewards_are_gated_partial_credit_in_real_sandboxes(backend: LocalBackend) -> None:
    sem = asyncio.Semaphore(2)
    keys = [(s, t) for s in CATALOG.sets() for t in CATALOG.ids(s)]

    async def run(task: Task, name: str, script: str | None) -> tuple[str, str, float | None]:
        launch = None if script is None else HarnessLaunch(name="command", argv=("bash", "-c", script))
        async with sem:
            result = await backend.execute(_plan(task, launch, name))
        return task.task_id, name, result.reward.value if result.reward else None

    jobs = []
    for s, t in keys:
        task = CATALOG.get(s, t)
        jobs += [
            run(task, "oracle", None),
            run(task, "wrong", "echo nothing-like-it > answer.txt"),
            run(task, "nothing", "true"),
        ]
    expected = {"oracle": 1.0, "wrong": 0.2, "nothing": 0.0}
    for task_id, name, reward in await asyncio.gather(*jobs):
        assert reward == expected[name], (task_id, name, reward)
