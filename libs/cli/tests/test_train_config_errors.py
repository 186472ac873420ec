"""Bad ``openforge train`` configs: each is refused with one clear line naming the field or value,
before any process (services, the tiny-model build) is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from openforge_cli import local
from openforge_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "examples" / "tasks"

BASE = """run_id: probe
model: {{path: {model}}}
harness: mini-swe-agent
split: train
tasks: [hello-world]
stack: {{tasks_root: {tasks}}}
run: {{steps: 1, group_size: 1}}
eval: {{split: test, tasks: [celsius-convert], k: 1}}
"""


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder that passes for a model (config.json present), so no build starts."""
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text("{}")
    return m


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a process was started for an invalid config")

    monkeypatch.setattr(local, "up", refuse)
    monkeypatch.setattr("subprocess.run", refuse)


def _train(tmp_path: Path, text: str) -> tuple[int, str]:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(text)
    result = CliRunner().invoke(main, ["train", str(cfg), "--state-dir", str(tmp_path / "state")])
    assert not isinstance(result.exception, AssertionError), result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("run: {steps: 1,", "run: {stpes: 1,", "run.stpes: Extra inputs are not permitted"),
        ("steps: 1", "steps: -1", "run.steps: Input should be greater than or equal to 1"),
        ("steps: 1", "steps: abc", "run.steps: Input should be a valid integer"),
        ("group_size: 1}", "group_size: 1, pass_k: [3]}", "run: Value error, pass_k"),
        ("harness: mini-swe-agent", "harness: mini-swe", "harness: unknown harness 'mini-swe'"),
        ("split: train", "split: nosuch", "split: no task split 'nosuch'"),
        ("tasks: [hello-world]", "tasks: [no-such-task]", "tasks: no task 'no-such-task' in split 'train'"),
        ("split: test", "split: nosuch2", "eval.split: no task split 'nosuch2'"),
        ("[celsius-convert]", "[nope]", "eval.tasks: no task 'nope' in split 'test'"),
        ("stack: {", "stack: {engine: vlm, ", "stack.engine: unknown engine 'vlm'"),
        ("stack: {", "stack: {fallback_engine: tranformers, ", "stack.fallback_engine: unknown engine 'tranformers'"),
        (
            "eval: {split",
            "warm_start: {engine: scripted-oracle, run: {stpes: 2}}\neval: {split",
            "warm_start.run.stpes: Extra inputs are not permitted",
        ),
        ("split: train", "harness_config: no/such.yaml\nsplit: train", "harness_config: no/such.yaml is not a file"),
        (
            "harness: mini-swe-agent",
            "harness: codex\nharness_config: examples/demo/mini-swe-agent.yaml",
            "harness_config: codex takes no settings file (only mini-swe-agent)",
        ),
    ],
)
def test_invalid_field_is_named_before_anything_starts(
    tmp_path: Path, model_dir: Path, old: str, new: str, expected: str
) -> None:
    text = BASE.format(model=model_dir, tasks=TASKS)
    assert old in text
    code, out = _train(tmp_path, text.replace(old, new, 1))
    assert code == 1
    assert expected in out, out
    assert "Traceback" not in out


def test_missing_task_root_is_named(tmp_path: Path, model_dir: Path) -> None:
    code, out = _train(tmp_path, BASE.format(model=model_dir, tasks=tmp_path / "nowhere"))
    assert code == 1
    assert "stack.tasks_root: no folder" in out and "nowhere" in out


def test_missing_model_without_init_tiny_is_refused(tmp_path: Path) -> None:
    code, out = _train(tmp_path, BASE.format(model=tmp_path / "no-model", tasks=TASKS))
    assert code == 1
    assert "no model at" in out and "model.init_tiny" in out


