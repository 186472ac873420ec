"""Token-exact splice invariants over multi-turn conversations.

* The prompt ids the engine saw are the rendered ids (text spans encode to
  exactly the ids recorded) plus the exact ids sampled earlier (reused spans).
* Each call's prompt extends the previous call's prompt + completion, through
  the history edits real clients make: reasoning dropped or resent, argument
  JSON re-serialized, tool-call ids rewritten, an ephemeral message moved,
  a Qwen3 template that drops past reasoning.
* Breaks are reported with their cause (retry, compaction, sub-agent).
* Incremental cost: a call encodes only the chunks that are new.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from openforge_proxy.domain.splice import Splicer
from openforge_proxy.domain.splice_memo import RenderMemo
from openforge_proxy.domain.template_loop import LoopCache
from openforge_proxy.domain.turns import norm_ref
from openforge_testing.fakes import ScriptedInferenceServer, final_text, tool_call_text

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {"name": "exec", "description": "Run a command", "parameters": {"type": "object"}},
    }
]
CTX = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nActive exec sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"


def assistant_from(reply: Any) -> dict[str, Any]:
    """The assistant message a chat client reassembles from the stream, resent OpenClaw-style."""
    text, reasoning, calls = "", "", []
    for _, chunk in reply.events()[:-1]:
        if not chunk.get("choices"):
            continue
        delta = chunk["choices"][0]["delta"]
        text += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for tc in delta.get("tool_calls", []):
            if "id" in tc:
                calls.append(
                    {
                        "id": tc["id"],
                        "type": "function",
                        "function": {"name": tc["function"]["name"], "arguments": ""},
                    }
                )
            calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    for c in calls:
        # OpenClaw re-serializes the arguments without spaces and strips non-alphanumerics from ids
        c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":"))
        c["id"] = "".join(ch for ch in c["id"] if ch.isalnum()).upper()
    msg: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": calls}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def check_invariants(proxy: Any, fake: ScriptedInferenceServer) -> None:
    rt = proxy.runtime
    assert rt is not None
    for rec, seen in zip(proxy.recorder.records, fake.seen, strict=True):
        assert rec.prompt_ids == seen.prompt_ids and rec.completion_ids == seen.sampled_ids
        spans = sorted(rec.splice.reused + rec.splice.rendered, key=lambda s: s.start)
        assert spans[0].start == 0 and spans[-1].end == len(rec.prompt_ids)
        assert all(a.end == b.start for a, b in itertools.pairwise(spans))
        sampled = {r.call_id: r.completion_ids for r in proxy.recorder.records}
        for span in rec.splice.reused:
            ids = rec.prompt_ids[span.start : span.end]
            assert ids == sampled[span.source_call_id]  # the exact sampled ids, EOS included
        for span in rec.splice.rendered:
            ids = rec.prompt_ids[span.start : span.end]
            assert rt.codec.encode(rt.codec.decode(ids)) == ids


async def openclaw_like_rollout(proxy: Any, fake: ScriptedInferenceServer, turns: int) -> None:
    key = proxy.session()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a personal assistant running inside OpenClaw."},
        {"role": "user", "content": "Create hello.txt using the shell."},
    ]
    for _ in range(turns):
        body = {
            "model": "policy-model",
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": TOOLS,
            "messages": [*messages, {"role": "user", "content": [{"type": "text", "text": CTX}]}],
        }
        reply = await proxy.post(CHAT, body, key=key, bearer=True)
        assert reply.status == 200, reply.body
        msg = assistant_from(reply)
        messages.append(msg)
        for call in msg["tool_calls"]:
            messages.append({"role": "tool", "content": "hello-from-harness", "tool_call_id": call["id"]})


async def test_openclaw_history_edits_still_extend(qwen3_model_dir: Path, start_proxy: Any) -> None:
    step = tool_call_text("exec", {"command": "echo hi > hello.txt", "timeout": 5}, text="On it.", reasoning="Plan.")
    fake = ScriptedInferenceServer(qwen3_model_dir, [step, step, final_text("Done.", reasoning="All good.")])
    proxy = await start_proxy(fake)
    await openclaw_like_rollout(proxy, fake, 3)
    recs = proxy.recorder.records
    assert len(recs) == 3
    for prev, rec in itertools.pairwise(recs):
        seq = prev.prompt_ids + prev.completion_ids
        assert rec.prompt_ids[: len(seq)] == seq
        assert rec.splice.break_cause.value == "none" and rec.splice.extends_call_id == prev.call_id
        assert any("kept 1 user message" in n for n in rec.splice.notes), rec.splice
    check_invariants(proxy, fake)
    # rendering the resent history from text (what a naive proxy does) is not what the model saw:
    # the Qwen3 template drops past reasoning
    rt = proxy.runtime
    second = recs[1]
    span = second.splice.reused[0]
    assert "<think>\nPlan.\n</think>" in rt.codec.decode(second.prompt_ids[span.start : span.end])
    past = [
        {"role": "user", "content": "Create hello.txt"},
        {"role": "assistant", "content": "On it.", "reasoning_content": "Plan."},
        {"role": "user", "content": "next"},
    ]
    assert "Plan." not in rt.template.render(past)


async def test_breaks_are_reported_with_their_cause(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "first"}]

    async def call(messages: list[dict[str, Any]]) -> Any:
        reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
        assert reply.status == 200
        return proxy.recorder.records[-1]

    r1 = await call(base)
    r2 = await call([*base, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "second"}])
    assert r2.splice.break_cause.value == "none" and r2.splice.extends_call_id == r1.call_id
    retry = await call([*base, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "second"}])
    assert (retry.call_id, retry.attempt, retry.splice.break_cause.value) == (r2.call_id, 2, "retry")
    compacted = await call([base[0], {"role": "user", "content": "first"}, {"role": "user", "content": "summary"}])
    assert compacted.splice.break_cause.value == "compaction"
    sub = await call([{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": "task"}])
    assert sub.splice.break_cause.value == "sub_agent"
    check_invariants(proxy, fake)


async def _three_calls(proxy: Any, key: str) -> list[dict[str, Any]]:
    """Three calls of a Chat Completions conversation the fake answers "Sure." to; returns the
    history that follows them (the third answer and a fourth user message appended)."""
    said = {"role": "assistant", "content": "Sure."}
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "first"}]
    for text in ("second", "third", "fourth"):
        reply = await proxy.post(CHAT, {"model": "m", "messages": history}, key=key, bearer=True)
        assert reply.status == 200
        history = [*history, said, {"role": "user", "content": text}]
    return history


async def test_an_edited_history_is_rendered_again_from_the_edit(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    history = await _three_calls(proxy, key)
    edited = [*history[:3], {"role": "user", "content": "second, edited"}, *history[4:]]
    reply = await proxy.post(CHAT, {"model": "m", "messages": edited}, key=key, bearer=True)
    assert reply.status == 200
    last = proxy.recorder.records[-1]
    assert last.splice.break_cause.value == "other"
    # the three generated turns are still the sampled ids; the edited message is rendered as sent
    assert [s.source_call_id for s in last.splice.reused] == [r.call_id for r in proxy.recorder.records[:3]]
    assert "second, edited" in proxy.runtime.codec.decode(last.prompt_ids)
    check_invariants(proxy, fake)


async def test_each_call_encodes_only_its_new_chunks(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: tool_call_text("exec", {"command": "ls"}))
    proxy = await start_proxy(fake)
    await openclaw_like_rollout(proxy, fake, 12)
    state = proxy.handler.state("r1")
    cache = state.splicer.cache
    # per call: the new tool result, the new context message and the generation prompt tail; never the history
    assert cache.misses <= 2 + 4 * 12
    assert cache.hits > 5 * 12
    check_invariants(proxy, fake)
    recs = proxy.recorder.records
    assert all(r.splice.break_cause.value == "none" for r in recs[1:])
    assert [len(r.splice.reused) for r in recs] == list(range(12))


def test_ids_match_loosely() -> None:
    assert norm_ref("call_9617da-X") == norm_ref("call9617daX".lower()) == "call9617dax"


async def test_identical_text_turns_match_in_conversation_order(model_dir: Path, start_proxy: Any) -> None:
    # every answer is the same text: the n-th "OK." of the history must be the n-th turn that said it
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "OK.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    for turn in range(6):
        reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "OK."
        messages += [{"role": "assistant", "content": "OK."}, {"role": "user", "content": f"result {turn}"}]
    recs = list(proxy.recorder.records)
    assert len(recs) == 6
    for prev, rec in itertools.pairwise(recs):
        assert rec.splice.break_cause.value == "none", rec.splice
        assert rec.splice.extends_call_id == prev.call_id
        seq = prev.prompt_ids + prev.completion_ids
        assert rec.prompt_ids[: len(seq)] == seq
    for i, rec in enumerate(recs):
        assert [s.source_call_id for s in rec.splice.reused] == [r.call_id for r in recs[:i]]
    check_invariants(proxy, fake)
    # a retry of the latest call and then the next call still pair each "OK." with its own turn
    retry = await proxy.post(CHAT, {"model": "m", "messages": messages[:-2]}, key=key, bearer=True)
    assert retry.status == 200
    assert proxy.recorder.records[-1].splice.break_cause.value == "retry"
    nxt = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
    assert nxt.status == 200
    last = proxy.recorder.records[-1]
    assert last.splice.break_cause.value == "none"
    assert [s.source_call_id for s in last.splice.reused] == [r.call_id for r in recs]


async def test_resumed_renders_equal_full_ones(
    qwen3_model_dir: Path, model_dir: Path, start_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every prompt built by resuming the session's previous render equals the one built from scratch."""
    full_render = Splicer._render
    full_resume = RenderMemo.resume
    resumed = 0

    def checked(self: Splicer, *args: Any) -> Any:
        memo, loops, forms = self._memo, self._loop_cache, self._forms
        self._memo, self._loop_cache, self._forms = None, LoopCache(), None  # from scratch: no previous render
        scratch = full_render(self, *args)
        self._memo, self._loop_cache, self._forms = memo, loops, forms
        out = full_render(self, *args)
        assert out[0].ids == scratch[0].ids and out[0].packed == scratch[0].packed
        assert out[1:] == scratch[1:]
        return out

    partial = known = 0

    def counted(self: RenderMemo, text: str, turns: list[str], same: int = 0) -> int | None:
        nonlocal resumed, partial, known
        at = full_resume(self, text, turns, same)
        resumed += at is not None
        partial += at is not None and at < len(self.marks) - 1  # resumed before the last mark
        known += same > 0  # the template's render knew a prefix unchanged
        return at

    monkeypatch.setattr(Splicer, "_render", checked)
    monkeypatch.setattr(RenderMemo, "resume", counted)
    await test_openclaw_history_edits_still_extend(qwen3_model_dir, start_proxy)
    await test_breaks_are_reported_with_their_cause(model_dir, start_proxy)
    await test_identical_text_turns_match_in_conversation_order(model_dir, start_proxy)
    await test_an_edited_history_is_rendered_again_from_the_edit(model_dir, start_proxy)
    assert resumed >= 8
    assert partial >= 1  # the edited history resumed after the first generated turn, before the edit
    assert known >= 4


