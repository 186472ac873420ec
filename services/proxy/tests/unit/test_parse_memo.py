"""Anthropic Messages and Chat Completions parsing that reuses the unchanged start of a session's conversation.

Whatever is reused, the canonical request must equal a fresh parse of the same body: the
same messages, template forms, tool names and record JSON.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from openforge_core.errors import InvalidArgument
from openforge_proxy.domain.conversation import CanonicalRequest
from openforge_proxy.domain.protocols import anthropic, chat
from openforge_proxy.domain.protocols.memo import BodyMemo, ConversationMemo
from openforge_proxy.domain.scrub import scrub_json_bytes
from openforge_testing.captures import CAPTURES, load_run, runs


def _same_as_fresh(got: CanonicalRequest, body: dict[str, Any], protocol: Any = anthropic) -> None:
    """Compared as serialized JSON: ``==`` on parsed values ignores key order and takes 1, 1.0
    and true for one another, differences the template and the record do not ignore."""
    fresh = protocol.parse(copy.deepcopy(body))
    assert orjson.dumps(got.to_json()) == orjson.dumps(fresh.to_json())
    assert orjson.dumps([m.template_dict() for m in got.messages]) == orjson.dumps(
        [m.template_dict() for m in fresh.messages]
    )
    assert [m.refs for m in got.messages] == [m.refs for m in fresh.messages]
    assert got.record_json() == scrub_json_bytes(orjson.dumps(fresh.to_json()))


def _conversation(turns: int) -> list[dict[str, Any]]:
    """A Claude Code-like conversation: each turn a tool call and its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"step {i}", "signature": f"sig{i}"},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"ls {i}"}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"out {i}"},
                    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                ],
            }
        )
    return messages


def _body(messages: list[dict[str, Any]], system: Any = "You are a coding agent.") -> dict[str, Any]:
    return {
        "model": "policy",
        "max_tokens": 100,
        "system": system,
        "messages": messages,
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
    }


def test_growing_conversation_reuses_every_earlier_message() -> None:
    memo = ConversationMemo()
    previous: CanonicalRequest | None = None
    for turns in range(6):
        body = _body(_conversation(turns))
        got = anthropic.parse(body, memo)
        _same_as_fresh(got, body)
        if previous is not None:
            # everything the previous request held is the same objects, the new messages are new
            n = len(previous.messages)
            assert all(a is b for a, b in zip(got.messages[:n], previous.messages, strict=True))
            assert not any(m is p for m in got.messages[n:] for p in previous.messages)
            assert got.tools is previous.tools
        previous = got
    # tool results reused or not carry the tool's name, taken from the assistant message before them
    assert previous is not None
    assert [m.name for m in previous.messages if m.role == "tool"] == ["Bash"] * 5


def test_edited_history_is_converted_again_from_the_edit() -> None:
    memo = ConversationMemo()
    first = anthropic.parse(_body(_conversation(4)), memo)
    edited = _conversation(4)
    edited[4]["content"][0]["content"] = "compacted"  # the second tool result
    got = anthropic.parse(_body(edited), memo)
    _same_as_fresh(got, _body(edited))
    # reused: system, then entries 0-3 (user, assistant, tool + user, assistant); converted again from entry 4
    assert all(a is b for a, b in zip(got.messages[:6], first.messages[:6], strict=True))
    assert got.messages[6].role == "tool"
    assert got.messages[6].content == "compacted"
    assert not any(m is p for m in got.messages[6:] for p in first.messages)


