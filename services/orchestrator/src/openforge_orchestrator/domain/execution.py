"""One rollout, start to end: task → policy gate → proxy session → harness in a sandbox →
session closed → verifier → reward, with retries of infrastructure failures only.

Outcomes (``RolloutFinished``):

* SUCCEEDED with the verifier's reward (0.0 included: a policy's failure is scored, never
  retried);
* TIMED_OUT when the harness reached its time limit: it was killed, the verifier still ran
  and its reward is kept, and so is every call the proxy recorded (the partial trajectory);
* FAILED when the verifier wrote no reward, the task is malformed, the sandbox could not start
  (after the retries), the harness crashed before its first model call (after the retries), or
  the rollout was flagged as bypassing the proxy: it made no model call through the proxy, or
  tried another network destination. A flagged rollout has ``bypass_reason`` set and no reward,
  so it is never trained on as a plain failure;
* CANCELLED by ``CancelRollout``: the sandbox is stopped, the session closed, the calls kept.

A stopping orchestrator (:meth:`RolloutExecutor.drain`) starts no new attempt: a rollout still
waiting for its policy version ends CANCELLED as one that never started
(:data:`STOPPING_REASON`), and one whose attempt failed for infrastructure reasons ends FAILED
at once, its reason the usual ``infrastructure: ...`` one followed by :data:`NOT_RETRIED` (a
retry's backoff is cut short too).

The first launch of a run in this process completes the run's manifest
(:mod:`~openforge_orchestrator.domain.manifest`): once its session reported what the proxy serves
with (it does once the proxy has loaded the model; until then the next launch tries again).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from openforge_core.backoff import doubling_delay
from openforge_core.errors import OpenForgeError, Unavailable
from openforge_core.manifest import ServedModel
from openforge_orchestrator.domain.manifest import LaunchManifest, RunManifests, image_digest, run_config_hash
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry, RolloutStatus
from openforge_orchestrator.domain.sandbox import (
    ExecutionPlan,
    ExecutionResult,
    HarnessLaunch,
    SandboxBackend,
    SandboxStartError,
)
from openforge_orchestrator.domain.tasks import Task, TaskCatalog

log = structlog.get_logger(__name__)

LOG_ATTEMPT = "rollout.attempt"
LOG_RETRY = "rollout.infra_retry"
LOG_FLAGGED = "rollout.bypass_flagged"
LOG_FAILED = "rollout.failed"
LOG_MANIFEST_FAILED = "run.manifest_failed"

NO_PROXY_CALL = "no model call went through the proxy"
#: Cancel reason of a rollout that had not started when its orchestrator stopped.
STOPPING_REASON = "the orchestrator stopped before the rollout started"
#: Appended to the ``infrastructure: ...`` failure reason of a rollout not retried because its
#: orchestrator was stopping.
NOT_RETRIED = "not retried: the orchestrator is stopping"
OTHER_DESTINATIONS = "tried other network destinations: "


@dataclass(frozen=True)
class OpenedSession:
    """A rollout's proxy session as opened.

    Attributes:
        api_key: The rollout's key.
        served: What the proxy serves the session with; None while it has not loaded the model.
    """

    api_key: str
    served: ServedModel | None = None


class SessionGateway(Protocol):
    """The proxy's per-rollout sessions."""

    async def open(self, rollout: Rollout, attempt: int, ttl_s: float) -> OpenedSession:
        """Opens the rollout's session (idempotent per attempt)."""
        ...

    async def close(self, rollout_id: str) -> int:
        """Closes the session (its key stops working); returns the calls it served."""
        ...


class PolicyVersions(Protocol):
    """The policy version inference serves now."""

    async def current(self) -> int:
        """The served policy version."""
        ...


class LaunchBuilder(Protocol):
    """Builds the harness launch of one attempt (adapters + install manifests)."""

    def __call__(self, rollout: Rollout, task: Task, base_url: str, api_key: str, timeout_s: float) -> HarnessLaunch:
        """The launch, or raises ``InvalidArgument``/``FailedPrecondition``."""
        ...