async def test_a_render_whose_build_failed_is_not_taken_for_the_previous_prompt(
    model_dir: Path, start_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's render knows how much of its text equals its previous render; when that
    render's build failed (so the prompt memo kept an older one), that knowledge is not used."""
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    history = await _three_calls(proxy, key)
    edited = [history[0], {"role": "user", "content": "first, edited"}, *history[2:]]
    codec = proxy.runtime.codec

    def failing(*args: Any) -> None:
        raise RuntimeError("tokenizer failure")

    # the template renders the edited conversation, then building its prompt fails
    monkeypatch.setattr(codec, "encode_into", failing)
    reply = await proxy.post(CHAT, {"model": "m", "messages": edited}, key=key, bearer=True)
    assert reply.status == 400
    monkeypatch.undo()
    # sent again: the template's render equals the failed one, not the one the memo holds
    reply = await proxy.post(CHAT, {"model": "m", "messages": edited}, key=key, bearer=True)
    assert reply.status == 200
    last = proxy.recorder.records[-1]
    assert "first, edited" in codec.decode(last.prompt_ids)
    check_invariants(proxy, fake)


async def test_template_forms_are_reused_only_for_the_same_messages_and_turns(
    model_dir: Path, start_proxy: Any
) -> None:
    """A render reuses the previous render's template forms for its leading messages that are the
    same objects with the same generated turns; a message now matched to another turn, or to
    none, gets its own."""
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session()
    await _three_calls(proxy, key)
    splicer = proxy.handler.state("r1").splicer
    forms = splicer._forms
    assert forms is not None
    view, turns = forms.view, forms.turns
    generated = [i for i, t in enumerate(turns) if t is not None]
    assert len(generated) == 2
    a, b = generated
    variants = [
        [*turns[:a], turns[b], *turns[a + 1 : b], turns[a], *turns[b + 1 :]],  # two turns swapped
        [*turns[:a], None, *turns[a + 1 :]],  # the first no longer matched
    ]
    tools = splicer.tools_key([])[1]
    for variant in variants:
        splicer._render(view, turns, tools)  # the previous render: the original turns
        got = splicer._render(view, variant, tools)
        splicer._memo, splicer._loop_cache, splicer._forms = None, LoopCache(), None
        want = splicer._render(view, variant, tools)
        assert got[0].ids == want[0].ids and got[1:] == want[1:]


async def test_whole_floats_resent_as_integers_still_match(model_dir: Path, start_proxy: Any) -> None:
    # JSON.parse + JSON.stringify (Claude Code, OpenClaw) turn the model's 30.0 into 30 and 1e3 into 1000
    args = '{"timeout": 30.0, "n": 1e3, "ratio": 0.5, "nested": [2.0, {"x": -4.0}]}'
    call = '<tool_call>\n{"name": "exec", "arguments": ' + args + "}\n</tool_call>"
    fake = ScriptedInferenceServer(model_dir, [call, "Done."])
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "run it"}]
    reply = await proxy.post(CHAT, {"model": "m", "messages": messages, "tools": TOOLS}, key=key, bearer=True)
    (tc,) = reply.json()["choices"][0]["message"]["tool_calls"]
    resent = '{"timeout":30,"n":1000,"ratio":0.5,"nested":[2,{"x":-4}]}'
    assert json.loads(resent) == json.loads(tc["function"]["arguments"])
    tc["function"]["arguments"] = resent
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [tc]},
        {"role": "tool", "tool_call_id": tc["id"], "content": "ok"},
    ]
    reply = await proxy.post(CHAT, {"model": "m", "messages": messages, "tools": TOOLS}, key=key, bearer=True)
    assert reply.status == 200
    first, second = proxy.recorder.records
    assert second.splice.break_cause.value == "none" and second.splice.extends_call_id == first.call_id
    assert [s.source_call_id for s in second.splice.reused] == [first.call_id]
    check_invariants(proxy, fake)


