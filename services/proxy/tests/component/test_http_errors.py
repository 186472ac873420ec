"""HTTP surface: error shapes per protocol, limits, auth, body encodings, routes, streaming order.

Every error is answered in the caller's own shape (Anthropic
``{"type": "error", "error": {...}}`` with ``request-id``; OpenAI
``{"error": {"message", "type", "param", "code"}}`` with ``x-request-id``)
and no error before a call is admitted leaves a record. A call admitted and then not
answered (the engine failed, the client left, the record could not be stored) leaves a
failed record: its call id and attempt, the error, the status sent, no token ids — so the
rollout's count of calls, taken at admission, is met by its records.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import zstandard

from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import RecordTooLarge
from openforge_proxy.domain.sessions import Limits
from openforge_testing.fakes import ScriptedInferenceServer, final_text, tool_call_text

MESSAGES = "/v1/messages?beta=true"
RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"


def anthropic_body(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": "policy-model",
        "max_tokens": 64,
        "stream": stream,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Say hi."}],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "some_future_field": {"x": 1},
        **extra,
    }


def responses_body(stream: bool = True) -> dict[str, Any]:
    return {
        "model": "policy-model",
        "stream": stream,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be terse."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]},
        ],
        "client_metadata": {"x-codex-installation-id": "abc123"},
        "store": False,
    }


def chat_body(stream: bool = True) -> dict[str, Any]:
    return {
        "model": "policy-model",
        "stream": stream,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say hi."}],
        "max_completion_tokens": 64,
    }


def assert_anthropic_error(reply: Any, status: int, kind: str) -> None:
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert reply.headers["request-id"] == body["request_id"]


def assert_openai_error(reply: Any, status: int, kind: str) -> None:
    assert reply.status == status, reply.body
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == kind
    assert reply.headers["x-request-id"].startswith("req")


async def test_auth_errors_in_each_protocol(proxy: Any) -> None:
    key = proxy.session()
    assert_anthropic_error(await proxy.post(MESSAGES, anthropic_body()), 401, "authentication_error")
    assert_anthropic_error(await proxy.post(MESSAGES, anthropic_body(), key="ofk-unknown"), 401, "authentication_error")
    assert_openai_error(
        await proxy.post(RESPONSES, responses_body(), key="nope", bearer=True), 401, "invalid_request_error"
    )
    assert_openai_error(await proxy.post(CHAT, chat_body()), 401, "invalid_request_error")
    proxy.sessions.close("r1")
    closed = await proxy.post(CHAT, chat_body(), key=key, bearer=True)
    assert_openai_error(closed, 401, "invalid_request_error")
    assert "ofk-" not in closed.body.decode()
    assert proxy.recorder.records == []


async def test_bad_json_too_large_and_unknown_model(model_dir: Path, start_proxy: Any) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir))
    proxy._max_body = 0  # unused after start; the server's own limit is set below
    assert proxy.http is not None
    proxy.http._limit = 4096
    key = proxy.session(model_name="policy-model", harness="claude-code")
    assert_anthropic_error(await proxy.post(MESSAGES, b"{not json", key=key), 400, "invalid_request_error")
    assert_openai_error(await proxy.post(RESPONSES, b"[1, 2]", key=key, bearer=True), 400, "invalid_request_error")
    big = anthropic_body(messages=[{"role": "user", "content": "x" * 10000}])
    assert_anthropic_error(await proxy.post(MESSAGES, big, key=key), 413, "request_too_large")
    # a small compressed body that expands past the limit is refused too
    bomb = gzip.compress(json.dumps(big).encode())
    assert len(bomb) < 4096
    reply = await proxy.post(CHAT, bomb, key=key, bearer=True, headers={"Content-Encoding": "gzip"})
    assert_openai_error(reply, 413, "invalid_request_error")
    wrong = await proxy.post(CHAT, {**chat_body(), "model": "gpt-x"}, key=key, bearer=True)
    assert_openai_error(wrong, 404, "invalid_request_error")
    assert wrong.json()["error"]["code"] == "model_not_found"
    assert_anthropic_error(await proxy.post(MESSAGES, anthropic_body(model="other"), key=key), 404, "not_found_error")
    missing = await proxy.post(MESSAGES, {"model": "policy-model", "max_tokens": 5}, key=key)
    assert_anthropic_error(missing, 400, "invalid_request_error")
    unknown = await proxy.post(MESSAGES, anthropic_body(), key="ofk-not-a-key")
    assert_anthropic_error(unknown, 401, "authentication_error")
    assert proxy.recorder.records == []
    # each refusal is counted by route, status and the key's harness for Prometheus
    # (openforge_proxy.http.metrics); a key no session has counts under no harness
    answers = {
        (s.labels["route"], s.labels["status"], s.labels["harness"]): s.value
        for f in proxy.metrics_registry.collect()
        if f.name == "openforge_proxy_http_responses"
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert answers == {
        ("/messages", "400", "claude-code"): 2,
        ("/messages", "413", "claude-code"): 1,
        ("/messages", "404", "claude-code"): 1,
        ("/responses", "400", "claude-code"): 1,
        ("/chat/completions", "413", "claude-code"): 1,
        ("/chat/completions", "404", "claude-code"): 1,
        ("/messages", "401", ""): 1,
    }


def assert_failed(rec: Any, status: int, *, attempt: int = 1, finish: Finish = Finish.ERROR) -> None:
    assert rec.error and rec.http_status == status and rec.finish is finish and rec.attempt == attempt
    assert rec.completion_ids == [] and len(rec.prompt) == 0 and rec.request_json == b"" and rec.rollout_attempt == 1


async def test_inference_unavailable_is_503_and_leaves_a_failed_record(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, [final_text("hi")])
    proxy = await start_proxy(fake)
    key = proxy.session()
    fake.fail_next.append(grpc.StatusCode.UNAVAILABLE)
    assert_anthropic_error(await proxy.post(MESSAGES, anthropic_body(stream=True), key=key), 503, "api_error")
    fake.fail_next.append(grpc.StatusCode.UNAVAILABLE)
    assert_openai_error(await proxy.post(RESPONSES, responses_body(), key=key, bearer=True), 503, "server_error")
    first, second = proxy.recorder.records
    assert_failed(first, 503)
    assert_failed(second, 503)
    assert "inference" in first.error and first.call_id != second.call_id
    assert proxy.sessions.get("r1").calls == 2  # counted at admission, each met by a record
    # the retry is served and recorded as attempt 2 of the same call
    ok = await proxy.post(RESPONSES, responses_body(), key=key, bearer=True)
    assert ok.status == 200
    (rec,) = proxy.recorder.answered
    assert rec.attempt == 2 and rec.call_id == second.call_id and rec.completion_ids == fake.seen[-1].sampled_ids


async def test_engine_down_before_model_loaded(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir)
    proxy = await start_proxy(fake)
    key = proxy.session()
    await fake.stop()
    assert_openai_error(await proxy.post(CHAT, chat_body(), key=key, bearer=True), 503, "server_error")
    assert proxy.recorder.records == []


async def test_mid_stream_failure_ends_with_the_protocols_error_event(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, [final_text("one two three four five six seven eight")] * 3)
    proxy = await start_proxy(fake)
    key = proxy.session()
    fake.fail_after_tokens = 3
    events = (await proxy.post(MESSAGES, anthropic_body(stream=True), key=key)).events()
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "overloaded_error"
    fake.fail_after_tokens = 3
    events = (await proxy.post(RESPONSES, responses_body(), key=key, bearer=True)).events()
    assert events[-1][0] == "response.failed"
    assert all(e != "response.output_item.done" for e, _ in events)
    fake.fail_after_tokens = 3
    events = (await proxy.post(CHAT, chat_body(), key=key, bearer=True)).events()
    assert "error" in events[-1][1]
    # each stream began with 200; none of the tokens sampled before the failure is recorded
    # (the Chat request renders to the Responses request's prompt: a second attempt of its call)
    assert len(proxy.recorder.failed) == len(proxy.recorder.records) == 3
    for rec, attempt in zip(proxy.recorder.records, [1, 1, 2], strict=True):
        assert_failed(rec, 200, attempt=attempt)


async def test_limits_end_the_rollout_with_400(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "ok")
    proxy = await start_proxy(fake)
    key = proxy.session(limits=Limits(max_turns=1, max_tokens_per_call=3))
    first = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert first.status == 200
    assert fake.seen[0].sampling.max_tokens == 3  # the per-call cap wins over the harness's 64
    # the same request again is a retry (allowed); a new conversation is a new turn (refused)
    assert (await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)).status == 200
    nxt = chat_body(stream=False)
    nxt["messages"].append({"role": "user", "content": "again"})
    assert_openai_error(await proxy.post(CHAT, nxt, key=key, bearer=True), 400, "invalid_request_error")
    anth = anthropic_body()
    anth["messages"].append({"role": "assistant", "content": "ok"})
    anth["messages"].append({"role": "user", "content": "more"})
    assert_anthropic_error(await proxy.post(MESSAGES, anth, key=key), 400, "invalid_request_error")
    assert [r.attempt for r in proxy.recorder.records] == [1, 2]


async def test_encodings_routes_and_enforced_sampling(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "hi there")
    proxy = await start_proxy(fake)
    key = proxy.session(temperature=0.7, top_p=0.9, seed=5)
    raw = json.dumps(chat_body(stream=False)).encode()
    for path, data, enc in [
        ("/v1/chat/completions", gzip.compress(raw), "gzip"),
        ("/chat/completions", zstandard.ZstdCompressor().compress(raw), "zstd"),
        ("/some/prefix/v1/chat/completions?x=1", raw, "identity"),
    ]:
        reply = await proxy.post(path, data, key=key, bearer=True, headers={"Content-Encoding": enc})
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "hi there"
    s = fake.seen[0].sampling
    assert (round(s.temperature, 3), round(s.top_p, 3)) == (0.7, 0.9)
    assert s.seed != 5 and 0 <= s.seed < 2**63  # the call's own seed, derived from the session's
    recorded = proxy.recorder.records[0].sampling  # the same value the engine got, seed an int
    assert (recorded.temperature, recorded.top_p, recorded.seed) == (0.7, 0.9, s.seed) and type(recorded.seed) is int
    assert (await proxy.post("/messages", anthropic_body(), key=key)).status == 200
    models = await proxy.get("/v1/models", headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
    assert models.status == 200 and models.json()["data"][0]["type"] == "model"
    assert (await proxy.get("/v1/models")).status == 401
    counted = await proxy.post("/v1/messages/count_tokens", anthropic_body(), key=key)
    assert counted.status == 200 and counted.json()["input_tokens"] > 10
    assert (await proxy.get("/v1/nothing")).status == 404


async def test_each_call_samples_with_its_own_seed_and_the_same_call_again_with_the_same(
    model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "ok")
    proxy = await start_proxy(fake)
    first, nxt = chat_body(stream=False), chat_body(stream=False)
    nxt["messages"].append({"role": "assistant", "content": "ok"})
    nxt["messages"].append({"role": "user", "content": "again"})
    sessions = {"a": proxy.session("a", seed=11), "b": proxy.session("b", seed=11), "c": proxy.session("c", seed=12)}
    for key in sessions.values():
        for body in (first, first, nxt):  # a call, its retry, the next call
            assert (await proxy.post(CHAT, body, key=key, bearer=True)).status == 200
    seeds = [r.sampling.seed for r in fake.seen]
    a, b, c = seeds[0:3], seeds[3:6], seeds[6:9]
    assert a[0] == a[1] != a[2]  # a retry samples as the call did; the next call differently
    assert a == b  # the same session seed and calls: the same seeds
    assert set(c).isdisjoint(a)  # another session seed: others
    assert all(0 <= x < 2**63 for x in seeds)
    unseeded = proxy.session("d", temperature=1.0)
    assert (await proxy.post(CHAT, first, key=unseeded, bearer=True)).status == 200
    assert not fake.seen[-1].sampling.HasField("seed")


async def test_streams_in_exact_event_order(model_dir: Path, start_proxy: Any) -> None:
    completion = tool_call_text("exec", {"command": "ls"}, text="Looking.", reasoning="I should list.")
    fake = ScriptedInferenceServer(model_dir, [completion] * 3)
    proxy = await start_proxy(fake)
    key = proxy.session()
    tools = [{"name": "exec", "description": "run", "input_schema": {"type": "object"}}]
    body = anthropic_body(stream=True, tools=tools, thinking={"type": "adaptive"})
    events = (await proxy.post(MESSAGES, body, key=key)).events()
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    names = [(e, d.get("content_block", {}).get("type") or d.get("delta", {}).get("type")) for e, d in events]
    collapsed = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
    assert collapsed == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    rbody = {**responses_body(), "reasoning": {"summary": "auto"}}
    rbody["tools"] = [{"type": "function", "name": "exec", "parameters": {"type": "object"}}]
    rnames = [e for e, _ in (await proxy.post(RESPONSES, rbody, key=key, bearer=True)).events()]
    rcollapsed = [n for i, n in enumerate(rnames) if i == 0 or n != rnames[i - 1]]
    assert rcollapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    cbody = {**chat_body(), "tools": [{"type": "function", "function": {"name": "exec", "parameters": {}}}]}
    chunks = [d for _, d in (await proxy.post(CHAT, cbody, key=key, bearer=True)).events()]
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] > 0
    kinds = [next(iter(c["choices"][0]["delta"]), "finish") for c in chunks[:-2]]
    ccollapsed = [n for i, n in enumerate(kinds) if i == 0 or n != kinds[i - 1]]
    assert ccollapsed == ["role", "reasoning_content", "content", "tool_calls", "finish"]
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert len(proxy.recorder.records) == 3
    # usage reported equals what the engine saw and sampled
    rec = proxy.recorder.records[-1]
    assert chunks[-2]["usage"]["prompt_tokens"] == len(rec.prompt_ids) == len(fake.seen[-1].prompt_ids)


async def test_a_record_that_cannot_be_stored_fails_the_call(model_dir: Path, start_proxy: Any) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "fine"))
    key = proxy.session()
    proxy.recorder.fail = RuntimeError("bus down")
    reply = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert_openai_error(reply, 503, "server_error")
    events = (await proxy.post(MESSAGES, anthropic_body(stream=True), key=key)).events()
    assert events[-1][0] == "error" and all(e != "message_stop" for e, _ in events)


async def test_an_answer_begun_before_its_record_is_acknowledged_completes_only_after_it(
    model_dir: Path, start_proxy: Any
) -> None:
    """A non-streamed answer leaves but its last byte while the bus acknowledges the record: the
    harness holds a complete answer only once the record is stored, and a broken one if it is not."""
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "fine"))
    key = proxy.session()
    proxy.recorder.ack_delay_s = 0.05
    reply = await proxy.post(MESSAGES, anthropic_body(stream=False), key=key)
    assert reply.status == 200 and reply.json()["content"][0]["text"] == "fine"
    assert int(reply.headers["Content-Length"]) == len(reply.body)
    assert len(proxy.recorder.records) == 1
    proxy.recorder.fail = RuntimeError("bus down")
    with pytest.raises(aiohttp.ClientPayloadError):
        await proxy.post(MESSAGES, anthropic_body(stream=False), key=key)
    # the connection is dropped, not the proxy: the next call is answered
    proxy.recorder.fail = None
    assert (await proxy.post(MESSAGES, anthropic_body(stream=False), key=key)).status == 200


async def test_a_record_over_the_bus_limit_stops_the_harness(model_dir: Path, start_proxy: Any) -> None:
    """Retrying cannot make a record smaller: the terminal 400 of each protocol, not a 503."""
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "fine"))
    key = proxy.session()
    proxy.recorder.fail_answered = RecordTooLarge(2_000_000, 1_048_576)
    reply = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert_openai_error(reply, 400, "invalid_request_error")
    assert "2000000 bytes, over the event bus's limit of 1048576 bytes" in reply.json()["error"]["message"]
    reply = await proxy.post(MESSAGES, anthropic_body(stream=False), key=key)
    assert_anthropic_error(reply, 400, "invalid_request_error")
    assert proxy.recorder.answered == []
    # each refused call still leaves its small failed record (no ids, no bodies)
    assert [r.error.startswith("record: the call record is 2000000 bytes") for r in proxy.recorder.failed] == [
        True,
        True,
    ]
    # nothing of the refused calls stays in the session: no conversation view, no cached ids
    state = proxy.handler.state("r1")
    assert state is not None and not state.splicer.heads and len(state.splicer.cache) == 0


async def test_engine_output_the_store_would_refuse_fails_the_call_unrecorded(
    model_dir: Path, start_proxy: Any
) -> None:
    """Sampled ids without a logprob each would make a record the store refuses (and every later
    record coded against it): the call fails as an inference failure instead."""
    fake = ScriptedInferenceServer(model_dir, default=lambda p: "fine")
    proxy = await start_proxy(fake)
    key = proxy.session()
    fake.short_logprobs = True
    reply = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert_openai_error(reply, 503, "server_error")
    assert "logprobs" in reply.json()["error"]["message"]
    fake.short_logprobs = True
    events = (await proxy.post(MESSAGES, anthropic_body(stream=True), key=key)).events()
    assert events[-1][0] == "error" and all(e != "message_stop" for e, _ in events)
    assert proxy.recorder.answered == []
    fake.misplaced_logprobs = True  # as many logprobs as ids in all, but not each with its token
    reply = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert_openai_error(reply, 503, "server_error")
    assert proxy.recorder.answered == []
    assert (await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)).status == 200  # then it serves
    assert len(proxy.recorder.answered) == 1
    assert [r.error != "" for r in proxy.recorder.records] == [True, True, True, False]


async def test_a_call_whose_serving_raises_still_leaves_its_failed_record(model_dir: Path, start_proxy: Any) -> None:
    """An exception nobody expected (a bug) after the call was admitted and counted: the harness
    gets an error, and the failed record closes the rollout's count of calls."""
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "fine"))
    key = proxy.session()

    def broken(p: Any, out: Any) -> None:
        raise RuntimeError("a bug")

    proxy.handler._finish_ids = broken
    reply = await proxy.post(CHAT, chat_body(stream=False), key=key, bearer=True)
    assert reply.status >= 500
    (rec,) = proxy.recorder.records
    assert_failed(rec, 0)
    assert "RuntimeError('a bug')" in rec.error
    assert proxy.sessions.get("r1").calls == 1
