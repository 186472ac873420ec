"""Session limits hold whatever the order of calls: retries after a failed attempt, calls in
flight together, and a session replaced by a newer one of the same rollout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_proxy.domain.sessions import Limits
from openforge_testing.fakes import ScriptedInferenceServer

CHAT = "/v1/chat/completions"


def _chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16}


async def test_a_call_counts_as_a_turn_when_admitted_even_if_its_first_attempt_failed(
    model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session(limits=Limits(max_turns=1))
    fake.fail_next.append(grpc.StatusCode.UNAVAILABLE)
    assert (await proxy.post(CHAT, _chat("first"), key=key, bearer=True)).status == 503
    assert (await proxy.post(CHAT, _chat("first"), key=key, bearer=True)).status == 200  # its retry
    refused = await proxy.post(CHAT, _chat("second"), key=key, bearer=True)
    assert refused.status == 400 and "rollout limit reached" in refused.json()["error"]["message"]
    first, retry = proxy.recorder.records
    assert (first.attempt, first.completion_ids) == (1, []) and "fake inference failure" in first.error
    assert (retry.attempt, retry.call_id, retry.error) == (2, first.call_id, "")
    session = proxy.sessions.get("r1")
    assert session.calls == 1 and session.reserved_tokens == 0


async def test_calls_in_flight_together_count_against_the_limits(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "a longer answer " * 4, token_delay_s=0.01)
    proxy = await start_proxy(fake)
    key = proxy.session(limits=Limits(max_turns=1))
    replies = await asyncio.gather(*(proxy.post(CHAT, _chat(f"question {i}"), key=key, bearer=True) for i in range(5)))
    assert sorted(r.status for r in replies) == [200, 400, 400, 400, 400]
    assert proxy.sessions.get("r1").calls == 1 and len(proxy.recorder.records) == 1

    budget = 60
    key = proxy.session("r2", limits=Limits(max_total_tokens=budget))
    replies = await asyncio.gather(*(proxy.post(CHAT, _chat(f"question {i}"), key=key, bearer=True) for i in range(5)))
    served = [r for r in replies if r.status == 200]
    assert served and all(r.status in (200, 400, 503) for r in replies)
    session = proxy.sessions.get("r2")
    assert session.total_tokens <= budget and session.reserved_tokens == 0
    assert session.total_tokens == sum(r.json()["usage"]["total_tokens"] for r in served)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_of_a_replaced_session_fails_cleanly_and_is_not_counted_in_the_new_one(
    model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    """The session is closed and a new one opened for the rollout while the engine generates:
    the call fails whole in its protocol's shape (an error event ends a stream), only its failed
    record is stored (the old session counted it), and nothing is counted in the new session,
    whose records carry the new attempt of the rollout."""
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "word " * 40, token_delay_s=0.02)
    proxy = await start_proxy(fake)
    key = proxy.session("r1", limits=Limits(max_turns=1))
    proxy.recorder.ack_delay_s = 0.05
    old_call = asyncio.ensure_future(proxy.post(CHAT, {**_chat("x"), "stream": stream}, key=key, bearer=True))
    for _ in range(500):  # until the engine generates it
        if fake.seen:
            break
        await asyncio.sleep(0.01)
    proxy.sessions.close("r1")
    _, new_key = proxy.sessions.create(
        request_id="r1-again",
        rollout_id="r1",
        run_id="run",
        model_name="",
        limits=Limits(max_turns=1),
        sampling=SamplingParams(),
        ttl_s=None,
        rollout_attempt=2,
    )
    old = await asyncio.wait_for(old_call, 10)
    if stream:
        assert old.status == 200
        last = old.events()[-1][1]
        assert "error" in last and "session ended" in last["error"]["message"]
    else:
        assert old.status == 401 and "session ended" in old.json()["error"]["message"]
    (failed,) = proxy.recorder.records
    assert "session ended" in failed.error and failed.completion_ids == [] and failed.rollout_attempt == 1
    session = proxy.sessions.get("r1")
    assert session.calls == 0 and session.total_tokens == 0 and session.reserved_tokens == 0
    assert session.rollout_attempt == 2
    assert (await proxy.post(CHAT, _chat("new"), key=new_key, bearer=True)).status == 200
    assert [(r.rollout_attempt, r.error == "") for r in proxy.recorder.records] == [(1, False), (2, True)]


async def test_a_call_that_could_not_be_recorded_uses_no_budget(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "Sure.")
    proxy = await start_proxy(fake)
    key = proxy.session(limits=Limits(max_total_tokens=1000))
    proxy.recorder.fail = ConnectionError("bus down")
    assert (await proxy.post(CHAT, _chat("first"), key=key, bearer=True)).status == 503
    session = proxy.sessions.get("r1")
    assert session.total_tokens == 0 and session.reserved_tokens == 0 and session.calls == 1
    proxy.recorder.fail = None
    ok = await proxy.post(CHAT, _chat("first"), key=key, bearer=True)  # the retry: attempt 2, counted
    assert ok.status == 200
    assert proxy.sessions.get("r1").total_tokens == ok.json()["usage"]["total_tokens"]


async def test_a_budget_held_by_calls_in_flight_is_a_retry_not_the_end(model_dir: Path, start_proxy: Any) -> None:
    # each call reserves its prompt and its completion cap (4096 by default) while in flight
    fake = ScriptedInferenceServer(model_dir, default=lambda prompt: "a short answer", token_delay_s=0.01)
    proxy = await start_proxy(fake)
    key = proxy.session(limits=Limits(max_total_tokens=10_000))
    calls = [{"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(4)]
    replies = await asyncio.gather(*(proxy.post(CHAT, c, key=key, bearer=True) for c in calls))
    busy = [(c, r) for c, r in zip(calls, replies, strict=True) if r.status != 200]
    assert busy, [r.status for r in replies]
    for call, reply in busy:  # retryable, and served once the others are done
        assert reply.status == 503 and reply.headers["retry-after"] == "1"
        assert "in flight" in reply.json()["error"]["message"]
        assert (await proxy.post(CHAT, call, key=key, bearer=True)).status == 200
    assert proxy.sessions.get("r1").reserved_tokens == 0
