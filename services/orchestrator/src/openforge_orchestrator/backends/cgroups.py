"""Per-sandbox resource limits with cgroups (v2 when delegated, else v1), or none.

A sandbox's processes are put into its own cgroup by the wrapper that starts ``bwrap``
(``echo $$ > cgroup.procs; exec bwrap ...``), so every process of the sandbox is inside from
its first instruction. Limits: memory (``memory.max`` / ``memory.limit_in_bytes``), processes
and threads (``pids.max``), CPU bandwidth (``cpu.max`` / ``cpu.cfs_quota_us``). When neither
hierarchy is writable (an unprivileged container), :func:`detect` returns a limiter that
creates nothing and says so once in the log; rlimits still apply.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "openforge-sandboxes"
CPU_PERIOD_US = 100_000

LOG_CGROUPS = "sandbox.cgroups"


@dataclass(frozen=True)
class Limits:
    """Limits of one sandbox.

    Attributes:
        memory_mb: Memory, MiB.
        cpus: CPU cores of bandwidth.
        pids: Processes and threads.
    """

    memory_mb: int
    cpus: float
    pids: int


@dataclass(frozen=True)
class Usage:
    """What one sandbox used, read from its cgroup before it is removed.

    Attributes:
        cpu_s: CPU time of all its processes, seconds (v2 ``cpu.stat`` ``usage_usec``; v1
            ``cpuacct.usage``); None where not accounted.
        peak_memory_bytes: Highest memory use, bytes (v2 ``memory.peak``, Linux 5.19+; v1
            ``memory.max_usage_in_bytes``); None where not accounted.
    """

    cpu_s: float | None
    peak_memory_bytes: int | None


def _read_number(path: Path, key: str = "") -> float | None:
    """The number in ``path`` (or on its ``key`` line); None when it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if key:
        text = next((line.split()[1] for line in text.splitlines() if line.startswith(key + " ")), "")
    try:
        return float(text.strip())
    except ValueError:
        return None


class Cgroup(Protocol):
    """One sandbox's cgroup(s)."""

    #: The ``cgroup.procs`` files a new process must be written into.
    procs_files: tuple[Path, ...]

    def pids(self) -> list[int]:
        """Processes still inside."""
        ...

    def usage(self) -> Usage:
        """CPU time and peak memory so far (read it before :meth:`kill_and_remove`)."""
        ...

    def kill_and_remove(self) -> None:
        """SIGKILLs whatever is left and removes the cgroup(s)."""
        ...


class Limiter(Protocol):
    """Creates cgroups for sandboxes."""

    kind: str

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        """A new cgroup with ``limits``, or None when this limiter enforces none."""
        ...

    def remove(self, name: str) -> None:
        """SIGKILLs what is left in the cgroup(s) called ``name`` and removes them (if any)."""
        ...


class _Dirs:
    def __init__(self, dirs: list[Path], usage: Callable[[], Usage] = lambda: Usage(None, None)) -> None:
        self.dirs = dirs
        self.procs_files = tuple(d / "cgroup.procs" for d in dirs)
        self.usage = usage

    def pids(self) -> list[int]:
        found: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in f.read_text().split())
        return sorted(found)

    def kill_and_remove(self) -> None:
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last process is being reaped
                    time.sleep(0.02)


class V2Limiter:
    """cgroup v2: ``<root>/openforge-sandboxes/<name>`` with memory, pids and cpu enabled."""

    kind = "cgroup2"

    def __init__(self, root: Path) -> None:
        self.parent = root / PARENT
        self.parent.mkdir(exist_ok=True)
        wanted = {"memory", "pids", "cpu"}
        available = set((root / "cgroup.controllers").read_text().split())
        for folder in (root, self.parent):
            (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted & available)))
        self.controllers = set((self.parent / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= self.controllers:
            raise OSError(f"cgroup v2 controllers not delegated: {sorted(self.controllers)}")

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        d = self.parent / name
        d.mkdir()
        (d / "memory.max").write_text(str(limits.memory_mb * 1024 * 1024))
        with contextlib.suppress(OSError):
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(limits.pids))
        if "cpu" in self.controllers:
            (d / "cpu.max").write_text(f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        return _Dirs([d], lambda: self.usage(d))

    @staticmethod
    def usage(d: Path) -> Usage:
        """``d``'s CPU time (``cpu.stat``, kept without the cpu controller) and peak memory."""
        usec = _read_number(d / "cpu.stat", "usage_usec")
        peak = _read_number(d / "memory.peak")
        return Usage(None if usec is None else usec / 1e6, None if peak is None else int(peak))

    def remove(self, name: str) -> None:
        if (self.parent / name).is_dir():
            _Dirs([self.parent / name]).kill_and_remove()


class V1Limiter:
    """cgroup v1: one cgroup per sandbox in each of the memory, pids and cpu hierarchies."""

    kind = "cgroup1"

    def __init__(self, root: Path) -> None:
        controllers = ["memory", "pids", "cpu"]
        # CPU accounting: its own hierarchy, or the cpu one where they are mounted together
        if (root / "cpuacct").is_dir() and not (root / "cpu" / "cpuacct.usage").exists():
            controllers.append("cpuacct")
        self.parents = {c: root / c / PARENT for c in controllers}
        for p in self.parents.values():
            p.mkdir(exist_ok=True)

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        dirs = {c: p / name for c, p in self.parents.items()}
        for d in dirs.values():
            d.mkdir()
        (dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 1024 * 1024))
        (dirs["pids"] / "pids.max").write_text(str(limits.pids))
        (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * CPU_PERIOD_US)))
        return _Dirs(list(dirs.values()), lambda: self.usage(dirs))

    @staticmethod
    def usage(dirs: dict[str, Path]) -> Usage:
        """CPU time (``cpuacct.usage``, ns) and peak memory (``memory.max_usage_in_bytes``)."""
        ns = _read_number(dirs.get("cpuacct", dirs["cpu"]) / "cpuacct.usage")
        peak = _read_number(dirs["memory"] / "memory.max_usage_in_bytes")
        return Usage(None if ns is None else ns / 1e9, None if peak is None else int(peak))

    def remove(self, name: str) -> None:
        dirs = [p / name for p in self.parents.values() if (p / name).is_dir()]
        if dirs:
            _Dirs(dirs).kill_and_remove()


class NoLimiter:
    """No cgroup is writable here: limits are not enforced (logged once)."""

    kind = "none"

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        return None

    def remove(self, name: str) -> None:
        return None


def detect(root: Path = CGROUP_ROOT) -> Limiter:
    """The best limiter this machine allows: cgroup v2, else v1, else none."""
    errors: list[str] = []
    if (root / "cgroup.controllers").is_file():
        try:
            return V2Limiter(root)
        except OSError as exc:
            errors.append(f"v2: {exc}")
    if all((root / c).is_dir() for c in ("memory", "pids", "cpu")):
        try:
            return V1Limiter(root)
        except OSError as exc:
            errors.append(f"v1: {exc}")
    log.warning(LOG_CGROUPS, enforced=False, reason="; ".join(errors) or "no cgroup hierarchy found")
    return NoLimiter()
