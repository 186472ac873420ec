"""The proxy's memos are a layer: the same conversations through a proxy with them (``memos``, the
default) and one without (``OPENFORGE_MEMOS=false``: every call parsed, converted, matched,
rendered and encoded whole) give the same answers and the same records: prompt ids, the spans
reused from each sampled turn, and the splice report.

The scenarios are what harnesses do to a session's conversation (reference/harness-protocols.md):
grow it; send a request again; edit an earlier message; drop a turn; run a sub-agent beside the
main conversation; move a context message to the end (OpenClaw). Every generated turn says the
same ("OK."), so matching has to tell identical turns apart by their place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import ScriptedInferenceServer

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
SCENARIOS = ["grow", "again", "edit", "drop", "sub-agent", "move-context"]


def _user(path: str, text: str) -> dict[str, Any]:
    if path == RESPONSES:
        return {"type": "message", "role": "user", "content": text}
    return {"role": "user", "content": text}


def _body(path: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    if path == RESPONSES:
        return {"model": "m", "instructions": "Be brief.", "input": history}
    if path == MESSAGES:
        return {"model": "m", "max_tokens": 20, "system": "Be brief.", "messages": history}
    return {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *history]}


def _answer(path: str, reply: Any) -> list[dict[str, Any]]:
    """The assistant turn(s) to append to the history, as the harness echoes them."""
    if path == RESPONSES:
        return [item for item in reply.json()["output"] if item["type"] == "message"]
    if path == CHAT:
        return [reply.json()["choices"][0]["message"]]
    return [{"role": "assistant", "content": reply.json()["content"]}]


async def _converse(proxy: Any, path: str, scenario: str) -> list[Any]:
    key = proxy.session(model_name="m")
    bearer = path != MESSAGES
    history = [_user(path, "context: the repository is small"), _user(path, "step 0")]
    side = [_user(path, "sub task")]
    statuses = []

    async def call(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        reply = await proxy.post(path, _body(path, messages), key=key, bearer=bearer)
        statuses.append(reply.status)
        assert reply.status == 200, reply.body
        return _answer(path, reply)

    for step in range(1, 6):
        history += await call(history)
        if scenario == "again" and step == 2:
            await call(history[:-1])  # the previous request sent again (a harness retry)
        if scenario == "edit" and step == 3:
            history[1] = _user(path, "step 0, edited")
        if scenario == "drop" and step == 3:
            del history[2]  # the first generated turn dropped
        if scenario == "sub-agent" and step in (2, 4):
            side += await call(side)
            side.append(_user(path, f"sub step {step}"))
        if scenario == "move-context":
            history = [*history[1:], history[0]]
        history.append(_user(path, f"step {step}"))
    return [
        statuses,
        [
            (
                r.prompt.ids,
                [(s.start, s.end) for s in r.splice.reused],
                [(s.start, s.end) for s in r.splice.rendered],
                r.splice.break_cause,
                r.canonical_json,
            )
            for r in proxy.recorder.records
        ],
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("path", [MESSAGES, CHAT, RESPONSES])
async def test_calls_with_and_without_memos_agree(model_dir: Path, start_proxy: Any, path: str, scenario: str) -> None:
    seen = []
    for memos in (True, False):
        proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "OK."), memos=memos)
        seen.append(await _converse(proxy, path, scenario))
    assert seen[0] == seen[1]
    records = seen[0][1]
    assert len(records) >= 5
    if scenario == "grow":  # each call extends the one before: one sample
        assert [len(reused) for _, reused, *_ in records] == [0, 1, 2, 3, 4]
