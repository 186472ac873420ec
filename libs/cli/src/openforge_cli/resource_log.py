"""Resource use over a run's time: the machine's and each service's, sampled while the process
that started the services (``openforge up`` in the foreground, ``openforge train``) runs, kept as
JSON lines in ``<state dir>/resources.jsonl`` for the dashboard's curves (``openforge dash
--state-dir``).

One line per sample (every ``interval_s``, 5 s by default)::

    {"t": 1796300000.0, "machine": {"cpu_cores": 1.73, "cores": 2, "memory_bytes": 9.1e9,
     "memory_total_bytes": 2.5e10}, "services": {"proxy": {"cpu_s": 12.5, "rss_bytes": 1.2e8}, ...}}

``t`` is Unix time (s); ``machine.cpu_cores`` the cores busy on average since the previous sample
(psutil's ``cpu_percent`` x cores: services, sandboxes, harnesses and engines alike);
``memory_bytes`` the memory in use (total - available); each service's ``cpu_s`` is its
cumulative CPU time and ``rss_bytes`` its resident memory, scraped from its Prometheus endpoint
(``process_*``; a service that cannot be read is left out of that sample).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from openforge_cli import local

FILE = "resources.jsonl"


def sample(processes: Sequence[local.ProcessInfo], now: float | None = None) -> dict[str, Any]:
    """One line of the log (see the module docstring) for the services in ``processes`` that
    serve metrics."""
    memory = psutil.virtual_memory()
    cores = psutil.cpu_count() or 1
    services: dict[str, dict[str, float]] = {}
    for p in processes:
        if not p.metrics:
            continue
        found = local.resources(p.metrics, timeout_s=1.0)
        if found is not None:
            services[p.name] = {"cpu_s": found.cpu_s, "rss_bytes": found.rss_bytes}
    return {
        "t": time.time() if now is None else now,
        "machine": {
            "cpu_cores": psutil.cpu_percent(interval=None) / 100.0 * cores,
            "cores": cores,
            "memory_bytes": float(memory.total - memory.available),
            "memory_total_bytes": float(memory.total),
        },
        "services": services,
    }


def read(state_dir: Path) -> list[dict[str, Any]]:
    """Every sample of ``state_dir``'s log, in order (empty when there is none; a line cut short
    by a stop is skipped)."""
    path = state_dir / FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class ResourceLog:
    """Appends a :func:`sample` of the services ``up.json`` lists to ``<state_dir>/resources.jsonl``
    every ``interval_s`` in a daemon thread, until :meth:`stop` or until the services are gone
    (``up.json`` removed, or ``openforge down`` under way).

    Args:
        state_dir: The ``up``'s folder.
        interval_s: Seconds between samples.
    """

    def __init__(self, state_dir: Path, interval_s: float = 5.0) -> None:
        self.state_dir = state_dir
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts sampling (the first sample after ``interval_s``)."""
        psutil.cpu_percent(interval=None)  # the machine's CPU share is measured from here
        self._thread = threading.Thread(target=self._run, name="openforge-resources", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether it still samples."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stops sampling; returns once no sample is being written."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        path = self.state_dir / FILE
        while not self._stop.wait(self.interval_s):
            state = local.UpState.load(self.state_dir)
            if state is None or local.stopping(self.state_dir):
                return
            line = json.dumps(sample(state.processes))
            with path.open("a") as f:
                f.write(line + "\n")
