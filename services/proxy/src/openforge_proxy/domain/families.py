"""Model families: the markers of a chat template and the parsers that match it.

A family knows how its template frames a turn (message-start token,
assistant header, end-of-turn tokens) and how the model writes reasoning and
tool calls, so the proxy can (a) cut prompts into per-message chunks, (b) find
where an assistant turn's sampled tokens go when splicing, and (c) parse the
sampled text into reasoning, text and tool calls while it streams.

What the proxy needs of a family is the :class:`Family` protocol, and of its
parser the :class:`StreamParser` protocol. Families live in a registry
(:data:`FAMILIES`, :func:`family_for`):

* ``hermes``: ChatML framing with
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and
  ``<think>...</think>`` (Qwen2.5/Qwen3, Hermes 2/3, and the project's tiny
  test model); the calls as vLLM's ``hermes`` tool parser reads them, the
  reasoning as its ``qwen3`` reasoning parser does.
* ``llama3``: Llama 3.1+ framing
  (``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``) with JSON
  tool calls ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``, several separated by ``;``; the calls as vLLM's
  ``llama3_json`` tool parser reads them; no reasoning.
* ``glm45``: GLM-4.5 framing (``<|user|>``, ``<|assistant|>``, ``<|observation|>``
  open the messages; an assistant turn ends with the token that opens the next one) with
  ``<think>...</think>`` reasoning and calls written
  ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>``;
  the calls as vLLM's ``glm45`` tool parser reads them, the reasoning as its ``glm45``
  reasoning parser does.
* ``mistral``: Mistral v11 framing (Mistral Small 3.x, Devstral: ``[INST]...[/INST]``,
  ``[SYSTEM_PROMPT]``, ``[AVAILABLE_TOOLS]``, ``[TOOL_RESULTS]...[/TOOL_RESULTS]``, an
  assistant turn ended by ``</s>``) with calls written ``[TOOL_CALLS]NAME[ARGS]{...}``; the
  calls as vLLM's ``mistral`` tool parser reads them with a v11 tokenizer; no reasoning.
* ``deepseek_v31``: DeepSeek-V3.1 framing (``<｜User｜>``, ``<｜Assistant｜></think>`` after a
  user message, ``<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>``, a turn ended by
  ``<｜end▁of▁sentence｜>``) with calls written
  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``
  and reasoning only where the generation prompt opened it (``thinking``); the calls as vLLM's
  ``deepseek_v31`` tool parser reads them, the reasoning as its ``deepseek_v3`` reasoning parser does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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


class StreamParser(Protocol):
    """Parses one completion's sampled text while it streams.

    Fed the detokenized text in deltas of any size, it returns :class:`Event` s:
    ``reasoning`` and ``text`` deltas, and ``tool`` events each carrying one complete,
    valid call. The events' concatenated reasoning, concatenated text and list of calls
    are the same however the completion is cut into deltas. A call that is not valid in
    the family's format is never emitted: what the model wrote is passed on as text.
    """

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed last is reasoning (counts reasoning tokens)."""
        ...

    def feed(self, text: str) -> list[Event]:
        """Parses a text delta; returns the events it completes (possibly none)."""
        ...

    def finish(self) -> list[Event]:
        """Flushes what is held at the end of generation; the parser is then spent."""
        ...


class Family(Protocol):
    """What the proxy needs of a model family (chat-template markers and parsers).

    The markers are text as the chat template writes it; each is a single special token
    of the family's tokenizers. Used by :class:`~openforge_proxy.domain.runtime.ModelRuntime`
    (detection, stop ids, manifest), :class:`~openforge_proxy.domain.splice.Splicer`
    (framing of assistant turns) and the handler (parsing what is sampled).
    """

    @property
    def name(self) -> str:
        """Registry name (``hermes``, ``llama3``)."""
        ...

    @property
    def message_start(self) -> str:
        """Token that starts every message: prompts are cut into per-message chunks at it."""
        ...

    @property
    def assistant_header(self) -> str:
        """Text that opens an assistant turn, up to where the sampled tokens begin."""
        ...

    @property
    def bare_turn_after(self) -> tuple[str, ...]:
        """Tokens right after which the template opens an assistant turn with nothing (not with
        :attr:`assistant_header`): the model writes right after them. Empty for most families."""
        ...

    @property
    def end_of_turn(self) -> str:
        """Token the template writes after an assistant turn (a spliced turn that ended
        with one of :attr:`end_tokens` stands in for the template's copy)."""
        ...

    @property
    def end_tokens(self) -> tuple[str, ...]:
        """Every token the model may end a turn with (sampling stops at each), the first
        :attr:`end_of_turn`."""
        ...

    @property
    def parsers(self) -> tuple[str, ...]:
        """The family and its parsers as the run manifest records them (``family:<name>``,
        ``tool_call:<name>``, and ``reasoning:<name>`` where it has reasoning)."""
        ...

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks (none: it is of this family)."""
        ...

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family (:meth:`missing` is empty)."""
        ...

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> StreamParser:
        """A parser for one completion that follows ``generation_prompt`` (the text the
        template appends for the assistant's turn, which may open reasoning); ``tools`` are
        the tools offered (a family whose calls carry untyped values reads their types)."""
        ...