@dataclass(frozen=True)
class ExecutionSettings:
    """Retry and timing knobs of :class:`RolloutExecutor`.

    Attributes:
        max_infra_attempts: Attempts when the sandbox fails to start or the harness dies before
            its first model call.
        policy_wait_s: Longest wait for ``min_policy_version``, seconds.
        policy_poll_s: Poll interval for the policy version, seconds.
        session_grace_s: How long a session key outlives the harness time limit, seconds.
        retry_backoff_s: Wait before the second attempt, seconds; doubled before each later
            one, capped, with "equal jitter" (a uniform draw in [delay / 2, delay]; M. Brooker,
            "Exponential Backoff And Jitter", AWS Architecture Blog, 2015); 0 retries at once.
        retry_backoff_max_s: Longest wait between two attempts, seconds.
    """

    max_infra_attempts: int = 3
    policy_wait_s: float = 600.0
    policy_poll_s: float = 1.0
    session_grace_s: float = 120.0
    retry_backoff_s: float = 2.0
    retry_backoff_max_s: float = 30.0

    def retry_delay(self, attempt: int, draw: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one.

        Args:
            attempt: The attempt that failed (>= 1).
            draw: A uniform draw in [0, 1) (the jitter).
        """
        delay = doubling_delay(self.retry_backoff_s, attempt - 1, self.retry_backoff_max_s)
        return delay * (0.5 + 0.5 * draw)


class RolloutExecutor:
    """Runs one rollout to a terminal status (see the module docstring).

    Args:
        registry: Rollout state and facts.
        tasks: The task catalog.
        backend: The sandbox backend.
        sessions: The proxy's sessions.
        build_launch: Harness launch builder.
        policy: Served policy version (None = no gate).
        settings: Retries and timings.
        manifests: Where each run's manifest goes, completed at its first launch (None: nowhere).
        clock: Monotonic seconds (injectable for tests).
        sleep: ``asyncio.sleep`` (injectable for tests).
        jitter: Uniform draws in [0, 1) for the retry backoff (injectable for tests).
    """

    def __init__(
        self,
        registry: RolloutRegistry,
        tasks: TaskCatalog,
        backend: SandboxBackend,
        sessions: SessionGateway,
        build_launch: LaunchBuilder,
        policy: PolicyVersions | None = None,
        settings: ExecutionSettings = ExecutionSettings(),
        manifests: RunManifests | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._registry = registry
        self._tasks = tasks
        self._backend = backend
        self._sessions = sessions
        self._build_launch = build_launch
        self._policy = policy
        self._settings = settings
        self._manifests = manifests
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter
        self._cancel_reasons: dict[str, str] = {}
        #: Runs whose manifest this process completed; the lock lets one launch complete it.
        self._manifested: set[str] = set()
        self._manifest_lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    def drain(self) -> None:
        """Starts no new attempt from now on (the orchestrator is stopping): rollouts waiting for
        their policy version end CANCELLED, infrastructure failures are no longer retried. Running
        attempts go on."""
        self._stopping.set()

    async def run(self, rollout_id: str) -> Rollout:
        """Runs the rollout; returns it terminal. Cancelling ends it CANCELLED (then re-raises)."""
        rollout = self._registry.get(rollout_id)
        calls = 0
        attempt = 0
        try:
            try:
                task = self._tasks.get(rollout.task_set, rollout.task_id)
            except OpenForgeError as exc:
                return await self._fail(rollout_id, f"task: {exc.message}")
            ready = await self._policy_ready(rollout)
            if ready is None:
                return await self._registry.finish(rollout_id, RolloutStatus.CANCELLED, failure_reason=STOPPING_REASON)
            if not ready:
                return await self._fail(
                    rollout_id,
                    f"policy version {rollout.min_policy_version} not served within {self._settings.policy_wait_s:g}s",
                )
            last_error = ""
            for attempt in range(1, self._settings.max_infra_attempts + 1):
                if attempt > 1:  # an infrastructure retry: let a restarting service come back
                    delay = self._settings.retry_delay(attempt - 1, self._jitter())
                    if self._stopping.is_set() or not await self._unless_stopping(self._sleep(delay)):
                        return await self._fail(
                            rollout_id, f"infrastructure: {last_error}; {NOT_RETRIED}", attempts=attempt - 1
                        )
                log.info(LOG_ATTEMPT, rollout_id=rollout_id, attempt=attempt)
                try:
                    result, calls = await self._attempt(rollout, task, attempt)
                except SandboxStartError as exc:
                    last_error = f"sandbox failed to start: {exc}"
                    log.warning(LOG_RETRY, rollout_id=rollout_id, attempt=attempt, reason=last_error)
                    continue
                except Unavailable as exc:
                    last_error = exc.message
                    log.warning(LOG_RETRY, rollout_id=rollout_id, attempt=attempt, reason=last_error)
                    continue
                except OpenForgeError as exc:
                    return await self._fail(rollout_id, f"harness: {exc.message}", attempts=attempt)
                crashed = not result.timed_out and result.exit_code not in (0, None) and calls == 0
                retry = crashed and attempt < self._settings.max_infra_attempts and not result.blocked_destinations
                if retry and not self._stopping.is_set():
                    last_error = f"harness exited {result.exit_code} before its first model call"
                    log.warning(LOG_RETRY, rollout_id=rollout_id, attempt=attempt, reason=last_error)
                    continue
                return await self._finish(rollout_id, task, result, calls, attempt, crashed, not_retried=retry)
            return await self._fail(
                rollout_id, f"infrastructure: {last_error}", attempts=self._settings.max_infra_attempts
            )
        except asyncio.CancelledError:
            reason = self.pop_cancel(rollout_id)
            await asyncio.shield(
                self._registry.finish(
                    rollout_id, RolloutStatus.CANCELLED, failure_reason=reason, calls=calls, attempts=attempt
                )
            )
            raise

    def note_cancel(self, rollout_id: str, reason: str) -> None:
        """Records why a rollout is about to be cancelled (written on its terminal state)."""
        self._cancel_reasons[rollout_id] = reason or "cancelled"

    def pop_cancel(self, rollout_id: str) -> str:
        """The recorded cancel reason (forgotten afterwards); ``"cancelled"`` when none."""
        return self._cancel_reasons.pop(rollout_id, "cancelled")

    async def _policy_ready(self, rollout: Rollout) -> bool | None:
        """Waits for the rollout's policy version: True once served, False after
        ``policy_wait_s``, None when the orchestrator began stopping meanwhile."""
        if self._policy is None or rollout.min_policy_version <= 0:
            return True
        deadline = self._clock() + self._settings.policy_wait_s
        while True:
            if self._stopping.is_set():
                return None
            try:
                if await self._policy.current() >= rollout.min_policy_version:
                    return True
            except OpenForgeError:
                pass
            if self._clock() >= deadline:
                return False
            await self._unless_stopping(asyncio.sleep(self._settings.policy_poll_s))

    async def _unless_stopping(self, wait: Awaitable[None]) -> bool:
        """Awaits ``wait`` unless :meth:`drain` is called first (then cancels it).

        Returns:
            True when ``wait`` ended, False when the drain began first.
        """
        waiting = asyncio.ensure_future(wait)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (waiting, stopping):
                t.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)
        return not self._stopping.is_set()

    async def _attempt(self, rollout: Rollout, task: Task, attempt: int) -> tuple[ExecutionResult, int]:
        timeout_s = rollout.timeout_s or task.agent_timeout_s
        session = await self._sessions.open(
            rollout, attempt, timeout_s + task.verifier_timeout_s + self._settings.session_grace_s
        )
        key = session.api_key
        closed: list[int] = []

        async def close_session() -> None:
            if not closed:
                closed.append(await self._sessions.close(rollout.rollout_id))

        try:
            launch = self._build_launch(rollout, task, self._backend.proxy_base_url, key, timeout_s)
            if session.served is not None:
                await self._complete_manifest(rollout, task, launch, session.served)
            if self._registry.get(rollout.rollout_id).status is RolloutStatus.PENDING:
                await self._registry.mark_started(rollout.rollout_id)
            result = await self._backend.execute(
                ExecutionPlan(
                    rollout_id=rollout.rollout_id,
                    task=task,
                    launch=launch,
                    agent_timeout_s=timeout_s,
                    verifier_timeout_s=task.verifier_timeout_s,
                    on_harness_exit=close_session,
                    api_key=key,
                )
            )
        finally:
            if not closed:
                await asyncio.shield(close_session())
        return result, closed[0]

    async def _complete_manifest(
        self, rollout: Rollout, task: Task, launch: HarnessLaunch, served: ServedModel
    ) -> None:
        """Publishes the run's complete manifest at its first launch in this process.

        Launches arriving meanwhile wait for it. A failure (the task catalog unreadable, the event
        bus down) is logged and left to the run's next launch: the manifest is no reason to fail a
        rollout.
        """
        run_id = rollout.run_id
        if self._manifests is None or not run_id or run_id in self._manifested:
            return
        async with self._manifest_lock:
            if run_id in self._manifested:
                return
            try:
                manifest = LaunchManifest(
                    harness_version=launch.version,
                    harness_config_hash=run_config_hash(self._build_launch, rollout, task),
                    served=served,
                    sandbox_image_digest=image_digest(self._backend.sandbox_image(task)),
                    verifier_version=await asyncio.to_thread(self._tasks.verifier_version),
                )
                await self._manifests.launched(rollout, manifest)
            except Exception as exc:  # whatever the publisher raises: the rollout goes on
                log.warning(LOG_MANIFEST_FAILED, run_id=run_id, error=repr(exc))
                return
            self._manifested.add(run_id)

    async def _finish(
        self,
        rollout_id: str,
        task: Task,
        result: ExecutionResult,
        calls: int,
        attempts: int,
        crashed: bool,
        *,
        not_retried: bool = False,
    ) -> Rollout:
        common = {
            "calls": calls,
            "harness_exit_code": result.exit_code if result.exit_code is not None else -1,
            "blocked_destinations": result.blocked_destinations,
            "attempts": attempts,
            "timed_out": result.timed_out,
            "start_latency_s": result.start_latency_s,
            "verifier_output": result.verifier_output,
            "sandbox_cpu_s": result.cpu_s,
            "sandbox_peak_memory_bytes": result.peak_memory_bytes,
        }
        bypass = ""
        if result.blocked_destinations:
            bypass = OTHER_DESTINATIONS + ", ".join(result.blocked_destinations)
        elif calls == 0 and not crashed:
            bypass = NO_PROXY_CALL
        if bypass:
            log.warning(LOG_FLAGGED, rollout_id=rollout_id, reason=bypass)
            status = RolloutStatus.TIMED_OUT if result.timed_out else RolloutStatus.FAILED
            return await self._registry.finish(
                rollout_id, status, bypass_reason=bypass, failure_reason=f"bypass: {bypass}", **common
            )
        if crashed:
            reason = f"infrastructure: harness exited {result.exit_code} before its first model call"
            return await self._fail(rollout_id, f"{reason}; {NOT_RETRIED}" if not_retried else reason, **common)
        reward = result.reward.value if result.reward is not None else None
        if result.timed_out:
            reason = f"harness timed out after {result.harness_s:.0f}s"
            if result.verifier_error:
                reason += f"; verifier: {result.verifier_error}"
            return await self._registry.finish(
                rollout_id, RolloutStatus.TIMED_OUT, reward=reward, failure_reason=reason, **common
            )
        if reward is None:
            return await self._fail(rollout_id, f"verifier: {result.verifier_error}", **common)
        return await self._registry.finish(rollout_id, RolloutStatus.SUCCEEDED, reward=reward, **common)

    async def _fail(self, rollout_id: str, reason: str, **changes: object) -> Rollout:
        log.warning(LOG_FAILED, rollout_id=rollout_id, reason=reason)
        return await self._registry.finish(rollout_id, RolloutStatus.FAILED, failure_reason=reason, **changes)
