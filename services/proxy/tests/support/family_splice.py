"""One rollout, four model calls, replayed by a harness through each wire API: the shared part of
the per-family splice tests (``test_splice_<family>.py``).

A family's test scripts four completions as exact token ids in its format (text, one call, text
and two calls, an answer; parts spelled in ids the tokenizer would not produce), then drives the
proxy as a harness would (:func:`chat_rollout`, :func:`anthropic_rollout`,
:func:`responses_rollout`: the history replayed as each wire API gives it back, a user message
after the first answer, the tools' results after each call) and checks the records with
:func:`check_one_sample`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge_testing.fakes import ScriptedInferenceServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
SYSTEM = "You are a coding agent. Use the tools."
TASK = "Create hello.txt using the shell."
_STR = {"type": "string"}
SCHEMAS: dict[str, dict[str, Any]] = {
    "exec": {"type": "object", "properties": {"command": _STR, "timeout": {"type": "integer"}}},
    "read_file": {"type": "object", "properties": {"path": _STR}},
}
DESCRIPTIONS = {"exec": "Run a shell command", "read_file": "Read a file"}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": s}}
    for n, s in SCHEMAS.items()
]
ANTHROPIC_TOOLS = [{"name": n, "description": DESCRIPTIONS[n], "input_schema": s} for n, s in SCHEMAS.items()]
RESPONSES_TOOLS = [
    {"type": "function", "name": n, "description": DESCRIPTIONS[n], "parameters": s} for n, s in SCHEMAS.items()
]
COMMAND = "echo hello-from-harness > hello.txt"
#: What the parser makes of the four completions: text, calls (name, arguments).
EXPECTED: list[tuple[str | None, list[tuple[str, dict[str, Any]]]]] = [
    ("Let me look at the directory first.", []),
    (None, [("exec", {"command": COMMAND})]),
    ("Checking both.", [("read_file", {"path": "hello.txt"}), ("exec", {"command": "cat hello.txt", "timeout": 30})]),
    ("Done: hello.txt now contains hello-from-harness.", []),
]
RESULTS = {"exec": "hello-from-harness", "read_file": "hello-from-harness\n"}
Said = list[tuple[str | None, list[tuple[str, Any]]]]


@dataclass
class Sample:
    """One training sequence as the trajectory store assembles it (prompt, response, loss mask)."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def samples_of(records: list[Any]) -> list[Sample]:
    """The store's assembly: a call whose prompt extends the running sequence appends the new
    prompt tokens (mask 0) and its completion (mask 1); any other starts a sample."""
    out: list[Sample] = []
    for rec in records:
        cur = out[-1] if out else None
        if cur is not None and rec.prompt_ids[: len(cur.prompt) + len(cur.response)] == cur.prompt + cur.response:
            gap = rec.prompt_ids[len(cur.prompt) + len(cur.response) :]
            cur.response += gap + rec.completion_ids
            cur.mask += [0] * len(gap) + [1] * len(rec.completion_ids)
            cur.calls.append(rec.call_id)
            continue
        out.append(Sample(list(rec.prompt_ids), list(rec.completion_ids), [1] * len(rec.completion_ids), [rec.call_id]))
    return out


def odd_spelling(fake: ScriptedInferenceServer, text: str) -> list[int]:
    """``text`` in one token per character: the same text in ids the tokenizer would not produce."""
    ids = [t for ch in text for t in fake.encode(ch)]
    assert ids != fake.encode(text)
    return ids


def token(fake: ScriptedInferenceServer, text: str) -> int:
    """The id of a text that is one token."""
    (tid,) = fake.encode(text)
    return tid


async def scripted_proxy(
    model_dir: Any, start_proxy: Any, completions: Callable[[ScriptedInferenceServer], list[list[int]]], **options: Any
) -> tuple[Any, ScriptedInferenceServer, list[list[int]]]:
    """A fake engine over ``model_dir`` scripted with ``completions(fake)``, and an in-process
    proxy over it (``start_proxy`` with ``options``): (proxy, fake, the scripted ids)."""
    fake = ScriptedInferenceServer(model_dir)
    scripted = completions(fake)
    fake.script(*scripted)
    return await start_proxy(fake, **options), fake, scripted


