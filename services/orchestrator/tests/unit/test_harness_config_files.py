"""A harness settings file (``harness.config_files``): layered over mini-swe-agent's own
``mini.yaml`` with a second ``-c`` and visible read-only in the sandbox; refused for harnesses
that take none and for a missing file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openforge_orchestrator.domain.rollouts import Rollout, RolloutStatus
from openforge_orchestrator.domain.tasks import load_task
from openforge_orchestrator.harnesses.launches import LaunchFactory

ROOT = Path(__file__).resolve().parents[4]


def _install(root: Path) -> Path:
    folder = root / "mini-swe-agent"
    folder.mkdir(parents=True)
    manifest = {"name": "mini-swe-agent", "version": "2.4.6", "executable": "/x/mini", "path": [], "roots": ["/x"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return root


def _launch(factory: LaunchFactory) -> tuple[tuple[str, ...], tuple[str, ...]]:
    task = load_task(ROOT / "examples" / "demo" / "tasks" / "train" / "count-0", "train")
    rollout = Rollout(
        rollout_id="r", run_id="run", task_id="count-0", task_set="train", group_id="g", group_index=0,
        harness="mini-swe-agent", model_name="policy", status=RolloutStatus.PENDING, min_policy_version=0,
        timeout_s=0.0, create_time=0.0,
    )  # fmt: skip
    launch = factory(rollout, task, "http://proxy", "key", 60.0)
    assert launch.argv[0] == "/x/mini"
    return launch.argv, launch.install_dirs


def test_the_file_is_layered_after_mini_yaml_and_its_folder_is_visible(tmp_path: Path) -> None:
    settings = tmp_path / "conf" / "mini.demo.yaml"
    settings.parent.mkdir()
    settings.write_text("agent: {step_limit: 3}\n")
    installs = _install(tmp_path / "installs")
    argv, dirs = _launch(LaunchFactory(installs, config_files={"mini-swe-agent": str(settings)}))
    specs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert specs[:2] == ["mini.yaml", str(settings.resolve())]
    assert dirs == ("/x", str(settings.parent.resolve()))
    plain_argv, plain_dirs = _launch(LaunchFactory(installs))
    assert next(plain_argv[i + 1] for i, a in enumerate(plain_argv) if a == "-c") == "mini.yaml"
    assert str(settings.resolve()) not in plain_argv
    assert plain_dirs == ("/x",)


def test_a_file_for_another_harness_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    existing = tmp_path / "s.yaml"
    existing.write_text("{}\n")
    with pytest.raises(ValueError, match="codex"):
        LaunchFactory(tmp_path, config_files={"codex": str(existing)})
    with pytest.raises(ValueError, match="not a file"):
        LaunchFactory(tmp_path, config_files={"mini-swe-agent": str(tmp_path / "missing.yaml")})
