"""Local sandboxes: the key's files, clean-up on every exit path and after a crash, the bridge
under connection churn, and the key bound to its sandbox. Real bubblewrap sandboxes.

The proxy is a fake here (a TCP server that answers every request and records its head).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from openforge_orchestrator.backends import cgroups
from openforge_orchestrator.backends.gate import MAX_HEAD, RequestGate
from openforge_orchestrator.backends.local import LOCK_SUFFIX, LocalBackend, write_private
from openforge_orchestrator.domain.sandbox import ExecutionPlan, ExecutionResult, HarnessLaunch
from openforge_orchestrator.domain.tasks import TaskCatalog
from openforge_orchestrator.settings import LocalSandboxSettings

ROOT = Path(__file__).resolve().parents[4]
CATALOG = TaskCatalog(ROOT / "examples" / "tasks")
TASK = CATALOG.get("train", "hello-world")
KEY = "ofk-" + "a1" * 16
OTHER_KEY = "ofk-" + "b2" * 16

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


class FakeProxy:
    """A fake proxy: answers every request ``200 proxied`` (keep-alive) and records its head."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nproxied")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FakeProxy]:
    p = FakeProxy()
    await p.start()
    yield p
    p.close()


def _backend(root: Path, proxy_port: int = 9, pids: int = 1024) -> LocalBackend:
    return LocalBackend(
        LocalSandboxSettings(root=str(root / "sb"), cache=str(root / "cache"), artifacts="", pids=pids),
        f"127.0.0.1:{proxy_port}",
    )


def _plan(argv: tuple[str, ...], *, rollout_id: str = "ro-sec", timeout_s: float = 60, key: str = KEY) -> ExecutionPlan:
    launch = HarnessLaunch(
        name="command",
        argv=argv,
        env={"OPENAI_API_KEY": key},
        files={"/root/.config/harness/settings.json": json.dumps({"apiKey": key})},
    )
    return ExecutionPlan(
        rollout_id=rollout_id,
        task=TASK,
        launch=launch,
        agent_timeout_s=timeout_s,
        verifier_timeout_s=30,
        run_verifier=False,
        api_key=key,
    )


