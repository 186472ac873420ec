"""Checkpoint store: atomic checkpoints, the inference checksum convention, pruning, journal."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from openforge_trainer.adapters.storage import FileCheckpointStore, checkpoint_checksum
from openforge_trainer.domain.runs import Run, RunState, StepMetrics
from openforge_trainer.domain.state import TrainerState


def fake_save(payload: bytes) -> Callable[[Path], None]:
    def save(directory: Path) -> None:
        (directory / "model-00002.safetensors").write_bytes(payload[::-1])
        (directory / "model-00001.safetensors").write_bytes(payload)
        (directory / "config.json").write_text("{}")

    return save


def test_checksum_is_sha256_of_safetensors_in_name_order(tmp_path: Path) -> None:
    fake_save(b"abc")(tmp_path)
    assert checkpoint_checksum(tmp_path) == "sha256:" + hashlib.sha256(b"abc" + b"cba").hexdigest()


def test_write_latest_prune_and_failed_write(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, keep=2)
    assert store.latest("r") is None
    for step in (1, 2, 3):
        store.write("r", TrainerState(step=step, policy_version=step, cursor=f"c{step}"), fake_save(bytes([step])))
    latest = store.latest("r")
    assert latest is not None and latest.state.cursor == "c3" and latest.path.name == "step_00000003"
    assert sorted(p.name for p in (tmp_path / "r").iterdir() if p.name.startswith("step_")) == [
        "step_00000002",
        "step_00000003",
    ]

    def crash(directory: Path) -> None:
        (directory / "model-00001.safetensors").write_bytes(b"partial")
        raise RuntimeError("killed while saving")

    try:
        store.write("r", TrainerState(step=4), crash)
    except RuntimeError:
        pass
    again = store.latest("r")
    assert again is not None and again.state.step == 3  # a partial checkpoint never becomes latest


def test_journal_round_trip_and_metrics_cut_at_checkpoint(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    run = Run(run_id="r", config={"model": "m"}, state=RunState.RUNNING, step=2, create_time=1.0)
    store.save_run(run)
    assert store.load_runs() == [run]
    for step in (1, 2, 3, 2):
        store.append_metrics("r", StepMetrics(step, {"x": float(step)}, 0.0))
    with (tmp_path / "r" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "metr')  # a line cut by a kill
    assert [(m.step, m.metrics["x"]) for m in store.read_metrics("r", up_to_step=2)] == [(1, 1.0), (2, 2.0)]
