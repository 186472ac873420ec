"""What the loop needs from the outside world, as protocols (adapters implement them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from openforge_trainer.domain.samples import CompletedGroup
from openforge_trainer.domain.state import TrainerState


@dataclass(frozen=True)
class RolloutRequest:
    """Groups of rollouts to ask the orchestrator for (``SubmitRolloutsRequest``).

    Attributes:
        request_id: Idempotency key: a retry or a resumed trainer gets the same rollouts back.
        run_id: Run the rollouts belong to.
        task_set: Task set of the tasks.
        task_ids: One group per task id.
        group_size: Rollouts per group.
        harness: Harness name.
        model_name: Model name for the harness's config.
        min_policy_version: Calls must be served with at least this policy version.
        timeout_s: Overrides the task timeout when > 0, seconds.
        temperature: Sampling temperature the proxy enforces on every call of the rollouts.
        max_tokens: Most tokens sampled per call, enforced by the proxy (0 = not enforced).
        max_turns: Most model calls per rollout (0 = no limit).
        max_total_tokens: Most prompt + sampled tokens per rollout (0 = no limit).
        command: Argv template of the ``command`` harness (empty = the orchestrator's).
        seed: Sampling seed of the submission (``SamplingParams.seed``; the orchestrator derives
            one per rollout from it); None = unseeded.
    """

    request_id: str
    run_id: str
    task_set: str
    task_ids: tuple[str, ...]
    group_size: int
    harness: str
    model_name: str
    min_policy_version: int
    timeout_s: float = 0.0
    temperature: float = 1.0
    max_tokens: int = 0
    max_turns: int = 0
    max_total_tokens: int = 0
    command: tuple[str, ...] = ()
    seed: int | None = None


class RolloutSubmitter(Protocol):
    """The orchestrator."""

    async def submit(self, request: RolloutRequest) -> list[str]:
        """Requests the groups; returns their group ids (in task order)."""

    async def cancel_group(self, group_id: str, reason: str) -> None:
        """Cancels the group's rollouts that have not ended, ``reason`` recorded as their failure
        reason (idempotent); a group the orchestrator does not hold (it restarted) is nothing to
        cancel."""


class GroupSource(Protocol):
    """The trajectory store's completed groups."""

    def watch(self, run_id: str, cursor: str) -> AsyncIterator[CompletedGroup]:
        """Every completed group of ``run_id`` after ``cursor`` in completion order, then new
        ones as they complete (never ends by itself)."""


class WeightSync(Protocol):
    """The inference service."""

    async def update_weights(self, request_id: str, uri: str, version: int, checksum: str) -> int:
        """Loads the checkpoint as ``version`` (idempotent per version and checksum); returns the
        version serving after the call."""

    async def serving_version(self) -> int:
        """The policy version inference serves now (0 after a restart on the initial model).

        Raises:
            Unavailable: Inference cannot be reached.
        """


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint.

    Attributes:
        path: Its directory (HF safetensors, config, tokenizer, ``optimizer.pt``).
        checksum: ``"sha256:<hex>"`` over its ``*.safetensors`` files in name order.
        state: The trainer state saved with it.
    """

    path: Path
    checksum: str
    state: TrainerState


class CheckpointStore(Protocol):
    """Where a run's checkpoints live."""

    def latest(self, run_id: str) -> Checkpoint | None:
        """The newest complete checkpoint of the run, or None."""

    def write(self, run_id: str, state: TrainerState, save: Callable[[Path], None]) -> Checkpoint:
        """Writes checkpoint ``state.step``: ``save(dir)`` fills the weights, then the state is
        added and the checkpoint becomes the latest atomically."""


class MetricsSink(Protocol):
    """Somewhere step metrics go (TensorBoard, the event bus)."""

    async def write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        """Records the metrics of one step (``time_s``: Unix seconds when it finished)."""

    async def close(self) -> None:
        """Flushes and releases."""
