"""A harness settings file (``harness.config_files``): layered over mini-swe-agent's own
``mini.yaml`` with a second ``-c``, its text written into the sandbox (no host path exposed);
refused for harnesses that take none and for a missing file. The browser's settings (JSON) pick its
wire API (``--api`` and that API's endpoint variables) and step limit, and bad ones are refused at
start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openforge_orchestrator.domain.rollouts import Rollout, RolloutStatus
from openforge_orchestrator.domain.sandbox import HarnessLaunch
from openforge_orchestrator.domain.tasks import load_task
from openforge_orchestrator.harnesses.launches import LaunchFactory
from openforge_orchestrator.harnesses.mini_swe_agent import SETTINGS_FILE

ROOT = Path(__file__).resolve().parents[4]


def _install(root: Path) -> Path:
    folder = root / "mini-swe-agent"
    folder.mkdir(parents=True)
    manifest = {"name": "mini-swe-agent", "version": "2.4.6", "executable": "/x/mini", "path": [], "roots": ["/x"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return root


def _launch(factory: LaunchFactory) -> HarnessLaunch:
    task = load_task(ROOT / "examples" / "demo" / "tasks" / "train" / "count-0", "train")
    rollout = Rollout(
        rollout_id="r", run_id="run", task_id="count-0", task_set="train", group_id="g", group_index=0,
        harness="mini-swe-agent", model_name="policy", status=RolloutStatus.PENDING, min_policy_version=0,
        timeout_s=0.0, create_time=0.0,
    )  # fmt: skip
    launch = factory(rollout, task, "http://proxy", "key", 60.0)
    assert launch.argv[0] == "/x/mini"
    assert launch.install_dirs == ("/x",)
    return launch


def test_the_file_is_layered_after_mini_yaml_and_its_text_written_into_the_sandbox(tmp_path: Path) -> None:
    settings = tmp_path / "conf" / "mini.demo.yaml"
    settings.parent.mkdir()
    settings.write_text("agent: {step_limit: 3}\n")
    installs = _install(tmp_path / "installs")
    launch = _launch(LaunchFactory(installs, config_files={"mini-swe-agent": str(settings)}))
    specs = [launch.argv[i + 1] for i, a in enumerate(launch.argv) if a == "-c"]
    assert specs[:2] == ["mini.yaml", SETTINGS_FILE]
    assert dict(launch.files) == {SETTINGS_FILE: "agent: {step_limit: 3}\n"}
    assert not any(str(tmp_path) in a for a in launch.argv)
    plain = _launch(LaunchFactory(installs))
    assert next(plain.argv[i + 1] for i, a in enumerate(plain.argv) if a == "-c") == "mini.yaml"
    assert SETTINGS_FILE not in plain.argv and not plain.files


def test_a_file_for_another_harness_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    existing = tmp_path / "s.yaml"
    existing.write_text("{}\n")
    with pytest.raises(ValueError, match="codex"):
        LaunchFactory(tmp_path, config_files={"codex": str(existing)})
    with pytest.raises(ValueError, match="not a file"):
        LaunchFactory(tmp_path, config_files={"mini-swe-agent": str(tmp_path / "missing.yaml")})


def test_browser_settings_pick_the_wire_api_and_its_endpoint_variables(tmp_path: Path) -> None:
    folder = tmp_path / "installs" / "browser"
    folder.mkdir(parents=True)
    manifest = {"name": "browser", "version": "0.1.0", "executable": "/x/openforge-browser", "path": [], "roots": []}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    task = load_task(ROOT / "examples" / "demo" / "tasks" / "train" / "count-0", "train")
    rollout = Rollout(
        rollout_id="r", run_id="run", task_id="count-0", task_set="train", group_id="g", group_index=0,
        harness="browser", model_name="policy", status=RolloutStatus.PENDING, min_policy_version=0,
        timeout_s=0.0, create_time=0.0,
    )  # fmt: skip
    launches = {}
    for api in ("chat", "messages", "responses", None):
        settings = tmp_path / f"browser-{api}.json"
        settings.write_text(json.dumps({"api": api, "max_steps": 4}) if api else "")
        factory = LaunchFactory(tmp_path / "installs", config_files={"browser": str(settings)})
        launches[api] = factory(rollout, task, "http://proxy:8080", "key", 60.0)
    for api, launch in launches.items():
        argv = dict(zip(launch.argv[1::2], launch.argv[2::2], strict=True))
        assert argv["--api"] == (api or "chat") and argv["--max-steps"] == ("4" if api else "10")
        assert not launch.files.keys() - {"/run/openforge/instruction.md"}
    assert launches["messages"].env["ANTHROPIC_BASE_URL"] == "http://proxy:8080"
    assert launches["messages"].env["ANTHROPIC_API_KEY"] == "key" and "OPENAI_BASE_URL" not in launches["messages"].env
    for api in ("chat", "responses", None):
        assert (
            launches[api].env["OPENAI_BASE_URL"] == "http://proxy:8080/v1"
            and launches[api].env["OPENAI_API_KEY"] == "key"
        )
        assert "ANTHROPIC_BASE_URL" not in launches[api].env


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[]", "JSON object"),
        ('{"api": "grpc"}', "api must be"),
        ('{"steps": 3}', "unknown keys"),
        ('{"max_steps": 0}', "max_steps"),
    ],
)
def test_bad_browser_settings_are_refused_at_start(tmp_path: Path, text: str, error: str) -> None:
    settings = tmp_path / "browser.json"
    settings.write_text(text)
    with pytest.raises(ValueError, match=error):
        LaunchFactory(tmp_path, config_files={"browser": str(settings)})
