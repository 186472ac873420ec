"""Token-exact splice with Llama 3.1 framing (the ``llama3`` family), end to end through the proxy.

The fake engine samples Llama-format completions as exact token ids: text, a call after
``<|python_tag|>`` ended with ``<|eom_id|>``, two calls separated by ``;`` ended with
``<|eot_id|>`` (where the template writes ``<|eom_id|>``), a final answer. Parts of them are
spelled in ids the tokenizer would not produce (one token per character: the same text,
other ids), so a prompt re-tokenised from text would show. The harness replays the history
as its wire API gives it back (Chat Completions, streamed or not, arguments re-serialized;
Anthropic Messages). Checks:

* every call's prompt extends the previous call's prompt + completion (no break reported),
  so the rollout assembles, as the trajectory store does, into exactly one sample whose
  loss-mask-1 tokens are exactly the sampled ids, in order;
* the history re-rendered by the template from what the harness sent differs from what the
  model saw in exactly the places the model wrote differently from the template (the
  ``<|python_tag|>``, an ``<|eot_id|>`` where the template writes ``<|eom_id|>``) and in the
  ids of the non-canonical spellings: the splice, not the template, keeps the sample whole.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from openforge_proxy.domain.families import Llama3Family
from openforge_testing.fakes import ScriptedInferenceServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
SYSTEM = "You are a coding agent. Use the tools."
TASK = "Create hello.txt using the shell."
TOOL_NAMES = (("exec", "Run a shell command"), ("read_file", "Read a file"))
CHAT_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {"type": "object"}}}
    for name, desc in TOOL_NAMES
]
ANTHROPIC_TOOLS = [{"name": name, "description": desc, "input_schema": {"type": "object"}} for name, desc in TOOL_NAMES]
CALL_1 = '{"name": "exec", "parameters": {"command": "echo hello-from-harness > hello.txt"}}'
CALL_2A = '{"name": "read_file", "parameters": {"path": "hello.txt"}}'
CALL_2B = '{"name": "exec", "parameters": {"command": "cat hello.txt"}}'


@dataclass
class Sample:
    """One training sequence as the trajectory store assembles it (prompt, response, loss mask)."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    cause: str = "none"


def samples_of(records: list[Any]) -> list[Sample]:
    """The store's assembly (ARCHITECTURE.md, data path step 7): a call whose prompt extends the
    running sequence appends the new prompt tokens (mask 0) and its completion (mask 1); any other
    starts a sample, labelled with the proxy's break cause."""
    out: list[Sample] = []
    for rec in records:
        cur = out[-1] if out else None
        seq = cur.prompt + cur.response if cur is not None else None
        if cur is not None and seq is not None and rec.prompt_ids[: len(seq)] == seq:
            gap = rec.prompt_ids[len(seq) :]
            cur.response += gap + rec.completion_ids
            cur.mask += [0] * len(gap) + [1] * len(rec.completion_ids)
            cur.calls.append(rec.call_id)
            continue
        out.append(
            Sample(
                list(rec.prompt_ids),
                list(rec.completion_ids),
                [1] * len(rec.completion_ids),
                [rec.call_id],
                rec.splice.break_cause.value if cur is not None else "none",
            )
        )
    return out


class Spelling:
    """Token ids of Llama-format completions in the fake tokenizer, canonical or not."""

    def __init__(self, fake: ScriptedInferenceServer) -> None:
        self.fake = fake

    def token(self, text: str) -> int:
        (tid,) = self.fake.encode(text)
        return tid

    def odd(self, text: str) -> list[int]:
        """``text`` one token per character: decodes to ``text``, re-tokenises otherwise."""
        ids = [t for ch in text for t in self.fake.encode(ch)]
        assert ids != self.fake.encode(text)
        return ids

    def completions(self) -> list[list[int]]:
        enc, odd, tok = self.fake.encode, self.odd, self.token
        fam = Llama3Family()
        eot, eom, tag = tok(fam.end_of_turn), tok("<|eom_id|>"), tok(fam.python_tag)
        cmd_at = CALL_1.index("echo")
        return [
            # text only, a word spelled oddly
            [*enc("Let me look at the "), *odd("directory"), *enc(" first."), eot],
            # one call after the python tag, its command spelled oddly, then <|eom_id|> (the model card's)
            [tag, *enc(CALL_1[:cmd_at]), *odd(CALL_1[cmd_at:-3]), *enc(CALL_1[-3:]), eom],
            # text, then two calls, ended with <|eot_id|> (the template writes <|eom_id|> there)
            [*enc("Checking both.\n"), *odd(CALL_2A), *enc("; " + CALL_2B), eot],
            # the final answer
            [*odd("Done"), *enc(": hello.txt now contains hello-from-harness."), eot],
        ]


