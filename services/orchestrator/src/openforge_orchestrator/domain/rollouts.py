"""Rollouts: acceptance into groups, state, watching and cancellation.

A request for ``n`` rollouts of each of ``k`` tasks creates ``k`` groups of
``n`` rollouts each (the GRPO/RLOO group is all rollouts of one task request).
Accepted rollouts are PENDING until the scheduler starts them (RUNNING, a
``RolloutStarted`` fact), then end in a terminal status with a ``RolloutFinished`` fact
carrying the reward and what happened in the sandbox.
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_core.errors import InvalidArgument, NotFound
from openforge_core.seeds import derive_seed

HARNESSES = frozenset({"claude-code", "codex", "openclaw", "mini-swe-agent", "browser", "command"})


class RolloutStatus(enum.Enum):
    """Lifecycle of a rollout (mirrors ``openforge.common.v1.RolloutStatus``)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self not in (RolloutStatus.PENDING, RolloutStatus.RUNNING)


@dataclass(frozen=True)
class RolloutLimits:
    """Limits the proxy enforces on a rollout's session; 0 = no limit.

    Attributes:
        max_turns: Model calls.
        max_tokens_per_call: Completion tokens per call.
        max_total_tokens: Prompt + completion tokens over the rollout.
    """

    max_turns: int = 0
    max_tokens_per_call: int = 0
    max_total_tokens: int = 0


@dataclass(frozen=True)
class Rollout:
    """One run of one harness on one task.

    Attributes:
        rollout_id: Unique id.
        run_id: Its run.
        task_id: Task folder name.
        task_set: Task set the task comes from.
        group_id: Group (one task request).
        group_index: 0-based index within the group.
        harness: Harness name.
        model_name: Model name given to the harness.
        status: Lifecycle state.
        min_policy_version: Lowest policy version allowed to serve it.
        timeout_s: Timeout override in seconds (0 = the task's own).
        create_time: Unix seconds.
        start_time: Unix seconds (0 = not started).
        end_time: Unix seconds (0 = not ended).
        reward: Verifier reward, None until verified (and for a flagged bypass).
        failure_reason: Why it failed, timed out or was cancelled.
        limits: Session limits.
        sampling: Enforced sampling parameters, the trainer's message as received (``seed`` an
            int64, never a JSON string); None = none enforced (the proxy's and engine's
            defaults). Passed on to the proxy's session (with :attr:`seed`) and as is to the
            run's manifest; never mutated.
        seed: The rollout's own sampling seed (:func:`rollout_seed`), which its proxy session
            samples with in place of the submission's; None = unseeded.
        command: Argv template of the ``command`` harness.
        verifier_output: End of the verifier's output.
        calls: Model calls the proxy served (read when the session closed).
        harness_exit_code: The harness's exit status; -1 when killed or never started.
        bypass_reason: Why it was flagged as bypassing the proxy; empty when not.
        blocked_destinations: Destinations other than the proxy the harness tried.
        attempts: Attempts made (more than 1 after infrastructure failures).
        timed_out: Whether the harness was killed at its time limit.
        start_latency_s: From asking for the sandbox to the harness running, seconds.
        sandbox_cpu_s: CPU time of the harness's sandbox (its cgroup), seconds; None where
            not accounted (no cgroup, or another backend).
        sandbox_peak_memory_bytes: The sandbox's highest memory use, bytes; None likewise.
    """

    rollout_id: str
    run_id: str
    task_id: str
    task_set: str
    group_id: str
    group_index: int
    harness: str
    model_name: str
    status: RolloutStatus
    min_policy_version: int
    timeout_s: float
    create_time: float
    start_time: float = 0.0
    end_time: float = 0.0
    reward: float | None = None
    failure_reason: str = ""
    limits: RolloutLimits = RolloutLimits()
    sampling: SamplingParams | None = None
    seed: int | None = None
    command: tuple[str, ...] = ()
    verifier_output: str = ""
    calls: int = 0
    harness_exit_code: int = -1
    bypass_reason: str = ""
    blocked_destinations: tuple[str, ...] = ()
    attempts: int = 0
    timed_out: bool = False
    start_latency_s: float = 0.0
    sandbox_cpu_s: float | None = None
    sandbox_peak_memory_bytes: int | None = None


