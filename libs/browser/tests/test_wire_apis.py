"""The agent's model call in each wire API, against a small HTTP server that records what it got:
the path and key header of each API, the history (system prompt, tool results, the previous turn
as the server returned it) in that API's shape, and the reply read back into one assistant message
with the same tool calls. The endpoint variables the CLI reads follow ``--api``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from openforge_browser import __main__ as cli
from openforge_browser.agent import TOOLS, ChatEndpoint, ChatError, chat_completions

CALL = {"ref": 3}
REPLIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "I click.",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "click", "arguments": json.dumps(CALL)}}
                    ],
                }
            }
        ]
    },
    "/v1/messages": {
        "content": [
            {"type": "text", "text": "I click."},
            {"type": "tool_use", "id": "c1", "name": "click", "input": CALL},
        ]
    },
    "/v1/responses": {
        "output": [
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "I click."}],
            },
            {"type": "function_call", "id": "f1", "call_id": "c1", "name": "click", "arguments": json.dumps(CALL)},
        ]
    },
}
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


async def _two_calls(api: str) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, str]]], dict[str, Any]]:
    """Two calls over ``api``: the first reply's turn and its tool result go into the second."""
    seen: list[dict[str, Any]] = []
    where: list[tuple[str, dict[str, str]]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(await request.json())
        where.append((request.path, dict(request.headers)))
        return web.json_response(REPLIES.get(request.path, {}), status=200 if request.path in REPLIES else 404)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            endpoint = ChatEndpoint(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="m", api=api)
            chat = chat_completions(session, endpoint)
            history: list[dict[str, Any]] = [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "Task: T"},
            ]
            message = await chat(history, TOOLS)
            history.append(message)
            history.append({"role": "tool", "tool_call_id": "c1", "content": "clicked [3]"})
            await chat(history, TOOLS)
    finally:
        await runner.cleanup()
    return seen, where, message


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_each_api_sends_its_shape_and_reads_back_the_same_message(api: str) -> None:
    seen, where, message = asyncio.run(_two_calls(api))
    assert [p for p, _ in where] == [PATHS[api]] * 2
    headers = where[0][1]
    if api == "messages":
        assert headers["x-api-key"] == "k" and headers["anthropic-version"] == "2023-06-01"
    else:
        assert headers["Authorization"] == "Bearer k"
    assert message["content"] == "I click."
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]
    ] == [("c1", "click", CALL)]
    second = seen[1]
    assert second["model"] == "m"
    if api == "chat":
        assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
        assert "_raw" not in second["messages"][2] and second["tools"] == TOOLS
    elif api == "messages":
        assert second["system"] == "S" and second["max_tokens"] > 0
        assert second["messages"] == [
            {"role": "user", "content": "Task: T"},
            {"role": "assistant", "content": REPLIES["/v1/messages"]["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "clicked [3]"}]},
        ]
        assert [(t["name"], t["input_schema"]) for t in second["tools"]] == [
            (t["function"]["name"], t["function"]["parameters"]) for t in TOOLS
        ]
    else:
        assert second["instructions"] == "S" and second["store"] is False
        assert second["input"] == [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Task: T"}]},
            *REPLIES["/v1/responses"]["output"],
            {"type": "function_call_output", "call_id": "c1", "output": "clicked [3]"},
        ]
        assert [t["name"] for t in second["tools"]] == [t["function"]["name"] for t in TOOLS]
        assert all(t["type"] == "function" and "parameters" in t for t in second["tools"])


def test_an_unknown_api_or_a_reply_without_a_message_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown api"):
        chat_completions(None, ChatEndpoint(base_url="http://x/v1", api_key="", model="m", api="grpc"))  # type: ignore[arg-type]

    async def wrong_shape() -> None:
        async def handle(request: web.Request) -> web.Response:
            return web.json_response({"choices": []})  # a Chat Completions body to a Messages call

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with aiohttp.ClientSession() as session:
                base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
                chat = chat_completions(session, ChatEndpoint(base_url=base, api_key="k", model="m", api="messages"))
                await chat([{"role": "user", "content": "x"}], TOOLS)
        finally:
            await runner.cleanup()

    with pytest.raises(ChatError, match="no assistant message"):
        asyncio.run(wrong_shape())


def test_the_cli_reads_the_endpoint_variables_of_its_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://o/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "ok")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://a")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak")
    assert cli._endpoint_env("messages") == ("http://a/v1", "ak")
    assert cli._endpoint_env("responses") == cli._endpoint_env("chat") == ("http://o/v1", "ok")