def check_one_sample(
    proxy: Any,
    fake: ScriptedInferenceServer,
    scripted: list[list[int]],
    opening: Callable[[int], Sequence[int]] = lambda k: (),
) -> None:
    """Every call extends the previous one; the rollout is one sample whose sampled tokens are
    exactly the scripted ids; re-tokenising what the model saw last gives other ids.

    Args:
        proxy: The in-process proxy (its records, its runtime's tokenizer).
        fake: The engine (what it saw and sampled).
        scripted: The completions' ids, end tokens included.
        opening: The ids the splice puts before turn ``k``'s sampled ids (the part of the
            generation prompt after the family's assistant header it followed; none by default).
    """
    recs = proxy.recorder.records
    assert len(recs) == len(scripted) == len(fake.seen)
    for rec, seen, ids in zip(recs, fake.seen, scripted, strict=True):
        assert rec.prompt_ids == seen.prompt_ids
        assert rec.completion_ids == seen.sampled_ids == ids
    for prev, rec in itertools.pairwise(recs):
        assert rec.splice.break_cause.value == "none", rec.splice.break_detail
        assert rec.splice.extends_call_id == prev.call_id
    order = [r.call_id for r in recs]
    for i, rec in enumerate(recs):
        # each earlier turn is its sampled ids, its end token included (standing in for the
        # template's, or for the next message's opening token: the rendered text never repeats it)
        assert [s.source_call_id for s in rec.splice.reused] == order[:i]
        for span in rec.splice.reused:
            k = order.index(span.source_call_id)
            assert rec.prompt_ids[span.start : span.end] == [*opening(k), *scripted[k]]
            assert rec.prompt_ids[span.end : span.end + 1] != rec.prompt_ids[span.end - 1 : span.end]
        for span in rec.splice.rendered:  # the text between them encodes to exactly its ids
            ids = rec.prompt_ids[span.start : span.end]
            assert proxy.runtime.codec.encode(proxy.runtime.codec.decode(ids)) == ids
    (sample,) = samples_of(recs)
    assert sample.calls == order
    assert [t for t, m in zip(sample.response, sample.mask, strict=True) if m] == [t for ids in scripted for t in ids]
    last = recs[-1].prompt_ids
    assert proxy.runtime.codec.encode(proxy.runtime.codec.decode(last)) != last


def chat_message(reply: Any, stream: bool) -> dict[str, Any]:
    """The assistant message a Chat Completions client rebuilds from the answer, its reasoning
    left out (streamed: its calls' arguments re-serialized without spaces, as a JavaScript
    client does)."""
    if not stream:
        msg: dict[str, Any] = reply.json()["choices"][0]["message"]
        return {k: msg[k] for k in ("role", "content", "tool_calls") if k in msg}
    text, calls = "", []
    for _, chunk in reply.events()[:-1]:
        if not chunk.get("choices"):
            continue
        delta = chunk["choices"][0]["delta"]
        text += delta.get("content") or ""
        for tc in delta.get("tool_calls", []):
            if "id" in tc:
                calls.append({"id": tc["id"], "type": "function", "function": {"name": tc["function"]["name"]}})
                calls[-1]["function"]["arguments"] = ""
            calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    for c in calls:
        c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":"))
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out


async def chat_rollout(proxy: Any, stream: bool, *, reasoning_back: bool = False) -> tuple[Said, list[str | None]]:
    """The four calls through Chat Completions; what each answer said, and its reasoning (not
    streamed: the harness sends it back as ``reasoning_content`` with ``reasoning_back``)."""
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    said: Said = []
    reasoning: list[str | None] = []
    for turn in range(4):
        body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS, "stream": stream}
        reply = await proxy.post(CHAT, body, key=key, bearer=True)
        assert reply.status == 200, reply.body
        msg = chat_message(reply, stream)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
        said.append((msg["content"], calls))
        reasoning.append(None if stream else reply.json()["choices"][0]["message"].get("reasoning_content"))
        if reasoning_back and reasoning[-1] is not None:
            msg["reasoning_content"] = reasoning[-1]
        messages.append(msg)
        if turn == 0:
            messages.append({"role": "user", "content": "Go on."})
        for call in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULTS[call["function"]["name"]]})
    return said, reasoning


async def anthropic_rollout(proxy: Any, *, thinking: bool = False) -> tuple[list[list[str]], list[str]]:
    """The four calls through Anthropic Messages; each answer's block types and stop reason."""
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    kinds, stops = [], []
    for turn in range(4):
        body: dict[str, Any] = {
            "model": "m",
            "max_tokens": 2048,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        reply = await proxy.post(MESSAGES, body, key=key)
        assert reply.status == 200, reply.body
        content: list[dict[str, Any]] = reply.json()["content"]
        kinds.append([b["type"] for b in content])
        stops.append(reply.json()["stop_reason"])
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if turn == 0:
            messages.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
        elif uses:
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": RESULTS[b["name"]]} for b in uses]
            messages.append({"role": "user", "content": results})
    return kinds, stops


async def responses_rollout(proxy: Any) -> Said:
    """The four calls through Responses; what each answer said."""
    key = proxy.session()
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TASK}]
    said: Said = []
    for turn in range(4):
        body = {"model": "m", "instructions": SYSTEM, "input": items, "tools": RESPONSES_TOOLS}
        reply = await proxy.post(RESPONSES, body, key=key, bearer=True)
        assert reply.status == 200, reply.body
        output: list[dict[str, Any]] = reply.json()["output"]
        text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"]) or None
        calls = [it for it in output if it["type"] == "function_call"]
        said.append((text, [(c["name"], json.loads(c["arguments"])) for c in calls]))
        items += output
        if turn == 0:
            items.append({"type": "message", "role": "user", "content": "Go on."})
        for c in calls:
            items.append({"type": "function_call_output", "call_id": c["call_id"], "output": RESULTS[c["name"]]})
    return said
