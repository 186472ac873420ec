"""Bad ``openforge eval`` arguments: each is refused with one clear line before any process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from openforge_cli import local
from openforge_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "examples" / "tasks"


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a process was started for invalid arguments")

    monkeypatch.setattr(local, "up", refuse)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"model: {{path: {tmp_path / 'm'}}}\nstack: {{tasks_root: {TASKS}}}\n")
    return cfg


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    return ck


def _eval(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["eval", *args])
    assert not isinstance(result.exception, AssertionError), result.exception
    return result.exit_code, result.output


def test_missing_checkpoint_folder_is_a_usage_error(config: Path, tmp_path: Path) -> None:
    code, out = _eval(str(config), "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 2 and "--checkpoint" in out and "does not exist" in out


def test_checkpoint_without_a_model_is_refused(config: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = _eval(str(config), "--checkpoint", str(empty))
    assert code == 2 and "--checkpoint" in out and "config.json" in out


@pytest.mark.parametrize("k", ["0", "-3"])
def test_k_below_one_is_refused(config: Path, checkpoint: Path, k: str) -> None:
    code, out = _eval(str(config), "--checkpoint", str(checkpoint), "-k", k)
    assert code == 2 and "-k" in out and "must be >= 1" in out


def test_unknown_task_is_named(config: Path, checkpoint: Path) -> None:
    code, out = _eval(str(config), "--checkpoint", str(checkpoint), "--tasks", "celsius-convert,no-such-task")
    assert code == 1 and "no task 'no-such-task' in split 'test'" in out


def test_unknown_split_is_named(config: Path, checkpoint: Path) -> None:
    code, out = _eval(str(config), "--checkpoint", str(checkpoint), "--split", "nosuch")
    assert code == 1 and "no task split 'nosuch'" in out


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("run: {max_tokens: abc}\n", "run.max_tokens: Input should be a valid integer"),
        ("run: {temperature: -1}\n", "run.temperature: Input should be greater than 0"),
        ("harness: mini-swe\n", "harness: unknown harness 'mini-swe'"),
        ("stack: {engine: vlm, tasks_root: TASKS}\n", "stack.engine: unknown engine 'vlm'"),
    ],
)
def test_config_errors_that_eval_uses_are_named(tmp_path: Path, checkpoint: Path, extra: str, expected: str) -> None:
    cfg = tmp_path / "eval.yaml"
    lines = f"model: {{path: {tmp_path / 'm'}}}\n" + extra.replace("TASKS", str(TASKS))
    if "stack:" not in extra:
        lines += f"stack: {{tasks_root: {TASKS}}}\n"
    cfg.write_text(lines)
    code, out = _eval(str(cfg), "--checkpoint", str(checkpoint))
    assert code == 1 and expected in out, out


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (("--harness", "codex,mini-swe"), 1, "harness: unknown harness 'mini-swe'"),
        (("--harness", "mini-swe-agent,claude-code"), 1, "harness: claude-code is not installed in"),
        (("--engine", "scripted-orcle"), 1, "stack.engine: unknown engine 'scripted-orcle'"),
        (("--store", "127.0.0.1:1"), 2, "only with --orchestrator"),
    ],
)
def test_comparison_arguments_are_checked_for_every_harness_first(
    tmp_path: Path, checkpoint: Path, args: tuple[str, ...], code: int, expected: str
) -> None:
    """Every harness of --harness is checked (known, installed) before anything starts."""
    harnesses = tmp_path / "harnesses"
    (harnesses / "mini-swe-agent").mkdir(parents=True)
    (harnesses / "mini-swe-agent" / "manifest.json").write_text("{}")
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"model: {{path: {tmp_path / 'm'}}}\nstack: {{tasks_root: {TASKS}, harness_dir: {harnesses}}}\n")
    got, out = _eval(str(cfg), "--checkpoint", str(checkpoint), *args)
    assert got == code and expected in out, out
