"""The large-body parser process (``OPENFORGE_LARGE_BODY__PROCESS``) under faults.

Concurrent large bodies of several sessions, bodies at the threshold, clients that go away, a
child that is killed, hangs or cannot take a body, cancellations while the child parses, and a
proxy stopped meanwhile: every body still gets its own parse (as
:func:`~openforge_proxy.domain.json_text.parse_object` gives it), within a bounded time, and
nothing is left running. Bodies are small (the threshold is lowered) to keep this light."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from openforge_proxy.adapters.body_parser import ProcessBodyParser
from openforge_proxy.domain.json_text import parse_object
from openforge_proxy.domain.output import ApiError
from openforge_testing.fakes import ScriptedInferenceServer

CHAT = "/v1/chat/completions"
MIN = 64 << 10


def _reference(raw: bytes) -> Any:
    try:
        return parse_object(raw)
    except ApiError as err:
        return err.kind, err.message, err.status


async def _fast(parser: ProcessBodyParser, raw: bytes) -> Any:
    try:
        return await parser.parse(raw)
    except ApiError as err:
        return err.kind, err.message, err.status


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _depth(value: Any) -> int:
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    return depth


def _chat(tag: str, size: int) -> bytes:
    """A chat body of about ``size`` bytes whose message names ``tag`` (the bulk in a field the
    model does not see)."""
    body = {"model": "m", "messages": [{"role": "user", "content": f"from {tag}", "pad": "x" * size}]}
    return orjson.dumps(body)


async def test_nesting_orjson_parses_does_not_kill_the_child() -> None:
    # orjson parses up to 1023 levels; pickling them must not fail in the child (it would die
    # and every such body would be parsed in the proxy, and a new child started, each time)
    parser = ProcessBodyParser(0)
    try:
        for depth in (990, 1023):
            raw = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
            await _fast(parser, b"{}")
            pid = parser.pid
            got = await parser.parse(raw)
            assert isinstance(got, tuple)  # parsed, not screened
            parsed, recorded = got
            assert recorded is raw and _depth(parsed["a"]) == depth  # (== recurses too deep)
            assert parser.pid == pid, f"the child died on a body {depth} deep"
    finally:
        parser.close()


async def test_a_hung_child_costs_its_deadline_then_the_body_is_parsed_here() -> None:
    parser = ProcessBodyParser(0, timeout_s=2.0)
    raw = orjson.dumps({"a": "x" * (1 << 20)})
    try:
        await asyncio.to_thread(parser.start)  # (a child's start counts in the deadline)
        assert await _fast(parser, b"{}") == _reference(b"{}")
        pid = parser.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # wedged: neither reads nor answers
        t0 = time.monotonic()
        assert await asyncio.wait_for(_fast(parser, raw), 20) == _reference(raw)
        assert time.monotonic() - t0 < 10
        assert not _alive(pid)  # killed and reaped
        parser.timeout_s = 30.0
        assert await _fast(parser, raw) == _reference(raw)  # by a new child
        assert parser.pid not in (None, pid)
    finally:
        parser.close()


async def test_a_call_cancelled_twice_leaves_no_reply_for_the_next_body() -> None:
    # the first body's exchange is still under way when its caller gives up (twice): the next
    # body must get its own parse, not the first one's
    parser = ProcessBodyParser(0, timeout_s=30.0)
    first = orjson.dumps({"who": "first", "pad": "x" * (1 << 20)})
    second = orjson.dumps({"who": "second", "pad": "y" * (1 << 20)})
    assert await _fast(parser, b"{}") == _reference(b"{}")
    pid = parser.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        task = asyncio.ensure_future(parser.parse(first))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.sleep(0.1)
        task.cancel()
        nxt = asyncio.ensure_future(_fast(parser, second))
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGCONT)
        got = await asyncio.wait_for(nxt, 20)
        assert got == _reference(second)
        assert parser.pid == pid  # the pipes were used by one exchange at a time: nothing broke
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
        parser.close()


async def test_concurrent_large_bodies_of_sessions_each_get_their_own(model_dir: Path, start_proxy: Any) -> None:
    proxy = await start_proxy(
        ScriptedInferenceServer(model_dir, default=lambda prompt: f"n{len(prompt)}"), body_parser_min_bytes=MIN
    )
    keys = {f"s{i}": proxy.session(f"r{i}", model_name="m") for i in range(4)}
    bodies = {tag: _chat(tag * (i + 1), MIN + i * 7000) for i, tag in enumerate(keys)}
    replies = await asyncio.gather(*(proxy.post(CHAT, bodies[tag], key=key, bearer=True) for tag, key in keys.items()))
    assert [r.status for r in replies] == [200] * 4
    by_rollout = {r.rollout_id: r for r in proxy.recorder.answered}
    for i, tag in enumerate(keys):
        record = by_rollout[f"r{i}"]
        assert orjson.loads(record.request_json)["messages"][0]["content"] == f"from {tag * (i + 1)}"
        assert len(record.request_json) == len(bodies[tag])
    texts = {r.json()["choices"][0]["message"]["content"] for r in replies}
    assert len(texts) == 4  # each answer is to its own prompt


@pytest.mark.parametrize("delta", [-1, 0, 1])
async def test_bodies_at_the_threshold_answer_as_the_reference(model_dir: Path, start_proxy: Any, delta: int) -> None:
    answers = []
    for min_bytes in (None, MIN):
        fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "OK.")
        proxy = await start_proxy(fake, body_parser_min_bytes=min_bytes)
        key = proxy.session(model_name="m")
        raw = _chat("t", MIN + delta - len(_chat("t", 0)))
        assert len(raw) == MIN + delta
        reply = await proxy.post(CHAT, raw, key=key, bearer=True)
        bad = await proxy.post(CHAT, raw[:-1], key=key, bearer=True)
        answers.append(
            (reply.status, bad.status, bad.json()["error"], [r.request_json for r in proxy.recorder.records])
        )
    assert answers[0] == answers[1]


async def test_a_client_gone_while_its_body_is_parsed_leaves_the_next_call_right(
    model_dir: Path, start_proxy: Any
) -> None:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "OK."), body_parser_min_bytes=MIN)
    key = proxy.session("r1", model_name="m")
    other = proxy.session("r2", model_name="m")
    parser = proxy.body_parser
    assert parser is not None
    await asyncio.to_thread(parser.start)
    pid = parser.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the body stays in the child until the client is gone
    try:
        async with aiohttp.ClientSession() as client:
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(1.0):
                    await client.post(
                        proxy.base + CHAT,
                        data=_chat("gone", MIN * 3),
                        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                    )
        await asyncio.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    reply = await proxy.post(CHAT, _chat("next", MIN * 2), key=other, bearer=True)
    assert reply.status == 200, reply.body
    # The next call's record holds its own body (the gone client's call may still be answered and
    # recorded, before or after it: aiohttp does not cancel a handler whose client left).
    nexts = [r for r in proxy.recorder.answered if r.rollout_id == "r2"]
    assert [orjson.loads(r.request_json)["messages"][0]["content"] for r in nexts] == ["from next"]


def _pipes() -> int:
    """How many pipes this process holds open."""
    out = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # gone meanwhile
            out += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return out


@pytest.mark.parametrize("wedged", [False, True])
async def test_stopping_the_proxy_while_a_body_is_parsed_leaves_nothing_running(
    model_dir: Path, start_proxy: Any, wedged: bool
) -> None:
    pipes = _pipes()
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda p: "OK."), body_parser_min_bytes=MIN)
    key = proxy.session("r1", model_name="m")
    parser = proxy.body_parser
    assert parser is not None
    parser.timeout_s = 2.0
    await asyncio.to_thread(parser.start)
    pid = parser.pid
    assert pid is not None
    if wedged:
        os.kill(pid, signal.SIGSTOP)
    call = asyncio.ensure_future(proxy.post(CHAT, _chat("late", 8 << 20), key=key, bearer=True))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await asyncio.wait_for(proxy.stop(), 60)
    stopped_s = time.monotonic() - t0
    with contextlib.suppress(aiohttp.ClientError):  # answered, or its connection closed
        await asyncio.wait_for(call, 5)
    assert parser.pid is None
    assert not _alive(pid)
    assert _pipes() <= pipes
    assert stopped_s < 10, stopped_s  # a wedged child: its deadline (then killed), not aiohttp's grace


async def test_a_child_that_cannot_be_started_leaves_bodies_parsed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy starts (``warm`` is False, logged) and answers as the reference does."""
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # the module reads it at start
    parser = ProcessBodyParser(1)
    try:
        assert parser.warm() is False and parser.pid is None
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100}]})
        assert await parser.parse(body) == parse_object(body)
        with pytest.raises(ApiError) as err:
            await parser.parse(b"{not json")
        with pytest.raises(ApiError) as ref:
            parse_object(b"{not json")
        assert (err.value.kind, err.value.message, err.value.status) == (
            ref.value.kind,
            ref.value.message,
            ref.value.status,
        )
    finally:
        parser.close()


async def test_closing_the_parser_during_an_exchange_leaves_its_pipes_to_that_exchange() -> None:
    # close() while an exchange is blocked on the child's pipes: the child is killed (not its
    # pipes closed under the exchange), the body is parsed here, and the exchange closes them
    pipes = _pipes()
    parser = ProcessBodyParser(0, timeout_s=30.0)
    raw = orjson.dumps({"who": "closed", "pad": "x" * (1 << 20)})  # more than a pipe holds
    assert await _fast(parser, b"{}") == _reference(b"{}")
    pid = parser.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)  # the exchange blocks writing the body
        call = asyncio.ensure_future(_fast(parser, raw))
        await asyncio.sleep(0.3)
        assert not call.done()
        t0 = time.monotonic()
        await asyncio.to_thread(parser.close)
        assert time.monotonic() - t0 < 1.0  # killed at once, not waited for
        assert await asyncio.wait_for(call, 20) == _reference(raw)
        assert parser.pid is None and not _alive(pid)
        assert _pipes() <= pipes
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
        parser.close()
