"""Training runs known to this trainer."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from openforge_core.errors import NotFound


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

    def put(self, run: Run) -> None:
        """Adds or replaces a run."""
        self._runs[run.run_id] = run
