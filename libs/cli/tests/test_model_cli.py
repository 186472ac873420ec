"""``openforge model init-tiny``: the family is passed to the builder, an unknown one is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from openforge_cli.main import main


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The builder commands ``init-tiny`` started (none really runs)."""
    commands: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", run)
    return commands


@pytest.mark.parametrize(
    ("args", "family"), [([], "qwen"), (["--family", "llama3"], "llama3"), (["--family", "glm45"], "glm45")]
)
def test_family_reaches_the_builder(started: list[list[str]], tmp_path: Path, args: list[str], family: str) -> None:
    result = CliRunner().invoke(main, ["model", "init-tiny", "--size", "1m", "--out", str(tmp_path), *args])

    assert result.exit_code == 0, result.output
    assert len(started) == 1
    cmd = started[0]
    assert cmd[1:3] == ["-m", "openforge_inference.tiny_model"]
    assert cmd[cmd.index("--family") + 1] == family
    assert f"tiny 1m {family} model written to {tmp_path}" in result.output


def test_unknown_family_is_refused_before_building(started: list[list[str]], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["model", "init-tiny", "--out", str(tmp_path), "--family", "gpt-oss"])

    assert result.exit_code == 2
    refusal = (
        "Invalid value for '--family': 'gpt-oss' is not one of 'qwen', 'llama3', 'glm45', 'mistral', 'deepseek_v31'."
    )
    assert refusal in result.output
    assert started == []