def test_floats_that_are_not_whole_keep_their_identity() -> None:
    from openforge_proxy.domain.turns import fingerprint

    assert fingerprint("", [("f", '{"a": 30.0}')]) == fingerprint("", [("f", {"a": 30})])
    assert fingerprint("", [("f", '{"a": 30.5}')]) != fingerprint("", [("f", {"a": 30})])
    assert fingerprint("", [("f", '{"a": 1e17}')]) == fingerprint("", [("f", '{"a": 100000000000000000}')])
    assert fingerprint("", [("f", '{"a": 1e20}')]) == fingerprint("", [("f", '{"a": 100000000000000000000}')])
    assert fingerprint("", [("f", '{"a": -2e18}')]) == fingerprint("", [("f", '{"a": -2000000000000000000}')])
    assert fingerprint("", [("f", '{"a": 1e300}')]) == fingerprint("", [("f", {"a": 1e300})])  # beyond 2**64
    assert fingerprint("", [("f", '{"a": 1e300}')]) != fingerprint("", [("f", {"a": 1e299})])
    assert fingerprint("", [("f", '{"a": "30.0"}')]) != fingerprint("", [("f", {"a": "30"})])


async def test_text_like_the_splice_placeholder_is_only_text(model_dir: Path, start_proxy: Any) -> None:
    # private-use characters a harness may send (pasted, or in a tool's output) never stand for a turn
    fake = ScriptedInferenceServer(model_dir, ["Sure.", "Done."])
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    assert (await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)).status == 200
    pasted = "\ue000ofsplice0\ue001 and \ue000ofsplice-0\ue001"
    messages = [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "HAND WRITTEN ANSWER"},
        {"role": "user", "content": f"tool output with {pasted} inside"},
        *messages,
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "next"},
    ]
    reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key, bearer=True)
    assert reply.status == 200
    rec = proxy.recorder.records[-1]
    text = proxy.runtime.codec.decode(rec.prompt_ids)
    assert "HAND WRITTEN ANSWER" in text and pasted in text
    assert [s.source_call_id for s in rec.splice.reused] == [proxy.recorder.records[0].call_id]
    check_invariants(proxy, fake)


