"""Requests that are legal JSON but unusual: every one answered in the caller's protocol shape
before anything is streamed, and nothing recorded for a refused one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import ScriptedInferenceServer

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("stream", [False, True])
async def test_json_nested_too_deep_to_record_is_refused_before_the_answer(
    model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "OK."))
    key = proxy.session()
    message = {"role": "user", "content": "hi", "x_meta": _deep(300)}
    body = {"model": "m", "max_tokens": 50, "stream": stream, "messages": [message]}
    reply = await proxy.post(MESSAGES, body, key=key)
    assert reply.status == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    assert "nested" in reply.json()["error"]["message"]
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object", "properties": _deep(300)}}]
    reply = await proxy.post(
        MESSAGES, {**body, "messages": [{"role": "user", "content": "hi"}], "tools": tools}, key=key
    )
    assert reply.status == 400 and reply.json()["type"] == "error"
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}], "x": _deep(300)}
    reply = await proxy.post(RESPONSES, {"model": "m", "stream": stream, "input": [item]}, key=key, bearer=True)
    assert reply.status == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    for field in ("reasoning", "tool_choice"):  # echoed in the response object
        echoed = {"model": "m", "stream": stream, "input": "hi", field: _deep(300)}
        reply = await proxy.post(RESPONSES, echoed, key=key, bearer=True)
        assert reply.status == 400 and reply.json()["error"]["type"] == "invalid_request_error", field
    assert proxy.recorder.records == []
    assert len(proxy.fake.seen) == 0  # refused before the engine was asked
    # 200 levels are an unknown field like any other: accepted and kept in the record
    reply = await proxy.post(MESSAGES, {**body, "messages": [{**message, "x_meta": _deep(200)}]}, key=key)
    assert reply.status == 200
    assert len(proxy.recorder.records) == 1


async def test_count_tokens_checks_the_model(model_dir: Path, start_proxy: Any) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "OK."))
    key = proxy.session(model_name="policy")
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    ok = await proxy.post(MESSAGES + "/count_tokens", body, key=key)
    assert ok.status == 200 and ok.json()["input_tokens"] > 0
    wrong = await proxy.post(MESSAGES + "/count_tokens", {**body, "model": "other"}, key=key)
    assert wrong.status == 404 and wrong.json()["error"]["type"] == "not_found_error"
    # nothing is recorded for a count: a deep unknown field is counted like any other
    deep = {**body, "messages": [{"role": "user", "content": "hi", "x": _deep(300)}]}
    counted = await proxy.post(MESSAGES + "/count_tokens", deep, key=key)
    assert counted.status == 200 and counted.json() == ok.json()


def test_lone_surrogate_escapes_become_replacement_characters() -> None:
    from openforge_proxy.domain.json_text import replace_lone_surrogates

    assert replace_lone_surrogates(b'{"a":"x\\ud83d"}') == b'{"a":"x\\ufffd"}'
    assert replace_lone_surrogates(b'{"a":"\\uDE00y"}') == b'{"a":"\\ufffdy"}'
    assert replace_lone_surrogates(b'{"a":"\\ud83d\\ude00"}') is None  # a pair: kept
    assert replace_lone_surrogates(b'{"a":"\\\\ud83d"}') is None  # a backslash, then text
    assert replace_lone_surrogates(b'{"a":"\\\\\\ud83d"}') == b'{"a":"\\\\\\ufffd"}'
    assert replace_lone_surrogates(b'{"a":"\\ud83d\\ud83d\\ude00"}') == b'{"a":"\\ufffd\\ud83d\\ude00"}'
    assert replace_lone_surrogates(b'{"a":"plain"}') is None


async def test_a_string_cut_inside_a_surrogate_pair_is_served(model_dir: Path, start_proxy: Any) -> None:
    # JSON.stringify of a string cut in the middle of an emoji (a truncated tool output)
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "OK."))
    key = proxy.session()
    raw = b'{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"output: abc\\ud83d"}]}'
    reply = await proxy.post(MESSAGES, raw, key=key)
    assert reply.status == 200, reply.body
    (rec,) = proxy.recorder.records
    assert b"\\ufffd" in rec.request_json and b"\\ud83d" not in rec.request_json
    text = proxy.runtime.codec.decode(rec.prompt_ids)
    assert "output: abc\ufffd" in text
    bad = await proxy.post(MESSAGES, raw[:-1], key=key)  # still not JSON once repaired: the parser's error
    assert bad.status == 400 and "not valid JSON" in bad.json()["error"]["message"]
