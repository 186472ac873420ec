"""Model families: the markers of a chat template and the parsers that match it.

A family knows how its template frames a turn (message-start token,
assistant header, end-of-turn token) and how the model writes reasoning and
tool calls, so the proxy can (a) cut prompts into per-message chunks, (b) find
where an assistant turn's sampled tokens go when splicing, and (c) parse the
sampled text into reasoning, text and tool calls while it streams.

Families live in a registry (:data:`FAMILIES`, :func:`family_for`) so that
more can be added; the first is ``hermes``: ChatML framing with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and
``<think>...</think>`` (Qwen2.5/Qwen3, Hermes 2/3, and the project's tiny
test model).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from openforge_core.errors import FailedPrecondition


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the model wrote it.

    Attributes:
        name: Tool name.
        arguments: Parsed arguments (usually an object).
        arguments_json: The arguments' JSON text exactly as written.
    """

    name: str
    arguments: Any
    arguments_json: str


@dataclass(frozen=True)
class Event:
    """One parsed piece of a completion.

    Attributes:
        kind: ``reasoning`` or ``text`` (a delta), or ``tool`` (a complete call).
        text: The delta text (reasoning/text).
        call: The call (tool).
    """

    kind: str
    text: str = ""
    call: ParsedCall | None = None


def _partial_suffix(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:k]):
                best = k
                break
    return best


