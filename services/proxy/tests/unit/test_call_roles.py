"""Call roles and lineages from the request alone, on every captured harness run and on
requests derived from them for the roles the captures do not hold (title, compaction,
sub-agent, probes)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from record_builders import make_record

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2
from openforge_proxy.adapters.publisher import event_bytes
from openforge_proxy.domain.call_roles import CallRole, LineageTracker, static_role
from openforge_proxy.domain.conversation import CanonicalRequest
from openforge_proxy.domain.protocols import anthropic, chat, responses
from openforge_testing.captures import CAPTURES, load_run, run_dir, run_names, samples_of

CAPTURES_BENCH = Path(__file__).resolve().parents[4] / "tools" / "bench" / "call_roles_bench.py"
_PARSERS = {"/v1/messages": anthropic, "/v1/chat/completions": chat, "/v1/responses": responses}


def _parse(path: str, body: dict[str, Any]) -> CanonicalRequest:
    req: CanonicalRequest = _PARSERS[path.split("?", 1)[0]].parse(copy.deepcopy(body))
    return req


@pytest.mark.parametrize("name", run_names())
def test_captured_runs_are_main_calls_one_lineage_per_sample(name: str) -> None:
    docs, _ = load_run(run_dir(name))
    tracker = LineageTracker()
    classes = [tracker.classify(_parse(d["path"], d["body"]), d["path"]) for d in docs]
    assert {c.role for c in classes} == {CallRole.MAIN}
    # A lineage per training sample: retries stay in theirs, a rewritten history starts one.
    lineage_of = [c.lineage_id for c in classes]
    expected = [i for i, group in enumerate(samples_of(docs)) for _ in group]
    assert lineage_of == [f"l{i}" for i in expected]


def _claude_code_first() -> tuple[str, dict[str, Any]]:
    docs, _ = load_run(run_dir("claude-code/normal"))
    return docs[0]["path"], docs[0]["body"]


def test_title_request_without_tools_is_side() -> None:
    path, body = _claude_code_first()
    title = {
        "model": body["model"],
        "max_tokens": 512,
        "system": [{"type": "text", "text": "Generate a concise, sentence-case title (3-7 words) for this session."}],
        "messages": [{"role": "user", "content": "create hello.txt"}],
    }
    assert static_role(_parse(path, title), path) is CallRole.SIDE
    # The same prompt with the agent's tools offered is not a title request.
    assert static_role(_parse(path, {**title, "tools": body["tools"]}), path) is None


def test_probes_are_side() -> None:
    path, body = _claude_code_first()
    quota = {"model": body["model"], "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    assert static_role(_parse(path, quota), path) is CallRole.SIDE
    assert static_role(_parse(path, body), "/v1/messages/count_tokens?beta=true") is CallRole.SIDE


def test_compaction_then_main_in_a_new_lineage() -> None:
    path, body = _claude_code_first()
    tracker = LineageTracker()
    first = tracker.classify(_parse(path, body), path)
    assert (first.role, first.lineage_id) == (CallRole.MAIN, "l0")
    summary = copy.deepcopy(body)
    summary["messages"].append(
        {"role": "user", "content": "Your task is to create a detailed summary of the conversation so far."}
    )
    assert tracker.classify(_parse(path, summary), path).role is CallRole.COMPACTION
    after = copy.deepcopy(body)
    after["messages"] = [{"role": "user", "content": "This session continues from a summary: ..."}]
    c = tracker.classify(_parse(path, after), path)
    assert (c.role, c.lineage_id) == (CallRole.MAIN, "l1")
    assert tracker.classify(_parse("/v1/responses", {"model": "m", "input": "x"}), "/v1/responses/compact").role is (
        CallRole.COMPACTION
    )


def test_sub_agent_is_its_own_lineage_and_main_continues() -> None:
    docs, _ = load_run(run_dir("claude-code/normal"))
    path = docs[0]["path"]
    tracker = LineageTracker()
    assert tracker.classify(_parse(path, docs[0]["body"]), path).lineage_id == "l0"
    sub = copy.deepcopy(docs[0]["body"])
    sub["system"] = [{"type": "text", "text": "You are a file search specialist. Report findings."}]
    sub["tools"] = [t for t in sub["tools"] if t["name"] in ("Bash", "Read", "Grep")]
    sub["messages"] = [{"role": "user", "content": "Find where hello.txt is written."}]
    c = tracker.classify(_parse(path, sub), path)
    assert (c.role, c.lineage_id) == (CallRole.SUB_AGENT, "l1")
    # The sub-agent's next turn extends its own history.
    sub2 = copy.deepcopy(sub)
    sub2["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "Searching."}]},
        {"role": "user", "content": "go on"},
    ]
    assert tracker.classify(_parse(path, sub2), path).lineage_id == "l1"
    # The main agent's next call extends its first call: back in l0.
    c = tracker.classify(_parse(path, docs[1]["body"]), path)
    assert (c.role, c.lineage_id) == (CallRole.MAIN, "l0")


@pytest.mark.parametrize("role", list(CallRole))
def test_the_published_record_carries_role_and_lineage(role: CallRole) -> None:
    data = make_record(role=role, lineage_id="l1")
    rec = events_pb2.CallRecorded.FromString(event_bytes(data)).record
    assert common_pb2.CallRole.Name(rec.role) == "CALL_ROLE_" + role.name
    assert rec.lineage_id == "l1"


def test_the_roles_benchmark_counts_one_main_sample_per_lineage() -> None:
    spec = importlib.util.spec_from_file_location("call_roles_bench", CAPTURES_BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.table(CAPTURES)
    assert {"claude-code", "codex", "mini-swe-agent", "openclaw"} <= set(rows)
    for row in rows.values():
        main = row["main"]
        assert main["samples_per_rollout"] >= 1.0
        assert main["merge_ratio"] == pytest.approx(main["calls_per_rollout"] / main["samples_per_rollout"])
        assert row["side"]["requests_per_rollout"] == row["sub_agent"]["requests_per_rollout"] == 0.0
