"""The agent loop: page → accessibility tree → one model call → actions in the browser.

One episode: open the start URL, send the system prompt and ``Task: ...`` with the page's tree,
then for at most ``max_steps`` model calls execute each returned tool call and answer it with a
``tool`` message (the action's result; the last one of a turn also carries the new tree). The
history only grows, so every call extends the previous one (the proxy splices them into one
sample). The episode ends at ``done(answer)``, at an answer without a tool call, or at the step
limit. Tools (OpenAI function tools): ``click(ref)``, ``type_text(ref, text)``,
``press_key(key)``, ``scroll(direction)``, ``done(answer)``.

The model is reached only through an endpoint (in a rollout, the proxy) in one of three APIs, the
same loop in each: OpenAI Chat Completions (``<base>/chat/completions``), Anthropic Messages
(``<base>/messages``, ``tool_use`` / ``tool_result`` blocks) or OpenAI Responses
(``<base>/responses``, ``function_call`` / ``function_call_output`` items).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, async_playwright

from openforge_browser.page import accessibility_tree, page_state, ref_selector

SYSTEM_PROMPT: Final = (
    "You operate a web browser to complete a task. After each action you see the page as an "
    'accessibility tree: one line per element, `[ref] role "name"` with its state. Act with the '
    "tools, naming elements by their ref. Call done(answer) when the task is complete."
)

_REF = {"type": "integer", "description": "The element's ref, the number in brackets in the tree."}
TOOLS: Final[list[dict[str, Any]]] = [
    {
        "type": "function",
        "function": {
            "name": "click",
            "description": "Click an element.",
            "parameters": {"type": "object", "properties": {"ref": _REF}, "required": ["ref"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "type_text",
            "description": "Replace the text of a text field with `text`.",
            "parameters": {
                "type": "object",
                "properties": {"ref": _REF, "text": {"type": "string"}},
                "required": ["ref", "text"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "press_key",
            "description": "Press a key (Enter, Tab, Escape, ArrowDown...) in the focused element.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "scroll",
            "description": "Scroll the page up or down by one screen.",
            "parameters": {
                "type": "object",
                "properties": {"direction": {"type": "string", "enum": ["up", "down"]}},
                "required": ["direction"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "done",
            "description": "Finish the task, with a short answer or summary.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    },
]

#: Milliseconds an action waits for its element.
ACTION_TIMEOUT_MS: Final = 3000

#: One model call: (messages, tools) → the assistant message (Chat Completions shape), whatever the
#: API on the wire.
ChatFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]

#: The wire APIs the harness speaks (``--api``).
APIS: Final = ("chat", "messages", "responses")
#: Output-token cap sent where the API requires one (Anthropic Messages).
MAX_TOKENS: Final = 4096
#: Key of an assistant message holding the turn exactly as the API returned it (Messages content
#: blocks, Responses output items), resent verbatim on the next call; never sent over chat.
RAW: Final = "_raw"


class ChatError(RuntimeError):
    """The endpoint answered with an error status or an unexpected body."""


@dataclass(frozen=True)
class ChatEndpoint:
    """A model endpoint (in a rollout: the proxy).

    Attributes:
        base_url: The base URL with ``/v1`` (``OPENAI_BASE_URL``'s convention).
        api_key: The key (``Authorization: Bearer`` for OpenAI's APIs, ``x-api-key`` for Anthropic's).
        model: Model name sent with each call.
        timeout_s: Per-call limit, seconds.
        api: The wire API, one of :data:`APIS`.
    """

    base_url: str
    api_key: str
    model: str
    timeout_s: float = 300.0
    api: str = "chat"


@dataclass
class Episode:
    """What one episode did.

    Attributes:
        answer: ``done``'s answer (or the final text without a tool call); empty if none.
        finished: Whether the model ended the episode (``done`` or a final text).
        calls: Model calls made.
        actions: Each executed tool call as ``{"name", "arguments", "result"}``.
        state: The final page state (:func:`openforge_browser.page.page_state`).
    """

    answer: str = ""
    finished: bool = False
    calls: int = 0
    actions: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record the harness writes for the verifier."""
        return {
            "answer": self.answer,
            "finished": self.finished,
            "calls": self.calls,
            "actions": self.actions,
            "page": self.state,
        }


def _chat_request(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    history = [{k: v for k, v in m.items() if k != RAW} for m in messages]
    return {"model": model, "messages": history, "tools": tools, "stream": False}


def _chat_reply(doc: Any) -> dict[str, Any]:
    message: dict[str, Any] = doc["choices"][0]["message"]
    if not isinstance(message, dict):
        raise TypeError("choices[0].message is not an object")
    return message


def _messages_request(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    system = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            turns.append({"role": "assistant", "content": m[RAW]})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
                turns[-1]["content"].append(block)  # one user turn answers all calls of a turn
            else:
                turns.append({"role": "user", "content": [block]})
        elif m["role"] == "user":
            turns.append({"role": "user", "content": m["content"]})
    specs = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]
    return {"model": model, "system": system, "messages": turns, "tools": specs, "max_tokens": MAX_TOKENS}


def _messages_reply(doc: Any) -> dict[str, Any]:
    blocks = doc["content"]
    if not isinstance(blocks, list):
        raise TypeError("content is not a list")
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    return {"role": "assistant", "content": text or None, "tool_calls": calls or None, RAW: blocks}


def _responses_request(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    instructions = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    for m in messages:
        if m["role"] == "assistant":
            items.extend(m[RAW])
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m["role"] == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]})
    specs = [{"type": "function", **t["function"]} for t in tools]
    return {
        "model": model,
        "instructions": instructions,
        "input": items,
        "tools": specs,
        "stream": False,
        "store": False,
    }


