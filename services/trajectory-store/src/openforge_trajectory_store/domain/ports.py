"""What the store's domain and its front ends need from storage, as protocols (adapters implement them).

* :class:`ProjectionStore`: the storage operations the event projection
  (:mod:`.projection`) applies, all inside the one transaction of a batch.
* :class:`IngestStore`: what the event consumer needs: ingest a batch, find and mark the
  completed groups it announces.
* :class:`TrajectoryReads`: what the gRPC servicer reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import Message

from openforge.common.v1 import common_pb2
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trajectory_store.domain import tokens, wire
from openforge_trajectory_store.domain.query import RolloutFilter

#: (event id, event message[, the event's wire bytes]): one event of an ingested batch.
Event = tuple[str, Message] | tuple[str, Message, bytes]


@dataclass(frozen=True)
class CompletedGroup:
    """A group whose every rollout ended and was assembled.

    Attributes:
        seq: Its position in the completion order (the watch cursor).
        group_id: The group.
        run_id: Its run.
        task_id: Its task.
        size: Rollouts in it.
    """

    seq: int
    group_id: str
    run_id: str
    task_id: str
    size: int


@dataclass
class IngestResult:
    """What one ingested batch changed.

    Attributes:
        applied: Events applied (not seen before).
        duplicates: Events skipped as already applied.
        completed_groups: Groups that completed in this batch.
    """

    applied: int = 0
    duplicates: int = 0
    completed_groups: list[CompletedGroup] = field(default_factory=list)


@dataclass(frozen=True)
class RolloutRow:
    """A stored rollout, as the projection reads it back.

    Attributes:
        status: Its ``RolloutStatus``.
        expected_calls: Calls the orchestrator counted (``RolloutFinished.calls``; 0 before).
        attempts: The orchestrator's attempts of it (0 when not known).
        assembled: Whether its samples are stored.
        group_id: Its group.
        run_id: Its run.
        data: The serialized ``Rollout``.
    """

    status: int
    expected_calls: int
    attempts: int
    assembled: bool
    group_id: str
    run_id: str
    data: bytes


@dataclass(frozen=True)
class GroupRow:
    """A stored group.

    Attributes:
        run_id: Its run.
        task_id: Its task.
        size: Rollouts in it.
        completed_seq: Its position in the completion order, None while it is not complete.
    """

    run_id: str
    task_id: str
    size: int
    completed_seq: int | None


class ProjectionStore(Protocol):
    """The storage operations of the projection.

    The adapter calls :meth:`.projection.Projection.apply` inside one transaction per batch, so
    every operation below sees the batch's earlier writes and all of them commit (or roll back)
    together. Times are Unix seconds.
    """

    def mark_seen(self, event_id: str, now: float) -> bool:
        """Records an event id; False when it was recorded before (a duplicate)."""

    def rollout_row(self, rollout_id: str) -> RolloutRow | None:
        """The stored rollout, or None."""

    def insert_rollout(self, rollout: common_pb2.Rollout, expected_calls: int, attempts: int, now: float) -> None:
        """Stores a rollout not stored before, and its (run, task) pair if new."""

    def update_rollout(self, rollout: common_pb2.Rollout, expected_calls: int, attempts: int, now: float) -> None:
        """Replaces a stored rollout; its expected calls and attempts only ever grow."""

    def add_group(self, group_id: str, run_id: str, task_id: str, size: int) -> None:
        """Stores a group of ``size`` rollouts (nothing if it is stored already)."""

    def put_run(self, manifest: common_pb2.RunManifest, now: float) -> None:
        """Stores a run's manifest (replacing an earlier one; ``now`` is kept as first seen)."""

    def put_step(self, step: trainer_events.StepCompleted) -> None:
        """Stores the trainer's metrics of one step (replacing an earlier event of that step)."""

    def insert_call(self, record: common_pb2.CallRecord, stored: tokens.StoredCall) -> bool:
        """Stores one call attempt encoded as ``stored``; False if that attempt is stored already."""

    def call_views(self, rollout_id: str) -> list[wire.CallView]:
        """Every stored attempt of every call of a rollout, as full records, in receive order."""

    def distinct_calls(self, rollout_id: str, rollout_attempt: int) -> int:
        """Distinct call ids stored of a rollout's attempt (of every attempt when it is 0)."""

    def put_samples(self, rollout_id: str, run_id: str, samples: Sequence[bytes]) -> None:
        """Replaces a rollout's samples (serialized ``Sample``s, by index) and marks it assembled."""

    def group_row(self, group_id: str) -> GroupRow | None:
        """The stored group, or None."""

    def assembled_rollouts(self, group_id: str) -> int:
        """Rollouts of a group that are assembled."""

    def complete_group(self, group_id: str) -> int:
        """Gives a group the next position in the completion order (1, 2, ...) and returns it."""


class IngestStore(Protocol):
    """What the event consumer needs from the store."""

    def ingest(self, events: Sequence[Event]) -> IngestResult:
        """Applies a batch of events in one transaction; idempotent per event id (see the adapter)."""

    def unpublished_groups(self) -> list[CompletedGroup]:
        """Completed groups whose ``GroupCompleted`` event is not yet confirmed published."""

    def group_contents(self, group_id: str) -> tuple[list[common_pb2.Rollout], list[trajectory_pb2.Sample]]:
        """The rollouts (by group index) and their samples of one group."""

    def mark_published(self, group_id: str) -> None:
        """Records that a group's ``GroupCompleted`` event was published."""


class TrajectoryReads(Protocol):
    """What the servicer reads. Methods raise ``NotFound`` for an unknown rollout or run and
    ``InvalidArgument`` for a negative page size or a page token the store did not issue."""

    def rollout(self, rollout_id: str) -> common_pb2.Rollout:
        """One rollout."""

    def list_rollouts(self, flt: RolloutFilter, size: int, token: str) -> tuple[list[common_pb2.Rollout], str]:
        """A page of rollouts, newest first, and the next page token ("" on the last page)."""

    def calls(self, rollout_id: str) -> list[common_pb2.CallRecord]:
        """Every attempt of every call of a rollout, in receive order."""

    def samples(self, rollout_id: str) -> list[trajectory_pb2.Sample]:
        """A rollout's samples (``FailedPrecondition`` before it is assembled)."""

    def completed_groups(self, run_id: str, after_seq: int, limit: int = 100) -> list[CompletedGroup]:
        """Completed groups of a run after a cursor position, in completion order."""

    def group_contents(self, group_id: str) -> tuple[list[common_pb2.Rollout], list[trajectory_pb2.Sample]]:
        """The rollouts (by group index) and their samples of one group."""

    def run_samples(self, run_id: str) -> list[tuple[common_pb2.Rollout, trajectory_pb2.Sample]]:
        """Every sample of a run with its rollout, in rollout creation order."""

    def list_runs(self, size: int, token: str) -> tuple[list[trajectory_pb2.RunSummary], str]:
        """A page of runs, newest first, and the next page token."""

    def run_summary(self, run_id: str) -> trajectory_pb2.RunSummary:
        """One run's manifest and counts."""

    def step_metrics_page(self, run_id: str, size: int, token: str) -> tuple[list[trajectory_pb2.StepMetrics], str]:
        """A page of a run's step metrics in step order, and the next page token."""
