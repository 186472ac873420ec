"""HTTP inputs: bounded in size and time on every path, answered in the caller's shape.

* a body over the size limit is refused while it is read (declared or chunked), in the
  protocol shape of each of the three APIs, and leaves nothing in the session;
* a prompt that cannot fit the model's context is refused before it is tokenized, in the
  caller's shape, and leaves nothing in the session (its earlier turns stay usable);
* a request whose line and headers, or whose body, do not arrive in time is answered 408
  and its connection closed; idle kept-alive connections are not affected;
* a client that goes away mid-body is logged as ``http.client_gone`` (info, no traceback);
* unknown paths, wrong methods and requests aiohttp cannot parse are answered as JSON in the
  caller's shape;
* requests converted in a worker thread (large bodies) are served as on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from openforge_testing.fakes import ScriptedInferenceServer

MESSAGES = "/v1/messages?beta=true"
RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


def anthropic_body(text: str) -> dict[str, Any]:
    return {"model": "policy-model", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


def responses_body(text: str) -> dict[str, Any]:
    return {
        "model": "policy-model",
        "stream": False,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
    }


def chat_body(text: str) -> dict[str, Any]:
    return {"model": "policy-model", "messages": [{"role": "user", "content": text}]}


@dataclass
class Answer:
    """One HTTP answer (status, headers with lower-case names, body)."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def anthropic_error(reply: Any, status: int) -> dict[str, Any]:
    """The ``error`` object of an Anthropic-shaped error answer."""
    assert reply.status == status, reply.body
    body = reply.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error", body
    assert body["error"]["message"] and body["error"]["type"]
    assert reply.headers["request-id"] == body["request_id"]
    err: dict[str, Any] = body["error"]
    return err