@pytest.mark.parametrize(("reasoning", "same_task"), [("plan X", False), ("", False), ("plan X", True)])
async def test_twin_turns_of_two_conversations_stay_in_their_own(
    model_dir: Path, start_proxy: Any, reasoning: str, same_task: bool
) -> None:
    # a main agent and a sub-agent in one session both answer "OK." first, with nothing echoed
    first = final_text("OK.", reasoning=reasoning) if reasoning else "OK."
    fake = ScriptedInferenceServer(model_dir, [first, "OK.", "Next X.", "Next Y."])
    proxy = await start_proxy(fake)
    key = proxy.session()
    convs = {
        name: [
            {"role": "system", "content": f"You are {name}."},
            {"role": "user", "content": "Continue." if same_task else f"task {name}"},
        ]
        for name in ("X", "Y")
    }
    for name in ("X", "Y"):
        reply = await proxy.post(CHAT, {"model": "m", "messages": convs[name]}, key=key, bearer=True)
        convs[name] += [reply.json()["choices"][0]["message"], {"role": "user", "content": f"go on {name}"}]
    for name in ("X", "Y"):
        assert (await proxy.post(CHAT, {"model": "m", "messages": convs[name]}, key=key, bearer=True)).status == 200
    x1, y1, x2, y2 = proxy.recorder.records
    for earlier, later in ((x1, x2), (y1, y2)):
        assert later.splice.break_cause.value == "none", later.splice
        assert later.splice.extends_call_id == earlier.call_id
        assert later.prompt_ids[: len(earlier.prompt_ids) + len(earlier.completion_ids)] == (
            earlier.prompt_ids + earlier.completion_ids
        )
    check_invariants(proxy, fake)