def test_yaml_syntax_error_is_one_line_with_its_position(tmp_path: Path) -> None:
    code, out = _train(tmp_path, "run_id: [unclosed\nharness: x\n")
    assert code == 1
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert "line 2" in lines[0] and "train.yaml" in lines[0]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n"])
def test_empty_or_non_mapping_file_is_refused(tmp_path: Path, text: str) -> None:
    code, out = _train(tmp_path, text)
    assert code == 1
    assert "must hold a mapping of config fields" in out


def test_the_demo_config_passes_the_checks(tmp_path: Path) -> None:
    from openforge_cli.train_config import check_config, load_train_config

    cfg = load_train_config(ROOT / "examples" / "demo" / "demo.yaml")
    check_config(cfg.model_copy(update={"stack": cfg.stack.model_copy(update={"tasks_root": TASKS})}))


@pytest.mark.parametrize("option", ["--base-port", "--nats-port", "--http-port"])
def test_ports_out_of_range_are_usage_errors(tmp_path: Path, model_dir: Path, option: str) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(BASE.format(model=model_dir, tasks=TASKS))
    result = CliRunner().invoke(main, ["train", str(cfg), option, "70000"])
    assert result.exit_code == 2 and option in result.output, result.output


def test_unreadable_phase_record_is_named(tmp_path: Path, model_dir: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "phases.json").write_text("not json")
    cfg = tmp_path / "train.yaml"
    cfg.write_text(BASE.format(model=model_dir, tasks=TASKS))
    result = CliRunner().invoke(main, ["train", str(cfg), "--state-dir", str(state)])
    assert not isinstance(result.exception, AssertionError), result.exception
    assert result.exit_code == 1 and "phases.json" in result.output and "--fresh" in result.output, result.output


def test_harness_not_installed_is_named_before_anything_starts(tmp_path: Path, model_dir: Path) -> None:
    """A known harness that is not installed where the local orchestrator looks: refused with the
    install command, instead of every rollout failing (and the trainer asking for more)."""
    text = BASE.format(model=model_dir, tasks=TASKS).replace(
        "stack: {", f"stack: {{harness_dir: {tmp_path / 'no-harnesses'}, "
    )
    code, out = _train(tmp_path, text)
    assert code == 1, out
    assert "harness: mini-swe-agent is not installed in" in out
    assert "openforge harness install mini-swe-agent" in out


def test_the_warm_start_engine_gets_the_demonstrators_error_rate_kind_and_the_run_seed(tmp_path: Path) -> None:
    from openforge_cli.stack import LocalStack
    from openforge_cli.train_config import load_train_config

    cfg = load_train_config(ROOT / "examples" / "demo" / "demo.yaml")
    warm_start = cfg.warm_start
    assert warm_start is not None and warm_start.error_rate == 0.75
    cfg = cfg.model_copy(update={"run": {**cfg.run, "seed": 7}})
    stack = LocalStack(tmp_path, base_port=50100, nats_port=4300, http_port=8100)
    warm = stack.env(cfg, warm_start.engine, tmp_path)
    assert (warm["OPENFORGE_SCRIPTED_ERROR_RATE"], warm["OPENFORGE_SEED"]) == ("0.75", "7")
    assert warm["OPENFORGE_SCRIPTED_ERROR_KIND"] == warm_start.error_kind == "unwritten"
    policy = stack.env(cfg, cfg.stack.engine, tmp_path)
    assert not {"OPENFORGE_SCRIPTED_ERROR_RATE", "OPENFORGE_SCRIPTED_ERROR_KIND", "OPENFORGE_SEED"} & set(policy)
    path = tmp_path / "t.yaml"
    path.write_text(BASE.format(model=tmp_path, tasks=TASKS) + "warm_start: {error_rate: 1.5}\n")
    with pytest.raises(click.ClickException, match=r"warm_start\.error_rate"):
        load_train_config(path)
    path.write_text(BASE.format(model=tmp_path, tasks=TASKS) + "warm_start: {error_kind: typo}\n")
    with pytest.raises(click.ClickException, match=r"warm_start\.error_kind"):
        load_train_config(path)
