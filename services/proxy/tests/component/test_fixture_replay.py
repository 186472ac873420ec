"""Fixture replay: every captured harness request through the proxy, against a fake engine.

For each run in ``../shared/cases/harness-captures/`` (Claude Code, Codex,
OpenClaw, mini-swe-agent: every ``<harness>/<run>`` folder found is one case;
without any, the one case fails), the requests are sent in their captured
order, path (query string included), headers and body, with this session's
key in the same header scheme the client used. The fake engine is scripted
with the answer the capture server planned for that call (text, or a tool
call with its arguments; a custom ``exec`` call for Codex's code mode),
tokenized with the fake model's tokenizer. Checks:

* the answer is what that client accepted, structurally: status, content
  type, the protocol's event grammar and order, the same fields on each event
  type as the captured stream, usage where the client reads it, no malformed
  SSE line; the reassembled message equals the plan;
* one record per answered request, the prompt ids equal what the engine saw
  and the completion ids/logprobs/versions equal what it sampled; a repeated
  request is another attempt of the same call;
* in every run that is not a fault scenario (no request fault-injected),
  each later call's prompt extends the previous call's prompt + completion
  token for token (one training sample per rollout), through what the
  clients do to history (Claude Code's system message turning into a string,
  OpenClaw's moved context message and rewritten tool-call ids, re-serialized
  arguments, Codex's reasoning items).

Captured fault injections (429/500/400, broken streams) are the capture
server's doing, not the client's request: the proxy answers them normally.
Requests recorded only as a diff with truncated values cannot be rebuilt and
are skipped (named in the output).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from openforge_proxy.domain.call_roles import CallRole
from openforge_testing.captures import (
    captured_events,
    completion_for,
    headers_of,
    load_run,
    run_dir,
    run_names,
    samples_of,
)
from openforge_testing.fakes import ScriptedInferenceServer

_REASONING = "**Planning** I will run a shell command."


# --- what each client accepted --------------------------------------------------------------


def _message_from_anthropic(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    names = [e for e, _ in events]
    assert names[:2] == ["message_start", "ping"], names
    assert names[-2:] == ["message_delta", "message_stop"], names
    assert "usage" in events[0][1]["message"] and "usage" in events[-2][1]
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    for name, data in events[2:-2]:
        assert data["type"] == name
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append({**data["content_block"], "_json": ""})
        elif name == "content_block_delta":
            assert data["index"] == open_index
            delta = data["delta"]
            block = blocks[-1]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                block["_json"] += delta["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            open_index = None
    assert open_index is None
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b["_json"])
        del b["_json"]
    return {"content": blocks, "stop_reason": events[-2][1]["delta"]["stop_reason"]}


def _items_from_responses(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    names = [e for e, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"], names
    assert names[-1] == "response.completed", names
    seqs = [d["sequence_number"] for _, d in events]
    assert seqs == list(range(len(events)))
    done: list[dict[str, Any]] = []
    added = 0
    for name, data in events:
        assert data["type"] == name
        if name == "response.output_item.added":
            assert data["output_index"] == added
            added += 1
        elif name == "response.output_item.done":
            assert data["output_index"] == len(done)
            done.append(data["item"])
    completed = events[-1][1]["response"]
    assert completed["output"] == done
    usage = completed["usage"]
    assert {"input_tokens", "output_tokens", "total_tokens"} <= set(usage)
    assert "cached_tokens" in usage["input_tokens_details"]
    assert "reasoning_tokens" in usage["output_tokens_details"]
    return {"output": done}


def _message_from_chat(events: list[tuple[str | None, Any]], include_usage: bool) -> dict[str, Any]:
    assert events[-1] == (None, "[DONE]")
    chunks = [d for _, d in events[:-1]]
    if include_usage:
        assert chunks[-1]["choices"] == [] and "prompt_tokens" in chunks[-1]["usage"]
        chunks = chunks[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    text = ""
    calls: list[dict[str, Any]] = []
    for c in chunks[1:-1]:
        delta = c["choices"][0]["delta"]
        assert c["choices"][0]["finish_reason"] is None
        text += delta.get("content", "")
        for tc in delta.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] == len(calls)
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return {"text": text, "calls": calls, "finish": chunks[-1]["choices"][0]["finish_reason"]}


def _event_keys(events: list[tuple[str | None, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, data in events:
        if isinstance(data, dict) and name is not None:
            out.setdefault(name, set(data))
    return out


def check_reply(d: dict[str, Any], reply: Any) -> None:
    """Asserts the reply is structurally what this client accepted and says what the plan says."""
    body = d["body"]
    plan = d["plan"]
    assert reply.status == 200, reply.body[:500]
    path = d["path"]
    normal_capture = d["fault_injected"] is None and d["response"]["status"] == 200
    blocks: Any
    if body.get("stream"):
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = reply.events()
        if normal_capture:
            ours = _event_keys(events)
            theirs = _event_keys(captured_events(d))
            for name, keys in ours.items():
                if name in theirs:
                    assert keys == theirs[name], (name, keys ^ theirs[name])
        if "/messages" in path:
            msg = _message_from_anthropic(events)
            blocks = [b for b in msg["content"] if b["type"] != "thinking"]
        elif "/responses" in path:
            out = _items_from_responses(events)
            blocks = out["output"]
        else:
            chat = _message_from_chat(events, bool((body.get("stream_options") or {}).get("include_usage")))
            blocks = chat
    else:
        assert reply.headers["Content-Type"].startswith("application/json")
        obj = reply.json()
        if normal_capture:
            assert set(obj) == set(d["response"]["transcript"]), set(obj) ^ set(d["response"]["transcript"])
        if "/messages" in path:
            blocks = [b for b in obj["content"] if b["type"] != "thinking"]
        elif "/responses" in path:
            blocks = obj["output"]
        else:
            message = obj["choices"][0]["message"]
            blocks = {
                "text": message["content"] or "",
                "calls": [
                    {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    for c in message.get("tool_calls") or []
                ],
            }
    _check_plan(path, plan, blocks)


def _check_plan(path: str, plan: dict[str, Any], blocks: Any) -> None:
    want_text = plan.get("text", "")
    if "/chat/completions" in path:
        assert blocks["text"] == want_text
        if plan["type"] == "tool":
            (call,) = blocks["calls"]
            assert call["name"] == plan["name"] and json.loads(call["arguments"]) == plan["args"]
            assert call["id"].isalnum()
        return
    if "/responses" in path:
        texts = [p["text"] for b in blocks if b["type"] == "message" for p in b["content"]]
        assert "".join(texts) == want_text
        calls = [b for b in blocks if b["type"] in ("function_call", "custom_tool_call")]
        if plan["type"] == "tool":
            (call,) = calls
            if plan["name"].startswith("custom:"):
                assert call["type"] == "custom_tool_call" and call["input"] == plan["args"]
                assert call["name"] == "exec" and call["namespace"] == "functions"
            else:
                assert call["name"] == plan["name"] and json.loads(call["arguments"]) == plan["args"]
        else:
            assert calls == []
        return
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    assert "".join(texts) == want_text
    uses = [b for b in blocks if b["type"] == "tool_use"]
    if plan["type"] == "tool":
        (use,) = uses
        assert use["name"] == plan["name"] and use["input"] == plan["args"] and use["id"].isalnum()
    else:
        assert uses == []


@pytest.mark.parametrize("run_name", run_names())
async def test_replay_run(run_name: str, model_dir: Path, start_proxy: Any) -> None:
    docs, skipped = load_run(run_dir(run_name))
    faulted = any(d["fault_injected"] is not None for d in docs)
    fake = ScriptedInferenceServer(model_dir, [completion_for(d["plan"]) for d in docs], tokens_per_message=3)
    proxy = await start_proxy(fake)
    key = proxy.session("rollout-" + run_name.replace("/", "-"))
    for d in docs:
        headers, bearer = headers_of(d)
        reply = await proxy.post(d["path"], d["body"], key=key, bearer=bearer, headers=headers)
        check_reply(d, reply)
    records = proxy.recorder.records
    assert len(records) == len(docs)
    for rec, seen in zip(records, fake.seen, strict=True):
        assert rec.prompt_ids == seen.prompt_ids
        assert rec.completion_ids == seen.sampled_ids
        assert rec.logprobs == pytest.approx(seen.logprobs)
        assert rec.policy_versions == [fake.policy_version] * len(seen.sampled_ids)
        assert b"<REDACTED" not in rec.request_json or faulted
        assert "x-api-key" not in rec.request_headers and "authorization" not in rec.request_headers
    # the same conversation again is another attempt of the same call
    for i, rec in enumerate(records):
        earlier = [r for r in records[:i] if r.call_id == rec.call_id]
        assert rec.attempt == len(earlier) + 1
    # every captured call is the agent acting on the task; a lineage per training sample
    assert {rec.role for rec in records} == {CallRole.MAIN}
    lineages = [f"l{i}" for i, group in enumerate(samples_of(docs)) for _ in group]
    assert [rec.lineage_id for rec in records] == lineages
    if not faulted:
        for prev, rec in itertools.pairwise(records):
            assert rec.splice.break_cause.value == "none", rec.splice
            seq = prev.prompt_ids + prev.completion_ids
            assert rec.prompt_ids[: len(seq)] == seq
            assert rec.splice.extends_call_id == prev.call_id
            assert [s.source_call_id for s in rec.splice.reused][-1] == prev.call_id
    if skipped:
        print("not rebuildable (truncated diff values):", ", ".join(skipped))