async def test_an_attempt_the_client_left_is_not_taken_for_the_one_it_continued(
    model_dir: Path, start_proxy: Any
) -> None:
    # attempt 1 (non-streamed) is left by its client, generated on and recorded after attempt 2
    # of the retry; both say "OK.", with different reasoning: the client goes on from attempt 2
    answers = [final_text("OK.", reasoning="slow " * 40), final_text("OK.", reasoning="fast"), "Next."]
    fake = ScriptedInferenceServer(model_dir, answers, token_delay_s=0.01)
    proxy = await start_proxy(fake)
    key = proxy.session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    assert proxy.http is not None
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: {key}\r\n"
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()  # the client gives up on attempt 1
    answer = (await proxy.post(CHAT, body, key=key)).json()["choices"][0]["message"]
    for _ in range(1000):
        if len(proxy.recorder.records) == 2:
            break
        await asyncio.sleep(0.02)
    assert [r.attempt for r in proxy.recorder.records] == [2, 1], (proxy.recorder.records, len(fake.seen))
    messages += [answer, {"role": "user", "content": "go on"}]
    assert (await proxy.post(CHAT, {"model": "m", "messages": messages}, key=key)).status == 200
    text = proxy.runtime.codec.decode(proxy.recorder.records[-1].prompt_ids)
    assert "fast" in text and "slow" not in text


async def test_a_turn_after_an_edited_one_is_found_in_its_own_conversation(model_dir: Path, start_proxy: Any) -> None:
    # Y's "OK." follows no turn; X's "OK." follows X's "Plan.", which X's client then edits: X's
    # "OK." now follows no matched turn either, and is X's own by what it answered
    fake = ScriptedInferenceServer(model_dir, ["OK.", "Plan.", final_text("OK.", reasoning="hmm"), "Done."])
    proxy = await start_proxy(fake)
    key = proxy.session()
    y = [{"role": "system", "content": "You are Y."}, {"role": "user", "content": "task Y"}]
    x: list[dict[str, Any]] = [{"role": "system", "content": "You are X."}, {"role": "user", "content": "task X"}]
    await proxy.post(CHAT, {"model": "m", "messages": y}, key=key, bearer=True)
    for follow_up in ("go", "more"):
        reply = await proxy.post(CHAT, {"model": "m", "messages": x}, key=key, bearer=True)
        x += [reply.json()["choices"][0]["message"], {"role": "user", "content": follow_up}]
    x[2] = {"role": "assistant", "content": "Plan, edited."}
    assert (await proxy.post(CHAT, {"model": "m", "messages": x}, key=key, bearer=True)).status == 200
    records = proxy.recorder.records
    assert [s.source_call_id for s in records[-1].splice.reused] == [records[2].call_id]
    assert "hmm" in proxy.runtime.codec.decode(records[-1].prompt_ids)


async def test_an_http_1_0_client_gets_its_stream_until_the_connection_closes(
    model_dir: Path, start_proxy: Any
) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "streamed"))
    key = proxy.session()
    assert proxy.http is not None
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
    head = f"POST {CHAT} HTTP/1.0\r\nContent-Type: application/json\r\nx-api-key: {key}\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert raw.startswith(b"HTTP/1.0 200") and b"Transfer-Encoding: chunked" not in raw
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks = [json.loads(line[6:]) for line in raw.split(b"\r\n\r\n", 1)[1].split(b"\n") if line[6:7] == b"{"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "streamed"
    assert len(proxy.recorder.records) == 1