class ToolSchema(Protocol):
    """What a family's parser reads of an offered tool: its name and the JSON schema of
    its arguments."""

    @property
    def name(self) -> str:
        """Tool name as the model calls it."""
        ...

    @property
    def parameters(self) -> Mapping[str, Any]:
        """JSON schema of its arguments."""
        ...


def _partial_suffix(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:k]):
                best = k
                break
    return best


def _opens_reasoning(generation_prompt: str, open_tag: str, close_tag: str) -> bool:
    """Whether a generation prompt leaves a reasoning block open (its last ``open_tag`` is not
    closed after it): the model's first tokens are then reasoning."""
    opened = generation_prompt.rfind(open_tag)
    return opened >= 0 and generation_prompt.find(close_tag, opened) < 0


class _TextOut:
    """Text deltas as a parser passes them on: the first text's leading whitespace dropped, and
    trailing whitespace held back (``pending``) until more text follows; a parser drops it
    (``pending = ""``) before a tool call and at the end."""

    def __init__(self) -> None:
        self.started = False
        self.pending = ""

    def __call__(self, text: str) -> list[Event]:
        if not self.started:
            text = text.lstrip()
            if not text:
                return []
            self.started = True
        body = self.pending + text
        stripped = body.rstrip()
        self.pending = body[len(stripped) :]
        return [Event("text", stripped)] if stripped else []


class _StateParser:
    """A streaming parser as a state machine over the text held so far (``_buf``): in each
    mode, ``_steps[mode](final, out)`` reads what it can, appends the events it completes to
    ``out`` and says whether to go on (it changed mode) or wait for more text."""

    def __init__(self, mode: str, steps: Mapping[str, Callable[[bool, list[Event]], bool]]) -> None:
        self._buf = ""
        self._mode = mode
        self._steps = steps
        self._text = _TextOut()

    @property
    def in_reasoning(self) -> bool:
        """Whether the text being parsed is reasoning."""
        return self._mode == "reasoning"

    def feed(self, text: str) -> list[Event]:
        """Parses a text delta."""
        self._buf += text
        return self._drain(final=False)

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._steps[self._mode](final, out):
            pass
        return out

    def _text_until(self, marker: str, final: bool, out: list[Event]) -> bool:
        """Passes on the text before ``marker``; True when the marker came (the text held now
        starts after it), False when more text is needed (a partial marker is held back)."""
        at = self._buf.find(marker)
        if at >= 0:
            out.extend(self._text(self._buf[:at]))
            self._text.pending = ""
            self._buf = self._buf[at + len(marker) :]
            return True
        keep = 0 if final else _partial_suffix(self._buf, (marker,))
        out.extend(self._text(self._buf[: len(self._buf) - keep]))
        self._buf = self._buf[len(self._buf) - keep :]
        return False


