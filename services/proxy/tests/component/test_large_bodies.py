"""The large-body parser process (``OPENFORGE_LARGE_BODY__PROCESS``) against the reference path.

The same requests, through public calls, go to a proxy without the parser (every body parsed in
its process) and to one whose parser takes every body (``min_bytes`` 0: each body is parsed in
the child process and converted without the session's memos); answers and records must agree,
errors in the same protocol shape with the same messages."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest

from openforge_proxy.adapters.body_parser import ProcessBodyParser
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.json_text import parse_object
from openforge_proxy.domain.output import ApiError
from openforge_proxy.domain.screen import Screen, TooLong
from openforge_testing.fakes import ScriptedInferenceServer

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"

#: Bodies each API gets, as raw bytes: valid, not JSON, not an object, a lone surrogate
#: (repaired), invalid for the protocol, another model, a prompt longer than the context; then
#: prompts longer than the context that the reference path refuses for another reason first
#: (invalid, another model, tools that cannot be written again), and a long assistant turn
#: (not counted by check_fits: refused while rendering).
_LONG = "word " * 500_000  # over the context even at 16 bytes a token (the longest piece)
#: A tool schema 300 levels deep: parsed (orjson reads 1024 levels), not written again (254).
_DEEP = "DEEP-SCHEMA"
_DEEP_JSON = b'{"a":' * 300 + b'"x"' + b"}" * 300
_DEEP_TOOLS = {
    MESSAGES: {"tools": [{"name": "t", "input_schema": {"type": "object", "properties": _DEEP}}]},
    CHAT: {"tools": [{"type": "function", "function": {"name": "t", "parameters": {"properties": _DEEP}}}]},
    RESPONSES: {"tools": [{"type": "function", "name": "t", "parameters": {"properties": _DEEP}}]},
}


def _cases() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for path, body in (
        (MESSAGES, {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi \u00e9"}]}),
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        (RESPONSES, {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}]}),
    ):
        raw = orjson.dumps(body)
        out += [
            (path, raw),
            (path, raw[:-1]),  # not JSON
            (path, b"[1, 2]"),  # not an object
            (path, raw.replace(b"hi", b"hi \\ud83d")),  # a lone surrogate: repaired, served
            (path, raw.replace(b'"model":"m"', b'"model":5')),  # the protocol refuses it
            (path, raw.replace(b'"model":"m"', b'"model":"other"')),  # another model than the session's
            (path, raw.replace(b"hi", _LONG.encode())),  # cannot fit the context
            (path, raw.replace(b'"model":"m"', b'"model":5').replace(b"hi", _LONG.encode())),
            (path, raw.replace(b'"model":"m"', b'"model":"other"').replace(b"hi", _LONG.encode())),
            (
                path,
                orjson.dumps({**body, **_DEEP_TOOLS[path]})
                .replace(b'"DEEP-SCHEMA"', _DEEP_JSON)
                .replace(b"hi", _LONG.encode()),
            ),
            (path, _with_long_assistant_turn(path, body)),
        ]
    return out


def _with_long_assistant_turn(path: str, body: dict[str, Any]) -> bytes:
    if path == RESPONSES:
        text = [{"type": "output_text", "text": _LONG}]
        turn = {"type": "message", "role": "assistant", "id": "msg_1", "content": text}
        return orjson.dumps({**body, "input": [*body["input"], turn, {"role": "user", "content": "go"}]})
    turn = {"role": "assistant", "content": _LONG}
    return orjson.dumps({**body, "messages": [*body["messages"], turn, {"role": "user", "content": "go"}]})


def _comparable(reply: Any) -> tuple[int, Any]:
    """Status and JSON body without what differs per call (ids, times)."""
    body = reply.json()
    if reply.status != 200:
        body.pop("request_id", None)
        return reply.status, body
    return reply.status, None


async def _both(model_dir: Path, start_proxy: Any) -> tuple[Any, Any]:
    def fake() -> ScriptedInferenceServer:
        return ScriptedInferenceServer(model_dir, default=lambda prompt: "OK.")

    reference = await start_proxy(fake())
    fast = await start_proxy(fake(), body_parser_min_bytes=0)
    return reference, fast


async def test_every_body_answers_as_the_reference_path(model_dir: Path, start_proxy: Any) -> None:
    reference, fast = await _both(model_dir, start_proxy)
    screened: list[str] = []
    parser = fast.body_parser
    assert parser is not None
    parse = parser.parse

    async def spy(body: bytes, call: Screen | None = None) -> Any:
        got = await parse(body, call)
        if isinstance(got, TooLong):
            screened.append(got.model)
        return got

    parser.parse = spy
    answers: list[list[tuple[int, Any]]] = []
    for proxy in (reference, fast):
        key = proxy.session(model_name="m")
        got = []
        for path, raw in _cases():
            got.append(_comparable(await proxy.post(path, raw, key=key, bearer=path != MESSAGES)))
        counted = await proxy.post(MESSAGES + "/count_tokens", _cases()[0][1], key=key)
        got.append((counted.status, counted.json()))
        answers.append(got)
    assert answers[0] == answers[1]
    statuses = [status for status, _ in answers[0]]
    assert statuses == [200, 400, 400, 200, 400, 404, 400, 400, 404, 400, 400] * 3 + [200]
    messages = [body["error"]["message"] if body else "" for _, body in answers[0][:-1]]
    # the long prompt, and the long assistant turn (not counted by check_fits: refused while rendering)
    assert all("prompt is too long" in messages[api + k] for api in (0, 11, 22) for k in (6, 10))
    # refused in the parser's process where the reference refuses for the prompt's length:
    # the long prompt of each API, and the long prompt for another model (refused as such)
    assert screened == ["m", "other"] * 3
    records = [
        [(r.wire_api, r.request_json, r.canonical_json, r.prompt.ids) for r in p.recorder.records]
        for p in (reference, fast)
    ]
    assert records[0] == records[1] and len(records[0]) == 6
    assert fast.body_parser is not None


@pytest.mark.parametrize("path", [MESSAGES, CHAT, RESPONSES])
async def test_a_conversation_is_spliced_as_by_the_reference_path(model_dir: Path, start_proxy: Any, path: str) -> None:
    reference, fast = await _both(model_dir, start_proxy)
    seen = []
    for proxy in (reference, fast):
        key = proxy.session(model_name="m")
        history: list[dict[str, Any]] = []
        for turn in range(3):
            if path == RESPONSES:
                history.append({"type": "message", "role": "user", "content": f"step {turn}"})
                body: dict[str, Any] = {"model": "m", "input": history}
            else:
                history.append({"role": "user", "content": f"step {turn}"})
                body = {"model": "m", "max_tokens": 20, "messages": history}
            reply = await proxy.post(path, body, key=key, bearer=path != MESSAGES)
            assert reply.status == 200, reply.body
            if path == RESPONSES:
                history += [item for item in reply.json()["output"] if item["type"] == "message"]
            elif path == CHAT:
                history.append(reply.json()["choices"][0]["message"])
            else:
                history.append({"role": "assistant", "content": reply.json()["content"]})
        seen.append(
            [
                (r.prompt.ids, [(s.start, s.end) for s in r.splice.reused], r.canonical_json)
                for r in proxy.recorder.records
            ]
        )
    assert seen[0] == seen[1]
    assert [len(reused) for _, reused, _ in seen[1]] == [0, 1, 2]  # each call extends the last


async def test_the_parser_agrees_with_the_reference_and_survives_its_child() -> None:
    parser = ProcessBodyParser(0)
    bodies = [
        b'{"a":[1,2.5,true,null,"\\u00e9\\ud83d\\ude00"],"b":{"c":18446744073709551616}}',
        b'{"a":"x\\ud83d"}',  # repaired
        b'{"a":1',
        b'"text"',
        b"[" * 2000 + b"]" * 2000,  # deeper than orjson parses
        orjson.dumps({"big": "x" * (5 << 20)}),
    ]

    def reference(raw: bytes) -> Any:
        try:
            return parse_object(raw)
        except ApiError as err:
            return err.kind, err.message, err.status

    async def fast(raw: bytes) -> Any:
        try:
            return await parser.parse(raw)
        except ApiError as err:
            return err.kind, err.message, err.status

    try:
        for raw in bodies:
            assert await fast(raw) == reference(raw)
        # the child dies: the body is still parsed (here), and the next one by a new child
        pid = parser.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert await fast(bodies[0]) == reference(bodies[0])
        assert await fast(bodies[1]) == reference(bodies[1])
        assert parser.pid not in (None, pid)
    finally:
        parser.close()


async def test_a_body_whose_prompt_cannot_fit_comes_back_as_its_refusal_alone() -> None:
    parser = ProcessBodyParser(0)
    call = Screen(WireApi.OPENAI_CHAT, 1000, 4)

    def body(content: str, **extra: Any) -> bytes:
        return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}], **extra})

    try:
        # 10,000 characters, pieces of at most 4 bytes: at least 2,500 tokens, over 1,000
        assert await parser.parse(body("word " * 2000), call) == TooLong("m", 2500, 1000)
        assert str(TooLong("m", 2500, 1000).error()) == "prompt is too long: at least 2500 tokens > 1000 maximum"
        # what fits, what does not convert, and what is not screened come back parsed
        for raw, screen in (
            (body("word " * 100), call),
            (body("word " * 2000, max_tokens=True), call),  # a boolean token cap: invalid
            (body("word " * 2000), None),
            (body("word " * 2000), Screen(WireApi.OPENAI_CHAT, 3000, 4)),
        ):
            assert await parser.parse(raw, screen) == parse_object(raw)
    finally:
        parser.close()


def _deep_cases() -> list[tuple[str, bytes]]:
    """Bodies nested deep: an unknown field 300 levels deep on the user's message (parsed, not
    written again), for the session's model and another, with a short and a too-long prompt; and a
    tool call whose id nests 995 levels (past the interpreter's recursion limit when converted)
    before a too-long prompt."""
    ids = b"[" * 995 + b"]" * 995
    out: list[tuple[str, bytes]] = []
    bodies: tuple[tuple[str, dict[str, Any]], ...]
    for model in ("m", "other"):
        for text in ("hi", _LONG):
            user: dict[str, Any] = {"role": "user", "content": text, "x": _DEEP}
            bodies = (
                (MESSAGES, {"model": model, "max_tokens": 20, "messages": [user]}),
                (CHAT, {"model": model, "messages": [user]}),
                (RESPONSES, {"model": model, "input": [{"type": "message", **user}]}),
            )
            out += [(path, orjson.dumps(body).replace(b'"DEEP-SCHEMA"', _DEEP_JSON)) for path, body in bodies]
    user = {"role": "user", "content": _LONG}
    call = {"type": "tool_use", "id": "IDS", "name": "f", "input": {}}
    calls = [{"id": "IDS", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    bodies = (
        (MESSAGES, {"model": "m", "max_tokens": 20, "messages": [user, {"role": "assistant", "content": [call]}]}),
        (CHAT, {"model": "m", "messages": [user, {"role": "assistant", "tool_calls": calls}]}),
        (RESPONSES, {"model": "m", "input": [user, {"type": "function_call", "call_id": "IDS", "name": "f"}]}),
    )
    return out + [(path, orjson.dumps(body).replace(b'"IDS"', ids)) for path, body in bodies]


@pytest.mark.parametrize("path", [MESSAGES, CHAT, RESPONSES])
async def test_deep_bodies_are_refused_alike_by_every_path(model_dir: Path, start_proxy: Any, path: str) -> None:
    """Refused in the same order with the parser process or without, with the session's memos or
    without: the memos write each message as they read it (a part nested too deep is found there
    first), and the parser's process has a higher recursion limit; neither may change an answer."""

    def fake() -> ScriptedInferenceServer:
        return ScriptedInferenceServer(model_dir, default=lambda prompt: "OK.")

    proxies = [
        await start_proxy(fake()),  # the reference path (memos on)
        await start_proxy(fake(), body_parser_min_bytes=0),  # every body in the parser's process
        await start_proxy(fake(), memos=False),  # every call computed whole
    ]
    answers = []
    for proxy in proxies:
        key = proxy.session(model_name="m")
        first = _cases()[{MESSAGES: 0, CHAT: 11, RESPONSES: 22}[path]]
        assert (await proxy.post(*first, key=key, bearer=path != MESSAGES)).status == 200  # the model is loaded
        answers.append(
            [
                _comparable(await proxy.post(p, raw, key=key, bearer=p != MESSAGES))
                for p, raw in _deep_cases()
                if p == path
            ]
        )
    assert answers[0] == answers[1] == answers[2], answers
    statuses = [status for status, _ in answers[0]]
    assert statuses == [400, 400, 404, 404, 400], statuses  # never a 500
