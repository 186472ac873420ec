"""The agent loop: page → accessibility tree → one Chat Completions call → actions in the browser.

One episode: open the start URL, send the system prompt and ``Task: ...`` with the page's tree,
then for at most ``max_steps`` model calls execute each returned tool call and answer it with a
``tool`` message (the action's result; the last one of a turn also carries the new tree). The
history only grows, so every call extends the previous one (the proxy splices them into one
sample). The episode ends at ``done(answer)``, at an answer without a tool call, or at the step
limit. Tools (OpenAI function tools): ``click(ref)``, ``type_text(ref, text)``,
``press_key(key)``, ``scroll(direction)``, ``done(answer)``.

The model is reached only through an OpenAI-compatible endpoint (``<base>/chat/completions`` with
a bearer key): in a rollout, the proxy.
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

#: One model call: (messages, tools) → the assistant message (OpenAI shape).
ChatFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


class ChatError(RuntimeError):
    """The endpoint answered with an error status or an unexpected body."""


@dataclass(frozen=True)
class ChatEndpoint:
    """An OpenAI-compatible Chat Completions endpoint.

    Attributes:
        base_url: The base URL with ``/v1`` (``OPENAI_BASE_URL``'s convention).
        api_key: Bearer key.
        model: Model name sent with each call.
        timeout_s: Per-call limit, seconds.
    """

    base_url: str
    api_key: str
    model: str
    timeout_s: float = 300.0


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


def chat_completions(session: aiohttp.ClientSession, endpoint: ChatEndpoint) -> ChatFn:
    """A :data:`ChatFn` posting to ``<base_url>/chat/completions`` (non-streaming).

    Raises (from the returned function):
        ChatError: Non-200 status or no ``choices[0].message``.
    """
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    limit = aiohttp.ClientTimeout(total=endpoint.timeout_s)

    async def call(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": endpoint.model, "messages": messages, "tools": tools, "stream": False}
        async with session.post(url, json=body, headers=headers, timeout=limit) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise ChatError(f"HTTP {resp.status} from {url}: {text[:500]}")
        try:
            message: dict[str, Any] = json.loads(text)["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ChatError(f"no choices[0].message in the answer: {text[:500]}") from exc
        return message

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
            {k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v is not None}
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
