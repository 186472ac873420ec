"""Harbor task folders, the Dockerfile subset, reward files, and the harness adapters' configs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from openforge_core.errors import InvalidArgument, NotFound
from openforge_orchestrator.domain.tasks import InvalidTask, TaskCatalog, load_task, parse_dockerfile, parse_size_mb
from openforge_orchestrator.domain.verifier import RewardError, parse_reward
from openforge_orchestrator.harnesses import ADAPTERS, adapter
from openforge_orchestrator.harnesses.base import Installed, LaunchContext
from openforge_orchestrator.harnesses.command import InvalidCommand


def _task(root: Path, toml: str = "", dockerfile: str | None = None) -> Path:
    folder = root / "set" / "t1"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(toml)
    if dockerfile is not None:
        (folder / "environment").mkdir()
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    return folder


def test_task_toml_both_schema_spellings(tmp_path: Path) -> None:
    folder = _task(
        tmp_path,
        '[agent]\ntimeout_sec = 30.0\n[verifier]\ntimeout_sec = 9\nenv = { K = "v" }\n'
        '[environment]\ncpus = 2\nmemory = "1.5G"\nstorage_mb = 100\n[metadata]\ncategory = "x"\n',
    )
    t = load_task(folder, "set")
    assert (t.agent_timeout_s, t.verifier_timeout_s, t.verifier_env) == (30.0, 9.0, {"K": "v"})
    assert (t.resources.cpus, t.resources.memory_mb, t.resources.storage_mb) == (2.0, 1536, 100)
    assert t.metadata == {"metadata": {"category": "x"}} and t.key == "set/t1"
    assert t.environment.workdir == "/app" and t.solution_script is None


@pytest.mark.parametrize(
    ("toml", "field"),
    [("[agent]\ntimeout_sec = -1\n", "agent.timeout_sec"), ('[environment]\nmemory = "lots"\n', "environment.memory")],
)
def test_bad_task_values_are_invalid(tmp_path: Path, toml: str, field: str) -> None:
    with pytest.raises(InvalidTask) as err:
        load_task(_task(tmp_path, toml), "set")
    assert err.value.violations[0].field == field


def test_catalog_errors(tmp_path: Path) -> None:
    _task(tmp_path)
    cat = TaskCatalog(tmp_path)
    assert cat.ids("set") == ["t1"] and cat.sets() == ["set"]
    with pytest.raises(NotFound):
        cat.get("set", "nope")
    with pytest.raises(NotFound):
        cat.get("other", "t1")
    with pytest.raises(InvalidArgument):
        cat.get("../etc", "t1")


def test_dockerfile_subset() -> None:
    spec = parse_dockerfile(
        "# comment\nFROM python:3.11-slim AS base\nARG X=1\nWORKDIR /srv\nWORKDIR app\n"
        'ENV A=1 B="two words"\nENV C 3\nCOPY --chown=1:1 files/ ./\nCOPY a.txt b.txt /srv/app/data/\n'
        'RUN echo one \\\n && echo two\nRUN ["touch", "x y"]\nCMD ["bash"]\n'
    )
    assert spec.base_image == "python:3.11-slim" and spec.workdir == "/srv/app"
    assert spec.env == (("A", "1"), ("B", "two words"), ("C", "3"))
    assert spec.copies == (("files/", "/srv/app/"), ("a.txt", "/srv/app/data/"), ("b.txt", "/srv/app/data/"))
    assert spec.run == ("echo one  && echo two", "touch 'x y'")
    with pytest.raises(InvalidTask):
        parse_dockerfile("COPY --from=build /x /y\n")
    with pytest.raises(InvalidTask):
        parse_dockerfile("ADD https://example.com/x /app/\n")


def test_sizes() -> None:
    assert [parse_size_mb(v, "m") for v in (512, "2G", "512M", "1GiB", "2048K")] == [512, 2048, 512, 1024, 2]


@pytest.mark.parametrize(
    ("files", "value"),
    [
        ({"reward.txt": "1\n"}, 1.0),
        ({"reward.txt": "0.25", "reward.json": '{"reward": 0.9}'}, 0.25),  # reward.txt wins, as in Harbor
        ({"reward.json": '{"reward": 0.5, "checks": 2}'}, 0.5),
        ({"reward.json": '{"accuracy": 0.75}'}, 0.75),
        ({"reward.json": "0.5"}, 0.5),
    ],
)
def test_reward_files(tmp_path: Path, files: dict[str, str], value: float) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert parse_reward(tmp_path).value == value


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"reward.txt": ""},
        {"reward.txt": "yes"},
        {"reward.txt": "nan"},
        {"reward.json": '{"a": 1, "b": 2}'},
        {"reward.json": '{"reward": "1"}'},
        {"reward.json": "[1]"},
    ],
)
def test_bad_reward_files(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(RewardError):
        parse_reward(tmp_path)


CTX = LaunchContext(
    instruction="Fix it.",
    base_url="http://127.0.0.1:8080",
    api_key="ofk-k",
    model="policy-model",
    workdir="/app",
    timeout_s=120,
)


def test_every_adapter_points_its_harness_at_the_proxy_with_the_key() -> None:
    installed = Installed("x", "1.0", "/harness/x/bin/x", ("/harness/x/bin",), ("/harness/x",))
    for name in ADAPTERS:
        launch = adapter(name).launch(
            LaunchContext(**{**CTX.__dict__, "command": ("run", "{openai_base_url}", "{model}")}), installed
        )
        blob = json.dumps([launch.argv, dict(launch.env), dict(launch.files)])
        assert "ofk-k" in blob and "127.0.0.1:8080" in blob and "policy-model" in blob, name
        assert launch.install_dirs == ("/harness/x",) and launch.path_dirs == ("/harness/x/bin",)


def test_harness_configs_turn_side_traffic_off() -> None:
    codex = adapter("codex").launch(CTX, None)
    cfg = tomllib.loads(codex.files["/root/.codex/config.toml"])
    assert cfg["analytics"]["enabled"] is False and cfg["features"]["plugins"] is False
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8080/v1" and provider["wire_api"] == "responses"
    assert codex.env[provider["env_key"]] == "ofk-k" and codex.argv[:3] == ("codex", "exec", "--skip-git-repo-check")
    claude = adapter("claude-code").launch(CTX, None)
    assert claude.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert claude.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080"
    claw = adapter("openclaw").launch(CTX, None)
    doc = json.loads(claw.files["/run/openforge/openclaw.json"])
    assert doc["update"]["checkOnStart"] is False and claw.env["OPENCLAW_OFFLINE"] == "1"
    assert doc["agents"]["defaults"]["model"]["primary"] == "openforge/policy-model"
    mini = adapter("mini-swe-agent").launch(CTX, None)
    assert mini.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and "openai/policy-model" in mini.argv
    assert mini.env["OPENAI_API_BASE"] == "http://127.0.0.1:8080/v1"
    browser = adapter("browser").launch(CTX, None)
    assert browser.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8080/v1" and browser.argv[0] == "openforge-browser"
    argv = dict(zip(browser.argv[1::2], browser.argv[2::2], strict=True))
    assert argv["--url"] == f"file://{CTX.workdir.rstrip('/')}/index.html" and argv["--model"] == "policy-model"
    assert browser.files[argv["--instruction-file"]] == CTX.instruction


def test_command_template_errors() -> None:
    with pytest.raises(InvalidCommand):
        adapter("command").launch(CTX, None)
    with pytest.raises(InvalidCommand):
        adapter("command").launch(LaunchContext(**{**CTX.__dict__, "command": ("{nope}",)}), None)
