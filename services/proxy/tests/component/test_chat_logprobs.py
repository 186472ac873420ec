"""Chat Completions ``logprobs: true``: the engine's logprob of every sampled token, passed through.

The engine is the scripted fake (:class:`openforge_testing.fakes.ScriptedInferenceServer`),
which reports a known logprob per token; the proxy must return exactly those, for each
sampled token but the end-of-turn one, in order, non-streaming and streamed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import ScriptedInferenceServer, final_text, tool_call_text

CHAT = "/v1/chat/completions"
COMPLETION = final_text("The answer is 42, café.", reasoning="Think first.")


def _body(stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "question"}], **extra}


async def test_non_streaming_logprobs_are_the_engines(model_dir: Path, start_proxy: Any) -> None:
    fake = ScriptedInferenceServer(model_dir, [COMPLETION, COMPLETION])
    proxy = await start_proxy(fake)
    key = proxy.session()
    reply = await proxy.post(CHAT, _body(False, logprobs=True, top_logprobs=2), key=key, bearer=True)
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    entries = choice["logprobs"]["content"]
    seen = fake.seen[-1]
    assert seen.sampled_ids[-1] == fake.eos_id
    assert len(entries) == len(seen.sampled_ids) - 1  # every sampled token but the end of turn
    assert [e["logprob"] for e in entries] == pytest.approx(seen.logprobs[:-1])
    # each token's own bytes: "é" is split over two tokens here, a byte in each
    assert b"".join(bytes(e["bytes"]) for e in entries) == COMPLETION.encode()
    assert any(e["token"].startswith("\\x") for e in entries)
    assert all(e["token"] == bytes(e["bytes"]).decode("utf-8", "backslashreplace") for e in entries)
    assert all(e["top_logprobs"] == [] for e in entries)
    assert choice["message"]["content"] == "The answer is 42, café."
    # not asked for: null, as before
    plain = await proxy.post(
        CHAT, {**_body(False), "messages": [{"role": "user", "content": "again"}]}, key=key, bearer=True
    )
    assert plain.json()["choices"][0]["logprobs"] is None


async def test_streamed_logprobs_arrive_with_the_chunks(model_dir: Path, start_proxy: Any) -> None:
    completion = tool_call_text("exec", {"command": "ls"}, text="Listing.")
    fake = ScriptedInferenceServer(model_dir, [completion], tokens_per_message=2)
    proxy = await start_proxy(fake)
    key = proxy.session()
    reply = await proxy.post(CHAT, _body(True, logprobs=True), key=key, bearer=True)
    assert reply.status == 200, reply.body
    chunks = [data for _, data in reply.events() if data != "[DONE]" and data.get("choices")]
    entries = [e for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    seen = fake.seen[-1]
    assert [e["logprob"] for e in entries] == pytest.approx(seen.logprobs[:-1])
    assert "".join(e["token"] for e in entries) == completion
    text_chunks = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert text_chunks and all(c["choices"][0]["logprobs"]["content"] for c in text_chunks)
    # the tool call still arrives whole, and the record still holds every sampled logprob
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "exec"
    assert proxy.recorder.records[-1].logprobs == pytest.approx(seen.logprobs)
