"""`openforge up` brings all five services to SERVING; `openforge down` leaves no process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from openforge_cli import local
from openforge_testing.servers import free_port, free_port_block

#: The Grafana dashboard for a cluster's Prometheus (``deploy/grafana``).
GRAFANA_DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "openforge.json"
#: The sample names a metric family of each type serves.
_SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _dashboard_metrics() -> set[str]:
    """The metric names the Grafana dashboard's queries read (label names and matchers left out)."""
    panels = json.loads(GRAFANA_DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(exprs) >= 10, exprs
    bare = [re.sub(r"\{[^}]*\}|\bby \([^)]*\)", "", e) for e in exprs]
    return {m for e in bare for m in re.findall(r"\b(?:openforge|process|grpc)_[a-z_]+\b", e)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "openforge"
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


async def _max_payload(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return nc.max_payload
    finally:
        await nc.close()


def test_up_status_down_leaves_nothing(tmp_path: Path) -> None:
    base = free_port_block(5)
    nats_port = free_port()
    t0 = time.monotonic()
    up = _cli(
        "up",
        "--detach",
        "--state-dir",
        "st",
        "--base-port",
        str(base),
        "--nats-port",
        str(nats_port),
        "--http-port",
        str(free_port()),
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - t0
    assert up.returncode == 0, up.stdout + up.stderr
    assert elapsed < 60
    state = local.UpState.load(tmp_path / "st")
    assert state is not None and len(state.processes) == 6
    for p in state.processes:
        if p.name != "nats":
            status = asyncio.run(local.health(p.address))
            assert status == health_pb2.HealthCheckResponse.ServingStatus.Name(health_pb2.HealthCheckResponse.SERVING)
    st = _cli("status", "--state-dir", "st", cwd=tmp_path)
    assert st.returncode == 0 and st.stdout.count("SERVING") == 5
    assert st.stdout.count(" MiB") == 5, st.stdout  # each service's memory, from its metrics
    served: set[str] = set()  # every sample name some service serves (or will, once labelled)
    for p in state.processes:  # Prometheus scrapes each service: process figures, and its calls
        if p.name != "nats":
            with urllib.request.urlopen(f"http://{p.metrics}/metrics", timeout=5) as resp:
                families = list(text_string_to_metric_families(resp.read().decode()))
            samples = [s for f in families for s in f.samples]
            served |= {f.name + suffix for f in families for suffix in _SAMPLE_SUFFIXES.get(f.type, ("",))}
            found = {s.name: s for s in samples if not s.labels}
            assert found["process_resident_memory_bytes"].value > 10 * 2**20, p.name
            assert found["process_cpu_seconds_total"].value > 0, p.name
            health_checks = [
                s.value
                for s in samples
                if s.name == "grpc_server_handled_total"
                and s.labels["grpc_method"] == "Check"
                and s.labels["grpc_code"] == "OK"
            ]
            assert health_checks and health_checks[0] >= 2, p.name  # `up`'s wait, `local.health`, `status`
    wanted = _dashboard_metrics()  # the Grafana dashboard reads only what the services serve
    assert {"openforge_train_metric", "openforge_rollouts_finished_total", "process_cpu_seconds_total"} <= wanted
    assert wanted - served == set(), sorted(served)
    assert asyncio.run(_max_payload(state.nats_url)) == 8 * 1024 * 1024  # as deploy/k8s's NATS
    again = _cli(
        "up",
        "--detach",
        "--state-dir",
        "st",
        "--base-port",
        str(base),
        "--nats-port",
        str(nats_port),
        cwd=tmp_path,
    )
    assert again.returncode != 0 and "already up" in again.stderr
    down = _cli("down", "--state-dir", "st", cwd=tmp_path)
    assert down.returncode == 0
    assert not any(_alive(p.pid) for p in state.processes)
    assert _cli("status", "--state-dir", "st", cwd=tmp_path).returncode == 1


def test_up_fails_cleanly_when_a_service_cannot_start(tmp_path: Path) -> None:
    env_model = tmp_path / "no-such-model"
    with_bad_env = {**os.environ, "OPENFORGE_MODEL_PATH": str(env_model)}
    base = free_port_block(5)
    res = subprocess.run(
        [
            str(Path(sys.executable).parent / "openforge"),
            "up",
            "--detach",
            "--state-dir",
            "st",
            "--base-port",
            str(base),
            "--nats-port",
            str(free_port()),
            "--timeout",
            "30",
        ],
        cwd=tmp_path,
        env=with_bad_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    assert "inference" in res.stderr
    assert local.UpState.load(tmp_path / "st") is None  # everything started was stopped again


def test_up_in_the_foreground_restarts_a_killed_service_and_stops_on_sighup(tmp_path: Path) -> None:
    """`openforge up` supervises: a service killed with SIGKILL is SERVING again under a new pid
    (recorded for `down`/`status`); closing the terminal (SIGHUP) stops everything."""
    exe = Path(sys.executable).parent / "openforge"
    base = free_port_block(5)
    proc = subprocess.Popen(
        [
            str(exe),
            "up",
            "--state-dir",
            "st",
            "--base-port",
            str(base),
            "--nats-port",
            str(free_port()),
            "--http-port",
            str(free_port()),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # until up says everything is SERVING and supervised
            seen.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        assert "Press Ctrl-C to stop.\n" in seen, "".join(seen)
        state = local.UpState.load(tmp_path / "st")
        assert state is not None and len(state.processes) == 6
        killed = next(p for p in state.processes if p.name == "orchestrator")
        os.killpg(killed.pid, signal.SIGKILL)
        new = None
        while time.monotonic() < deadline:
            again = local.UpState.load(tmp_path / "st")
            assert again is not None
            new = next(p for p in again.processes if p.name == "orchestrator")
            if new.pid != killed.pid and asyncio.run(local.health(new.address)) == "SERVING":
                break
            time.sleep(0.5)
        assert new is not None and new.pid != killed.pid and _alive(new.pid)
        log = (tmp_path / "st" / "logs" / "supervisor.log").read_text()
        assert f"orchestrator (pid {killed.pid}) exited with -9" in log and f"restarted (pid {new.pid})" in log
        proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert not _alive(new.pid)
        final = local.UpState.load(tmp_path / "st")
        assert final is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        local.down(tmp_path / "st")


def test_up_in_the_foreground_ends_when_down_runs_in_another_terminal(tmp_path: Path) -> None:
    """`openforge down` from elsewhere stops a foreground `up`'s services (its supervisor restarts
    none of them and reaps them, so `down` does not wait out its grace on zombies) and the
    foreground `up` returns."""
    exe = Path(sys.executable).parent / "openforge"
    args = ["--base-port", str(free_port_block(5)), "--nats-port", str(free_port()), "--http-port", str(free_port())]
    proc = subprocess.Popen(
        [str(exe), "up", "--state-dir", "st", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        assert "Press Ctrl-C to stop.\n" in seen, "".join(seen)
        state = local.UpState.load(tmp_path / "st")
        assert state is not None
        t0 = time.monotonic()
        down = _cli("down", "--state-dir", "st", cwd=tmp_path)
        took = time.monotonic() - t0
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        assert took < 30  # no stage waited out its grace (15 s) on an unreaped child
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "stopped by `openforge down`" in out, out
        assert not any(_alive(p.pid) for p in state.processes)
        log = tmp_path / "st" / "logs" / "supervisor.log"
        assert not log.exists() or "restart" not in log.read_text()  # nothing restarted or scheduled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        local.down(tmp_path / "st")