class HermesParser:
    """Streaming parser of ``<think>`` reasoning, text and ``<tool_call>`` JSON blocks.

    Text deltas leave as soon as they cannot be the start of a marker;
    whitespace right before a tool call or at the very end is dropped (the
    template puts a newline before each ``<tool_call>``). A tool call is
    emitted only when its closing tag arrived and its JSON parsed to an object
    with a string ``name``; anything else the model wrote between the tags is
    passed on as text, so no malformed call ever reaches a harness.

    Args:
        family: The markers.
        in_reasoning: The generation prompt already opened a reasoning block.
    """

    def __init__(self, family: HermesFamily, in_reasoning: bool = False) -> None:
        self._f = family
        self._buf = ""
        self._mode = "reasoning" if in_reasoning else "start"
        self._pending_ws = ""
        self._strip_lead = in_reasoning
        self._text_started = False

    @property
    def in_reasoning(self) -> bool:
        """Whether the text being parsed is reasoning."""
        return self._mode == "reasoning"

    def feed(self, text: str) -> list[Event]:
        """Parses a text delta."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """Flushes what is left at the end of generation (an unclosed tool call becomes text)."""
        events = self._drain(final=True)
        if self._mode == "tool":
            events.extend(self._text(self._f.tool_open + self._buf))
            self._buf = ""
        elif self._mode == "reasoning" and self._buf:
            events.append(Event("reasoning", self._buf.rstrip("\n")))
            self._buf = ""
        self._pending_ws = ""
        return events

    def _text(self, text: str) -> list[Event]:
        if not self._text_started:
            text = text.lstrip()
            if not text:
                return []
            self._text_started = True
        body = self._pending_ws + text
        stripped = body.rstrip()
        self._pending_ws = body[len(stripped) :]
        return [Event("text", stripped)] if stripped else []

    def _drain(self, final: bool) -> list[Event]:
        f = self._f
        out: list[Event] = []
        while True:
            if self._mode == "start":
                lead = self._buf.lstrip()
                if not lead:
                    if final:
                        self._buf = ""
                    return out
                if lead.startswith(f.reasoning_open):
                    self._buf = lead[len(f.reasoning_open) :]
                    self._mode = "reasoning"
                    self._strip_lead = True
                    continue
                if f.reasoning_open.startswith(lead) and not final:
                    return out
                self._mode = "text"
                continue
            if self._mode == "reasoning":
                if self._strip_lead and self._buf:
                    self._buf = self._buf.lstrip("\n")
                    self._strip_lead = not self._buf
                at = self._buf.find(f.reasoning_close)
                if at >= 0:
                    chunk = self._buf[:at].rstrip("\n")
                    if chunk:
                        out.append(Event("reasoning", chunk))
                    self._buf = self._buf[at + len(f.reasoning_close) :]
                    self._mode = "text"
                    continue
                keep = _partial_suffix(self._buf, (f.reasoning_close,)) if not final else 0
                chunk = self._buf[: len(self._buf) - keep]
                # hold trailing newlines: they may precede the closing tag
                body = chunk.rstrip("\n")
                held = chunk[len(body) :]
                if body:
                    out.append(Event("reasoning", body))
                self._buf = held + self._buf[len(chunk) :]
                if not final or not self._buf:
                    return out
                return out
            if self._mode == "text":
                at = self._buf.find(f.tool_open)
                if at >= 0:
                    out.extend(self._text(self._buf[:at]))
                    self._pending_ws = ""
                    self._buf = self._buf[at + len(f.tool_open) :]
                    self._mode = "tool"
                    continue
                keep = _partial_suffix(self._buf, (f.tool_open,)) if not final else 0
                out.extend(self._text(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            # tool
            at = self._buf.find(f.tool_close)
            if at < 0:
                return out
            body = self._buf[:at]
            self._buf = self._buf[at + len(f.tool_close) :]
            self._mode = "text"
            call = f.parse_call(body)
            if call is None:
                out.extend(self._text(f.tool_open + body + f.tool_close))
            else:
                out.append(Event("tool", call=call))


_ARGS_RE = {key: re.compile(rf'"{key}"\s*:\s*') for key in ("arguments", "parameters")}


def _raw_arguments(text: str, key: str, args: Any) -> str:
    """The arguments exactly as the model wrote them: the text after a ``"<key>":`` whose value
    parses to ``args`` (the same key may also appear nested, or twice), else ``args`` serialized."""
    raw = None
    for m in _ARGS_RE[key].finditer(text):
        value = _raw_value(text, m.end())
        if value is not None and orjson.loads(value) == args:
            raw = value  # the last one, as the parser keeps the last of duplicate keys
    return raw if raw is not None else orjson.dumps(args).decode()


@dataclass(frozen=True)
class HermesFamily:
    """ChatML framing with Hermes tool calls and ``<think>`` reasoning.

    Attributes:
        name: Registry name.
        message_start: Token that starts every message.
        assistant_header: Text that opens an assistant turn.
        end_of_turn: Token that ends a turn.
        reasoning_open: Opens reasoning.
        reasoning_close: Closes reasoning.
        tool_open: Opens a tool call.
        tool_close: Closes a tool call.
        tool_call_parser: Name of the parser of its tool calls (:class:`HermesParser`).
        reasoning_parser: Name of the parser of its reasoning (the same parser).
    """

    name: str = "hermes"
    message_start: str = "<|im_start|>"
    assistant_header: str = "<|im_start|>assistant\n"
    end_of_turn: str = "<|im_end|>"
    reasoning_open: str = "<think>"
    reasoning_close: str = "</think>"
    tool_open: str = "<tool_call>"
    tool_close: str = "</tool_call>"
    tool_call_parser: str = "hermes"
    reasoning_parser: str = "hermes"

    @property
    def parsers(self) -> tuple[str, ...]:
        """The family and its parsers as the run manifest records them: ``family:<name>``,
        ``tool_call:<name>``, ``reasoning:<name>``."""
        return (f"family:{self.name}", f"tool_call:{self.tool_call_parser}", f"reasoning:{self.reasoning_parser}")

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks (none: it is of this family)."""
        return [m for m in (self.message_start, self.tool_open) if m not in template]

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family."""
        return not self.missing(template)

    def parser(self, generation_prompt: str) -> HermesParser:
        """A parser for one completion that follows ``generation_prompt``."""
        opened = generation_prompt.rfind(self.reasoning_open)
        in_reasoning = opened >= 0 and generation_prompt.find(self.reasoning_close, opened) < 0
        return HermesParser(self, in_reasoning=in_reasoning)

    def parse_call(self, body: str) -> ParsedCall | None:
        """Parses the JSON between the tool-call tags; None when it is not a valid call."""
        text = body.strip()
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        key = "arguments" if "arguments" in obj else "parameters"
        args = obj.get(key, {})
        if isinstance(args, str):
            # some models write the arguments as a JSON string
            try:
                parsed = orjson.loads(args)
            except orjson.JSONDecodeError:
                return ParsedCall(obj["name"], args, args)
            return ParsedCall(obj["name"], parsed, args)
        return ParsedCall(obj["name"], args, _raw_arguments(text, key, args))


def _raw_value(text: str, start: int) -> str | None:
    """The JSON value starting at ``start`` exactly as written (None if it does not parse alone)."""
    depth = 0
    in_str = False
    escape = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                raw = text[start : i + 1]
                try:
                    orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return None
                return raw
    return None


Family = HermesFamily

#: Registry: family name → constructor.
FAMILIES: dict[str, Callable[[], Family]] = {"hermes": HermesFamily}


def family_for(name: str, template: str) -> Family:
    """The family ``name``, or with ``auto`` the first whose template markers match.

    Raises:
        FailedPrecondition: Unknown name, or no registered family matches the template.
    """
    if name != "auto":
        if name not in FAMILIES:
            raise FailedPrecondition(f"unknown model family {name!r}; known: {sorted(FAMILIES)}", reason="BAD_FAMILY")
        return FAMILIES[name]()
    lacking = []
    for name, factory in FAMILIES.items():
        fam = factory()
        if fam.matches(template):
            return fam
        lacking.append(f"{name} needs {', '.join(fam.missing(template))}")
    raise FailedPrecondition(
        f"no model family the proxy parses token-exact matches the chat template ({'; '.join(lacking)})",
        reason="BAD_FAMILY",
    )
