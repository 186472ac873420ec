"""The ``miniwob`` task family: reproducible instances, disjoint splits, and a verifier that scores
the page state the harness writes (right outcome 1, wrong or missing 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from openforge_browser import miniwob


def _reward(task: Path, tmp_path: Path, state: object | None) -> float:
    state_path, reward_path = tmp_path / "state.json", tmp_path / "reward.json"
    state_path.unlink(missing_ok=True)
    if state is not None:
        state_path.write_text(json.dumps(state))
    done = subprocess.run(
        [sys.executable, str(task / "tests" / "check.py"), str(state_path), str(reward_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    reward: float = json.loads(reward_path.read_text())["reward"]
    return reward


def test_instances_are_reproducible_and_split_disjointly() -> None:
    assert miniwob.instances(seed=3) == miniwob.instances(seed=3)
    assert miniwob.instances(seed=3) != miniwob.instances(seed=4)
    sets = miniwob.split(miniwob.instances(), seed=0, test_per_kind=2)
    assert not set(sets["train"]) & set(sets["test"])
    assert sorted(i.kind for i in sets["test"]) == sorted(miniwob.KINDS * 2)
    for inst in miniwob.instances():
        assert set(inst.target) <= set(inst.choices) or inst.kind == "enter-text"
    with pytest.raises(ValueError, match="test_per_kind"):
        miniwob.split(miniwob.instances(per_kind=2), seed=0, test_per_kind=2)


def test_verifier_reads_the_final_page_state(tmp_path: Path) -> None:
    ids = miniwob.generate(tmp_path / "tasks", seed=0)
    assert len(ids["train"]) == 12 and len(ids["test"]) == 6
    by_id = {i.task_id: i for i in miniwob.instances()}
    for task_id in ("click-button-0", "enter-text-2", "click-checkboxes-0"):
        inst, task = by_id[task_id], tmp_path / "tasks" / "train" / task_id
        assert (task / "instruction.md").read_text().strip() == inst.instruction
        page = (task / "environment" / "files" / miniwob.PAGE_FILE).read_text()
        assert all(f">{c}<" in page for c in inst.choices)
        assert _reward(task, tmp_path, {"page": {"data": inst.expected}}) == 1.0
        wrong = {k: v + "x" for k, v in inst.expected.items()}
        assert _reward(task, tmp_path, {"page": {"data": wrong}}) == 0.0
        assert _reward(task, tmp_path, {"page": {"data": {}}}) == 0.0
        assert _reward(task, tmp_path, None) == 0.0
    # the page writes the checked labels with JSON.stringify (no spaces)
    boxes = by_id["click-checkboxes-0"]
    assert boxes.expected == {"submitted": "[" + ",".join(f'"{t}"' for t in sorted(boxes.target)) + "]"}
