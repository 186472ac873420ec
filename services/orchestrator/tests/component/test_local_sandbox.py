"""The local (bubblewrap) backend: oracles score 1.0, untouched workspaces 0.0, isolation holds.

Every task of ``examples/tasks`` runs twice in real sandboxes: its oracle ``solution/solve.sh``
(the verifier must write 1.0) and no agent at all (the verifier must write 0.0, so no task
is solved by its starting state). The isolation tests run probes inside a sandbox and check
that no address but the proxy bridge leads anywhere, and that each attempt is recorded.
Skips when ``bwrap`` is missing (Debian package ``bubblewrap``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from openforge_orchestrator.backends.local import BRIDGE_PORT, LocalBackend
from openforge_orchestrator.domain.sandbox import ExecutionPlan, ExecutionResult, HarnessLaunch
from openforge_orchestrator.domain.tasks import Task, TaskCatalog
from openforge_orchestrator.settings import LocalSandboxSettings

ROOT = Path(__file__).resolve().parents[4]
CATALOG = TaskCatalog(ROOT / "examples" / "tasks")
INTERPRETER_TOP = Path(os.path.realpath(sys.base_prefix)).parts[1]
ALL_TASKS = [(s, t) for s in CATALOG.sets() for t in CATALOG.ids(s)]

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(
        LocalSandboxSettings(root=str(tmp_path / "sb"), cache=str(tmp_path / "cache"), artifacts=""),
        "127.0.0.1:9",
    )


def _plan(task: Task, launch: HarnessLaunch | None, *, timeout_s: float = 60, verify: bool = True) -> ExecutionPlan:
    return ExecutionPlan(
        rollout_id=f"ro-{task.task_id}",
        task=task,
        launch=launch,
        agent_timeout_s=timeout_s,
        verifier_timeout_s=60,
        with_proxy=launch is not None,
        run_verifier=verify,
    )


def test_the_task_set_has_at_least_30_tasks_split_train_and_test() -> None:
    assert CATALOG.sets() == ["test", "train"]
    assert len(ALL_TASKS) >= 30
    assert len(CATALOG.ids("test")) >= 5
    for task_set, task_id in ALL_TASKS:
        task = CATALOG.get(task_set, task_id)
        assert task.solution_script is not None and task.instruction.strip()


async def test_every_oracle_earns_1_and_every_untouched_workspace_earns_0(backend: LocalBackend) -> None:
    sem = asyncio.Semaphore(2)

    async def both(task: Task) -> tuple[str, ExecutionResult, ExecutionResult]:
        async with sem:
            oracle = await backend.execute(_plan(task, None))
            noop = await backend.execute(_plan(task, HarnessLaunch(name="command", argv=("true",))))
            return task.key, oracle, noop

    results = await asyncio.gather(*(both(CATALOG.get(s, t)) for s, t in ALL_TASKS))
    for key, oracle, noop in results:
        assert oracle.exit_code == 0, (key, oracle.stderr_tail)
        assert oracle.reward is not None and oracle.reward.value == 1.0, (key, oracle.verifier_output)
        assert noop.reward is not None and noop.reward.value == 0.0, (key, noop.verifier_output)
        assert oracle.blocked_destinations == () and noop.blocked_destinations == ()
    assert {r.reward.source for _, r, _ in results if r.reward} == {"reward.txt", "reward.json"}


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP server on the host's loopback that a sandbox must not reach."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


@pytest.fixture
async def fake_proxy() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP server standing for the proxy (a fake: it answers every request with 'proxied')."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nproxied")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], seen
    server.close()


PROBE = """
import json, socket, sys, urllib.request
out = {}
def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__
out["outside"] = connect("203.0.113.7", 443)
out["host_loopback"] = connect("127.0.0.1", int(sys.argv[1]))
out["ipv6"] = connect("2001:db8::1", 80)
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = type(exc).__name__
out["proxy"] = urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % BRIDGE, timeout=5).read().decode()
out["ifaces"] = [name for _, name in socket.if_nameindex()]
print(json.dumps(out))
"""


async def test_a_sandbox_reaches_the_proxy_and_no_other_address(
    tmp_path: Path, host_listener: int, fake_proxy: tuple[int, list[bytes]]
) -> None:
    proxy_port, seen = fake_proxy
    backend = LocalBackend(
        LocalSandboxSettings(root=str(tmp_path / "sb"), cache=str(tmp_path / "cache"), artifacts=""),
        f"127.0.0.1:{proxy_port}",
    )
    probe = PROBE.replace("BRIDGE", str(BRIDGE_PORT))
    launch = HarnessLaunch(name="command", argv=("python3", "-c", probe, str(host_listener)))
    result = await backend.execute(_plan(CATALOG.get("train", "hello-world"), launch, verify=False))
    assert result.exit_code == 0, result.stderr_tail
    out = json.loads(result.stdout_tail)
    assert out["outside"] == "ConnectionRefusedError"  # routed to lo, refused, recorded
    assert out["host_loopback"] == "ConnectionRefusedError"  # the sandbox's loopback is its own
    assert out["ipv6"] in ("ConnectionRefusedError", "OSError")
    assert out["dns"] == "gaierror"
    assert out["proxy"] == "proxied" and len(seen) == 1 and seen[0].startswith(b"GET /v1/models")
    assert out["ifaces"] == ["lo"]
    assert "tcp 203.0.113.7:443" in result.blocked_destinations
    assert "udp 192.0.2.53:53 (dns example.com)" in result.blocked_destinations
    assert result.proxy_connections == 1
    assert not any(p.name.startswith("ro-") for p in (tmp_path / "sb").iterdir())  # removed


async def test_the_harness_has_no_capabilities_and_sees_only_its_workspace(backend: LocalBackend) -> None:
    script = "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; ls /"
    launch = HarnessLaunch(name="command", argv=("/bin/sh", "-c", script))
    result = await backend.execute(_plan(CATALOG.get("train", "count-lines"), launch, verify=False))
    caps = dict(line.split(":\t") for line in result.stdout_tail.splitlines() if line.startswith("Cap"))
    assert set(caps.values()) == {"0000000000000000"}
    top = {line for line in result.stdout_tail.splitlines() if not line.startswith("Cap")}
    interpreter = {INTERPRETER_TOP}  # the orchestrator's Python, visible read-only
    system = {"bin", "sbin", "lib", "lib64", "lib32", "libx32", "usr", "etc", "dev", "proc", "tmp", "var"}
    ours = {"app", "root", "logs", "run"}
    assert {"app", "usr", "tmp", "proc", "logs"} <= top
    assert top <= system | ours | interpreter, top - (system | ours | interpreter)


async def test_the_harness_is_killed_at_its_timeout_and_the_verifier_still_runs(backend: LocalBackend) -> None:
    launch = HarnessLaunch(name="command", argv=("/bin/sh", "-c", "echo started; sleep 600 & sleep 600"))
    task = CATALOG.get("train", "hello-world")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result = await backend.execute(_plan(task, launch, timeout_s=2))
    assert result.timed_out and result.exit_code is None
    assert 2 <= loop.time() - t0 < 20
    assert result.stdout_tail.startswith("started")
    assert result.reward is not None and result.reward.value == 0.0


async def test_cancelling_stops_the_sandbox_and_removes_it(backend: LocalBackend, tmp_path: Path) -> None:
    launch = HarnessLaunch(name="command", argv=("sleep", "600"))
    run = asyncio.create_task(backend.execute(_plan(CATALOG.get("train", "hello-world"), launch)))
    await asyncio.sleep(1.0)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not any(p.name.startswith("ro-") for p in (tmp_path / "sb").iterdir())