def openai_error(reply: Any, status: int) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error answer."""
    assert reply.status == status, reply.body
    body = reply.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert reply.headers["x-request-id"].startswith("req")
    return err


Check = Callable[[Any, int], dict[str, Any]]
#: api -> path, body builder, whether the key goes as Bearer, the error shape's checker
APIS: dict[str, tuple[str, Callable[[str], dict[str, Any]], bool, Check]] = {
    "anthropic": (MESSAGES, anthropic_body, False, anthropic_error),
    "responses": (RESPONSES, responses_body, True, openai_error),
    "chat": (CHAT, chat_body, True, openai_error),
}


def auth(key: str, bearer: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if bearer else {"x-api-key": key, **ANTHROPIC_HEADERS}


def parse_head(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and what follows them, of a raw HTTP/1.1 response."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


async def read_one(reader: asyncio.StreamReader) -> Answer:
    """One response with a ``Content-Length``, read from a connection."""
    status, headers, _ = parse_head(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5))
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return Answer(status, headers, body)


async def read_to_close(reader: asyncio.StreamReader) -> Answer:
    """The whole response of a connection the server closes after it."""
    raw = await asyncio.wait_for(reader.read(), 5)
    status, headers, body = parse_head(raw)
    return Answer(status, headers, body)


@pytest.mark.parametrize("api", list(APIS))
async def test_a_body_over_the_limit_is_refused_while_read(api: str, model_dir: Path, start_proxy: Any) -> None:
    path, build, bearer, check = APIS[api]
    proxy = await start_proxy(ScriptedInferenceServer(model_dir), max_body_bytes=64 * 1024)
    key = proxy.session(model_name="policy-model")
    raw = json.dumps(build("x" * 200_000)).encode()
    # a declared length over the limit: refused unread
    err = check(await proxy.post(path, raw, headers=auth(key, bearer)), 413)
    assert "exceeds 65536 bytes" in err["message"]

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 8192):
            yield raw[i : i + 8192]

    # no length declared (chunked): refused once what was read passes the limit
    async with proxy.client.post(proxy.base + path, data=chunks(), headers=auth(key, bearer)) as resp:
        reply = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read())
    assert "exceeds 65536 bytes" in check(reply, 413)["message"]
    assert proxy.handler.state("r1") is None and proxy.handler.open_states == 0
    assert proxy.recorder.records == []


@pytest.mark.parametrize("api", list(APIS))
async def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing_and_leaves_nothing(
    api: str, model_dir: Path, start_proxy: Any
) -> None:
    path, build, bearer, check = APIS[api]
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "ok"))
    key = proxy.session(model_name="policy-model")
    # ~3 MiB of text (over the size at which bodies are converted in a worker thread): far more
    # tokens than the model's context (131072) whatever the tokenizer makes of it
    huge = build("lorem ipsum dolor sit amet " * 120_000)
    t0 = time.monotonic()
    err = check(await proxy.post(path, huge, headers=auth(key, bearer)), 400)
    assert err["message"].startswith("prompt is too long: at least ") and "131071 maximum" in err["message"]
    assert time.monotonic() - t0 < 30  # tokenizing it whole takes minutes on a fake vocabulary
    assert proxy.handler.state("r1") is None and proxy.handler.open_states == 0  # no state was created

    # a session with a conversation: the refusal drops what it left, the conversation goes on
    first = build("Say hi.")
    assert (await proxy.post(path, first, headers=auth(key, bearer))).status == 200
    state = proxy.handler.state("r1")
    assert state is not None and len(state.splicer.heads) == 1
    check(await proxy.post(path, huge, headers=auth(key, bearer)), 400)
    assert proxy.handler.state("r1") is state
    assert len(state.splicer.cache) == 0 and len(state.splicer.heads) == 1
    assert (await proxy.post(path, first, headers=auth(key, bearer))).status == 200
    assert [r.attempt for r in proxy.recorder.records] == [1, 2]  # the same call again: its retry


async def test_a_rendered_prompt_that_cannot_fit_is_refused_before_tokenizing(
    model_dir: Path, start_proxy: Any
) -> None:
    """Assistant text is not counted before rendering (a template may drop part of it): a
    conversation too long only through it is refused once rendered, still before tokenizing."""
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "ok"))
    key = proxy.session(model_name="policy-model")
    long_answer = "lorem ipsum dolor sit amet " * 120_000
    body = {
        "model": "policy-model",
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": long_answer},
            {"role": "user", "content": "Go on."},
        ],
    }
    err = openai_error(await proxy.post(CHAT, body, headers=auth(key, True)), 400)
    assert err["message"].startswith("prompt is too long: at least ") and "131071 maximum" in err["message"]
    assert proxy.handler.state("r1") is None and proxy.recorder.records == []


async def test_headers_that_do_not_arrive_in_time_close_the_connection(model_dir: Path, start_proxy: Any) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir), header_timeout_s=0.5)
    port = proxy.http.port
    # part of a request: answered 408 and closed
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: appl")
    t0 = time.monotonic()
    answer = await read_to_close(reader)
    assert 0.4 < time.monotonic() - t0 < 5
    assert answer.status == 408 and answer.headers["connection"] == "close"
    assert json.loads(answer.body)["error"]["message"].startswith("the request line and headers did not arrive")
    writer.close()
    # nothing at all: closed without an answer
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # a kept-alive connection idle between two requests for longer than the timeout stays open
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(b"GET /health HTTP/1.1\r\nHost: proxy\r\n\r\n")
        answer = await read_one(reader)
        assert answer.status == 200 and answer.body == b"ok"
        await asyncio.sleep(0.8)
    writer.close()


async def test_the_rest_of_a_refused_body_is_no_new_request(model_dir: Path, start_proxy: Any) -> None:
    """aiohttp reads and drops what is left of a body refused while read: those bytes do not
    start the header deadline of a request that never comes."""
    proxy = await start_proxy(ScriptedInferenceServer(model_dir), max_body_bytes=64 * 1024, header_timeout_s=0.3)
    key = proxy.session()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
    writer.write(
        f"POST {CHAT} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n"
        f"Authorization: Bearer {key}\r\n\r\n".encode()
        + b"x" * 10_000
    )
    assert (await read_one(reader)).status == 413
    for _ in range(8):  # the rest, slowly: longer than the header deadline
        writer.write(b"x" * 1000)
        await asyncio.sleep(0.1)
    writer.close()
    assert b"408" not in await asyncio.wait_for(reader.read(), 5)


@pytest.mark.parametrize("api", ["anthropic", "chat"])
async def test_a_body_that_does_not_arrive_in_time_is_408_in_the_callers_shape(
    api: str, model_dir: Path, start_proxy: Any
) -> None:
    path, _, bearer, check = APIS[api]
    proxy = await start_proxy(ScriptedInferenceServer(model_dir), body_timeout_s=0.5)
    key = proxy.session()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
    head = "".join(f"{k}: {v}\r\n" for k, v in auth(key, bearer).items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
        f'{head}\r\n{{"model": "policy-model", "messages": ['.encode()
    )
    t0 = time.monotonic()
    answer = await read_to_close(reader)  # the server closes the connection after its answer
    assert 0.4 < time.monotonic() - t0 < 5
    assert "did not arrive within 0.5 s" in check(answer, 408)["message"]
    writer.close()
    assert proxy.handler.state("r1") is None and proxy.recorder.records == []


async def test_a_client_gone_mid_body_is_logged_quietly(
    model_dir: Path, start_proxy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir))
    key = proxy.session()
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
        writer.write(
            f"POST {MESSAGES} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100000\r\nx-api-key: {key}\r\n\r\n".encode()
            + b'{"model": "policy-model", "messages": [{"role": "user", "content": "'
            + b"x" * 20_000
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        for _ in range(250):  # up to 5 s
            if any(e["event"] == "http.client_gone" for e in logs):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # anything aiohttp would log after the handler returned
    (gone,) = [e for e in logs if e["event"] == "http.client_gone"]
    assert gone["log_level"] == "info" and gone["path"] == "/messages"
    assert not [e for e in logs if e["log_level"] in ("warning", "error", "critical") or "exc_info" in e]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert proxy.handler.state("r1") is None and proxy.recorder.records == []


async def test_unknown_paths_and_unparseable_requests_are_answered_in_the_callers_shape(
    model_dir: Path, start_proxy: Any
) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir))
    key = proxy.session()
    # an Anthropic client (its headers) on a path that is not served
    err = anthropic_error(await proxy.post("/v1/messages/batches", {}, headers=auth(key, False)), 404)
    assert err["type"] == "not_found_error" and "no route for /v1/messages/batches" in err["message"]
    err = anthropic_error(await proxy.post("/anthropic/v1/complete", {}, headers=ANTHROPIC_HEADERS), 404)
    assert err["type"] == "not_found_error"
    # an OpenAI client on a path that is not served
    err = openai_error(await proxy.post("/v1/embeddings", {}, headers=auth(key, True)), 404)
    assert err["type"] == "invalid_request_error"
    # a wrong method, each on its protocol's path
    assert anthropic_error(await proxy.get("/v1/messages"), 405)["type"] == "not_found_error"
    assert openai_error(await proxy.get("/v1/responses"), 405)["type"] == "invalid_request_error"
    # a request aiohttp's own parser refuses (a header over 64 KiB): JSON, not aiohttp's text
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.http.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    answer = await read_to_close(reader)
    writer.close()
    assert answer.headers["content-type"].startswith("application/json")
    assert openai_error(answer, 400)["type"] == "invalid_request_error"


async def test_calls_converted_in_a_worker_thread_are_served_and_spliced(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "ok")
    proxy = await start_proxy(fake, offload_min_bytes=0)  # every body off the event loop
    keys = [proxy.session(f"r{i}") for i in range(3)]

    async def conversation(key: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi."}]
        for turn in range(3):
            reply = await proxy.post(CHAT, {"model": "m", "messages": messages}, headers=auth(key, True))
            assert reply.status == 200, reply.body
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"again {turn}"}]

    await asyncio.gather(*(conversation(k) for k in keys))
    for i in range(3):
        recs = [r for r in proxy.recorder.records if r.rollout_id == f"r{i}"]
        # each call reuses the exact ids the session's earlier calls sampled
        assert [len(r.splice.reused) for r in recs] == [0, 1, 2]
    # concurrent calls of one session (sub-agents): prepared one at a time, all served
    key = proxy.session("r9")
    replies = await asyncio.gather(
        *(
            proxy.post(
                CHAT, {"model": "m", "messages": [{"role": "user", "content": f"agent {i}"}]}, headers=auth(key, True)
            )
            for i in range(6)
        )
    )
    assert [r.status for r in replies] == [200] * 6
    assert len([r for r in proxy.recorder.records if r.rollout_id == "r9"]) == 6