def check_one_sample(proxy: Any, fake: ScriptedInferenceServer, scripted: list[list[int]]) -> Sample:
    """Every call extends the previous one; the rollout is one sample whose sampled tokens are
    exactly the scripted ids."""
    recs = proxy.recorder.records
    assert len(recs) == len(scripted) == len(fake.seen)
    for rec, seen, ids in zip(recs, fake.seen, scripted, strict=True):
        assert rec.prompt_ids == seen.prompt_ids
        assert rec.completion_ids == seen.sampled_ids == ids
    for prev, rec in itertools.pairwise(recs):
        assert rec.splice.break_cause.value == "none", rec.splice.break_detail
        assert rec.splice.extends_call_id == prev.call_id
    for i, rec in enumerate(recs):
        # each earlier turn is its sampled ids, end token included
        assert [s.source_call_id for s in rec.splice.reused] == [r.call_id for r in recs[:i]]
        for span in rec.splice.reused:
            assert (
                rec.prompt_ids[span.start : span.end] == scripted[[r.call_id for r in recs].index(span.source_call_id)]
            )
        for span in rec.splice.rendered:  # the text between them encodes to exactly its ids
            ids = rec.prompt_ids[span.start : span.end]
            assert proxy.runtime.codec.encode(proxy.runtime.codec.decode(ids)) == ids
    (sample,) = samples_of(recs)
    assert sample.calls == [r.call_id for r in recs]
    assert [t for t, m in zip(sample.response, sample.mask, strict=True) if m] == [t for ids in scripted for t in ids]
    assert sample.prompt == recs[0].prompt_ids
    return sample


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
async def test_chat_rollout_with_llama_framing_is_one_sample(
    llama3_model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    fake = ScriptedInferenceServer(llama3_model_dir)
    scripted = Spelling(fake).completions()
    fake.script(*scripted)
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    results = {"exec": "hello-from-harness", "read_file": "hello-from-harness\n"}
    said: list[dict[str, Any]] = []
    for turn in range(4):
        body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS, "stream": stream}
        reply = await proxy.post(CHAT, body, key=key, bearer=True)
        assert reply.status == 200, reply.body
        msg = _chat_message(reply, stream)
        said.append(msg)
        messages.append(msg)
        if turn == 0:
            messages.append({"role": "user", "content": "Go on."})
        for call in msg.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": results[call["function"]["name"]]})
    # what the parser made of the Llama-format completions
    assert [m["content"] for m in said] == [
        "Let me look at the directory first.",
        None,
        "Checking both.",
        "Done: hello.txt now contains hello-from-harness.",
    ]
    assert [[c["function"]["name"] for c in m.get("tool_calls", [])] for m in said] == [
        [],
        ["exec"],
        ["read_file", "exec"],
        [],
    ]
    check_one_sample(proxy, fake, scripted)

    # The history as the harness sent it, rendered by the template: the text differs from what the
    # model saw exactly where the model wrote differently from the template, and re-tokenising it
    # changes the ids of the odd spellings. (Re-serialized arguments are one more difference.)
    rt = proxy.runtime
    last = proxy.recorder.records[-1]
    seen_text = rt.codec.decode(last.prompt_ids)
    rendered = rt.template.render(messages[:-1], CHAT_TOOLS, add_generation_prompt=True)
    if not stream:
        as_sampled = rendered.replace(CALL_1 + "<|eom_id|>", "<|python_tag|>" + CALL_1 + "<|eom_id|>").replace(
            CALL_2B + "<|eom_id|>", CALL_2B + "<|eot_id|>"
        )
        assert as_sampled != rendered and seen_text == as_sampled
    assert rt.codec.encode(seen_text) != last.prompt_ids


def _anthropic_content(reply: Any) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = reply.json()["content"]
    return blocks


