"""A sandbox's memory limit: the task's, raised to what its harness needs to run at all."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from openforge_orchestrator.domain.sandbox import ExecutionPlan
from openforge_orchestrator.domain.tasks import Resources, load_task
from openforge_orchestrator.harnesses import adapter
from openforge_orchestrator.harnesses.base import LaunchContext
from openforge_orchestrator.harnesses.openclaw import MIN_MEMORY_MB

DEMO_TASK = Path(__file__).resolve().parents[4] / "examples" / "demo" / "tasks" / "test" / "first-4"
CTX = LaunchContext(
    instruction="x", base_url="http://127.0.0.1:9", api_key="k", model="m", workdir="/app", timeout_s=60, command=()
)


def _plan(harness: str, memory_mb: int | None) -> ExecutionPlan:
    task = load_task(DEMO_TASK, "test")
    task = replace(task, resources=replace(task.resources, memory_mb=memory_mb))
    launch = adapter(harness).launch(CTX, None)
    return ExecutionPlan(rollout_id="r", task=task, launch=launch, agent_timeout_s=60, verifier_timeout_s=30)


def test_openclaw_gets_its_floor_and_a_bigger_task_keeps_its_own() -> None:
    assert load_task(DEMO_TASK, "test").resources.memory_mb == 512  # the demo's tasks ask for 512 MiB
    assert _plan("openclaw", 512).memory_mb(1024) == MIN_MEMORY_MB == 2048
    assert _plan("openclaw", 4096).memory_mb(1024) == 4096
    assert _plan("openclaw", None).memory_mb(8192) == 8192  # the backend's default when the task names none


def test_other_harnesses_and_the_oracle_run_under_the_tasks_limit() -> None:
    assert _plan("mini-swe-agent", 512).memory_mb(1024) == 512
    assert _plan("codex", None).memory_mb(1024) == 1024
    oracle = replace(_plan("codex", 512), launch=None)
    assert oracle.memory_mb(1024) == 512
    assert Resources().memory_mb is None
