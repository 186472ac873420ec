"""The answer leaves when the engine's last delta says the generation finished, not when its RPC closes.

The fake engine (:class:`openforge_testing.fakes.ScriptedInferenceServer`, a test double)
streams the whole completion in one message carrying the finish reason, then waits
``token_delay_s`` before ending the RPC. The proxy must answer, stream or not, without that
wait, record the whole generation, and still read the RPC to its end (not cancel it).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import ScriptedInferenceServer

MESSAGES = "/v1/messages"
CLOSE_DELAY_S = 3.0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_answer_does_not_wait_for_the_rpc_to_close(model_dir: Path, start_proxy: Any, stream: bool) -> None:
    fake = ScriptedInferenceServer(model_dir, ["Done."], tokens_per_message=64, token_delay_s=CLOSE_DELAY_S)
    proxy = await start_proxy(fake)
    key = proxy.session()
    body = {"model": "m", "max_tokens": 32, "stream": stream, "messages": [{"role": "user", "content": "go"}]}
    t0 = time.monotonic()
    reply = await proxy.post(MESSAGES, body, key=key)
    took = time.monotonic() - t0
    assert reply.status == 200, reply.body
    assert took < CLOSE_DELAY_S / 2  # the close comes CLOSE_DELAY_S after the last delta
    text = (
        reply.json()["content"][0]["text"]
        if not stream
        else "".join(d["delta"].get("text", "") for e, d in reply.events() if e == "content_block_delta")
    )
    assert text == "Done."
    record = proxy.recorder.records[-1]
    assert record.completion_ids == fake.seen[-1].sampled_ids
    # the RPC is still read to its end in the background, then nothing is left running
    handler = proxy.handler
    assert handler is not None and len(handler._draining) == 1
    await asyncio.wait_for(asyncio.gather(*handler._draining), CLOSE_DELAY_S * 2)
    assert not handler._draining
