"""The supervisor of `openforge up`/`train` restarts a process that exits, with backoff, and gives
up on one that keeps exiting (real child processes; the clock is injected)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from openforge_cli import local

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stack(tmp_path: Path, argv: list[str]) -> tuple[local.UpState, subprocess.Popen[bytes]]:
    log = tmp_path / "logs" / "svc.log"
    proc = local._spawn(argv, {}, log)
    state = local.UpState(nats_url="nats://x", processes=[local.ProcessInfo("svc", proc.pid, "127.0.0.1:1", str(log))])
    state.save(tmp_path)
    return state, proc


def _exited(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=30)


def test_a_process_that_exits_is_started_again_after_a_growing_wait(tmp_path: Path) -> None:
    state, proc = _stack(tmp_path, CRASHER)
    clock = Clock()
    sup = local.Supervisor(
        tmp_path, state, {"svc": (SLEEPER, {}, proc)}, backoff_s=1.0, max_restarts=3, clock=clock, window_s=100
    )
    try:
        assert _exited(proc) == 3
        sup.check()  # seen: the restart is due in 1 s
        assert sup.restarts == []
        clock.now += 1.0
        sup.check()
        assert [(name, code) for name, code, _ in sup.restarts] == [("svc", 3)]
        new_pid = sup.restarts[0][2]
        saved = local.UpState.load(tmp_path)
        assert saved is not None and saved.processes[0].pid == new_pid != proc.pid  # `down` finds it
        assert local._alive(new_pid)
        # it dies again: the next wait is twice as long
        local.stop_group(new_pid, grace_s=5)
        sup.check()
        clock.now += 1.0
        sup.check()
        assert len(sup.restarts) == 1
        clock.now += 1.0
        sup.check()
        assert len(sup.restarts) == 2 and sup.failure == ""
        log = (tmp_path / "logs" / "supervisor.log").read_text()
        assert "svc (pid" in log and "restarting in 2s" in log
    finally:
        sup.stop()
        for _, _, pid in sup.restarts:
            local.stop_group(pid, grace_s=5)


def test_a_process_that_keeps_exiting_is_given_up_with_its_log(tmp_path: Path) -> None:
    state, proc = _stack(tmp_path, CRASHER)
    clock = Clock()
    failures: list[str] = []
    sup = local.Supervisor(
        tmp_path,
        state,
        {"svc": (CRASHER, {}, proc)},
        backoff_s=1.0,
        backoff_max_s=2.0,
        max_restarts=2,
        window_s=100,
        clock=clock,
        on_failure=failures.append,
    )
    for _ in range(20):
        sup.check()
        clock.now += 2.0
        time.sleep(0.05)
        if sup.failure:
            break
    assert len(sup.restarts) == 2
    assert sup.failure.startswith("svc exited with 3 after 2 restarts within 100s; given up (log: ")
    assert sup.failure.endswith("svc.log)")
    assert failures == [sup.failure]
    sup.check()  # given up: nothing more is started
    assert len(sup.restarts) == 2


def test_restarts_long_ago_do_not_count_against_the_limit(tmp_path: Path) -> None:
    state, proc = _stack(tmp_path, CRASHER)
    clock = Clock()
    sup = local.Supervisor(
        tmp_path, state, {"svc": (CRASHER, {}, proc)}, backoff_s=1.0, max_restarts=1, window_s=10, clock=clock
    )
    _exited(proc)
    sup.check()
    clock.now += 1.0
    sup.check()
    assert len(sup.restarts) == 1
    _exited(sup._children["svc"].proc)
    clock.now += 60.0  # the restart left the window
    sup.check()
    assert sup.failure == ""
    clock.now += 1.0
    sup.check()
    assert len(sup.restarts) == 2


def test_while_down_runs_elsewhere_nothing_is_restarted_and_what_it_stops_is_reaped(tmp_path: Path) -> None:
    state, proc = _stack(tmp_path, SLEEPER)
    clock = Clock()
    sup = local.Supervisor(tmp_path, state, {"svc": (SLEEPER, {}, proc)}, backoff_s=1.0, clock=clock)
    try:
        (tmp_path / local.STOPPING_FILE).touch()  # `openforge down` in another terminal
        proc.kill()
        for _ in range(100):
            sup.check()
            if proc.returncode is not None:
                break
            time.sleep(0.05)
        assert proc.returncode is not None  # reaped: no zombie for that `down` to wait on
        clock.now += 60
        sup.check()
        assert sup.restarts == [] and not (tmp_path / "logs" / "supervisor.log").exists()
    finally:
        sup.stop()


def test_down_waits_for_the_orchestrator_s_drain_as_it_was_started() -> None:
    assert local.drain_wait_s({local.DRAIN_ENV: "120"}) == 120.0
    assert local.drain_wait_s({}) == local.drain_wait_s({local.DRAIN_ENV: "x"}) == local.DRAIN_WAIT_S
