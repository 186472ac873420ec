"""Training runs known to this trainer, their lifecycle and their metrics history."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from openforge_core.errors import FailedPrecondition, InvalidArgument, NotFound
from openforge_core.run_config import RunConfig
from openforge_trainer.domain.config import parse_run_config
from openforge_trainer.domain.loop import LoopDeps, TrainingLoop

log = structlog.get_logger(__name__)


class RunState(enum.Enum):
    """Lifecycle of a run (mirrors ``openforge.trainer.v1.RunState``)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class Run:
    """A training run.

    Attributes:
        run_id: Run id.
        config: The validated run config.
        state: Lifecycle state.
        step: Last completed step.
        policy_version: Policy version serving.
        checkpoint_uri: Last checkpoint.
        create_time: Unix seconds.
        error: Why it failed.
    """

    run_id: str
    config: dict[str, Any] = field(default_factory=dict)
    state: RunState = RunState.PENDING
    step: int = 0
    policy_version: int = 0
    checkpoint_uri: str = ""
    create_time: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class StepMetrics:
    """Metrics of one step.

    Attributes:
        step: The step.
        metrics: Name → value.
        time_s: Unix seconds when the step finished.
    """

    step: int
    metrics: dict[str, float]
    time_s: float


class RunRegistry:
    """Runs by id."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def get(self, run_id: str) -> Run:
        """One run.

        Raises:
            NotFound: Unknown run.
        """
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id}) from None

    def find(self, run_id: str) -> Run | None:
        """The run, or None."""
        return self._runs.get(run_id)

    def put(self, run: Run) -> None:
        """Adds or replaces a run."""
        self._runs[run.run_id] = run

    def all(self) -> list[Run]:
        """Every run."""
        return list(self._runs.values())


class RunJournal(Protocol):
    """Durable record of runs (config, state) and their step metrics."""

    def save_run(self, run: Run) -> None:
        """Writes the run record."""

    def load_runs(self) -> list[Run]:
        """Every recorded run."""

    def append_metrics(self, run_id: str, entry: StepMetrics) -> None:
        """Adds one step's metrics."""

    def read_metrics(self, run_id: str, up_to_step: int) -> list[StepMetrics]:
        """Recorded metrics of steps <= ``up_to_step`` (later ones belong to no checkpoint)."""


