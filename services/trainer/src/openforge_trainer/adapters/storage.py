"""Checkpoints, run records and metrics on a local (or mounted) filesystem.

Layout under the checkpoint root::

    <run_id>/run.json               the run record (config, state, create time)
    <run_id>/metrics.jsonl          one JSON object per step: {"step", "time", "metrics"}
    <run_id>/latest                 name of the newest complete checkpoint ("step_00000003")
    <run_id>/step_00000003/         model.safetensors, config.json, tokenizer files,
                                    optimizer.pt, trainer_state.json

A checkpoint is written into a hidden temporary directory, completed with its trainer state and
renamed into place; then ``latest`` is replaced atomically. A trainer killed at any moment
leaves either the previous or the new checkpoint as the latest, never a partial one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import structlog

from openforge_trainer.domain.ports import Checkpoint
from openforge_trainer.domain.runs import Run, RunState, StepMetrics
from openforge_trainer.domain.state import TrainerState

log = structlog.get_logger(__name__)

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
_CHUNK = 1 << 20


def checkpoint_checksum(directory: Path) -> str:
    """``"sha256:<hex>"`` of the concatenated bytes of the directory's ``*.safetensors`` files in
    file-name order (the convention of ``UpdateWeightsRequest.checksum``).

    Raises:
        FileNotFoundError: The directory holds no safetensors file.
    """
    files = sorted((p for p in directory.glob("*.safetensors") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _safe_id(run_id: str) -> str:
    if not run_id or "/" in run_id or run_id in (".", "..") or run_id.startswith("."):
        raise ValueError(f"run id {run_id!r} cannot name a directory")
    return run_id


class FileCheckpointStore:
    """Checkpoints and run journal under one root directory.

    Args:
        root: The checkpoint root (created if missing).
        keep: Complete checkpoints kept per run (older ones are deleted); at least 1.
    """

    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = root
        self.keep = max(1, keep)
        root.mkdir(parents=True, exist_ok=True)

    def run_dir(self, run_id: str) -> Path:
        """The run's directory."""
        return self.root / _safe_id(run_id)

    # ---- checkpoints ----

    def latest(self, run_id: str) -> Checkpoint | None:
        """The newest complete checkpoint, or None (see :class:`CheckpointStore`)."""
        run = self.run_dir(run_id)
        try:
            name = (run / LATEST_FILE).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        path = run / name
        state = TrainerState.from_json((path / STATE_FILE).read_text(encoding="utf-8"))
        return Checkpoint(path=path, checksum=checkpoint_checksum(path), state=state)

    def write(self, run_id: str, state: TrainerState, save: Callable[[Path], None]) -> Checkpoint:
        """Writes checkpoint ``state.step`` atomically (see the module docstring)."""
        run = self.run_dir(run_id)
        run.mkdir(parents=True, exist_ok=True)
        name = f"step_{state.step:08d}"
        final = run / name
        tmp = run / f".{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save(tmp)
        _write_atomic(tmp / STATE_FILE, state.to_json())
        if final.exists():  # left over from a step that never became the latest
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(run / LATEST_FILE, name + "\n")
        checksum = checkpoint_checksum(final)
        self._prune(run, keep_name=name)
        log.info("checkpoint.written", run_id=run_id, step=state.step, path=str(final), checksum=checksum)
        return Checkpoint(path=final, checksum=checksum, state=state)

    def _prune(self, run: Path, keep_name: str) -> None:
        steps = sorted(p for p in run.iterdir() if p.is_dir() and p.name.startswith("step_"))
        for old in steps[: max(0, len(steps) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)

    # ---- run journal ----

    def save_run(self, run: Run) -> None:
        """Writes ``run.json``."""
        d = self.run_dir(run.run_id)
        d.mkdir(parents=True, exist_ok=True)
        record = {
            "run_id": run.run_id,
            "config": run.config,
            "state": run.state.value,
            "step": run.step,
            "policy_version": run.policy_version,
            "checkpoint_uri": run.checkpoint_uri,
            "create_time": run.create_time,
            "error": run.error,
        }
        _write_atomic(d / RUN_FILE, json.dumps(record, sort_keys=True))

    def load_runs(self) -> list[Run]:
        """Every ``run.json`` under the root (unreadable ones are logged and skipped)."""
        runs = []
        for path in sorted(self.root.glob(f"*/{RUN_FILE}")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                runs.append(
                    Run(
                        run_id=data["run_id"],
                        config=data["config"],
                        state=RunState(data["state"]),
                        step=int(data["step"]),
                        policy_version=int(data["policy_version"]),
                        checkpoint_uri=data["checkpoint_uri"],
                        create_time=float(data["create_time"]),
                        error=data.get("error", ""),
                    )
                )
            except (OSError, ValueError, KeyError) as exc:
                log.warning("run.record_unreadable", path=str(path), error=str(exc))
        return runs

    def append_metrics(self, run_id: str, entry: StepMetrics) -> None:
        """Appends one line to ``metrics.jsonl``."""
        d = self.run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"step": entry.step, "time": entry.time_s, "metrics": entry.metrics}, sort_keys=True)
        with (d / METRICS_FILE).open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    def read_metrics(self, run_id: str, up_to_step: int) -> list[StepMetrics]:
        """Recorded steps <= ``up_to_step``, the last record of each step winning."""
        path = self.run_dir(run_id) / METRICS_FILE
        by_step: dict[int, StepMetrics] = {}
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                data = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            step = int(data["step"])
            if step <= up_to_step:
                by_step[step] = StepMetrics(step, {k: float(v) for k, v in data["metrics"].items()}, data["time"])
        return [by_step[s] for s in sorted(by_step)]