@dataclass(frozen=True)
class TaskRef:
    """A task by reference: its id within a task set."""

    task_id: str
    task_set: str


class RolloutEvents(Protocol):
    """Where the registry reports facts (implemented by a NATS publisher)."""

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None: ...

    async def started(self, rollout: Rollout) -> None: ...

    async def finished(self, rollout: Rollout) -> None: ...


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _own_copy(sampling: SamplingParams | None) -> SamplingParams | None:
    """A copy of the caller's message (messages are mutable) that the group's rollouts share;
    None for None or an empty message (nothing enforced either way)."""
    if sampling is None or not sampling.ByteSize():
        return None
    own = SamplingParams()
    own.CopyFrom(sampling)
    return own


def rollout_seed(enforced: SamplingParams | None, task_position: int, index: int) -> int | None:
    """One rollout's sampling seed, derived from the submission's seed, the task's position in
    the submission and the rollout's index in its group (:func:`openforge_core.seeds.derive_seed`),
    so the rollouts of a group sample differently and a submission made again samples the same;
    None when the submission has no seed."""
    if enforced is None or not enforced.HasField("seed"):
        return None
    return derive_seed(enforced.seed, "rollout", task_position, index)


class RolloutRegistry:
    """Rollouts in memory with watchers.

    Args:
        events: Receives a fact after each accepted change.
        clock: Unix seconds (injectable for tests).
    """

    def __init__(self, events: RolloutEvents, clock: Callable[[], float] = time.time) -> None:
        self._events = events
        self._clock = clock
        self._rollouts: dict[str, Rollout] = {}
        self._by_request: dict[str, list[str]] = {}
        self._by_group: dict[str, list[str]] = {}
        self._watchers: set[asyncio.Queue[Rollout]] = set()

    async def submit(
        self,
        *,
        request_id: str,
        run_id: str,
        tasks: Iterable[TaskRef],
        group_size: int,
        harness: str,
        model_name: str,
        min_policy_version: int,
        timeout_s: float,
        limits: RolloutLimits = RolloutLimits(),
        sampling: SamplingParams | None = None,
        command: tuple[str, ...] = (),
        validate_task: Callable[[TaskRef], None] | None = None,
    ) -> list[Rollout]:
        """Accepts one group of ``group_size`` rollouts per task; idempotent per ``request_id``.

        Returns:
            The rollouts, in task order then group index order.

        Raises:
            InvalidArgument: No tasks, an empty task id, group_size < 1, an
                unknown harness, a negative timeout or limit, a malformed task.
            NotFound: ``validate_task`` found no such task.
        """
        if request_id and request_id in self._by_request:
            return [self._rollouts[r] for r in self._by_request[request_id]]
        task_list = list(tasks)
        if not task_list:
            raise InvalidArgument.field("tasks", "at least one task is required")
        for i, t in enumerate(task_list):
            if not t.task_id:
                raise InvalidArgument.field(f"tasks[{i}].task_id", "must not be empty")
        if group_size < 1:
            raise InvalidArgument.field("group_size", "must be >= 1")
        if harness not in HARNESSES:
            raise InvalidArgument.field("harness", f"unknown harness {harness!r}; one of {sorted(HARNESSES)}")
        if timeout_s < 0:
            raise InvalidArgument.field("timeout", "must not be negative")
        for name in ("max_turns", "max_tokens_per_call", "max_total_tokens"):
            if getattr(limits, name) < 0:
                raise InvalidArgument.field(f"limits.{name}", "must be >= 0 (0 = no limit)")
        if validate_task is not None:
            for t in task_list:
                validate_task(t)
        enforced = _own_copy(sampling)
        now = self._clock()
        created: list[Rollout] = []
        for position, task in enumerate(task_list):
            group_id = _new_id("grp")
            for index in range(group_size):
                created.append(
                    Rollout(
                        rollout_id=_new_id("ro"),
                        run_id=run_id,
                        task_id=task.task_id,
                        task_set=task.task_set,
                        group_id=group_id,
                        group_index=index,
                        harness=harness,
                        model_name=model_name,
                        status=RolloutStatus.PENDING,
                        min_policy_version=min_policy_version,
                        timeout_s=timeout_s,
                        create_time=now,
                        limits=limits,
                        sampling=enforced,
                        seed=rollout_seed(enforced, position, index),
                        command=command,
                    )
                )
        request_id = request_id or _new_id("req")
        await self._events.submitted(request_id, created)
        for r in created:
            self._rollouts[r.rollout_id] = r
            self._by_group.setdefault(r.group_id, []).append(r.rollout_id)
            self._notify(r)
        self._by_request[request_id] = [r.rollout_id for r in created]
        return created

    def get(self, rollout_id: str) -> Rollout:
        """One rollout.

        Raises:
            NotFound: Unknown rollout id.
        """
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id}) from None

    def group(self, group_id: str) -> list[Rollout]:
        """The rollouts of one group, in group index order.

        Raises:
            NotFound: No rollout of that group (unknown here, or submitted before a restart).
        """
        ids = self._by_group.get(group_id)
        if not ids:
            raise NotFound(f"no group {group_id!r}", metadata={"group_id": group_id})
        return [self._rollouts[i] for i in ids]

    async def cancel(self, rollout_id: str, reason: str) -> Rollout:
        """Cancels a rollout that has not ended; idempotent on ended rollouts.

        Raises:
            NotFound: Unknown rollout id.
        """
        current = self.get(rollout_id)
        if current.status.terminal:
            return current
        cancelled = replace(
            current,
            status=RolloutStatus.CANCELLED,
            end_time=self._clock(),
            failure_reason=reason or "cancelled",
        )
        await self._events.finished(cancelled)
        self._rollouts[rollout_id] = cancelled
        self._notify(cancelled)
        return cancelled

    async def mark_started(self, rollout_id: str) -> Rollout:
        """PENDING → RUNNING with ``start_time``; publishes ``RolloutStarted``.

        Raises:
            NotFound: Unknown rollout id.
        """
        started = replace(self.get(rollout_id), status=RolloutStatus.RUNNING, start_time=self._clock())
        await self._events.started(started)
        self._rollouts[rollout_id] = started
        self._notify(started)
        return started

    async def finish(self, rollout_id: str, status: RolloutStatus, **changes: Any) -> Rollout:
        """Moves a rollout to a terminal ``status`` with ``changes``; publishes ``RolloutFinished``.

        A rollout that already ended is returned unchanged (idempotent).

        Raises:
            NotFound: Unknown rollout id.
            ValueError: ``status`` is not terminal.
        """
        if not status.terminal:
            raise ValueError(f"{status} is not terminal")
        current = self.get(rollout_id)
        if current.status.terminal:
            return current
        done = replace(current, status=status, end_time=self._clock(), **changes)
        await self._events.finished(done)
        self._rollouts[rollout_id] = done
        self._notify(done)
        return done

    async def watch(self, run_id: str = "", group_id: str = "") -> AsyncIterator[Rollout]:
        """Yields every matching rollout as it is now, then each change, until cancelled."""

        def matches(r: Rollout) -> bool:
            return (not run_id or r.run_id == run_id) and (not group_id or r.group_id == group_id)

        queue: asyncio.Queue[Rollout] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            for r in list(self._rollouts.values()):
                if matches(r):
                    yield r
            while True:
                r = await queue.get()
                if matches(r):
                    yield r
        finally:
            self._watchers.discard(queue)

    def _notify(self, rollout: Rollout) -> None:
        for q in self._watchers:
            q.put_nowait(rollout)