def test_shorter_history_and_other_system_prompt() -> None:
    memo = ConversationMemo()
    first = anthropic.parse(_body(_conversation(4)), memo)
    shorter = anthropic.parse(_body(_conversation(2)), memo)
    _same_as_fresh(shorter, _body(_conversation(2)))
    assert shorter.messages[1] is first.messages[1]
    other = anthropic.parse(_body(_conversation(2), system=[{"type": "text", "text": "Other."}]), memo)
    _same_as_fresh(other, _body(_conversation(2), system=[{"type": "text", "text": "Other."}]))
    assert other.messages[0].content == "Other."
    assert not any(m is p for m in other.messages for p in shorter.messages)
    no_system = _body(_conversation(2), system=None)
    del no_system["system"]
    got = anthropic.parse(no_system, memo)
    _same_as_fresh(got, no_system)
    assert got.messages[0].role == "user"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # re-serialized with another key order
        ({"n": 1}, {"n": 1.0}),
        ({"n": 1}, {"n": True}),
        ({"n": 0}, {"n": False}),
    ],
)
def test_values_equal_to_python_but_not_the_same_json_are_converted_again(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    memo = ConversationMemo()
    messages = _conversation(2)
    messages[1]["content"][1]["input"] = before
    first = anthropic.parse(_body(messages), memo)
    resent = copy.deepcopy(messages)
    resent[1]["content"][1]["input"] = after
    got = anthropic.parse(_body(resent), memo)
    _same_as_fresh(got, _body(resent))
    assert got.messages[2].tool_calls[0].arguments is not first.messages[2].tool_calls[0].arguments
    assert orjson.dumps(got.messages[2].tool_calls[0].arguments) == orjson.dumps(after)
    system = [{"type": "image", "source": {"type": "base64", "data": "x", "media_type": "image/png"}}]
    reordered = [{"type": "image", "source": {"media_type": "image/png", "type": "base64", "data": "x"}}]
    anthropic.parse(_body(resent, system=system), memo)
    got = anthropic.parse(_body(resent, system=reordered), memo)
    _same_as_fresh(got, _body(resent, system=reordered))


def test_other_tools_are_converted_again() -> None:
    memo = ConversationMemo()
    first = anthropic.parse(_body(_conversation(1)), memo)
    body = _body(_conversation(2))
    body["tools"] = [*body["tools"], {"name": "Read", "input_schema": {"type": "object"}, "defer_loading": True}]
    got = anthropic.parse(body, memo)
    _same_as_fresh(got, body)
    assert got.tools is not first.tools
    assert [t.name for t in got.tools] == ["Bash", "Read"] and got.tools[1].deferred
    assert got.messages[1] is first.messages[1]


def test_a_refused_request_leaves_the_memo_as_it_was() -> None:
    memo = ConversationMemo()
    anthropic.parse(_body(_conversation(2)), memo)
    bad = _conversation(3)
    bad[-1] = {"role": "robot", "content": "x"}
    with pytest.raises(InvalidArgument):
        anthropic.parse(_body(bad), memo)
    assert len(memo.raw) == 5
    body = _body(_conversation(3))
    _same_as_fresh(anthropic.parse(body, memo), body)


def test_captured_claude_code_and_openclaw_sessions_parse_as_fresh() -> None:
    checked = {"anthropic": 0, "chat": 0}
    for run in runs(CAPTURES):
        memos = {"anthropic": ConversationMemo(), "chat": ConversationMemo()}
        docs, _ = load_run(run)
        for doc in docs:
            path = str(doc.get("path", "")).split("?")[0]
            name = "anthropic" if path.endswith("/messages") else "chat" if path.endswith("/chat/completions") else ""
            if not name:
                continue
            protocol = anthropic if name == "anthropic" else chat
            body = doc["body"]
            _same_as_fresh(protocol.parse(copy.deepcopy(body), memos[name]), body, protocol)
            checked[name] += 1
    assert checked["anthropic"] >= 10 and checked["chat"] >= 2, checked


def _chat_conversation(turns: int) -> list[dict[str, Any]]:
    """An OpenClaw-like Chat Completions conversation: tool calls with string arguments."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a personal assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Create hello.txt"}]},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "exec", "arguments": f'{{"n":{i}}}'}}
        messages.append({"role": "assistant", "content": "", "reasoning_content": f"r{i}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"out {i}"})
    return messages


def test_chat_completions_reuse_and_edits() -> None:
    memo = ConversationMemo()
    tools = [{"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}]
    previous: CanonicalRequest | None = None
    for turns in range(5):
        body = {"model": "m", "messages": _chat_conversation(turns), "tools": tools}
        got = chat.parse(body, memo)
        _same_as_fresh(got, body, chat)
        if previous is not None:
            n = len(previous.messages)
            assert all(a is b for a, b in zip(got.messages[:n], previous.messages, strict=True))
            assert got.tools is previous.tools
        previous = got
    assert previous is not None
    assert [m.name for m in previous.messages if m.role == "tool"] == ["exec"] * 4
    # arguments re-serialized with a space: the same value to Python, not the same JSON
    edited = _chat_conversation(4)
    edited[4]["tool_calls"][0]["function"]["arguments"] = '{"n": 1}'
    body = {"model": "m", "messages": edited, "tools": tools}
    got = chat.parse(body, memo)
    _same_as_fresh(got, body, chat)
    assert got.messages[3] is previous.messages[3] and got.messages[4] is not previous.messages[4]
    bad = {"model": "m", "messages": [*edited, {"role": "robot"}], "tools": tools}
    with pytest.raises(InvalidArgument):
        chat.parse(bad, memo)
    body = {"model": "m", "messages": _chat_conversation(2)}
    _same_as_fresh(chat.parse(body, memo), body, chat)


def _random_entry(rng: random.Random, protocol: Any) -> Any:
    i = rng.randint(0, 3)
    r = rng.random()
    if protocol is anthropic:
        if r < 0.3:
            use = {"type": "tool_use", "id": f"id{i}", "name": f"T{rng.randint(0, 2)}", "input": {"x": str(i)}}
            thinking = {"type": "thinking", "thinking": "th", "signature": f"s{i}"}
            return {"role": "assistant", "content": rng.choice([f"t{i}", [use, thinking]])}
        if r < 0.6:
            result = {"type": "tool_result", "tool_use_id": f"id{i}", "content": "out"}
            text = [{"type": "text", "text": "u"}] if rng.random() < 0.5 else []
            return {"role": "user", "content": [result, *text]}
    elif r < 0.3:
        call = {"id": f"id{i}", "type": "function", "function": {"name": f"T{rng.randint(0, 2)}", "arguments": "{}"}}
        return {"role": "assistant", "content": rng.choice([f"t{i}", None]), "tool_calls": [call]}
    elif r < 0.6:
        return {"role": "tool", "tool_call_id": f"id{i}", "content": "out"}
    if r < 0.75:
        return {"role": "system", "content": rng.choice(["s", [{"type": "text", "text": "s"}]])}
    if r < 0.95:
        image = {"type": "image", "source": {"d": str(i)}}
        return {"role": "user", "content": rng.choice(["hi", [{"type": "text", "text": "hi"}, image]])}
    return rng.choice([{"role": "bogus"}, "not an object"])  # the request is refused


@pytest.mark.parametrize("bodies", [False, True], ids=["dicts", "body-memo"])
@pytest.mark.parametrize("protocol", [anthropic, chat], ids=["anthropic", "chat"])
def test_random_histories_parse_as_fresh(protocol: Any, bodies: bool) -> None:
    """Appends, edits, truncations, system prompt changes and refused requests, in random order;
    with ``bodies``, each body serialized and parsed by a session's :class:`BodyMemo` as the
    handler does (unchanged values are then the previous parse's objects)."""
    rng = random.Random(7)
    tools: list[Any] = (
        [{"name": "T0", "input_schema": {}}]
        if protocol is anthropic
        else [{"type": "function", "function": {"name": "T0", "parameters": {}}}]
    )
    parsed = refused = reused = 0
    for _ in range(120):
        memo = ConversationMemo()
        body_memo = BodyMemo()
        entries: list[Any] = []
        system = rng.choice([None, "sys", [{"type": "text", "text": "sys"}]])
        for _ in range(20):
            op = rng.random()
            if op < 0.6:
                entries = entries + [_random_entry(rng, protocol) for _ in range(rng.randint(1, 3))]
            elif op < 0.75 and entries:
                k = rng.randrange(len(entries))
                entries = [*entries[:k], _random_entry(rng, protocol), *entries[k + 1 :]]
            elif op < 0.85:
                entries = entries[: rng.randint(0, len(entries))]
            else:
                system = rng.choice([None, "sys", [{"type": "text", "text": "other"}]])
            body: dict[str, Any] = {"model": "m", "messages": copy.deepcopy(entries), "tools": tools}
            if system is not None and protocol is anthropic:
                body["system"] = copy.deepcopy(system)
            given = body_memo.loads(orjson.dumps(body)) if bodies else body
            try:
                protocol.parse(copy.deepcopy(body))
            except InvalidArgument:
                with pytest.raises(InvalidArgument):
                    protocol.parse(given, memo)
                refused += 1
                entries = [e for e in entries if isinstance(e, dict) and e.get("role") != "bogus"]
                continue
            _same_as_fresh(protocol.parse(given, memo), body, protocol)
            parsed += 1
        reused += body_memo.reused
    assert parsed > 1000 and refused > 20
    assert reused > 1000 if bodies else reused == 0


def test_tools_that_are_not_a_list_are_refused_naming_the_field() -> None:
    body = _body(_conversation(1))
    body["tools"] = {"name": "Bash"}
    with pytest.raises(InvalidArgument, match="tools"):
        anthropic.parse(body, ConversationMemo())


@pytest.mark.parametrize("protocol", [anthropic, chat])
def test_tool_names_of_reused_messages_follow_edits_of_the_history(protocol: Any) -> None:
    """A tool result names its tool from the assistant message that called it; when the whole
    previous request is reused its names are the previous parse's, including after an edit that
    gave a call id another tool."""

    def call(call_id: str, name: str) -> dict[str, Any]:
        if protocol is anthropic:
            return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": {}}]}
        tc = {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        return {"role": "assistant", "content": None, "tool_calls": [tc]}

    def result(call_id: str) -> dict[str, Any]:
        if protocol is anthropic:
            return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]}
        return {"role": "tool", "tool_call_id": call_id, "content": "ok"}

    user = {"role": "user", "content": "go"}
    histories = [
        [user, call("t1", "Bash")],
        [user, call("t1", "Bash"), result("t1"), call("t2", "Read")],
        [user, call("t1", "Edit"), result("t1"), call("t2", "Read")],  # t1 now calls another tool
        [user, call("t1", "Edit"), result("t1"), call("t2", "Read"), result("t2"), call("t1", "Grep")],
        [user, call("t1", "Edit"), result("t1"), call("t2", "Read"), result("t2"), call("t1", "Grep"), result("t1")],
    ]
    memo = ConversationMemo()
    bodies = BodyMemo()
    want_names = [[], ["Bash"], ["Edit"], ["Edit", "Read"], ["Edit", "Read", "Grep"]]
    for history, names in zip(histories, want_names, strict=True):
        body = {"model": "m", "max_tokens": 8, "messages": history}
        got = protocol.parse(bodies.loads(orjson.dumps(body)), memo)
        _same_as_fresh(got, body, protocol)
        assert [m.name for m in got.messages if m.role == "tool"] == names
    # a request refused half-way through its parse leaves the names kept as they were
    grown = [*histories[-1], call("t3", "Zzz"), 5]
    with pytest.raises(InvalidArgument):
        protocol.parse(bodies.loads(orjson.dumps({"model": "m", "max_tokens": 8, "messages": grown})), memo)
    body = {"model": "m", "max_tokens": 8, "messages": [*histories[-1], result("t3")]}  # t3 was never called
    got = protocol.parse(bodies.loads(orjson.dumps(body)), memo)
    _same_as_fresh(got, body, protocol)
    assert [m.name for m in got.messages if m.role == "tool"][-1] != "Zzz"