def _responses_reply(doc: Any) -> dict[str, Any]:
    output = doc["output"]
    if not isinstance(output, list):
        raise TypeError("output is not a list")
    text = "".join(
        str(part.get("text", ""))
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i.get("arguments", "{}")}}
        for i in output
        if i.get("type") == "function_call"
    ]
    return {"role": "assistant", "content": text or None, "tool_calls": calls or None, RAW: output}


@dataclass(frozen=True)
class _Wire:
    """One API's adapter: its path, its request body from the history, the reply as a message."""

    path: str
    request: Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]
    reply: Callable[[Any], dict[str, Any]]


_WIRES: Final = {
    "chat": _Wire("/chat/completions", _chat_request, _chat_reply),
    "messages": _Wire("/messages", _messages_request, _messages_reply),
    "responses": _Wire("/responses", _responses_request, _responses_reply),
}


def _headers(endpoint: ChatEndpoint) -> dict[str, str]:
    if endpoint.api == "messages":
        return {"x-api-key": endpoint.api_key, "anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {endpoint.api_key}"}


def chat_completions(session: aiohttp.ClientSession, endpoint: ChatEndpoint) -> ChatFn:
    """A :data:`ChatFn` posting to the endpoint in its API (non-streaming): ``<base_url>`` +
    ``/chat/completions``, ``/messages`` or ``/responses``.

    The loop keeps its history in Chat Completions' shape; an adapter per API builds the request
    from it (system prompt as ``system`` / ``instructions``, tool results as ``tool_result``
    blocks / ``function_call_output`` items, earlier turns resent as returned) and reads the reply
    back into an assistant message.

    Raises:
        ValueError: ``endpoint.api`` is not one of :data:`APIS`.
        ChatError: (from the returned function) Non-200 status or a reply without a message.
    """
    if endpoint.api not in _WIRES:
        raise ValueError(f"unknown api {endpoint.api!r} (one of {', '.join(APIS)})")
    wire = _WIRES[endpoint.api]
    url = endpoint.base_url.rstrip("/") + wire.path
    headers = _headers(endpoint)
    limit = aiohttp.ClientTimeout(total=endpoint.timeout_s)

    async def call(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        body = wire.request(endpoint.model, messages, tools)
        async with session.post(url, json=body, headers=headers, timeout=limit) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise ChatError(f"HTTP {resp.status} from {url}: {text[:500]}")
        try:
            return wire.reply(json.loads(text))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ChatError(f"no assistant message in the answer: {text[:500]}") from exc

    return call


async def execute(page: Page, name: str, args: dict[str, Any]) -> str:
    """Runs one tool call in the browser; returns its result text (errors included, not raised)."""
    try:
        if name == "click":
            await page.click(ref_selector(args["ref"]), timeout=ACTION_TIMEOUT_MS)
            return f"clicked [{int(args['ref'])}]"
        if name == "type_text":
            await page.fill(ref_selector(args["ref"]), str(args["text"]), timeout=ACTION_TIMEOUT_MS)
            return f"typed into [{int(args['ref'])}]"
        if name == "press_key":
            await page.keyboard.press(str(args["key"]))
            return f"pressed {args['key']}"
        if name == "scroll":
            sign = -1 if args.get("direction") == "up" else 1
            await page.evaluate("(s) => window.scrollBy(0, s * window.innerHeight)", sign)
            return f"scrolled {args.get('direction', 'down')}"
    except (KeyError, ValueError, TypeError) as exc:
        return f"error: bad arguments for {name}: {exc!r}"
    except PlaywrightError as exc:
        return f"error: {name} failed: {str(exc).splitlines()[0]}"
    return f"error: unknown tool {name}"


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = call.get("function", {}).get("arguments") or "{}"
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def run_episode(page: Page, instruction: str, chat: ChatFn, max_steps: int) -> Episode:
    """Drives ``page`` (already at the start URL) for at most ``max_steps`` model calls.

    Raises:
        ChatError: A model call failed (the episode cannot go on without the model).
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Task: {instruction}\n\nPage:\n{await accessibility_tree(page)}"},
    ]
    episode = Episode()
    while episode.calls < max_steps and not episode.finished:
        message = await chat(messages, TOOLS)
        episode.calls += 1
        calls = message.get("tool_calls") or []
        messages.append(
            {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", RAW) and v is not None}
            | {"role": "assistant"}
        )
        if not calls:
            episode.answer, episode.finished = str(message.get("content") or ""), True
            break
        for i, call in enumerate(calls):
            name = str(call.get("function", {}).get("name", ""))
            args = _arguments(call)
            if name == "done":
                episode.answer, episode.finished = str(args.get("answer", "")), True
                result = "done"
            else:
                result = await execute(page, name, args)
            episode.actions.append({"name": name, "arguments": args, "result": result})
            if i == len(calls) - 1 and not episode.finished:
                result += f"\n\nPage:\n{await accessibility_tree(page)}"
            messages.append({"role": "tool", "tool_call_id": str(call.get("id", "")), "content": result})
    episode.state = await page_state(page)
    return episode


#: Chromium's flags beyond Playwright's: no sandbox of its own (it needs user namespaces, which
#: the rollout sandbox, bubblewrap, already uses; the page is the task's local file), and no host
#: name resolved (Chromium's own side traffic, such as its component updater's, would otherwise
#: show up as DNS queries the rollout sandbox reports as a bypass); loopback still resolves.
CHROMIUM_ARGS: Final = (
    "--no-sandbox",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost",
    "--dns-prefetch-disable",
    "--disable-domain-reliability",
    "--no-pings",
)

#: Debian's Chromium binary behind its ``/usr/bin/chromium`` wrapper script.
DEBIAN_CHROMIUM: Final = "/usr/lib/chromium/chromium"


def chromium_path() -> str:
    """Debian's Chromium (Playwright's own browser download is not used).

    The binary itself when it is where Debian puts it: the ``/usr/bin/chromium`` wrapper sources
    ``/etc/chromium.d``, which a sandbox does not expose. Otherwise ``chromium`` on PATH.

    Raises:
        FileNotFoundError: Neither is there.
    """
    if os.access(DEBIAN_CHROMIUM, os.X_OK):
        return DEBIAN_CHROMIUM
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    return path


async def run(url: str, instruction: str, endpoint: ChatEndpoint, max_steps: int = 10) -> Episode:
    """One episode in a fresh headless Chromium: opens ``url``, runs :func:`run_episode`."""
    async with async_playwright() as pw, aiohttp.ClientSession() as session:
        browser = await pw.chromium.launch(executable_path=chromium_path(), args=list(CHROMIUM_ARGS))
        try:
            page = await browser.new_page()
            await page.goto(url)
            return await run_episode(page, instruction, chat_completions(session, endpoint), max_steps)
        finally:
            await browser.close()