async def _wait_for(predicate: object, timeout_s: float = 30.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def _sandboxes(root: Path) -> list[Path]:
    if not (root / "sb").is_dir():
        return []
    return [p for p in (root / "sb").iterdir() if p.name.startswith("ro-") and p.is_dir()]


# --- files holding the key ------------------------------------------------------------------


def test_a_private_file_is_0600_whatever_the_umask_and_never_written_through_a_link(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write_private(tmp_path / "config.json", KEY)
    finally:
        os.umask(old)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o600
    (tmp_path / "target").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        write_private(tmp_path / "link", KEY)
    assert (tmp_path / "target").read_text() == ""


async def test_files_holding_the_key_are_0600_in_a_0700_sandbox(tmp_path: Path, proxy: FakeProxy) -> None:
    backend = _backend(tmp_path, proxy.port)
    script = "stat -c '%a %n' /run/openforge/config.json /root/.config/harness/settings.json; sleep 3"
    run = asyncio.create_task(backend.execute(_plan(("/bin/sh", "-c", script))))
    await _wait_for(lambda: any((sb / "run" / "config.json").exists() for sb in _sandboxes(tmp_path)))
    (sb,) = _sandboxes(tmp_path)
    assert KEY in (sb / "run" / "config.json").read_text()
    assert sb.stat().st_mode & 0o777 == 0o700
    assert (sb / "run" / "config.json").stat().st_mode & 0o777 == 0o600
    assert (sb / "home" / ".config" / "harness" / "settings.json").stat().st_mode & 0o777 == 0o600
    assert backend.socket_of(sb).parent.stat().st_mode & 0o777 == 0o700
    result = await run
    assert result.exit_code == 0, result.stderr_tail
    assert result.stdout_tail.split() == [
        "600",
        "/run/openforge/config.json",
        "600",
        "/root/.config/harness/settings.json",
    ]


async def test_the_sandbox_cpu_time_and_peak_memory_are_read_from_its_cgroup(tmp_path: Path) -> None:
    """What the harness's processes used, summed over all of them (a child included)."""
    backend = _backend(tmp_path)
    burn = "dd if=/dev/zero of=/dev/null bs=1M count=4000 2>/dev/null"
    grow = "dd if=/dev/zero of=/dev/null bs=96M count=1 2>/dev/null"  # one 96 MiB buffer
    result = await backend.execute(_plan(("/bin/sh", "-c", f"{burn}; ({grow})")))
    assert result.exit_code == 0, result.stderr_tail
    if cgroups.detect().kind == "none":  # an unprivileged container: nothing accounted
        assert (result.cpu_s, result.peak_memory_bytes) == (None, None)
        return
    assert result.cpu_s is not None and 0.05 < result.cpu_s < 60
    assert result.peak_memory_bytes is not None and result.peak_memory_bytes >= 96 * 2**20


# --- removal on every exit path ---------------------------------------------------------------


EXIT_PATHS = {
    "normal": ("/bin/sh", "-c", "sleep 1"),
    "harness_crash": ("/bin/sh", "-c", "sleep 1; kill -SEGV $$"),
    "timeout": ("sleep", "600"),
    "cancelled": ("sleep", "600"),
    "backend_closed": ("sleep", "600"),
}


@pytest.mark.parametrize("path", list(EXIT_PATHS))
async def test_the_sandbox_its_key_files_socket_and_lock_are_removed_on_every_exit_path(
    tmp_path: Path, proxy: FakeProxy, path: str
) -> None:
    backend = _backend(tmp_path, proxy.port)
    run = asyncio.create_task(backend.execute(_plan(EXIT_PATHS[path], timeout_s=2 if path == "timeout" else 60)))
    await _wait_for(lambda: any((sb / "run" / "config.json").exists() for sb in _sandboxes(tmp_path)))
    (sb,) = _sandboxes(tmp_path)
    sock = backend.socket_of(sb)
    lock = sb.with_name(sb.name + LOCK_SUFFIX)
    assert sock.exists() and lock.exists()
    if path == "cancelled":
        await asyncio.sleep(0.5)
        run.cancel()
    elif path == "backend_closed":
        await asyncio.sleep(0.5)
        await backend.close()
    try:
        result: ExecutionResult | None = await run
    except asyncio.CancelledError:
        result = None
    assert (result is None) == (path in ("cancelled", "backend_closed"))
    if path == "timeout":
        assert result is not None and result.timed_out
    if path == "harness_crash":
        assert result is not None and result.exit_code == 128 + signal.SIGSEGV
    assert not sb.exists() and not sock.exists() and not lock.exists()
    assert sorted(p.name for p in (tmp_path / "sb").iterdir()) == [".static"]


CRASHING_ORCHESTRATOR = textwrap.dedent(
    """
    import asyncio, json, signal, sys
    from pathlib import Path
    from openforge_orchestrator.backends.local import LocalBackend
    from openforge_orchestrator.domain.sandbox import ExecutionPlan, HarnessLaunch
    from openforge_orchestrator.domain.tasks import TaskCatalog
    from openforge_orchestrator.settings import LocalSandboxSettings

    root, tasks, port = sys.argv[1], sys.argv[2], sys.argv[3]

    async def main():
        backend = LocalBackend(
            LocalSandboxSettings(root=root + "/sb", cache=root + "/cache", artifacts=""), "127.0.0.1:" + port
        )
        await backend.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        plan = ExecutionPlan(
            rollout_id="ro-crash", task=TaskCatalog(Path(tasks)).get("train", "hello-world"),
            launch=HarnessLaunch(name="command", argv=("sleep", "600"), env={"OPENAI_API_KEY": "K"}),
            agent_timeout_s=600, verifier_timeout_s=30, run_verifier=False, api_key="K",
        )
        run = asyncio.create_task(backend.execute(plan))
        await stop.wait()
        await backend.close()
        print("closed", run.cancelled(), flush=True)

    asyncio.run(main())
    """
)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _cgroups_of(sb: Path) -> list[Path]:
    """The cgroup folders (v1 or v2) of the sandbox folder ``sb``."""
    root = Path("/sys/fs/cgroup")
    found = list(root.glob(f"*/openforge-sandboxes/{sb.name[:40]}-*"))
    found += list(root.glob(f"openforge-sandboxes/{sb.name[:40]}-*"))
    return [p for p in found if p.is_dir()]


def _pids_mentioning(text: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_an_orchestrator_stopped_cleans_up_and_one_killed_is_cleaned_up_after_by_the_next(
    tmp_path: Path, proxy: FakeProxy, how: str
) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once; waited for in a thread)
        [sys.executable, "-c", CRASHING_ORCHESTRATOR, str(tmp_path), str(ROOT / "examples" / "tasks"), str(proxy.port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await _wait_for(lambda: any((sb / "run" / "config.json").exists() for sb in _sandboxes(tmp_path)), 60)
        (sb,) = _sandboxes(tmp_path)
        await _wait_for(lambda: b'"started"' in _read(sb / "run" / "report.jsonl"))  # the harness runs
        view = _backend(tmp_path, proxy.port)
        sock = view.socket_of(sb)
        lock = sb.with_name(sb.name + LOCK_SUFFIX)
        assert sock.exists() and lock.exists()
        os.kill(proc.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how == "sigterm":
        await _wait_for(lambda: not _pids_mentioning(str(sb / "app")))
        assert out.decode().splitlines()[-1] == "closed True", (out + err).decode()[-2000:]
        assert not sb.exists() and not sock.exists() and not lock.exists()
        return
    # killed: everything is still there, key included
    assert (sb / "run" / "config.json").exists() and sock.exists() and lock.exists()
    left_cgroups = _cgroups_of(sb)
    assert bool(left_cgroups) == (cgroups.detect().kind != "none")
    # a live sandbox of another orchestrator on the same root is left alone
    live_backend = _backend(tmp_path, proxy.port)
    live = asyncio.create_task(live_backend.execute(_plan(("sleep", "600"), rollout_id="ro-live")))
    await _wait_for(
        lambda: any((p / "run" / "config.json").exists() for p in _sandboxes(tmp_path) if p.name.startswith("ro-live"))
    )
    restarted = _backend(tmp_path, proxy.port)
    await restarted.start()
    assert not sb.exists() and not sock.exists() and not lock.exists()
    assert not any(p.exists() for p in left_cgroups)
    await _wait_for(lambda: not _pids_mentioning(str(sb / "app")), 10)
    (live_sb,) = [p for p in _sandboxes(tmp_path) if p.name.startswith("ro-live")]
    assert live_sb.exists() and live_backend.socket_of(live_sb).exists() and not live.done()
    assert restarted.clean_stale() == 0
    live.cancel()
    with pytest.raises(asyncio.CancelledError):
        await live
    assert sorted(p.name for p in (tmp_path / "sb").iterdir()) == [".static"]


async def test_start_removes_only_sandboxes_whose_lock_nobody_holds(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    root.mkdir()
    stale = root / "_odd_rollout_id-0a1b2c"  # any sanitised rollout id
    (stale / "run").mkdir(parents=True)
    (stale / "run" / "config.json").write_text(KEY)
    (root / f"{stale.name}{LOCK_SUFFIX}").touch()
    foreign = [root / "notes", root / "ro-x-0a1b2c"]  # no lock file / a name that is not a sandbox's
    for f in foreign:
        f.mkdir()
    (root / "notes.lock").touch()
    sock = _backend(tmp_path / "elsewhere").socket_of(stale)  # its stale socket, made by hand
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
    backend = _backend(tmp_path)
    await backend.start()
    assert not stale.exists() and not (root / f"{stale.name}{LOCK_SUFFIX}").exists() and not sock.exists()
    assert all(f.exists() for f in foreign) and (root / "notes.lock").exists()
    assert backend.clean_stale() == 0


# --- the bridge under connection churn -------------------------------------------------------


CHURN = textwrap.dedent(
    """
    import http.client, json, socket, sys, threading
    port = 8080
    def call(conn=None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", "/v1/models")
        body = conn.getresponse().read()
        if own:
            conn.close()
        return body == b"proxied"
    out = {}
    out["sequential"] = sum(call() for _ in range(1200))
    # held open at once: with a thread (or two) per connection this passes the pids limit
    held = []
    for _ in range(300):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        held.append(c)
    out["held"] = sum(call(c) for c in held)
    results = []
    def worker():
        results.append(sum(call() for _ in range(10)))
    threads = [threading.Thread(target=worker) for _ in range(24)]
    for t in threads: t.start()
    for t in threads: t.join()
    out["concurrent"] = sum(results)
    out["after"] = call()
    for c in held: c.close()
    print(json.dumps(out))
    """
)


async def test_the_bridge_survives_connection_churn_under_a_small_pids_limit(tmp_path: Path, proxy: FakeProxy) -> None:
    backend = _backend(tmp_path, proxy.port, pids=128)
    result = await backend.execute(_plan(("python3", "-c", CHURN), timeout_s=300))
    assert result.exit_code == 0, result.stderr_tail
    out = json.loads(result.stdout_tail)
    assert out == {"sequential": 1200, "held": 300, "concurrent": 240, "after": True}
    assert result.proxy_connections == 1200 + 300 + 240 + 1
    assert proxy.connections == result.proxy_connections and len(proxy.heads) == result.proxy_connections


# --- the key bound to its sandbox --------------------------------------------------------------


KEYS = textwrap.dedent(
    """
    import json, socket, sys
    own, other = sys.argv[1], sys.argv[2]
    def send(raw):
        s = socket.create_connection(("127.0.0.1", 8080), timeout=10)
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        return data.split(b" ", 2)[1].decode() if data else "closed"
    def get(*fields):
        head = b"".join(f.encode() + b"\\r\\n" for f in fields)
        return send(b"GET /v1/models HTTP/1.1\\r\\nhost: x\\r\\n" + head + b"\\r\\n")
    smuggled = (
        "GET /v1/models HTTP/1.1\\r\\nauthorization: Bearer " + other + "\\r\\n\\r\\n"
    ).encode()
    out = {
        "own_bearer": get("Authorization: Bearer " + own),
        "own_x_api_key": get("x-api-key: " + own),
        "no_key": get(),
        "other_bearer": get("Authorization: Bearer " + other),
        "other_x_api_key": get("X-Api-Key: " + other),
        "other_behind_own": get("x-api-key: " + own, "authorization: Bearer " + other),
        "twice": get("authorization: Bearer " + own, "authorization: Bearer " + other),
        "cl_and_te": send(
            b"POST /v1/chat/completions HTTP/1.1\\r\\nx-api-key: " + own.encode()
            + b"\\r\\ncontent-length: 0\\r\\ntransfer-encoding: chunked\\r\\n\\r\\n"
            + b"%x\\r\\n" % len(smuggled) + smuggled + b"\\r\\n0\\r\\n\\r\\n"
        ),
        "pipelined": send(
            b"POST /v1/chat/completions HTTP/1.1\\r\\nx-api-key: " + own.encode()
            + b"\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(smuggled) + smuggled + smuggled
        ),
        "folded": get("x-api-key: " + own, " continued"),
    }
    print(json.dumps(out))
    """
)


async def test_a_key_works_only_from_its_own_sandbox(tmp_path: Path, proxy: FakeProxy) -> None:
    backend = _backend(tmp_path, proxy.port)
    result = await backend.execute(_plan(("python3", "-c", KEYS, KEY, OTHER_KEY)))
    assert result.exit_code == 0, result.stderr_tail
    out = json.loads(result.stdout_tail)
    # the first request's body passes on as a body; the request after it (another key) is
    # refused, which ends the connection, before or after the first answer came back
    assert out.pop("pipelined") in ("200", "closed")
    assert out == {
        "own_bearer": "200",
        "own_x_api_key": "200",
        "no_key": "200",
        "other_bearer": "403",
        "other_x_api_key": "403",
        "other_behind_own": "403",
        "twice": "400",
        "cl_and_te": "501",
        "folded": "400",
    }
    assert not any(OTHER_KEY.encode() in head for head in proxy.heads)
    assert sum(KEY.encode() in head for head in proxy.heads) == 3  # own_bearer, own_x_api_key, pipelined

    # the other key's own sandbox may use it
    other = await backend.execute(_plan(("python3", "-c", KEYS, OTHER_KEY, KEY), rollout_id="ro-other", key=OTHER_KEY))
    assert json.loads(other.stdout_tail)["own_bearer"] == "200"
    assert any(OTHER_KEY.encode() in head for head in proxy.heads)


async def test_the_gate_writes_requests_upstream_in_canonical_form(tmp_path: Path) -> None:
    received = bytearray()
    got_all = asyncio.Event()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            received.extend(chunk)
            if received.endswith(b"0\r\n\r\n"):
                got_all.set()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    gate = RequestGate(KEY, "127.0.0.1", server.sockets[0].getsockname()[1])
    path = tmp_path / "g.sock"
    front = await asyncio.start_unix_server(gate.handle, path=str(path), limit=MAX_HEAD)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"POST  /v1/responses HTTP/1.1\r\n\r\n")  # two spaces: refused
    assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
    writer.close()
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(
        b"\r\nPOST /v1/responses HTTP/1.1\r\nHost:x\r\nAuthorization:   Bearer " + KEY.encode() + b"  \r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        b"A;ext=1\r\n0123456789\r\n3 \r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n"
    )
    await writer.drain()
    await asyncio.wait_for(got_all.wait(), 10)
    assert bytes(received) == (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
        b"Transfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    writer.close()
    front.close()
    server.close()
    assert gate.connections == 2 and gate.refused == 1