async def test_anthropic_rollout_with_llama_framing_is_one_sample(llama3_model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(llama3_model_dir)
    scripted = Spelling(fake).completions()
    fake.script(*scripted)
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    kinds = []
    for turn in range(4):
        body = {"model": "m", "max_tokens": 512, "system": SYSTEM, "messages": messages, "tools": ANTHROPIC_TOOLS}
        reply = await proxy.post(MESSAGES, body, key=key)
        assert reply.status == 200, reply.body
        content = _anthropic_content(reply)
        kinds.append([b["type"] for b in content])
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if turn == 0:
            messages.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
        elif uses:
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "hello-from-harness"} for b in uses]
            messages.append({"role": "user", "content": results})
    assert kinds == [["text"], ["tool_use"], ["text", "tool_use", "tool_use"], ["text"]]
    assert reply.json()["stop_reason"] == "end_turn"
    check_one_sample(proxy, fake, scripted)


async def test_a_call_cut_by_max_tokens_is_still_extended(llama3_model_dir: Path, start_proxy: Any) -> None:
    """A turn without its end token (max_tokens reached) is followed by the template's
    ``<|eot_id|>``, rendered: the next prompt still extends it."""
    fake = ScriptedInferenceServer(llama3_model_dir)
    fake.script("Let me look at the directory first, then decide.", "OK.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    reply = await proxy.post(CHAT, {"model": "m", "messages": messages, "max_tokens": 4}, key=key, bearer=True)
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
    assert reply.status == 200
    first, second = proxy.recorder.records
    assert second.splice.extends_call_id == first.call_id
    (sample,) = samples_of(proxy.recorder.records)
    eot = proxy.runtime.codec.token_id("<|eot_id|>")
    gap = sample.response[len(first.completion_ids) : sample.mask.index(1, len(first.completion_ids))]
    assert gap[0] == eot  # the template's end of the cut turn, not sampled (mask 0)


#: Meta's Llama 3.1-3.3 templates write today's date from the clock when no ``date_string`` is given.
CLOCK_TEMPLATE_LINE = "{%- set date_string = strftime_now('%d %b %Y') %}"


async def test_a_template_that_writes_todays_date_still_extends_after_midnight(
    llama3_model_dir: Path, start_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every render of a session gives the template the time of the session's first call: the
    date in the system message the model saw does not change at midnight (it would break the
    rollout with TEMPLATE_DRIFT at the date's first token)."""
    from datetime import datetime

    from openforge_proxy.domain import splice, template

    model = tmp_path / "llama-clock"
    shutil.copytree(llama3_model_dir, model)
    source = (model / "chat_template.jinja").read_text()
    clocked = source.replace("{%- set date_string = '26 Jul 2024' %}", CLOCK_TEMPLATE_LINE)
    assert clocked != source
    (model / "chat_template.jinja").write_text(clocked)
    today = [datetime(2025, 1, 1, 23, 59, 59)]

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Clock:
            t = today[0]
            return cls(t.year, t.month, t.day, t.hour, t.minute, t.second)

    monkeypatch.setattr(template, "datetime", Clock)
    monkeypatch.setattr(splice, "datetime", Clock)
    fake = ScriptedInferenceServer(model, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for text in ("next", "last"):
        reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
        assert reply.status == 200, reply.body
        messages += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": text}]
        today[0] = datetime(2025, 1, 2, 0, 0, 1)  # midnight passes after the first call
    recs = proxy.recorder.records
    assert [r.splice.break_cause.value for r in recs] == ["none", "none"]
    (sample,) = samples_of(recs)
    assert "Today Date: 01 Jan 2025" in proxy.runtime.codec.decode(sample.prompt)
    # a render without the session's time writes the new day
    assert "Today Date: 02 Jan 2025" in proxy.runtime.template.render(messages)


def test_the_generation_prompt_is_found_across_midnight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two renders that find the generation prompt read one time: a day passing between
    them does not refuse the model."""
    from datetime import datetime, timedelta

    from openforge_proxy.domain import template
    from openforge_testing.fakes import LLAMA3_TEMPLATE

    day = [datetime(2025, 1, 1, 23, 59, 59)]

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Clock:
            t, day[0] = day[0], day[0] + timedelta(days=1)  # every reading a day later
            return cls(t.year, t.month, t.day, t.hour, t.minute, t.second)

    monkeypatch.setattr(template, "datetime", Clock)
    clocked = template.ChatTemplate(
        LLAMA3_TEMPLATE.replace("{%- set date_string = '26 Jul 2024' %}", CLOCK_TEMPLATE_LINE)
    )
    assert clocked.generation_prompt() == Llama3Family().assistant_header