class HermesParser(_StateParser):
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
        parse_call: Reads the text between the tool-call tags (default: the family's
            ``parse_call``).
    """

    def __init__(
        self,
        family: HermesFamily | Glm45Family,
        in_reasoning: bool = False,
        parse_call: Callable[[str], ParsedCall | None] | None = None,
    ) -> None:
        steps = {
            "start": self._read_start,
            "reasoning": self._read_reasoning,
            "text": self._read_text,
            "tool": self._read_tool,
        }
        super().__init__("reasoning" if in_reasoning else "start", steps)
        self._f = family
        self._parse_call = parse_call if parse_call is not None else family.parse_call
        self._strip_lead = in_reasoning

    def finish(self) -> list[Event]:
        """Flushes what is left at the end of generation (an unclosed tool call becomes text)."""
        events = self._drain(final=True)
        if self._mode == "tool":
            events.extend(self._text(self._f.tool_open + self._buf))
            self._buf = ""
        elif self._mode == "reasoning" and self._buf:
            events.append(Event("reasoning", self._buf.rstrip("\n")))
            self._buf = ""
        self._text.pending = ""
        return events

    def _read_start(self, final: bool, out: list[Event]) -> bool:
        """Before anything but whitespace: a reasoning block, or text."""
        f = self._f
        lead = self._buf.lstrip()
        if not lead:
            if final:
                self._buf = ""
            return False
        if lead.startswith(f.reasoning_open):
            self._buf = lead[len(f.reasoning_open) :]
            self._mode = "reasoning"
            self._strip_lead = True
            return True
        if f.reasoning_open.startswith(lead) and not final:
            return False
        self._mode = "text"
        return True

    def _read_reasoning(self, final: bool, out: list[Event]) -> bool:
        """Reasoning up to its closing tag, less the newlines around it."""
        f = self._f
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
            return True
        keep = _partial_suffix(self._buf, (f.reasoning_close,)) if not final else 0
        chunk = self._buf[: len(self._buf) - keep]
        # hold trailing newlines: they may precede the closing tag
        body = chunk.rstrip("\n")
        held = chunk[len(body) :]
        if body:
            out.append(Event("reasoning", body))
        self._buf = held + self._buf[len(chunk) :]
        return False

    def _read_text(self, final: bool, out: list[Event]) -> bool:
        """Text up to a tool call's opening tag."""
        if not self._text_until(self._f.tool_open, final, out):
            return False
        self._mode = "tool"
        return True

    def _read_tool(self, final: bool, out: list[Event]) -> bool:
        """A tool call up to its closing tag: a call, or text where it does not parse."""
        f = self._f
        at = self._buf.find(f.tool_close)
        if at < 0:
            return False
        body = self._buf[:at]
        self._buf = self._buf[at + len(f.tool_close) :]
        self._mode = "text"
        call = self._parse_call(body)
        if call is None:
            out.extend(self._text(f.tool_open + body + f.tool_close))
        else:
            out.append(Event("tool", call=call))
        return True


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
    """ChatML framing with Hermes tool calls and ``<think>`` reasoning (a :class:`Family`).

    Attributes:
        name: Registry name.
        message_start: Token that starts every message.
        assistant_header: Text that opens an assistant turn.
        bare_turn_after: Empty: every assistant turn opens with the header.
        end_of_turn: Token that ends a turn.
        end_tokens: Tokens the model ends a turn with.
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
    bare_turn_after: tuple[str, ...] = ()
    end_of_turn: str = "<|im_end|>"
    end_tokens: tuple[str, ...] = ("<|im_end|>",)
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

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> HermesParser:
        """A parser for one completion that follows ``generation_prompt`` (the calls are
        JSON: ``tools`` are not needed)."""
        in_reasoning = _opens_reasoning(generation_prompt, self.reasoning_open, self.reasoning_close)
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
        return _call_of(obj, text)


def _call_of(obj: dict[str, Any], text: str) -> ParsedCall:
    """The call a JSON object with a string ``name`` states (its JSON text ``text``): its
    ``arguments``, else its ``parameters``, else none (``{}``)."""
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


_LEADING_SEPARATORS = re.compile(r"^[\s;]*;")  # what separates a call from what follows


class Llama3Parser:
    """Streaming parser of Llama 3.x JSON tool calls (a :class:`StreamParser`; no reasoning).

    The calls are those vLLM's ``Llama3JsonToolParser.extract_tool_calls`` reads: every
    ``{`` of the completion that is not inside an earlier call starts a JSON object; when
    each of them is an object with a string ``name`` and an ``arguments`` (else
    ``parameters``) key, they are the calls, in order; when any is not (not JSON, never
    closed, no name, no arguments), the completion has no call and all of it is text. The
    model writes them alone, optionally after ``<|python_tag|>``, several separated by
    ``;``.

    Streaming: text before the first ``{`` or ``<|python_tag|>`` leaves as it comes (less
    a held partial tag); what follows is held until it is decided. At the first ``{`` that
    cannot be a call, all that was held is text, and so is the rest of the completion; the
    calls are emitted only at :meth:`finish`, since a later ``{`` may still undo them.

    Text: with calls, what the model wrote around them is kept as text, less the
    ``<|python_tag|>`` marker, the ``;`` separators (with the whitespace before them) and
    the whitespace before the first call (vLLM drops all of it, as the template writes none: a harness then
    loses nothing the model said, as with the ``hermes`` family); with no call, the
    completion is the text, stripped at both ends.

    Args:
        family: The markers.
    """

    def __init__(self, family: Llama3Family) -> None:
        self._tag = family.python_tag
        self._buf = ""  # text: what is not yet sent (a partial tag); held: all that is held
        self._mode = "text"  # text -> held (a `{` or the tag) -> plain (no call) | finished
        self._piece = 0  # held: where the text after the last call begins
        self._pieces: list[str | ParsedCall] = []  # held: text and calls, in order
        self._obj = -1  # held: where the object being read begins (-1: none)
        self._scan = 0  # held: where reading resumes
        self._depth = 0
        self._in_str = False
        self._escape = False
        self._text = _TextOut()

    @property
    def in_reasoning(self) -> bool:
        """Always False: the family has no reasoning."""
        return False

    def feed(self, text: str) -> list[Event]:
        """Parses a text delta."""
        if self._mode == "plain":
            return self._text(text)
        self._buf += text
        return self._drain()

    def finish(self) -> list[Event]:
        """Flushes what is held: the calls when every object was one, else all as text."""
        out: list[Event] = []
        if self._mode == "text":
            out = self._text(self._buf)
        elif self._mode == "held":
            calls = [p for p in self._pieces if isinstance(p, ParsedCall)]
            if self._obj >= 0 or not calls:
                out = self._text(self._buf)
            else:
                self._text.pending = ""  # the whitespace before the first call
                self._pieces.append(self._buf[self._piece :])
                for piece in self._pieces:
                    if isinstance(piece, ParsedCall):
                        out.append(Event("tool", call=piece))
                        continue
                    piece = _LEADING_SEPARATORS.sub("", piece.replace(self._tag, ""), count=1)
                    if piece.strip():
                        out.extend(self._text(piece))
        self._buf = ""
        self._text.pending = ""
        self._mode = "finished"
        return out

    def _drain(self) -> list[Event]:
        if self._mode == "text":
            brace = self._buf.find("{")
            tag = self._buf.find(self._tag)
            starts = [i for i in (brace, tag) if i >= 0]
            if not starts:
                keep = _partial_suffix(self._buf, (self._tag,))
                out = self._text(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            at = min(starts)
            out = self._text(self._buf[:at])
            self._buf = self._buf[at:]
            self._mode = "held"
            return out + self._read()
        return self._read()

    def _read(self) -> list[Event]:
        """Reads the held objects as far as they arrived; at one that is no call, gives up."""
        buf = self._buf
        while True:
            if self._obj < 0:
                at = buf.find("{", self._scan)
                if at < 0:
                    self._scan = len(buf)
                    return []
                self._pieces.append(buf[self._piece : at])
                self._obj, self._scan = at, at + 1
                self._depth, self._in_str, self._escape = 1, False, False
                first = buf[at + 1 :].lstrip()
                if not first:
                    return []
            if self._scan == self._obj + 1:
                # an object begins with a key or ends: anything else is not JSON
                first = buf[self._obj + 1 :].lstrip()
                if not first:
                    return []
                if first[0] not in '"}':
                    return self._no_call()
            end = self._close(buf)
            if end < 0:
                return []
            body = buf[self._obj : end]
            call = _json_call(body)
            if call is None:
                return self._no_call()
            self._pieces.append(call)
            self._obj = -1
            self._piece = self._scan = end

    def _close(self, buf: str) -> int:
        """Scans the object being read; the index after its closing brace, or -1."""
        depth, in_str, escape = self._depth, self._in_str, self._escape
        i = self._scan
        n = len(buf)
        while i < n:
            ch = buf[i]
            i += 1
            if in_str:
                if escape:
                    escape = False
                elif ch == "\\":
                    escape = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    self._scan = i
                    return i
        self._depth, self._in_str, self._escape, self._scan = depth, in_str, escape, i
        return -1

    def _no_call(self) -> list[Event]:
        self._mode = "plain"
        text, self._buf = self._buf, ""
        self._pieces = []
        return self._text(text)


def _json_call(text: str) -> ParsedCall | None:
    """The call a Llama JSON object states: a string ``name`` and ``arguments`` or
    ``parameters`` (vLLM's rule); None when ``text`` is not one."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if "arguments" not in obj and "parameters" not in obj:
        return None
    return _call_of(obj, text)


@dataclass(frozen=True)
class Llama3Family:
    """Llama 3.1+ framing with JSON tool calls and no reasoning (a :class:`Family`).

    Attributes:
        name: Registry name.
        message_start: Token that starts every message.
        assistant_header: Text that opens an assistant turn.
        bare_turn_after: Empty: every assistant turn opens with the header.
        end_of_turn: Token that ends a turn (the template writes it after each message).
        end_tokens: Tokens the model ends a turn with: ``<|eot_id|>``, and ``<|eom_id|>``
            after a call that expects a result (Llama 3.1's built-in tools).
        header_end: Token that ends a message's role header.
        python_tag: Token a model may write before its calls.
        tool_call_parser: Name of the parser of its tool calls (:class:`Llama3Parser`; vLLM's
            ``llama3_json`` rules).
    """

    name: str = "llama3"
    message_start: str = "<|start_header_id|>"
    assistant_header: str = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    bare_turn_after: tuple[str, ...] = ()
    end_of_turn: str = "<|eot_id|>"
    end_tokens: tuple[str, ...] = ("<|eot_id|>", "<|eom_id|>")
    header_end: str = "<|end_header_id|>"
    python_tag: str = "<|python_tag|>"
    tool_call_parser: str = "llama3_json"

    @property
    def parsers(self) -> tuple[str, ...]:
        """``family:llama3``, ``tool_call:llama3_json`` (no reasoning parser)."""
        return (f"family:{self.name}", f"tool_call:{self.tool_call_parser}")

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks: its framing tokens, and
        ``tool_calls`` (a template that renders no assistant's calls serves no agent)."""
        markers = (self.message_start, self.header_end, self.end_of_turn, "tool_calls")
        return [m for m in markers if m not in template]

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family."""
        return not self.missing(template)

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> Llama3Parser:
        """A parser for one completion (the generation prompt opens nothing it parses; the
        calls are JSON: ``tools`` are not needed)."""
        return Llama3Parser(self)


_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _string_only(schema: Any) -> bool:
    """Whether a parameter's JSON schema allows only strings (``"type": "string"``)."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind == "string"
    return isinstance(kind, list) and bool(kind) and all(k == "string" for k in kind)


def _string_params(tools: Sequence[ToolSchema]) -> dict[str, frozenset[str]]:
    """Per tool name, the parameters whose schema allows only strings."""
    out: dict[str, frozenset[str]] = {}
    for tool in tools:
        props = tool.parameters.get("properties") if isinstance(tool.parameters, Mapping) else None
        if isinstance(props, Mapping):
            out[tool.name] = frozenset(k for k, v in props.items() if _string_only(v))
    return out


@dataclass(frozen=True)
class Glm45Family:
    """GLM-4.5 framing with ``<arg_key>``/``<arg_value>`` tool calls and ``<think>`` reasoning
    (a :class:`Family`).

    The template writes no token after an assistant turn: the model ends its turn with the
    token that opens the next message (``<|observation|>`` after calls, ``<|user|>`` after an
    answer), and the splicer lets that sampled token stand in for the template's copy.
    Reasoning, text and the framing of calls parse as in :class:`HermesParser`; a call's body
    is the name, then ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs (whitespace
    between them free). A value is the text between its tags, taken as a string for a
    parameter whose schema allows only strings, else as JSON when it parses as JSON (GLM's
    own rule, and vLLM's with the tools' schemas), else as a string.

    Attributes:
        name: Registry name.
        message_start: Token that starts the messages prompts are cut at (an assistant turn).
        assistant_header: Text that opens an assistant turn.
        bare_turn_after: Empty: every assistant turn opens with the header.
        end_of_turn: Empty: the template writes no end-of-turn token.
        end_tokens: Tokens the model ends a turn with: ``<|user|>``, ``<|observation|>``
            (waiting for tool results) and ``<|endoftext|>``.
        user_start: Token that opens a user message.
        observation_start: Token that opens tool results.
        reasoning_open: Opens reasoning.
        reasoning_close: Closes reasoning.
        tool_open: Opens a tool call.
        tool_close: Closes a tool call.
        arg_key: Opens an argument's name.
        tool_call_parser: Name of the parser of its tool calls (vLLM's ``glm45`` rules).
        reasoning_parser: Name of the parser of its reasoning (vLLM's ``glm45`` rules).
    """

    name: str = "glm45"
    message_start: str = "<|assistant|>"
    assistant_header: str = "<|assistant|>"
    bare_turn_after: tuple[str, ...] = ()
    end_of_turn: str = ""
    end_tokens: tuple[str, ...] = ("<|user|>", "<|observation|>", "<|endoftext|>")
    user_start: str = "<|user|>"
    observation_start: str = "<|observation|>"
    reasoning_open: str = "<think>"
    reasoning_close: str = "</think>"
    tool_open: str = "<tool_call>"
    tool_close: str = "</tool_call>"
    arg_key: str = "<arg_key>"
    tool_call_parser: str = "glm45"
    reasoning_parser: str = "glm45"

    @property
    def parsers(self) -> tuple[str, ...]:
        """``family:glm45``, ``tool_call:glm45``, ``reasoning:glm45``."""
        return (f"family:{self.name}", f"tool_call:{self.tool_call_parser}", f"reasoning:{self.reasoning_parser}")

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks: its framing tokens and the
        ``<tool_call>``/``<arg_key>`` of its calls."""
        markers = (self.user_start, self.assistant_header, self.observation_start, self.tool_open, self.arg_key)
        return [m for m in markers if m not in template]

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family."""
        return not self.missing(template)

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> HermesParser:
        """A parser for one completion that follows ``generation_prompt``; ``tools`` tell
        which parameters are strings."""
        in_reasoning = _opens_reasoning(generation_prompt, self.reasoning_open, self.reasoning_close)
        strings = _string_params(tools)
        return HermesParser(self, in_reasoning=in_reasoning, parse_call=lambda body: self.parse_call(body, strings))

    def parse_call(self, body: str, strings: Mapping[str, frozenset[str]] | None = None) -> ParsedCall | None:
        """Parses the text between the tool-call tags (``strings``: per tool, its string-only
        parameters); None when it names no tool."""
        at = body.find(self.arg_key)
        name = (body if at < 0 else body[:at]).strip()
        if not name:
            return None
        string_keys = (strings or {}).get(name, frozenset())
        args: dict[str, Any] = {}
        for m in _GLM_ARG.finditer(body, max(at, 0)):
            key, raw = m.group(1).strip(), m.group(2)
            args[key] = raw if key in string_keys else _json_or_string(raw)
        return ParsedCall(name, args, orjson.dumps(args).decode())


def _json_or_string(raw: str) -> Any:
    """A value as JSON when it parses as JSON, else the string itself."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


class MistralParser:
    """Streaming parser of Mistral v11 tool calls ``[TOOL_CALLS]NAME[ARGS]{...}`` (a
    :class:`StreamParser`; no reasoning).

    Text leaves as it comes (less a held partial ``[TOOL_CALLS]``). After ``[TOOL_CALLS]``
    the name runs to ``[ARGS]``; the arguments are the JSON object that follows, read to its
    closing brace (strings and escapes honoured), as vLLM's ``mistral`` parser takes the first
    JSON value after ``[ARGS]``. A call is emitted when its object closed and parsed, and its
    name is not empty; what follows it is text again (vLLM drops it; the proxy keeps it so a
    harness loses nothing the model said), and a further ``[TOOL_CALLS]`` opens the next call.
    A call that is not valid (no ``[ARGS]``, arguments that are not a JSON object, an empty
    name, generation cut before the object closed) is passed on as text.

    The pre-v11 syntax ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (Mistral 7B v0.3,
    Mixtral, Nemo) is not read: v11 is what current models (Mistral Small 3.2, Devstral) write.

    Args:
        family: The markers.
    """

    def __init__(self, family: MistralFamily) -> None:
        self._f = family
        self._buf = ""
        self._mode = "text"  # text -> name (after [TOOL_CALLS]) -> args (after [ARGS]) -> text
        self._name = ""
        self._scan = 0  # args: where scanning resumes
        self._depth = 0
        self._in_str = False
        self._escape = False
        self._text = _TextOut()

    @property
    def in_reasoning(self) -> bool:
        """Always False: the family has no reasoning."""
        return False

    def feed(self, text: str) -> list[Event]:
        """Parses a text delta."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """Flushes what is left at the end of generation (an unfinished call becomes text)."""
        f = self._f
        out = self._drain(final=True)
        if self._mode == "name":
            out.extend(self._text(f.tool_calls + self._buf))
        elif self._mode == "args":
            out.extend(self._text(f.tool_calls + self._name + f.args + self._buf))
        self._buf = ""
        self._mode = "text"
        self._text.pending = ""
        return out

    def _drain(self, final: bool) -> list[Event]:
        f = self._f
        out: list[Event] = []
        while True:
            if self._mode == "text":
                at = self._buf.find(f.tool_calls)
                if at >= 0:
                    out.extend(self._text(self._buf[:at]))
                    self._text.pending = ""
                    self._buf = self._buf[at + len(f.tool_calls) :]
                    self._mode = "name"
                    continue
                keep = _partial_suffix(self._buf, (f.tool_calls,)) if not final else 0
                out.extend(self._text(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            if self._mode == "name":
                at = self._buf.find(f.args)
                if at < 0:
                    return out
                self._name = self._buf[:at]
                self._buf = self._buf[at + len(f.args) :]
                self._mode = "args"
                self._scan, self._depth, self._in_str, self._escape = 0, 0, False, False
                continue
            # args
            if self._depth == 0:
                lead = self._buf.lstrip()
                if not lead:
                    return out
                if lead[0] != "{":
                    self._mode = "text"
                    out.extend(self._text(f.tool_calls + self._name + f.args))
                    continue
                self._scan = len(self._buf) - len(lead)
            end = self._close()
            if end < 0:
                return out
            body = self._buf[:end]
            self._buf = self._buf[end:]
            self._mode = "text"
            call = _json_object_call(self._name.strip(), body.strip())
            if call is None:
                out.extend(self._text(f.tool_calls + self._name + f.args + body))
            else:
                out.append(Event("tool", call=call))

    def _close(self) -> int:
        """Scans the arguments' object; the index after its closing brace, or -1."""
        buf = self._buf
        depth, in_str, escape = self._depth, self._in_str, self._escape
        i = self._scan
        n = len(buf)
        while i < n:
            ch = buf[i]
            i += 1
            if in_str:
                if escape:
                    escape = False
                elif ch == "\\":
                    escape = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    self._depth = 0
                    return i
        self._depth, self._in_str, self._escape, self._scan = depth, in_str, escape, i
        return -1


@dataclass(frozen=True)
class MistralFamily:
    """Mistral v11 framing with ``[TOOL_CALLS]NAME[ARGS]{...}`` calls and no reasoning (a
    :class:`Family`).

    The template writes no generation prompt: the model writes right after ``[/INST]`` or
    ``[/TOOL_RESULTS]``, so the assistant header is empty (a spliced turn goes exactly where the
    template writes the assistant's message) and ends with ``</s>``.

    Attributes:
        name: Registry name.
        message_start: Token that starts the messages prompts are cut at (a user message).
        assistant_header: Empty: nothing opens an assistant turn.
        bare_turn_after: Empty: every assistant turn opens with the header.
        end_of_turn: Token that ends an assistant turn.
        end_tokens: Tokens the model ends a turn with.
        inst_end: Token that ends a user message.
        tool_calls: Token that opens a tool call.
        args: Token between a call's name and its arguments.
        tool_results: Token that opens a tool result.
        tool_call_parser: Name of the parser of its tool calls (:class:`MistralParser`; vLLM's
            ``mistral`` rules with a v11 tokenizer).
    """

    name: str = "mistral"
    message_start: str = "[INST]"
    assistant_header: str = ""
    bare_turn_after: tuple[str, ...] = ()
    end_of_turn: str = "</s>"
    end_tokens: tuple[str, ...] = ("</s>",)
    inst_end: str = "[/INST]"
    tool_calls: str = "[TOOL_CALLS]"
    args: str = "[ARGS]"
    tool_results: str = "[TOOL_RESULTS]"
    tool_call_parser: str = "mistral"

    @property
    def parsers(self) -> tuple[str, ...]:
        """``family:mistral``, ``tool_call:mistral`` (no reasoning parser)."""
        return (f"family:{self.name}", f"tool_call:{self.tool_call_parser}")

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks: its framing tokens and the
        ``[TOOL_CALLS]``/``[ARGS]`` of its v11 calls."""
        markers = (self.message_start, self.inst_end, self.tool_calls, self.args, self.tool_results)
        return [m for m in markers if m not in template]

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family."""
        return not self.missing(template)

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> MistralParser:
        """A parser for one completion (the generation prompt opens nothing it parses; the
        arguments are JSON: ``tools`` are not needed)."""
        return MistralParser(self)


class DeepSeekV31Parser(_StateParser):
    """Streaming parser of DeepSeek-V3.1 reasoning, text and tool-call blocks (a :class:`StreamParser`).

    Reasoning is read only where the generation prompt opened it (``<｜Assistant｜><think>``),
    up to ``</think>``, as vLLM's ``deepseek_v3`` reasoning parser does with ``thinking``; then
    text up to ``<｜tool▁calls▁begin｜>``. Inside the block, each
    ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>`` is a call when its
    arguments parse as a JSON object and its name is not empty (vLLM's ``deepseek_v31`` parser
    passes any arguments on as written); whitespace between calls is skipped, and
    ``<｜tool▁calls▁end｜>`` closes the block. What is not a call (such a call, one cut before
    its end, anything else inside the block) is passed on as text as the model wrote it, and so
    is the text after the block (vLLM drops it).

    Args:
        family: The markers.
        in_reasoning: The generation prompt opened a reasoning block.
    """

    def __init__(self, family: DeepSeekV31Family, in_reasoning: bool = False) -> None:
        steps = {
            "reasoning": self._read_reasoning,
            "text": self._read_text,
            "calls": self._read_block,
            "call": self._read_call,
        }  # reasoning -> text -> calls <-> call -> text
        super().__init__("reasoning" if in_reasoning else "text", steps)
        self._f = family
        self._opened = False  # in the block, no call emitted yet: its opening marker not passed on
        self._calls = 0  # calls emitted in the block

    def finish(self) -> list[Event]:
        """Flushes what is left at the end of generation (an unfinished call becomes text)."""
        out = self._drain(final=True)
        if self._mode == "reasoning" and self._buf:
            out.append(Event("reasoning", self._buf))
        elif self._mode == "call":
            out.extend(self._text(self._opening() + self._f.call_begin + self._buf))
        else:  # text held back, or a block left open
            out.extend(self._text(self._opening() + self._buf))
        self._buf = ""
        self._mode = "text"
        self._text.pending = ""
        return out

    def _opening(self) -> str:
        """The block's opening marker, when what is passed on as text is the block's first item."""
        opened, self._opened = self._opened, False
        return self._f.calls_begin if opened else ""

    def _read_reasoning(self, final: bool, out: list[Event]) -> bool:
        at = self._buf.find(self._f.reasoning_close)
        if at >= 0:
            if at:
                out.append(Event("reasoning", self._buf[:at]))
            self._buf = self._buf[at + len(self._f.reasoning_close) :]
            self._mode = "text"
            return True
        keep = 0 if final else _partial_suffix(self._buf, (self._f.reasoning_close,))
        if len(self._buf) > keep:
            out.append(Event("reasoning", self._buf[: len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _read_text(self, final: bool, out: list[Event]) -> bool:
        if not self._text_until(self._f.calls_begin, final, out):
            return False
        self._mode, self._opened, self._calls = "calls", True, 0
        return True

    def _read_block(self, final: bool, out: list[Event]) -> bool:
        f = self._f
        lead = self._buf.lstrip()
        if lead.startswith(f.call_begin):
            self._buf = lead[len(f.call_begin) :]
            self._mode = "call"
            return True
        if lead.startswith(f.calls_end):
            if not self._calls:  # a block with no call: passed on as written
                out.extend(self._text(self._opening() + self._buf[: len(self._buf) - len(lead)] + f.calls_end))
            self._buf = lead[len(f.calls_end) :]
            self._mode = "text"
            return True
        if not lead or (not final and (f.call_begin.startswith(lead) or f.calls_end.startswith(lead))):
            return False
        out.extend(self._text(self._opening()))  # not a call: the rest is text
        self._mode = "text"
        return True

    def _read_call(self, final: bool, out: list[Event]) -> bool:
        f = self._f
        at = self._buf.find(f.call_end)
        if at < 0:
            return False
        body = self._buf[:at]
        self._buf = self._buf[at + len(f.call_end) :]
        self._mode = "calls"
        name, sep, args = body.partition(f.tool_sep)
        call = _json_object_call(name.strip(), args.strip()) if sep else None
        if call is None:
            out.extend(self._text(self._opening() + f.call_begin + body + f.call_end))
        else:
            self._opened = False
            self._calls += 1
            out.append(Event("tool", call=call))
        return True


def _json_object_call(name: str, body: str) -> ParsedCall | None:
    """A call when ``name`` is not empty and ``body`` parses as a JSON object, else None."""
    if not name:
        return None
    try:
        args = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return ParsedCall(name, args, body) if isinstance(args, dict) else None


@dataclass(frozen=True)
class DeepSeekV31Family:
    """DeepSeek-V3.1 framing with ``<｜tool▁calls▁begin｜>`` call blocks (a :class:`Family`).

    The template opens an assistant turn with ``<｜Assistant｜>`` right after a user message,
    then ``</think>`` (``<think>`` in the generation prompt with ``thinking``), and with nothing
    after tool results (the model writes right after ``<｜tool▁output▁end｜>``). A turn sampled
    after a user message is spliced after ``<｜Assistant｜>`` as the ``</think>`` or ``<think>``
    it followed plus its sampled ids; one sampled after tool results right after them. Past
    reasoning is never rendered (DeepSeek-V3.1's rule: a history turn is ``</think>`` and its
    text), so the splice is what keeps a thinking turn's prompt an extension of what the model saw.

    Attributes:
        name: Registry name.
        message_start: Token that starts the messages prompts are cut at (a user message).
        assistant_header: Token that opens an assistant turn after a user message.
        bare_turn_after: Token after which an assistant turn opens with nothing (tool results).
        end_of_turn: Token that ends an assistant turn.
        end_tokens: Tokens the model ends a turn with.
        reasoning_open: Opens reasoning (in the generation prompt, with ``thinking``).
        reasoning_close: Closes reasoning.
        calls_begin: Opens a turn's block of calls.
        calls_end: Closes it.
        call_begin: Opens one call.
        call_end: Closes one call.
        tool_sep: Between a call's name and its arguments.
        output_begin: Opens a tool result.
        tool_call_parser: Name of the parser of its tool calls (vLLM's ``deepseek_v31`` rules).
        reasoning_parser: Name of the parser of its reasoning (vLLM's ``deepseek_v3`` rules).
    """

    name: str = "deepseek_v31"
    message_start: str = "<｜User｜>"
    assistant_header: str = "<｜Assistant｜>"
    bare_turn_after: tuple[str, ...] = ("<｜tool▁output▁end｜>",)
    end_of_turn: str = "<｜end▁of▁sentence｜>"
    end_tokens: tuple[str, ...] = ("<｜end▁of▁sentence｜>",)
    reasoning_open: str = "<think>"
    reasoning_close: str = "</think>"
    calls_begin: str = "<｜tool▁calls▁begin｜>"
    calls_end: str = "<｜tool▁calls▁end｜>"
    call_begin: str = "<｜tool▁call▁begin｜>"
    call_end: str = "<｜tool▁call▁end｜>"
    tool_sep: str = "<｜tool▁sep｜>"
    output_begin: str = "<｜tool▁output▁begin｜>"
    tool_call_parser: str = "deepseek_v31"
    reasoning_parser: str = "deepseek_v3"

    @property
    def parsers(self) -> tuple[str, ...]:
        """``family:deepseek_v31``, ``tool_call:deepseek_v31``, ``reasoning:deepseek_v3``."""
        return (f"family:{self.name}", f"tool_call:{self.tool_call_parser}", f"reasoning:{self.reasoning_parser}")

    def missing(self, template: str) -> list[str]:
        """The markers of this family that ``template`` lacks: its framing tokens and those of its calls."""
        markers = (
            self.message_start,
            self.assistant_header,
            self.calls_begin,
            self.call_begin,
            self.tool_sep,
            self.output_begin,
        )
        return [m for m in markers if m not in template]

    def matches(self, template: str) -> bool:
        """Whether a chat template is of this family."""
        return not self.missing(template)

    def parser(self, generation_prompt: str, tools: Sequence[ToolSchema] = ()) -> DeepSeekV31Parser:
        """A parser for one completion that follows ``generation_prompt`` (reasoning when it
        opened ``<think>``; the arguments are JSON: ``tools`` are not needed)."""
        return DeepSeekV31Parser(self, _opens_reasoning(generation_prompt, self.reasoning_open, self.reasoning_close))


#: Registry: family name → constructor (``auto`` tries them in this order).
FAMILIES: dict[str, Callable[[], Family]] = {
    "hermes": HermesFamily,
    "llama3": Llama3Family,
    "glm45": Glm45Family,
    "mistral": MistralFamily,
    "deepseek_v31": DeepSeekV31Family,
}


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
