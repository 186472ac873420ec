"""Token-exact splice with DeepSeek-V3.1 framing (the ``deepseek_v31`` family), end to end through the proxy.

DeepSeek-V3.1's template opens an assistant turn with ``<｜Assistant｜></think>`` right after a
user message and with nothing after tool results (the model writes right after
``<｜tool▁output▁end｜>``), and ends each with ``<｜end▁of▁sentence｜>``, which the template writes
after each assistant message, so the splicer puts a turn's sampled ids exactly where the template
writes the message's text, its sampled end token standing in for the template's. The fake engine
samples DeepSeek-format completions as exact token ids: text, a call block with one call
``<｜tool▁call▁begin｜>exec<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, text and a block of two calls
(one with an integer argument), a final answer, each ended with ``<｜end▁of▁sentence｜>``; the
first answer is followed by a user message, so both openings occur. Parts of them are spelled in
ids the tokenizer would not produce (one token per character: the same text, other ids), so a
prompt re-tokenised from text would show. The harness replays the history as its wire API gives
it back (Chat Completions, streamed or not, arguments re-serialized; Anthropic Messages;
Responses). Checks:

* every call's prompt extends the previous call's prompt + completion (no break reported), so
  the rollout assembles, as the trajectory store does, into exactly one sample whose
  loss-mask-1 tokens are exactly the sampled ids, in order, each sampled end token once;
* re-tokenising what the model saw gives other ids: the splice, not the template, keeps the
  sample whole.

With ``thinking`` the generation prompt is ``<｜Assistant｜><think>`` and the turns after a user
message start with reasoning, which the template never renders in history (a history turn is
``</think>`` and its text): the splice keeps each such turn as ``<think>`` and its sampled ids, so
the rollout is still one sample; turns after tool results carry no reasoning.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir

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
#: The turns sampled right after a user message (the others follow tool results).
AFTER_USER = (0, 1)
RESULTS = {"exec": "hello-from-harness", "read_file": "hello-from-harness\n"}


@pytest.fixture(scope="module")
def deepseek_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with a DeepSeek-V3.1-style template and DeepSeek-V3.1's special tokens."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-deepseek"), template="deepseek_v31")


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


def completions(fake: ScriptedInferenceServer) -> list[list[int]]:
    """The four scripted completions as token ids, some spelled oddly."""
    enc = fake.encode

    def tok(text: str) -> int:
        (tid,) = enc(text)
        return tid

    def odd(text: str) -> list[int]:
        ids = [t for ch in text for t in enc(ch)]
        assert ids != enc(text)
        return ids

    end = tok("<｜end▁of▁sentence｜>")
    block, close = tok("<｜tool▁calls▁begin｜>"), tok("<｜tool▁calls▁end｜>")
    call, sep, done = tok("<｜tool▁call▁begin｜>"), tok("<｜tool▁sep｜>"), tok("<｜tool▁call▁end｜>")

    return [
        # text with a word spelled oddly
        [*enc("Let me look at the "), *odd("directory"), *enc(" first."), end],
        # one call, its command spelled oddly
        [block, call, *enc("exec"), sep, *enc('{"command": "'), *odd(COMMAND), *enc('"}'), done, close, end],
        # text, then two calls (an integer argument)
        [*enc("Checking both."), block, call, *odd("read_file"), sep, *enc('{"path": "hello.txt"}'), done,
         call, *enc("exec"), sep, *enc('{"command": "cat hello.txt", "timeout": 30}'), done, close, end],
        # the final answer
        [*odd("Done"), *enc(": hello.txt now contains hello-from-harness."), end],
    ]  # fmt: skip


def check_one_sample(
    proxy: Any, fake: ScriptedInferenceServer, scripted: list[list[int]], opened_by: str = "</think>"
) -> None:
    """Every call extends the previous one; the rollout is one sample whose sampled tokens are
    exactly the scripted ids (each turn sampled after a user message spliced with the
    ``opened_by`` token it followed); re-tokenising what the model saw last gives other ids."""
    recs = proxy.recorder.records
    assert len(recs) == len(scripted) == len(fake.seen)
    for rec, seen, ids in zip(recs, fake.seen, scripted, strict=True):
        assert rec.prompt_ids == seen.prompt_ids
        assert rec.completion_ids == seen.sampled_ids == ids
    for prev, rec in itertools.pairwise(recs):
        assert rec.splice.break_cause.value == "none", rec.splice.break_detail
        assert rec.splice.extends_call_id == prev.call_id
    for i, rec in enumerate(recs):
        # each earlier turn is its sampled ids, its end token included (standing in for the template's:
        # the rendered text never repeats it)
        assert [s.source_call_id for s in rec.splice.reused] == [r.call_id for r in recs[:i]]
        for span in rec.splice.reused:
            k = [r.call_id for r in recs].index(span.source_call_id)
            # a turn sampled after a user message keeps the </think> it followed
            opening = [proxy.runtime.codec.token_id(opened_by)] if k in AFTER_USER else []
            assert rec.prompt_ids[span.start : span.end] == [*opening, *scripted[k]]
            assert rec.prompt_ids[span.end : span.end + 1] != rec.prompt_ids[span.end - 1 : span.end]
        for span in rec.splice.rendered:  # the text between them encodes to exactly its ids
            ids = rec.prompt_ids[span.start : span.end]
            assert proxy.runtime.codec.encode(proxy.runtime.codec.decode(ids)) == ids
    (sample,) = samples_of(recs)
    assert sample.calls == [r.call_id for r in recs]
    assert [t for t, m in zip(sample.response, sample.mask, strict=True) if m] == [t for ids in scripted for t in ids]
    last = recs[-1].prompt_ids
    assert proxy.runtime.codec.encode(proxy.runtime.codec.decode(last)) != last


def _chat_message(reply: Any, stream: bool) -> dict[str, Any]:
    """The assistant message a Chat Completions client rebuilds from the answer."""
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
    for c in calls:  # re-serialized without spaces, as a JavaScript client does
        c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":"))
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-reserialized"])
async def test_chat_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    fake = ScriptedInferenceServer(deepseek_model_dir)
    scripted = completions(fake)
    fake.script(*scripted)
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    said = []
    for turn in range(4):
        body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS, "stream": stream}
        reply = await proxy.post(CHAT, body, key=key, bearer=True)
        assert reply.status == 200, reply.body
        msg = _chat_message(reply, stream)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
        said.append((msg["content"], calls))
        messages.append(msg)
        if turn == 0:
            messages.append({"role": "user", "content": "Go on."})
        for call in msg.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULTS[call["function"]["name"]]})
    assert said == EXPECTED
    check_one_sample(proxy, fake, scripted)


async def test_anthropic_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(deepseek_model_dir)
    scripted = completions(fake)
    fake.script(*scripted)
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    kinds, stops = [], []
    for turn in range(4):
        body = {
            "model": "m",
            "max_tokens": 2048,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
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
    assert kinds == [["text"], ["tool_use"], ["text", "tool_use", "tool_use"], ["text"]]
    assert stops == ["end_turn", "tool_use", "tool_use", "end_turn"]
    check_one_sample(proxy, fake, scripted)


async def test_responses_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(deepseek_model_dir)
    scripted = completions(fake)
    fake.script(*scripted)
    proxy = await start_proxy(fake)
    key = proxy.session()
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TASK}]
    said = []
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
    assert said == EXPECTED
    check_one_sample(proxy, fake, scripted)


async def test_thinking_turns_are_spliced_with_the_think_they_followed(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(deepseek_model_dir)
    plain = completions(fake)
    think = fake.encode("</think>")
    reasoned = [
        [*fake.encode("I should look first."), *think, *plain[0]],
        [*fake.encode("Now the file."), *think, *plain[1]],
    ]
    scripted = [*reasoned, plain[2], plain[3]]
    fake.script(*scripted)
    proxy = await start_proxy(fake, template_kwargs={"thinking": True})
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    said = []
    for turn in range(4):
        reply = await proxy.post(CHAT, {"model": "m", "messages": messages, "tools": CHAT_TOOLS}, key=key, bearer=True)
        assert reply.status == 200, reply.body
        msg = reply.json()["choices"][0]["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
        said.append((msg.get("reasoning_content"), msg["content"], calls))
        messages.append({k: msg[k] for k in ("role", "content", "tool_calls", "reasoning_content") if k in msg})
        if turn == 0:
            messages.append({"role": "user", "content": "Go on."})
        for call in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULTS[call["function"]["name"]]})
    assert [r for r, _, _ in said] == ["I should look first.", "Now the file.", None, None]
    assert [(text, calls) for _, text, calls in said] == EXPECTED
    assert fake.seen[0].prompt_ids[-1] == proxy.runtime.codec.token_id("<think>")
    check_one_sample(proxy, fake, scripted, opened_by="<think>")
