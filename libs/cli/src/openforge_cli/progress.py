"""Live progress of a training run or an evaluation in the terminal (``rich``).

Fed by the orchestrator's ``WatchRollouts`` (rollouts running and finished) and the trainer's
``WatchMetrics`` (step, reward); shows one bar of finished rollouts, one of optimizer steps with
the time remaining, and the latest reward. Every finished step is also printed as one line, so
a log file (no terminal) still shows the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from openforge.common.v1 import common_pb2

#: Rollout states after which a rollout no longer changes.
TERMINAL = frozenset(
    {
        common_pb2.ROLLOUT_STATUS_SUCCEEDED,
        common_pb2.ROLLOUT_STATUS_FAILED,
        common_pb2.ROLLOUT_STATUS_TIMED_OUT,
        common_pb2.ROLLOUT_STATUS_CANCELLED,
    }
)


class RunProgress:
    """Progress bars of one phase (a run's steps and its rollouts, or an evaluation's rollouts).

    Args:
        title: Shown before the bars (e.g. ``"SFT warm start"``).
        steps: Optimizer steps of the run; 0 for an evaluation (no step bar).
        console: Where to draw (default: standard output).

    Use as a context manager; ``rollout`` and ``step`` may be called from one event loop.
    """

    def __init__(self, title: str, steps: int = 0, console: Console | None = None) -> None:
        self.console = console or Console()
        self.title = title
        self.rollouts: dict[str, int] = {}
        self.rewards: dict[str, float] = {}
        self.last_step = 0
        self.last_metrics: dict[str, float] = {}
        self._progress = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._rollout_bar: TaskID = self._progress.add_task(f"{title}: rollouts", total=0, info="")
        self._step_bar: TaskID | None = None
        if steps > 0:
            self._step_bar = self._progress.add_task(f"{title}: steps", total=steps, info="")

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    @property
    def running(self) -> int:
        """Rollouts seen running now."""
        return sum(1 for s in self.rollouts.values() if s == common_pb2.ROLLOUT_STATUS_RUNNING)

    @property
    def finished(self) -> int:
        """Rollouts seen in a terminal state."""
        return sum(1 for s in self.rollouts.values() if s in TERMINAL)

    def rollout(self, rollout: common_pb2.Rollout) -> None:
        """Takes one ``WatchRollouts`` update."""
        self.rollouts[rollout.rollout_id] = rollout.status
        if rollout.status in TERMINAL and rollout.HasField("reward"):
            self.rewards[rollout.rollout_id] = rollout.reward
        mean = sum(self.rewards.values()) / len(self.rewards) if self.rewards else 0.0
        self._progress.update(
            self._rollout_bar,
            total=len(self.rollouts),
            completed=self.finished,
            info=f"running {self.running}  reward {mean:.2f}",
        )

    def resumed(self, step: int) -> None:
        """Marks the steps done before a resume (prints one line)."""
        self.last_step = step
        if self._step_bar is not None:
            self._progress.update(self._step_bar, completed=step)
        self._progress.console.print(f"{self.title}: resuming after step {step}")

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Takes one ``WatchMetrics`` entry and prints it as one line."""
        self.last_step = step
        self.last_metrics = dict(metrics)
        reward = metrics.get("reward/mean", float("nan"))
        loss = metrics.get("loss/total", metrics.get("loss/sft", metrics.get("loss/policy", float("nan"))))
        if self._step_bar is not None:
            self._progress.update(self._step_bar, completed=step, info=f"reward {reward:.2f}")
        extra = ""
        if "eval/reward/mean" in metrics:
            extra = f"  eval reward {metrics['eval/reward/mean']:.3f}"
        self._progress.console.print(
            f"{self.title}: step {step}  reward {reward:.3f}  loss {loss:.4f}  "
            f"policy v{int(metrics.get('policy_version', step))}  "
            f"{metrics.get('time/step_s', 0.0):.1f}s{extra}"
        )
