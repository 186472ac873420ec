"""Scheduling: every accepted rollout runs as soon as a global and a per-task slot are free.

``submit`` accepts rollouts (the registry) and starts one asyncio task per new rollout; the task
waits for a slot of its task (``max_per_task``), then for a global slot (``max_concurrent``), in
that order so that a rollout waiting for its task's slot never holds a global one. Slots are
FIFO. ``cancel`` cancels the rollout's task whether it waits or runs (``cancel_group`` every
rollout of a group); the executor ends it CANCELLED. ``drain`` refuses new rollouts, cancels those
still waiting and gives the running ones a grace period to finish (a stopping orchestrator)
without starting any new attempt of theirs (see :meth:`RolloutExecutor.drain`: one waiting for its
policy version is cancelled like a waiting one, an infrastructure failure is not retried);
``close`` cancels everything still running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from openforge_core.errors import Unavailable
from openforge_orchestrator.domain.execution import STOPPING_REASON, RolloutExecutor
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry, RolloutStatus, TaskRef

log = structlog.get_logger(__name__)

LOG_CRASHED = "scheduler.rollout_crashed"
#: Cancel reason of a rollout still running when its orchestrator closed.
CLOSING_REASON = "the orchestrator stopped while the rollout ran"


class Scheduler:
    """Runs accepted rollouts under concurrency limits.

    Args:
        registry: Rollout state.
        executor: Runs one rollout.
        max_concurrent: Rollouts running at once.
        max_per_task: Rollouts of one task running at once.
        validate_task: Checks a task reference at submit time (raises ``NotFound``/``InvalidArgument``).
    """

    def __init__(
        self,
        registry: RolloutRegistry,
        executor: RolloutExecutor,
        *,
        max_concurrent: int,
        max_per_task: int,
        validate_task: Callable[[TaskRef], None] | None = None,
        validate_harness: Callable[[str], None] | None = None,
    ) -> None:
        self._registry = registry
        self._executor = executor
        self._global = asyncio.Semaphore(max_concurrent)
        self._max_per_task = max_per_task
        self._per_task: dict[str, asyncio.Semaphore] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started: set[str] = set()
        self._draining = False
        self._validate_task = validate_task
        self._validate_harness = validate_harness
        self.running = 0
        self.peak_running = 0

    @property
    def waiting(self) -> int:
        """Rollouts accepted and waiting for a slot."""
        return len(self._tasks) - len(self._started)

    async def submit(self, **request: Any) -> list[Rollout]:
        """Accepts rollouts (see :meth:`RolloutRegistry.submit`) and schedules the new ones.

        Raises:
            FailedPrecondition: The harness is not installed here (from ``validate_harness``).
            Unavailable: The orchestrator is stopping (:meth:`drain`).
        """
        if self._draining:
            raise Unavailable("the orchestrator is stopping; submit again once it is back")
        if self._validate_harness is not None:
            self._validate_harness(str(request.get("harness", "")))
        created = await self._registry.submit(**request, validate_task=self._validate_task)
        for r in created:
            if r.rollout_id in self._tasks or r.status is not RolloutStatus.PENDING:
                continue
            if self._draining:  # the drain began while this submit was being recorded: never start it
                await self._registry.cancel(r.rollout_id, STOPPING_REASON)
                continue
            self._tasks[r.rollout_id] = asyncio.create_task(self._run(r), name=f"rollout-{r.rollout_id}")
        return [self._registry.get(r.rollout_id) for r in created]

    async def _run(self, rollout: Rollout) -> None:
        key = f"{rollout.task_set}/{rollout.task_id}"
        per_task = self._per_task.setdefault(key, asyncio.Semaphore(self._max_per_task))
        try:
            async with per_task, self._global:
                self._started.add(rollout.rollout_id)
                self.running += 1
                self.peak_running = max(self.peak_running, self.running)
                try:
                    await self._executor.run(rollout.rollout_id)
                finally:
                    self.running -= 1
        except asyncio.CancelledError:
            if not self._registry.get(rollout.rollout_id).status.terminal:  # cancelled while waiting
                reason = self._executor.pop_cancel(rollout.rollout_id)
                await asyncio.shield(self._registry.cancel(rollout.rollout_id, reason))
        except Exception:
            log.exception(LOG_CRASHED, rollout_id=rollout.rollout_id)
            await self._registry.finish(
                rollout.rollout_id, RolloutStatus.FAILED, failure_reason="internal error while running the rollout"
            )
        finally:
            self._tasks.pop(rollout.rollout_id, None)
            self._started.discard(rollout.rollout_id)

    async def cancel(self, rollout_id: str, reason: str) -> Rollout:
        """Cancels a rollout that has not ended: stops its sandbox, keeps its calls. Idempotent.

        Raises:
            NotFound: Unknown rollout id.
        """
        current = self._registry.get(rollout_id)
        if current.status.terminal:
            return current
        task = self._tasks.get(rollout_id)
        if task is None:
            return await self._registry.cancel(rollout_id, reason)
        self._executor.note_cancel(rollout_id, reason)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return self._registry.get(rollout_id)

    async def cancel_group(self, group_id: str, reason: str) -> list[Rollout]:
        """Cancels every rollout of a group that has not ended (see :meth:`cancel`), at once.
        Idempotent.

        Returns:
            The group's rollouts afterwards, in group index order.

        Raises:
            NotFound: Unknown group id.
        """
        rollouts = self._registry.group(group_id)
        await asyncio.gather(*(self.cancel(r.rollout_id, reason) for r in rollouts if not r.status.terminal))
        return [self._registry.get(r.rollout_id) for r in rollouts]

    async def drain(self, grace_s: float) -> None:
        """Refuses new rollouts, cancels the ones still waiting for a slot (CANCELLED, never
        started) and waits up to ``grace_s`` seconds for the running ones to end as they would
        (verifier reward, events published). No running rollout starts another attempt: one still
        waiting for its policy version ends CANCELLED (:data:`STOPPING_REASON`), one whose attempt
        failed for infrastructure reasons ends FAILED without a retry. What is still running
        after that is left to :meth:`close`."""
        self._draining = True
        self._executor.drain()
        waiting = [rid for rid in self._tasks if rid not in self._started]
        for rid in waiting:
            self._executor.note_cancel(rid, STOPPING_REASON)
            self._tasks[rid].cancel()
        running = list(self._tasks.values())
        if running:
            log.info("scheduler.draining", running=len(self._started), cancelled=len(waiting), grace_s=grace_s)
            _, late = await asyncio.wait(running, timeout=grace_s)
            if late:
                log.warning("scheduler.drain_timeout", still_running=len(late), grace_s=grace_s)

    async def close(self) -> None:
        """Cancels every rollout still waiting or running and waits for their cleanup."""
        tasks = list(self._tasks.values())
        for rid, t in list(self._tasks.items()):
            if not t.done():
                self._executor.note_cancel(rid, CLOSING_REASON if rid in self._started else STOPPING_REASON)
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
