"""The capture helpers that decide which runs a test replays and which samples a run gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openforge_testing.captures import NO_RUNS, run_dir, run_names, samples_of


def test_run_names_are_every_run_folder(tmp_path: Path) -> None:
    for name in ("codex/b", "codex/a", "claude-code/normal"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "README.md").write_text("captures")
    (tmp_path / "codex" / "notes.txt").write_text("not a run")
    assert run_names(tmp_path) == ["claude-code/normal", "codex/a", "codex/b"]
    assert run_dir("codex/a", tmp_path) == tmp_path / "codex" / "a"


@pytest.mark.parametrize("root", ["missing", "empty"])
def test_no_run_is_one_name_that_fails(tmp_path: Path, root: str) -> None:
    (tmp_path / "empty").mkdir()
    names = run_names(tmp_path / root)
    assert names == [NO_RUNS]
    with pytest.raises(pytest.fail.Exception, match=r"no harness capture runs.*CI copies"):
        run_dir(names[0], tmp_path / root)


def test_a_run_that_is_not_there_fails(tmp_path: Path) -> None:
    (tmp_path / "codex" / "a").mkdir(parents=True)
    with pytest.raises(pytest.fail.Exception, match="codex/b is not in"):
        run_dir("codex/b", tmp_path)


def _doc(fault: str | None, messages: list[str], **body: Any) -> dict[str, Any]:
    return {"fault_injected": fault, "body": {"messages": messages, "stream": True, **body}}


def test_a_retry_after_a_fault_stays_in_the_sample() -> None:
    docs = [
        _doc("e429", ["u"]),
        _doc("badsse", ["u"]),
        _doc(None, ["u"], stream=False, max_tokens=64000),  # another way to ask, the same conversation
        _doc(None, ["u", "a", "t"]),
    ]
    assert samples_of(docs) == [docs]


def test_a_conversation_rewritten_after_a_fault_starts_a_sample() -> None:
    docs = [_doc("trunc", ["u"]), _doc(None, ["queued: u"]), _doc(None, ["queued: u", "a", "t"])]
    assert samples_of(docs) == [docs[:1], docs[1:]]
    tools = [_doc("e500", ["u"]), _doc(None, ["u"], tools=[{"name": "exec"}])]
    assert samples_of(tools) == [tools[:1], tools[1:]]


def test_without_a_fault_the_run_is_one_sample() -> None:
    docs = [_doc(None, ["u"]), _doc(None, ["rewritten u", "a", "t"])]  # the proxy splices what harnesses rewrite
    assert samples_of(docs) == [docs]
    gave_up = [_doc("e400", ["u"])]
    assert samples_of(gave_up) == [gave_up]
    assert samples_of([]) == []
