"""Scheduler and executor with a fake sandbox backend and fake proxy sessions (test doubles).

Checks the global and per-task concurrency limits, that only infrastructure failures are
retried, how outcomes are classified (reward, timeout, bypass), the policy-version gate,
cancellation of waiting and running rollouts, and the drain of a stopping orchestrator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from openforge_core.manifest import ServedModel
from openforge_orchestrator.adapters.metrics import MeteredRolloutEvents, RolloutMetrics
from openforge_orchestrator.domain.execution import ExecutionSettings, OpenedSession, RolloutExecutor
from openforge_orchestrator.domain.manifest import LaunchManifest
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry, RolloutStatus, TaskRef
from openforge_orchestrator.domain.sandbox import ExecutionPlan, ExecutionResult, HarnessLaunch, SandboxStartError
from openforge_orchestrator.domain.scheduler import Scheduler
from openforge_orchestrator.domain.tasks import Task, TaskCatalog
from openforge_orchestrator.domain.verifier import Reward


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, Rollout]] = []
        self.recorded = asyncio.Event()  # cleared: a submit waits for its event to be acknowledged
        self.recorded.set()

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        await self.recorded.wait()
        self.log += [("submitted", r) for r in rollouts]

    async def started(self, rollout: Rollout) -> None:
        self.log.append(("started", rollout))

    async def finished(self, rollout: Rollout) -> None:
        self.log.append(("finished", rollout))


class FakeSessions:
    """A fake proxy: counts calls per rollout as the scripted backend says."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.opened: list[tuple[str, int]] = []
        self.closed: list[str] = []
        self.served: ServedModel | None = None  # what CreateSession reports (None: not loaded)

    async def open(self, rollout: Rollout, attempt: int, ttl_s: float) -> OpenedSession:
        self.opened.append((rollout.rollout_id, attempt))
        return OpenedSession(f"key-{rollout.rollout_id}-{attempt}", self.served)

    async def close(self, rollout_id: str) -> int:
        self.closed.append(rollout_id)
        return self.calls.get(rollout_id, 0)


class FakeBackend:
    """A fake sandbox backend: each task id names a scripted behaviour."""

    proxy_base_url = "http://127.0.0.1:8080"

    def __init__(self, sessions: FakeSessions) -> None:
        self.sessions = sessions
        self.retry_waits: list[float] = []  # what the executor slept between attempts
        self.running = 0
        self.peak = 0
        self.attempts: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.gate.set()

    def sandbox_image(self, task: Task) -> str:
        return ""

    async def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        rid = plan.rollout_id
        self.attempts[rid] = self.attempts.get(rid, 0) + 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.gate.wait()
            await asyncio.sleep(0.01)
            behaviour = plan.task.task_id
            if behaviour == "flaky-start" and self.attempts[rid] == 1:
                raise SandboxStartError("no space left")
            if behaviour == "crash-first" and self.attempts[rid] == 1:
                return ExecutionResult(exit_code=1, timed_out=False, start_latency_s=0.01, harness_s=0.1)
            if behaviour == "always-crash":
                return ExecutionResult(exit_code=1, timed_out=False, start_latency_s=0.01, harness_s=0.1)
            if behaviour == "sleep":
                await asyncio.sleep(3600)
            calls = {"no-call": 0, "policy-fail": 3}.get(behaviour, 2)
            self.sessions.calls[rid] = calls
            assert plan.on_harness_exit is not None
            await plan.on_harness_exit()
            reward = Reward(0.0 if behaviour == "policy-fail" else 1.0)
            blocked = ("tcp 203.0.113.7:443",) if behaviour == "phone-home" else ()
            return ExecutionResult(
                exit_code=None if behaviour == "timeout" else (1 if behaviour == "policy-fail" else 0),
                timed_out=behaviour == "timeout",
                start_latency_s=0.01,
                harness_s=1.0,
                reward=reward,
                verifier_output="ok",
                blocked_destinations=blocked,
                cpu_s=0.5,
                peak_memory_bytes=2**20,
            )
        finally:
            self.running -= 1

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


