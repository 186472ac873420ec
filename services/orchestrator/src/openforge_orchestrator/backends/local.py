"""The ``local`` sandbox backend: one bubblewrap sandbox per rollout on this machine.

Design
------
* **Filesystem.** A fresh tmpfs root holding: the host's ``/usr`` (and the ``/bin``, ``/lib``...
  links), a few files of ``/etc``, and the interpreter the orchestrator runs on, all read-only;
  the task's workspace (its Dockerfile's ``COPY``/``RUN`` done once per task and cached, then
  copied per rollout) read-write at the Dockerfile's ``WORKDIR`` (``/app`` by default); a
  private ``HOME`` (``/root``), ``/tmp`` and ``/logs/agent``; the harness install read-only at
  its own path. Nothing else of the host is visible. The sandbox folder is removed afterwards.
* **Network.** Every namespace is new (user, pid, net, ipc, uts, cgroup): the sandbox has only
  ``lo``. The proxy is reached through a unix socket of the sandbox's own, visible inside as
  ``/run/openforge/proxy.sock``: the host end (:mod:`gate`) forwards each request to the
  proxy's TCP address and refuses one that presents any key but the sandbox's own, so a
  rollout's key is bound to its sandbox. The sandbox's first process (:mod:`local_init`)
  bridges ``127.0.0.1:8080`` inside to that socket. So the harness's base URL is
  ``http://127.0.0.1:8080`` and no other address leads anywhere. That process also routes
  every other address to ``lo`` and records each connection attempt to one of them (bypass
  detection), then runs the harness with no capabilities.
* **Secrets and clean-up.** The sandbox folder is 0700 and every file the orchestrator writes
  into it (the init config, the harness's files: any may hold the key) is created 0600. Each
  sandbox has a lock file held while it exists; a restarted orchestrator removes the sandboxes,
  sockets and cgroups whose lock nobody holds (:meth:`LocalBackend.clean_stale`).
* **Limits.** A cgroup per sandbox (memory, pids, CPU; :mod:`cgroups`), the task's agent
  timeout (SIGKILL to the whole sandbox: killing bwrap ends its pid namespace), and
  ``RLIMIT_NOFILE``/``RLIMIT_CORE`` through the init process.
* **Verifier.** After the harness ended (or was killed), ``bash /tests/test.sh`` runs in a second
  sandbox over the same workspace, with ``/tests`` read-only and ``/logs/verifier`` writable,
  and no network at all; the reward is read as Harbor does (:mod:`domain.verifier`).

Needs ``bwrap`` (Debian package ``bubblewrap``) and user namespaces; runs as root or as a user
allowed to create user namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from openforge_orchestrator.backends import cgroups
from openforge_orchestrator.backends.gate import MAX_HEAD, RequestGate
from openforge_orchestrator.domain.sandbox import (
    AGENT_LOGS,
    SANDBOX_HOME,
    SANDBOX_RUN,
    SOLUTION_DIR,
    TESTS_DIR,
    VERIFIER_LOGS,
    ExecutionPlan,
    ExecutionResult,
    HarnessLaunch,
    SandboxStartError,
)
from openforge_orchestrator.domain.tasks import InvalidTask, Task
from openforge_orchestrator.domain.verifier import Reward, RewardError, parse_reward, tail
from openforge_orchestrator.settings import LocalSandboxSettings

log = structlog.get_logger(__name__)

#: Port the proxy bridge listens on inside every sandbox (each sandbox has its own network).
BRIDGE_PORT = 8080
#: A documentation address (RFC 5737) as the sandbox's DNS server: queries land on ``lo`` and
#: are recorded as attempts, instead of leaking to the host's resolver.
SINKHOLE_DNS = "192.0.2.53"
#: What a local sandbox isolates, after the bubblewrap version in the run manifest's
#: ``sandbox_image_digest`` (see the module docstring).
SANDBOX_DESCRIPTION = "local: new user, pid, net, ipc, uts and cgroup namespaces; host /usr read-only; the proxy only"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_FILES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "bash.bashrc",
    "profile",
    "inputrc",
    "os-release",
    "debian_version",
    "gitconfig",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INIT = Path(__file__).with_name("local_init.py")
_OUTPUT_TAIL = 8000

LOG_PREPARED = "sandbox.workspace_prepared"
LOG_STARTED = "sandbox.started"
LOG_TIMEOUT = "sandbox.timeout"
LOG_REMOVED = "sandbox.removed"
LOG_STALE = "sandbox.stale_removed"

#: Suffix of the lock file each live sandbox's orchestrator holds (``<root>/<name>.lock``).
LOCK_SUFFIX = ".lock"
#: A sandbox's name: ``<rollout_id, other characters as _, at most 64>-<6 hex>``
#: (:meth:`LocalBackend.execute`).
_SANDBOX_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}-[0-9a-f]{6}")


def _read_tail(path: Path, limit: int = _OUTPUT_TAIL) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            h.update(str(p.relative_to(folder)).encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


def write_private(path: Path, text: str) -> None:
    """Creates ``path`` with ``text``, mode 0600 from its creation (never readable by others).

    Raises:
        FileExistsError: ``path`` exists (or is a link): nothing is written through it.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def remove_tree(path: Path) -> None:
    """Removes ``path`` and everything below, also folders a harness made unwritable."""

    def retry(func: object, failed: str, _exc: object) -> None:
        parent = os.path.dirname(failed)
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=retry)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def owned_dir(path: Path) -> Path:
    """``path`` as a folder of this user: created 0700 when missing.

    Raises:
        SandboxStartError: It exists but is a link, not a folder, or someone else's.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SandboxStartError(f"{path} must be a folder of uid {os.getuid()}, not a link")
    return path


def private_dir(path: Path) -> Path:
    """``path`` as a folder of this user only: :func:`owned_dir`, narrowed to 0700.

    Raises:
        SandboxStartError: See :func:`owned_dir` (a shared folder such as ``/tmp`` could hold
            one planted by another user).
    """
    if owned_dir(path).lstat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


@dataclass
class _Run:
    exit_code: int | None
    timed_out: bool
    started_wall: float
    ended_wall: float


def _version_of(program: str) -> str:
    """``program --version``'s answer, stripped; "" when it cannot be read."""
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