class RunManager:
    """Starts, stops and watches runs; one run trains at a time.

    Args:
        deps: The loop's collaborators.
        journal: Durable run records and metrics.
        load_config_file: Reads a config file into a mapping (``config_path`` of StartRun).
    """

    def __init__(
        self,
        deps: LoopDeps,
        journal: RunJournal,
        load_config_file: Callable[[str], dict[str, Any]],
    ) -> None:
        self.runs = RunRegistry()
        self._deps = deps
        self._journal = journal
        self._load_config_file = load_config_file
        self._requests: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._metrics: dict[str, list[StepMetrics]] = {}
        self._changed: dict[str, asyncio.Condition] = {}

    # ---- lifecycle ----

    def restore(self) -> list[str]:
        """Loads recorded runs; returns the ids of those that were running (to resume)."""
        resume = []
        for run in self._journal.load_runs():
            latest = self._deps.checkpoints.latest(run.run_id)
            if latest is not None:
                run = dataclasses.replace(
                    run,
                    step=latest.state.step,
                    policy_version=latest.state.policy_version,
                    checkpoint_uri=str(latest.path),
                )
            self.runs.put(run)
            self._metrics[run.run_id] = self._journal.read_metrics(run.run_id, run.step)
            if run.state in (RunState.RUNNING, RunState.PENDING):
                resume.append(run.run_id)
        return resume

    def start(self, *, request_id: str, run_id: str, config: dict[str, Any], config_path: str) -> Run:
        """Starts a new run, or resumes an existing one from its last checkpoint.

        Idempotent per ``request_id``. For an existing run the recorded config is used unless a
        config is given (which must then validate).

        Raises:
            InvalidArgument: The config does not validate, or there is none for a new run.
            FailedPrecondition: Another run is training.
        """
        if request_id and request_id in self._requests:
            return self.runs.get(self._requests[request_id])
        active = [rid for rid, task in self._tasks.items() if not task.done()]
        if run_id and run_id in active:
            return self.runs.get(run_id)
        if active:
            raise FailedPrecondition(f"run {active[0]!r} is training; stop it first", metadata={"run_id": active[0]})
        run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
        existing = self.runs.find(run_id)
        merged: dict[str, Any] = {}
        if config_path:
            merged.update(self._load_config_file(config_path))
        merged.update(config)
        if not merged:
            if existing is None:
                raise InvalidArgument.field("config", "a new run needs a config (config or config_path)")
            merged = existing.config
        parsed = parse_run_config(merged)
        run = Run(
            run_id=run_id,
            config=parsed.model_dump(mode="json"),
            state=RunState.PENDING,
            step=existing.step if existing else 0,
            policy_version=existing.policy_version if existing else 0,
            checkpoint_uri=existing.checkpoint_uri if existing else "",
            create_time=existing.create_time if existing else time.time(),
        )
        self._put(run)
        if request_id:
            self._requests[request_id] = run_id
        self._launch(run_id, parsed)
        return run

    def resume(self, run_id: str) -> Run:
        """Resumes a recorded run with its recorded config."""
        run = self.runs.get(run_id)
        self._launch(run_id, parse_run_config(run.config))
        return run

    def stop(self, run_id: str) -> Run:
        """Asks the run to stop after its current step (idempotent).

        Raises:
            NotFound: Unknown run.
        """
        run = self.runs.get(run_id)
        stop = self._stops.get(run_id)
        if stop is not None:
            stop.set()
        if run.state in (RunState.PENDING, RunState.RUNNING) and run_id not in self._tasks:
            self._update(run_id, state=RunState.STOPPED)
        return self.runs.get(run_id)

    async def wait(self, run_id: str) -> Run:
        """Waits for the run's loop to end; returns the run."""
        task = self._tasks.get(run_id)
        if task is not None:
            await asyncio.shield(task)
        return self.runs.get(run_id)

    async def close(self) -> None:
        """Stops every run (they stay resumable) and waits for them."""
        for stop in self._stops.values():
            stop.set()
        tasks = [t for t in self._tasks.values() if not t.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- metrics ----

    async def watch_metrics(self, run_id: str, from_step: int) -> AsyncIterator[StepMetrics]:
        """Every recorded step >= ``from_step``, then new ones; ends when the run's loop ends.

        Raises:
            NotFound: Unknown run.
        """
        self.runs.get(run_id)
        cond = self._condition(run_id)
        sent = 0
        while True:
            history = self._metrics.get(run_id, [])
            for entry in history[sent:]:
                if entry.step >= from_step:
                    yield entry
            sent = len(history)
            task = self._tasks.get(run_id)
            if task is None or task.done():
                return
            async with cond:
                if len(self._metrics.get(run_id, [])) == sent and not task.done():
                    # The loop's last notification may precede the task's end by a moment.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cond.wait(), timeout=1.0)

    # ---- internals ----

    def _launch(self, run_id: str, config: RunConfig) -> None:
        stop = asyncio.Event()
        self._stops[run_id] = stop
        self._metrics.setdefault(run_id, [])
        loop = TrainingLoop(
            run_id,
            config,
            self._deps,
            on_progress=lambda step, version, uri: self._update(
                run_id, step=step, policy_version=version, checkpoint_uri=uri
            ),
            on_metrics=lambda step, metrics, t: self._record(run_id, StepMetrics(step, dict(metrics), t)),
        )
        self._tasks[run_id] = asyncio.create_task(self._drive(run_id, loop, stop), name=f"run-{run_id}")

    async def _drive(self, run_id: str, loop: TrainingLoop, stop: asyncio.Event) -> None:
        self._update(run_id, state=RunState.RUNNING, error="")
        try:
            completed = await loop.run(stop)
        except Exception as exc:
            log.exception("run.failed", run_id=run_id)
            self._update(run_id, state=RunState.FAILED, error=f"{type(exc).__name__}: {exc}")
        else:
            self._update(run_id, state=RunState.COMPLETED if completed else RunState.STOPPED)
            log.info("run.ended", run_id=run_id, completed=completed, step=loop.state.step)
        finally:
            await self._notify(run_id)

    def _update(self, run_id: str, **changes: Any) -> None:
        self._put(dataclasses.replace(self.runs.get(run_id), **changes))

    def _put(self, run: Run) -> None:
        self.runs.put(run)
        self._journal.save_run(run)

    def _record(self, run_id: str, entry: StepMetrics) -> None:
        history = self._metrics.setdefault(run_id, [])
        history[:] = [e for e in history if e.step < entry.step]
        history.append(entry)
        self._journal.append_metrics(run_id, entry)
        asyncio.get_running_loop().create_task(self._notify(run_id))

    def _condition(self, run_id: str) -> asyncio.Condition:
        return self._changed.setdefault(run_id, asyncio.Condition())

    async def _notify(self, run_id: str) -> None:
        cond = self._condition(run_id)
        async with cond:
            cond.notify_all()