class FakePolicy:
    def __init__(self, version: int) -> None:
        self.version = version

    async def current(self) -> int:
        return self.version


def _catalog(root: Path, names: list[str]) -> TaskCatalog:
    for n in names:
        d = root / "s" / n
        (d / "tests").mkdir(parents=True)
        (d / "tests" / "test.sh").write_text("true\n")
        (d / "instruction.md").write_text(n)
        (d / "task.toml").write_text("[agent]\ntimeout_sec = 5\n")
    return TaskCatalog(root)


def _check(catalog: TaskCatalog, ref: TaskRef) -> None:
    catalog.get(ref.task_set, ref.task_id)


def _launch(rollout: Rollout, task: Task, base_url: str, api_key: str, timeout_s: float) -> HarnessLaunch:
    return HarnessLaunch(name=rollout.harness, argv=("run", api_key))


def _recorded(waits: list[float]) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    return sleep


def _stack(tmp_path: Path, names: list[str], **kw: Any) -> tuple[Scheduler, RolloutRegistry, FakeBackend, Events]:
    events = Events()
    metrics: RolloutMetrics | None = kw.pop("metrics", None)
    reg = RolloutRegistry(events if metrics is None else MeteredRolloutEvents(events, metrics))
    sessions = kw.pop("sessions", None) or FakeSessions()
    backend = FakeBackend(sessions)
    catalog = _catalog(tmp_path, names)
    executor = RolloutExecutor(
        reg,
        catalog,
        backend,
        sessions,
        _launch,
        kw.pop("policy", None),
        ExecutionSettings(max_infra_attempts=3, policy_wait_s=kw.pop("policy_wait_s", 0.3), policy_poll_s=0.05),
        manifests=kw.pop("manifests", None),
        sleep=kw.pop("sleep", None) or _recorded(backend.retry_waits),
        jitter=lambda: 1.0,
    )
    sched = Scheduler(
        reg,
        executor,
        max_concurrent=kw.pop("max_concurrent", 4),
        max_per_task=kw.pop("max_per_task", 2),
        validate_task=lambda ref: _check(catalog, ref),
    )
    return sched, reg, backend, events


async def _submit(sched: Scheduler, names: list[str], n: int = 1, **kw: Any) -> list[Rollout]:
    return await sched.submit(
        request_id=kw.pop("request_id", "q"),
        run_id=kw.pop("run_id", "run"),
        tasks=[TaskRef(t, "s") for t in names],
        group_size=n,
        harness="command",
        model_name="m",
        min_policy_version=kw.pop("min_policy_version", 0),
        timeout_s=0.0,
    )


async def _done(reg: RolloutRegistry, ids: list[str]) -> list[Rollout]:
    for _ in range(500):
        rs = [reg.get(i) for i in ids]
        if all(r.status.terminal for r in rs):
            return rs
        await asyncio.sleep(0.01)
    raise AssertionError([reg.get(i).status for i in ids])


async def test_global_and_per_task_limits(tmp_path: Path) -> None:
    sched, reg, backend, _ = _stack(tmp_path, ["a", "b", "c"], max_concurrent=4, max_per_task=2)
    backend.gate.clear()
    created = await _submit(sched, ["a", "b", "c"], n=5)
    await asyncio.sleep(0.2)
    assert backend.running == 4  # global limit
    running = [r for r in (reg.get(c.rollout_id) for c in created) if r.status is RolloutStatus.RUNNING]
    assert max(sum(r.task_id == t for r in running) for t in "abc") == 2  # per-task limit
    backend.gate.set()
    done = await _done(reg, [c.rollout_id for c in created])
    assert all(r.status is RolloutStatus.SUCCEEDED and r.reward == 1.0 and r.calls == 2 for r in done)
    assert backend.peak == 4