class LocalBackend:
    """Runs rollouts in bubblewrap sandboxes (see the module docstring for the design).

    Args:
        settings: The backend's settings.
        proxy_http: ``host:port`` of the proxy's harness-facing HTTP server (host side).
        limiter: cgroup limiter (default: the best this machine allows).
    """

    proxy_base_url = f"http://127.0.0.1:{BRIDGE_PORT}"

    def __init__(self, settings: LocalSandboxSettings, proxy_http: str, limiter: cgroups.Limiter | None = None) -> None:
        self.settings = settings
        host, _, port = proxy_http.rpartition(":")
        self._proxy_host, self._proxy_port = host or "127.0.0.1", int(port)
        self.root = Path(settings.root).resolve()
        self.cache = Path(settings.cache).resolve()
        self.artifacts = Path(settings.artifacts).resolve() if settings.artifacts else None
        self._limiter = limiter
        self._bwrap: str | None = None
        self._bwrap_version: str | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        #: Task key → its prepared workspace folder (task folders are read once per process).
        self._prepared: dict[str, Path] = {}
        self._static: Path | None = None
        self._sockets: Path | None = None
        #: The :meth:`execute` calls in flight (cancelled by :meth:`close`).
        self._running: set[asyncio.Task[Any]] = set()
        self.python = os.path.realpath(sys.executable)
        self.python_prefix = os.path.realpath(sys.base_prefix)

    # --- set-up shared by every sandbox -----------------------------------------------------

    async def start(self) -> None:
        """Prepares the sandbox root and removes what a crashed orchestrator left in it.

        Raises:
            SandboxStartError: The root is not this user's folder, or the socket folder is not
                private to this user.
        """
        await asyncio.to_thread(self._ensure_dirs)

    def _ensure_dirs(self) -> Path:
        """The root and the socket folder, set up once; the first call cleans stale sandboxes."""
        if self._sockets is None:
            owned_dir(self.root)  # each sandbox in it is 0700
            # AF_UNIX paths are limited to 107 bytes: sockets live in a short private folder.
            sockets = private_dir(Path(tempfile.gettempdir()) / f"openforge-{os.getuid()}")
            if self._limiter is None:
                self._limiter = cgroups.detect()
            self._sockets = sockets
            self.clean_stale()
        return self._sockets

    def clean_stale(self) -> int:
        """Removes the sandboxes under the root whose orchestrator is gone; returns how many.

        Every sandbox ``<root>/<name>`` has a lock file ``<root>/<name>.lock``, created before
        the sandbox and held (``flock``) by its orchestrator until the sandbox, its proxy
        socket and its cgroup are removed. A lock file nobody holds marks what a crashed
        orchestrator left (the kernel drops the lock of a killed process); a held one, a
        sandbox of a live orchestrator sharing the root, is left alone, and so is a lock file of
        another user. Nothing is removed but the sandbox folder, its socket, its cgroup and
        processes started on it, all named after the lock file.
        """
        assert self._limiter is not None
        removed = 0
        for lock in sorted(self.root.glob(f"*{LOCK_SUFFIX}")):
            name = lock.name[: -len(LOCK_SUFFIX)]
            if not _SANDBOX_NAME.fullmatch(name):
                continue
            try:
                fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its orchestrator is alive
                if not self._still_at(lock, fd) or os.fstat(fd).st_uid != os.getuid():
                    continue
                sb = self.root / name
                sock = self.socket_of(sb)
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(sock.lstat().st_mode):
                        sock.unlink()
                self._limiter.remove(self._cgroup_name(sb))
                self._kill_leftovers(sb)
                remove_tree(sb)
                lock.unlink()
                removed += 1
            finally:
                os.close(fd)
        if removed:
            log.info(LOG_STALE, root=str(self.root), sandboxes=removed)
        return removed

    @staticmethod
    def _kill_leftovers(sb: Path) -> None:
        """SIGKILLs this user's processes started on the sandbox folder ``sb`` (its bwrap).

        ``--die-with-parent`` misses one case: the orchestrator dying while bwrap is still
        setting up (the sandbox's own first process is not yet tied to its parent), and without
        a cgroup nothing else finds it.
        """
        needle = f"{sb / 'app'}\0".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if proc.stat().st_uid == os.getuid() and needle in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)

    @staticmethod
    def _still_at(path: Path, fd: int) -> bool:
        try:
            return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def socket_of(self, sandbox: Path) -> Path:
        """The proxy socket the sandbox folder ``sandbox`` is served on (its host end)."""
        return self._ensure_dirs() / f"{self._ident(sandbox)}.sock"

    @staticmethod
    def _ident(sb: Path) -> str:
        """A short id unique to the sandbox's path (names its socket and cgroup)."""
        return hashlib.sha256(str(sb).encode()).hexdigest()[:16]

    def _cgroup_name(self, sb: Path) -> str:
        return f"{sb.name[:40]}-{self._ident(sb)[:8]}"

    def _claim(self, name: str) -> int:
        """Creates and locks ``<root>/<name>.lock``; returns its descriptor (see :meth:`clean_stale`)."""
        lock = self.root / f"{name}{LOCK_SUFFIX}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not self._still_at(lock, fd):  # a cleaner took it between creation and lock
            os.close(fd)
            raise OSError(errno.EAGAIN, f"the lock file of {name} was removed")
        return fd

    def _ensure_ready(self) -> str:
        self._ensure_dirs()
        found = self._find_bwrap()
        if found is None:
            raise SandboxStartError(f"bubblewrap not found ({self.settings.bwrap!r}): apt-get install -y bubblewrap")
        self.cache.mkdir(parents=True, exist_ok=True)
        if self._static is None:
            static = self.root / ".static"
            static.mkdir(exist_ok=True)
            (static / "hosts").write_text("127.0.0.1 localhost openforge-sandbox\n::1 localhost\n")
            (static / "resolv.conf").write_text(f"nameserver {SINKHOLE_DNS}\n")
            (static / "hostname").write_text("openforge-sandbox\n")
            self._static = static
        return found

    def _find_bwrap(self) -> str | None:
        """The ``bwrap`` executable's path (looked up once it is found), or None."""
        if self._bwrap is None:
            self._bwrap = shutil.which(self.settings.bwrap)
        return self._bwrap

    def _base_args(self, bwrap: str) -> list[str]:
        assert self._static is not None
        args = [
            bwrap,
            "--die-with-parent",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--hostname",
            "openforge-sandbox",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/var/tmp",
        ]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for name in ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for name in ("hosts", "resolv.conf", "hostname"):
            args += ["--ro-bind", str(self._static / name), f"/etc/{name}"]
        return args

    def _runtime_args(self, extra: tuple[str, ...] = ()) -> list[str]:
        """Read-only binds of the interpreter and harness installs; after the writable binds so
        that a HOME mounted over ``/root`` does not hide an install below it."""
        args: list[str] = []
        for path in (self.python_prefix, *self.settings.extra_ro_binds, *extra):
            if not path.startswith("/usr/") and os.path.exists(path):
                args += ["--ro-bind", path, path]
        return args

    def _limits(self, plan: ExecutionPlan) -> cgroups.Limits:
        return cgroups.Limits(
            memory_mb=plan.memory_mb(self.settings.memory_mb),
            cpus=plan.task.resources.cpus or self.settings.cpus,
            pids=self.settings.pids,
        )

    def _wrap(self, cgroup: cgroups.Cgroup | None, argv: list[str]) -> list[str]:
        """Puts the process into its cgroup before it becomes bwrap."""
        if cgroup is None:
            return argv
        files = " ".join(shlex.quote(str(f)) for f in cgroup.procs_files)
        return ["/bin/sh", "-c", f'echo $$ | tee {files} >/dev/null && exec "$@"', "sh", *argv]

    # --- workspaces -------------------------------------------------------------------------

    async def prepare_workspace(self, task: Task) -> Path:
        """The task's prepared workspace (``COPY`` and ``RUN`` of its Dockerfile done), cached.

        Raises:
            InvalidTask: A ``COPY`` outside the working folder, a missing source, or a ``RUN``
                that failed.
        """
        bwrap = self._ensure_ready()
        digest = hashlib.sha256((_tree_digest(task.environment_dir) + repr(task.environment)).encode()).hexdigest()[:16]
        folder = self.cache / task.task_set / f"{task.task_id}-{digest}"
        ws = folder / "ws"
        lock = self._locks.setdefault(str(folder), asyncio.Lock())
        async with lock:
            if (folder / ".ready").is_file():
                return ws
            tmp = folder.with_name(f"{folder.name}.tmp-{secrets.token_hex(4)}")
            try:
                await asyncio.to_thread(self._copy_sources, task, tmp / "ws")
                for command in task.environment.run:
                    await self._build_step(bwrap, task, tmp / "ws", command)
                (tmp / ".ready").touch()
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        log.info(LOG_PREPARED, task=task.key, steps=len(task.environment.run))
        self._prepared[task.key] = folder
        return ws

    def _copy_sources(self, task: Task, ws: Path) -> None:
        spec = task.environment
        workdir = PurePosixPath(spec.workdir)
        if workdir == PurePosixPath("/") or any(
            workdir == PurePosixPath(d) or PurePosixPath(d) in workdir.parents for d in (*SYSTEM_DIRS, "/etc")
        ):
            raise InvalidTask.field("environment/Dockerfile", f"WORKDIR {workdir} cannot be a sandbox workspace")
        ws.mkdir(parents=True)
        context = task.environment_dir.resolve()
        for src, dst in spec.copies:
            source = (context / src).resolve()
            if context != source and context not in source.parents:
                raise InvalidTask.field("environment/Dockerfile", f"COPY source {src!r} leaves the build context")
            if not source.exists():
                raise InvalidTask.field("environment/Dockerfile", f"COPY source {src!r} does not exist")
            target = PurePosixPath(dst.rstrip("/") or "/")
            if target != workdir and workdir not in target.parents:
                raise InvalidTask.field(
                    "environment/Dockerfile", f"COPY to {dst!r}: local sandboxes hold files only under {workdir}"
                )
            out = ws / target.relative_to(workdir)
            if source.is_dir():
                shutil.copytree(source, out, symlinks=True, dirs_exist_ok=True)
            else:
                if dst.endswith("/"):
                    out = out / source.name
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, out)

    async def _build_step(self, bwrap: str, task: Task, ws: Path, command: str) -> None:
        args = [
            *self._base_args(bwrap),
            "--cap-drop",
            "ALL",
            "--bind",
            str(ws),
            task.environment.workdir,
            "--tmpfs",
            SANDBOX_HOME,
            *self._runtime_args(),
            "--chdir",
            task.environment.workdir,
            "--clearenv",
            *self._env_args(self._env(task, None)),
            "--",
            "/bin/sh",
            "-c",
            command,
        ]
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.settings.build_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise InvalidTask.field("environment/Dockerfile", f"RUN {command!r} timed out") from None
        if proc.returncode != 0:
            raise InvalidTask.field(
                "environment/Dockerfile",
                f"RUN {command!r} failed in a local sandbox (exit {proc.returncode}): {out.decode()[-500:]}",
            )

    # --- environment ------------------------------------------------------------------------

    def _env(self, task: Task, launch: HarnessLaunch | None) -> dict[str, str]:
        path_dirs = [*(launch.path_dirs if launch else ()), os.path.join(self.python_prefix, "bin")]
        env = {
            "HOME": SANDBOX_HOME,
            "USER": "root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "PATH": ":".join([*path_dirs, DEFAULT_PATH]),
        }
        env.update(dict(task.environment.env))
        if launch is not None:
            env.update(launch.env)
        return env

    @staticmethod
    def _env_args(env: dict[str, str]) -> list[str]:
        out: list[str] = []
        for k, v in env.items():
            out += ["--setenv", k, v]
        return out

    # --- one rollout ------------------------------------------------------------------------

    def sandbox_image(self, task: Task) -> str:
        """No image: bubblewrap sandboxes run on the host's own filesystem, so the manifest names
        the sandbox instead: ``bwrap --version``'s answer (``bubblewrap 0.8.0``) and what it
        isolates; "" when bubblewrap is missing (no rollout can run then)."""
        if self._bwrap_version is None:
            found = self._find_bwrap()
            self._bwrap_version = _version_of(found) if found else ""
        return f"{self._bwrap_version} ({SANDBOX_DESCRIPTION})" if self._bwrap_version else ""

    async def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        """Runs the harness (or the oracle) and the verifier in fresh sandboxes; removes them.

        Raises:
            SandboxStartError: bubblewrap is missing, the sandbox could not be set up, or the
                harness process could not be started.
            InvalidTask: The task's workspace cannot be prepared.
        """
        t0_wall, t0 = time.time(), time.monotonic()
        bwrap = self._ensure_ready()
        template = await self.prepare_workspace(plan.task)
        name = f"{re.sub(r'[^A-Za-z0-9_-]', '_', plan.rollout_id)[:64] or 'sandbox'}-{secrets.token_hex(3)}"
        sb = self.root / name
        cgroup: cgroups.Cgroup | None = None
        server: asyncio.AbstractServer | None = None
        socket_path: Path | None = None
        lock_fd: int | None = None
        gate = RequestGate(plan.api_key, self._proxy_host, self._proxy_port, rollout_id=plan.rollout_id)
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            try:
                lock_fd = self._claim(name)
                sb.mkdir(mode=0o700)
                for sub in ("home", "logs/agent", "logs/verifier", "run", "out"):
                    (sb / sub).mkdir(parents=True)
                await asyncio.to_thread(shutil.copytree, template, sb / "app", symlinks=True)
                if plan.launch is not None:
                    self._write_files(sb, plan.launch)
                if plan.with_proxy:
                    # bind-mounted into the sandbox over a placeholder file
                    socket_path = self.socket_of(sb)
                    server = await asyncio.start_unix_server(
                        gate.handle, path=str(socket_path), limit=MAX_HEAD, backlog=1024
                    )
                    (sb / "run" / "proxy.sock").touch()
                assert self._limiter is not None
                cgroup = self._limiter.create(self._cgroup_name(sb), self._limits(plan))
            except OSError as exc:
                raise SandboxStartError(f"could not set up the sandbox: {exc}") from exc
            run = await self._run_agent(bwrap, plan, sb, cgroup, socket_path)
            used = cgroup.usage() if cgroup is not None else cgroups.Usage(None, None)
            attempts, started = self._read_report(sb / "run" / "report.jsonl")
            if server is not None:
                server.close()
            if plan.on_harness_exit is not None:
                await plan.on_harness_exit()
            reward, verifier_output, verifier_error = None, "", ""
            if plan.run_verifier:
                reward, verifier_output, verifier_error = await self._run_verifier(bwrap, plan.task, sb)
            artifacts = await asyncio.to_thread(self._keep_artifacts, plan.rollout_id, sb)
            return ExecutionResult(
                exit_code=run.exit_code,
                timed_out=run.timed_out,
                start_latency_s=max(0.0, (started or run.ended_wall) - t0_wall),
                harness_s=run.ended_wall - (started or run.started_wall),
                stdout_tail=_read_tail(sb / "out" / "stdout.log"),
                stderr_tail=_read_tail(sb / "out" / "stderr.log"),
                reward=reward,
                verifier_output=verifier_output,
                verifier_error=verifier_error,
                blocked_destinations=tuple(attempts),
                proxy_connections=gate.connections,
                artifacts=artifacts,
                cpu_s=used.cpu_s,
                peak_memory_bytes=used.peak_memory_bytes,
            )
        finally:
            # nothing here awaits: a second cancellation cannot cut the clean-up short
            if server is not None:
                server.close()
            gate.cancel()
            if socket_path is not None:
                socket_path.unlink(missing_ok=True)
            if cgroup is not None:
                cgroup.kill_and_remove()
            if lock_fd is not None:  # what a sandbox holds goes before its lock file
                remove_tree(sb)
                (self.root / f"{name}{LOCK_SUFFIX}").unlink(missing_ok=True)
                os.close(lock_fd)
            if task is not None:
                self._running.discard(task)
            log.debug(LOG_REMOVED, rollout_id=plan.rollout_id, seconds=round(time.monotonic() - t0, 3))

    def _write_files(self, sb: Path, launch: HarnessLaunch) -> None:
        for path, content in launch.files.items():
            p = PurePosixPath(path)
            for prefix, host in ((SANDBOX_HOME, sb / "home"), (SANDBOX_RUN, sb / "run")):
                if PurePosixPath(prefix) in p.parents:
                    out = host / p.relative_to(prefix)
                    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    write_private(out, content)  # any of them may hold the rollout's key
                    break
            else:
                raise SandboxStartError(f"harness file {path} is outside {SANDBOX_HOME} and {SANDBOX_RUN}")

    async def _run_agent(
        self, bwrap: str, plan: ExecutionPlan, sb: Path, cgroup: cgroups.Cgroup | None, socket_path: Path | None
    ) -> _Run:
        task = plan.task
        launch = plan.launch
        workdir = task.environment.workdir
        args = [*self._base_args(bwrap)]
        if self.settings.monitor_network:
            args += ["--cap-drop", "ALL"]
            args += ["--cap-add", "CAP_NET_ADMIN", "--cap-add", "CAP_NET_RAW", "--cap-add", "CAP_SETPCAP"]
        else:
            args += ["--cap-drop", "ALL"]
        args += [
            "--bind",
            str(sb / "app"),
            workdir,
            "--bind",
            str(sb / "home"),
            SANDBOX_HOME,
            "--bind",
            str(sb / "logs" / "agent"),
            AGENT_LOGS,
            "--ro-bind",
            str(sb / "run"),
            SANDBOX_RUN,
        ]
        if socket_path is not None:
            args += ["--bind", str(socket_path), f"{SANDBOX_RUN}/proxy.sock"]
        args += self._runtime_args(launch.install_dirs if launch is not None else ())
        if launch is not None:
            argv = list(launch.argv)
        else:
            solution = task.solution_script
            if solution is None:
                raise InvalidTask.field("solution/solve.sh", f"task {task.key} has no oracle solution")
            args += ["--ro-bind", str(solution.parent), SOLUTION_DIR]
            argv = ["/bin/bash", f"{SOLUTION_DIR}/solve.sh"]
        shutil.copy2(_INIT, sb / "run" / "init.py")
        report_path = sb / "run" / "report.jsonl"
        fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        config = {
            "argv": argv,
            "env": self._env(task, launch),
            "cwd": workdir,
            "report_fd": fd,
            "bridge_port": BRIDGE_PORT if plan.with_proxy else 0,
            "proxy_socket": f"{SANDBOX_RUN}/proxy.sock",
            "monitor": self.settings.monitor_network,
            "nofile": self.settings.nofile,
        }
        write_private(sb / "run" / "config.json", json.dumps(config))  # holds the key (env)
        args += [
            "--chdir",
            workdir,
            "--",
            self.python,
            "-I",
            "-S",
            f"{SANDBOX_RUN}/init.py",
            f"{SANDBOX_RUN}/config.json",
        ]
        started_wall = time.time()
        try:
            with (sb / "out" / "stdout.log").open("wb") as out, (sb / "out" / "stderr.log").open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    *self._wrap(cgroup, args),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(fd,),
                    start_new_session=True,
                    env={"PATH": DEFAULT_PATH},
                )
        except OSError as exc:
            raise SandboxStartError(f"could not start bwrap: {exc}") from exc
        finally:
            os.close(fd)
        log.debug(LOG_STARTED, rollout_id=plan.rollout_id, pid=proc.pid)
        timed_out = False
        try:
            code: int | None = await asyncio.wait_for(proc.wait(), plan.agent_timeout_s)
        except TimeoutError:
            timed_out = True
            log.info(LOG_TIMEOUT, rollout_id=plan.rollout_id, timeout_s=plan.agent_timeout_s)
            await self._kill(proc, cgroup)
            code = None
        except asyncio.CancelledError:
            await self._kill(proc, cgroup)
            raise
        if not timed_out and b'"started"' not in report_path.read_bytes():
            raise SandboxStartError(f"the sandbox did not start (exit {code}): {_read_tail(sb / 'out' / 'stderr.log')}")
        return _Run(exit_code=code, timed_out=timed_out, started_wall=started_wall, ended_wall=time.time())

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process, cgroup: cgroups.Cgroup | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if cgroup is not None:
            for pid in cgroup.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())

    @staticmethod
    def _read_report(path: Path) -> tuple[list[str], float | None]:
        attempts: list[str] = []
        started: float | None = None
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return attempts, started
        for line in lines:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("event") == "started":
                started = float(ev["t"])
            elif ev.get("event") == "attempt":
                where = f"{ev['dst']}:{ev['port']}" if ":" not in ev["dst"] else f"[{ev['dst']}]:{ev['port']}"
                desc = f"{ev['proto']} {where}"
                if ev.get("name"):
                    desc += f" (dns {ev['name']})"
                attempts.append(desc)
        return attempts, started

    async def _run_verifier(self, bwrap: str, task: Task, sb: Path) -> tuple[Reward | None, str, str]:
        env = self._env(task, None)
        env.update(task.verifier_env)
        args = [
            *self._base_args(bwrap),
            "--cap-drop",
            "ALL",
            "--bind",
            str(sb / "app"),
            task.environment.workdir,
            "--tmpfs",
            SANDBOX_HOME,
            "--ro-bind",
            str(task.tests_dir.resolve()),
            TESTS_DIR,
            "--bind",
            str(sb / "logs" / "verifier"),
            VERIFIER_LOGS,
            *self._runtime_args(),
            "--chdir",
            task.environment.workdir,
            "--clearenv",
            *self._env_args(env),
            "--",
            "/bin/bash",
            f"{TESTS_DIR}/test.sh",
        ]
        out_path = sb / "out" / "verifier.log"
        with out_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        error = ""
        try:
            await asyncio.wait_for(proc.wait(), task.verifier_timeout_s)
        except TimeoutError:
            await self._kill(proc, None)
            error = f"the verifier timed out after {task.verifier_timeout_s:g}s"
        except asyncio.CancelledError:
            await self._kill(proc, None)
            raise
        output = tail(_read_tail(out_path))
        if error:
            return None, output, error
        try:
            return parse_reward(sb / "logs" / "verifier"), output, ""
        except RewardError as exc:
            return None, output, f"{exc} (verifier exit {proc.returncode})"

    def _keep_artifacts(self, rollout_id: str, sb: Path) -> str:
        if self.artifacts is None:
            return ""
        dest = self.artifacts / rollout_id
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for name in ("stdout.log", "stderr.log", "verifier.log"):
            if (sb / "out" / name).is_file():
                shutil.copy2(sb / "out" / name, dest / name)
        if (sb / "run" / "report.jsonl").is_file():
            shutil.copy2(sb / "run" / "report.jsonl", dest / "network.jsonl")
        for sub in ("agent", "verifier"):
            src = sb / "logs" / sub
            if src.is_dir() and any(src.iterdir()):
                shutil.copytree(src, dest / sub, symlinks=True, ignore_dangling_symlinks=True)
        return str(dest)

    async def close(self) -> None:
        """Cancels the rollouts still running here and waits until their sandboxes are removed."""
        running = [t for t in self._running if not t.done()]
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