async def test_rollouts_are_counted_by_harness_and_outcome_and_the_queue_is_read_live(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = RolloutMetrics(registry)
    sched, reg, backend, _ = _stack(tmp_path, ["a", "timeout"], max_concurrent=1, metrics=metrics)
    metrics.watch_queue(lambda: sched.running, lambda: sched.waiting)
    backend.gate.clear()
    created = await _submit(sched, ["a", "timeout"], n=2)
    await asyncio.sleep(0.1)

    def value(name: str, **labels: str) -> float | None:
        found: float | None = registry.get_sample_value(name, labels)
        return found

    assert (value("openforge_rollouts_running"), value("openforge_rollouts_waiting")) == (1, 3)
    assert value("openforge_rollouts_submitted_total", harness="command") == 4
    backend.gate.set()
    await _done(reg, [c.rollout_id for c in created])
    assert value("openforge_rollouts_started_total", harness="command") == 4
    assert value("openforge_rollouts_finished_total", harness="command", status="succeeded") == 2
    assert value("openforge_rollouts_finished_total", harness="command", status="timed_out") == 2
    assert value("openforge_rollout_duration_seconds_count", harness="command", status="timed_out") == 2
    assert value("openforge_sandbox_cpu_seconds_sum", harness="command") == 4 * 0.5
    assert value("openforge_sandbox_peak_memory_bytes_count", harness="command") == 4
    assert (value("openforge_rollouts_running"), value("openforge_rollouts_waiting")) == (0, 0)


async def test_outcomes_and_retries(tmp_path: Path) -> None:
    names = ["flaky-start", "crash-first", "always-crash", "no-call", "phone-home", "timeout", "policy-fail"]
    sched, reg, backend, events = _stack(tmp_path, names)
    created = await _submit(sched, names)
    by = {r.task_id: r for r in await _done(reg, [c.rollout_id for c in created])}
    assert by["flaky-start"].status is RolloutStatus.SUCCEEDED and by["flaky-start"].attempts == 2
    assert by["crash-first"].status is RolloutStatus.SUCCEEDED and by["crash-first"].attempts == 2
    assert by["always-crash"].status is RolloutStatus.FAILED and by["always-crash"].attempts == 3
    assert by["always-crash"].failure_reason == "infrastructure: harness exited 1 before its first model call"
    assert by["no-call"].bypass_reason == "no model call went through the proxy" and by["no-call"].reward is None
    assert by["phone-home"].status is RolloutStatus.FAILED and "203.0.113.7" in by["phone-home"].bypass_reason
    assert by["timeout"].status is RolloutStatus.TIMED_OUT and by["timeout"].reward == 1.0
    # a policy's failure (harness error after model calls, reward 0) is scored, never retried
    assert by["policy-fail"].status is RolloutStatus.SUCCEEDED and by["policy-fail"].reward == 0.0
    assert backend.attempts[by["policy-fail"].rollout_id] == 1 and by["policy-fail"].harness_exit_code == 1
    kinds = [k for k, r in events.log if r.task_id == "flaky-start"]
    assert kinds == ["submitted", "started", "finished"]  # one start fact even with a retry
    # infrastructure retries back off (2 s, then 4 s); a first attempt never waits
    assert sorted(backend.retry_waits) == [2.0, 2.0, 2.0, 4.0]


def test_retry_delay_doubles_up_to_its_cap_with_equal_jitter() -> None:
    s = ExecutionSettings(retry_backoff_s=2.0, retry_backoff_max_s=10.0)
    assert [s.retry_delay(a, 1.0) for a in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert [s.retry_delay(a, 0.0) for a in (1, 2, 4)] == [1.0, 2.0, 5.0]  # never under half
    assert ExecutionSettings(retry_backoff_s=0.0).retry_delay(3, 0.7) == 0.0


async def test_policy_gate(tmp_path: Path) -> None:
    sched, reg, _, _ = _stack(tmp_path, ["a"], policy=FakePolicy(3))
    ok = await _submit(sched, ["a"], min_policy_version=3, request_id="ok")
    late = await _submit(sched, ["a"], min_policy_version=4, request_id="late")
    (r_ok,) = await _done(reg, [ok[0].rollout_id])
    (r_late,) = await _done(reg, [late[0].rollout_id])
    assert r_ok.status is RolloutStatus.SUCCEEDED
    assert r_late.status is RolloutStatus.FAILED and r_late.failure_reason.startswith("policy version 4")


async def test_cancel_waiting_and_running(tmp_path: Path) -> None:
    sched, reg, backend, _ = _stack(tmp_path, ["sleep"], max_concurrent=1, max_per_task=1)
    running, waiting = await _submit(sched, ["sleep"], n=2)
    await asyncio.sleep(0.1)
    assert reg.get(running.rollout_id).status is RolloutStatus.RUNNING
    w = await sched.cancel(waiting.rollout_id, "not needed")
    assert w.status is RolloutStatus.CANCELLED and w.failure_reason == "not needed"
    r = await sched.cancel(running.rollout_id, "stop")
    assert r.status is RolloutStatus.CANCELLED and r.failure_reason == "stop" and backend.running == 0
    assert (await sched.cancel(running.rollout_id, "again")).failure_reason == "stop"  # idempotent


async def test_cancel_group_cancels_its_rollouts_waiting_or_running_and_nothing_else(tmp_path: Path) -> None:
    from openforge_core.errors import NotFound

    sched, reg, backend, _ = _stack(tmp_path, ["a", "sleep"], max_concurrent=1, max_per_task=1)
    (finished,) = await _submit(sched, ["a"], request_id="f")
    await _done(reg, [finished.rollout_id])
    running, waiting = await _submit(sched, ["sleep"], n=2)
    (other,) = await _submit(sched, ["sleep"], request_id="o")  # another group of the same task
    await asyncio.sleep(0.1)
    assert reg.get(running.rollout_id).status is RolloutStatus.RUNNING
    rs = await sched.cancel_group(running.group_id, "not needed")
    assert [r.rollout_id for r in rs] == [running.rollout_id, waiting.rollout_id]
    assert {(r.status, r.failure_reason) for r in rs} == {(RolloutStatus.CANCELLED, "not needed")}
    assert backend.attempts.get(waiting.rollout_id) is None  # never started
    again = await sched.cancel_group(running.group_id, "again")  # idempotent
    assert {r.failure_reason for r in again} == {"not needed"}
    assert [r.status for r in await sched.cancel_group(finished.group_id, "late")] == [RolloutStatus.SUCCEEDED]
    assert not reg.get(other.rollout_id).status.terminal
    with pytest.raises(NotFound):
        await sched.cancel_group("grp-unknown", "x")
    await sched.close()


async def test_drain_lets_running_rollouts_finish_and_cancels_waiting_ones(tmp_path: Path) -> None:
    from openforge_core.errors import Unavailable
    from openforge_orchestrator.domain.execution import STOPPING_REASON
    from openforge_orchestrator.domain.scheduler import CLOSING_REASON

    sched, reg, backend, events = _stack(tmp_path, ["a", "sleep"], max_concurrent=2, max_per_task=1)
    backend.gate.clear()
    running, waiting = await _submit(sched, ["a"], n=2)
    stuck, _ = await _submit(sched, ["sleep"], n=2, request_id="s")
    await asyncio.sleep(0.1)
    assert reg.get(running.rollout_id).status is RolloutStatus.RUNNING
    drain = asyncio.create_task(sched.drain(grace_s=0.5))
    await asyncio.sleep(0.1)
    with pytest.raises(Unavailable):  # nothing new once stopping
        await _submit(sched, ["a"], request_id="late")
    backend.gate.set()  # the running rollout finishes within the grace: verified, published
    await drain
    assert reg.get(running.rollout_id).status is RolloutStatus.SUCCEEDED
    assert ("finished", running.rollout_id) in [(k, r.rollout_id) for k, r in events.log]
    w = reg.get(waiting.rollout_id)
    assert w.status is RolloutStatus.CANCELLED and w.failure_reason == STOPPING_REASON
    assert backend.attempts.get(waiting.rollout_id) is None  # never started
    assert not reg.get(stuck.rollout_id).status.terminal  # past the grace: left to close
    await sched.close()
    s = reg.get(stuck.rollout_id)
    assert s.status is RolloutStatus.CANCELLED and s.failure_reason == CLOSING_REASON


async def test_a_submit_still_being_recorded_when_the_drain_begins_never_starts(tmp_path: Path) -> None:
    from openforge_orchestrator.domain.execution import STOPPING_REASON

    sched, _, backend, events = _stack(tmp_path, ["a"])
    events.recorded.clear()
    submit = asyncio.create_task(_submit(sched, ["a"], n=2))
    await asyncio.sleep(0.05)
    await sched.drain(grace_s=1.0)  # nothing is running yet: returns at once
    events.recorded.set()
    created = await submit
    assert [r.status for r in created] == [RolloutStatus.CANCELLED] * 2
    assert {r.failure_reason for r in created} == {STOPPING_REASON} and backend.attempts == {}


async def test_a_drain_starts_no_infrastructure_retry(tmp_path: Path) -> None:
    from openforge_orchestrator.domain.execution import NOT_RETRIED

    backoffs: list[float] = []

    async def forever(seconds: float) -> None:  # a retry's backoff the drain must cut short
        backoffs.append(seconds)
        await asyncio.Event().wait()

    sched, reg, backend, _ = _stack(tmp_path, ["flaky-start", "crash-first"], sleep=forever)
    backend.gate.clear()
    (backing_off,) = await _submit(sched, ["flaky-start"])
    backend.gate.set()
    await asyncio.sleep(0.1)
    assert backoffs == [2.0] and reg.get(backing_off.rollout_id).status is RolloutStatus.RUNNING
    backend.gate.clear()
    (crashing,) = await _submit(sched, ["crash-first"], request_id="c")
    await asyncio.sleep(0.1)
    assert backend.attempts[crashing.rollout_id] == 1  # its first attempt is running
    drain = asyncio.create_task(sched.drain(grace_s=30.0))
    await asyncio.sleep(0.05)
    backend.gate.set()  # the running attempt crashes before its first model call
    await asyncio.wait_for(drain, timeout=5.0)  # nothing left to wait for: well within the grace
    b, c = reg.get(backing_off.rollout_id), reg.get(crashing.rollout_id)
    assert b.status is RolloutStatus.FAILED and b.attempts == 1 and b.reward is None
    assert b.failure_reason == f"infrastructure: sandbox failed to start: no space left; {NOT_RETRIED}"
    assert c.status is RolloutStatus.FAILED and c.attempts == 1 and c.harness_exit_code == 1
    assert c.failure_reason == f"infrastructure: harness exited 1 before its first model call; {NOT_RETRIED}"
    assert backend.attempts == {backing_off.rollout_id: 1, crashing.rollout_id: 1} and backoffs == [2.0]


async def test_a_drain_ends_the_wait_for_a_policy_version_like_a_waiting_rollout(tmp_path: Path) -> None:
    from openforge_orchestrator.domain.execution import STOPPING_REASON

    policy = FakePolicy(2)
    sched, reg, backend, events = _stack(tmp_path, ["a"], policy=policy, policy_wait_s=600.0)
    (gated,) = await _submit(sched, ["a"], min_policy_version=3)
    await asyncio.sleep(0.1)
    assert sched.running == 1 and reg.get(gated.rollout_id).status is RolloutStatus.PENDING
    await asyncio.wait_for(sched.drain(grace_s=30.0), timeout=5.0)
    g = reg.get(gated.rollout_id)
    assert g.status is RolloutStatus.CANCELLED and g.failure_reason == STOPPING_REASON
    assert backend.attempts == {} and [k for k, _ in events.log] == ["submitted", "finished"]  # never started
    policy.version = 3
    await sched.close()
    assert reg.get(gated.rollout_id).status is RolloutStatus.CANCELLED


async def test_unknown_task_is_refused_at_submit(tmp_path: Path) -> None:
    from openforge_core.errors import NotFound

    sched, _, _, events = _stack(tmp_path, ["a"])
    with pytest.raises(NotFound):
        await _submit(sched, ["a", "missing"])
    assert events.log == []


async def test_harness_not_installed_is_refused_at_submit(tmp_path: Path) -> None:
    from openforge_core.errors import FailedPrecondition
    from openforge_orchestrator.harnesses.launches import LaunchFactory

    events = Events()
    reg = RolloutRegistry(events)
    sessions = FakeSessions()
    catalog = _catalog(tmp_path, ["a"])
    launches = LaunchFactory(tmp_path / "no-installs")
    executor = RolloutExecutor(
        reg, catalog, FakeBackend(sessions), sessions, launches, None, ExecutionSettings(max_infra_attempts=3)
    )
    sched = Scheduler(
        reg,
        executor,
        max_concurrent=4,
        max_per_task=2,
        validate_task=lambda ref: _check(catalog, ref),
        validate_harness=launches.check_installed,
    )
    submit = {
        "request_id": "q",
        "run_id": "run",
        "tasks": [TaskRef("a", "s")],
        "group_size": 2,
        "model_name": "m",
        "min_policy_version": 0,
        "timeout_s": 0.0,
    }
    with pytest.raises(FailedPrecondition) as err:
        await sched.submit(harness="codex", **submit)
    assert err.value.reason == "HARNESS_NOT_INSTALLED"
    assert "openforge harness install codex" in str(err.value)
    assert events.log == []  # nothing accepted, nothing published
    # `command` needs no install; an unknown name is left to the request's own validation.
    assert len(await sched.submit(harness="command", **{**submit, "request_id": "q2"})) == 2
    from openforge_core.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        await sched.submit(harness="codx", **{**submit, "request_id": "q3"})
    await sched.close()


class Manifests:
    """Records each run's completed manifest; ``fail`` publications raise first."""

    def __init__(self) -> None:
        self.published: list[tuple[str, LaunchManifest]] = []
        self.fail = 0

    async def launched(self, rollout: Rollout, manifest: LaunchManifest) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("nats down")
        self.published.append((rollout.run_id, manifest))


SERVED = ServedModel("sha256:tok", "sha256:tpl", ("family:hermes", "tool_call:hermes", "reasoning:hermes"))


async def test_each_run_s_manifest_is_completed_once_at_its_first_launch_with_a_served_model(tmp_path: Path) -> None:
    sessions = FakeSessions()
    manifests = Manifests()
    sched, reg, _, _ = _stack(tmp_path, ["a", "b"], sessions=sessions, manifests=manifests)
    # the proxy has not loaded the model yet: nothing to complete the manifest with
    first = await _submit(sched, ["a"], request_id="q0")
    assert [r.status for r in await _done(reg, [r.rollout_id for r in first])] == [RolloutStatus.SUCCEEDED]
    assert manifests.published == []
    sessions.served = SERVED
    manifests.fail = 1  # the first publication fails: the rollout goes on, the next launch publishes
    rollouts = await _submit(sched, ["a", "b"], 2, request_id="q1")
    rollouts += await _submit(sched, ["a"], request_id="q2", run_id="other")
    done = await _done(reg, [r.rollout_id for r in rollouts])
    assert {r.status for r in done} == {RolloutStatus.SUCCEEDED}
    assert sorted(run for run, _ in manifests.published) == ["other", "run"]  # once per run
    catalog = TaskCatalog(tmp_path)
    for _, manifest in manifests.published:
        assert manifest.served == SERVED
        assert manifest.verifier_version == catalog.verifier_version()
        assert manifest.sandbox_image_digest == ""  # the fake backend runs no image
        assert manifest.harness_version == "" and manifest.harness_config_hash.startswith("sha256:")
    await sched.close()
