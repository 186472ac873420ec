"""The canonical conversation every wire protocol maps into and out of.

Anthropic Messages, OpenAI Responses and OpenAI Chat Completions requests are
all converted into one :class:`CanonicalRequest`: an ordered list of
:class:`Message` (roles ``system``, ``user``, ``assistant``, ``tool``), the
tools offered to the model, and the few request settings the proxy reads
(``max_tokens``, ``stream``...). Everything else a harness sends is kept: the
raw body is recorded as received (scrubbed), and fields of a message the
canonical form has no place for stay in :attr:`Message.extra`.

What the chat template receives is :meth:`Message.template_dict` and
:meth:`Tool.template_dict`, in the shape Hugging Face chat templates expect
(``transformers`` ``apply_chat_template``): ``{"role", "content"}`` plus
``reasoning_content`` and ``tool_calls`` (``{"id", "type": "function",
"function": {"name", "arguments": <object>}}``) on assistant messages and
``tool_call_id``/``name`` on tool messages; tools as ``{"type": "function",
"function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import orjson

from openforge_proxy.domain.scrub import scrub_json_bytes


class WireApi(enum.Enum):
    """The HTTP API a harness called."""

    ANTHROPIC_MESSAGES = "anthropic_messages"
    OPENAI_RESPONSES = "openai_responses"
    OPENAI_CHAT = "openai_chat_completions"


class ToolKind(enum.Enum):
    """How a tool is called.

    ``FUNCTION`` takes a JSON object; ``CUSTOM`` (OpenAI Responses freeform
    tools such as Codex's code-mode ``exec``) takes one raw string, shown to
    the model as a function with a single string parameter ``input``;
    ``HOSTED`` tools (``web_search``) are run by the provider, which this proxy
    is not, so they are recorded but not offered to the model.
    """

    FUNCTION = "function"
    CUSTOM = "custom"
    HOSTED = "hosted"


#: The parameter a custom (freeform) tool's raw input travels in when shown to the model.
CUSTOM_INPUT_PARAM = "input"


@dataclass
class Tool:
    """A tool offered to the model.

    Attributes:
        name: Tool name as the model must call it.
        description: Its description.
        parameters: JSON schema of its arguments (FUNCTION); for CUSTOM the
            schema of the single ``input`` string.
        kind: How it is called.
        namespace: OpenAI Responses namespace it came from (``functions``,
            ``multi_agent_v1``...), or None.
        deferred: Anthropic ``defer_loading: true``: its schema is not loaded
            into the context (the model finds it through a tool search), so it
            is not rendered.
        raw: The tool exactly as the harness sent it.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    deferred: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def rendered(self) -> bool:
        """Whether the tool is shown to the model (not hosted, not deferred)."""
        return self.kind is not ToolKind.HOSTED and not self.deferred

    def template_dict(self) -> dict[str, Any]:
        """The tool as chat templates expect it (OpenAI function format)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolCall:
    """One tool call of an assistant message.

    Attributes:
        id: The call id as the harness sent it (or as this proxy emitted it).
        name: Tool name.
        arguments: Parsed arguments: a JSON object for FUNCTION tools (a
            non-object or unparsable argument string is kept as the string),
            the raw input string for CUSTOM tools.
        kind: FUNCTION or CUSTOM.
        namespace: Responses namespace, if any.
        item_id: Responses item id (``fc_...``/``ctc_...``), if any.
    """

    id: str
    name: str
    arguments: Any
    kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    item_id: str | None = None

    def template_arguments(self) -> Any:
        """Arguments as rendered for the model (custom input wrapped in an object)."""
        if self.kind is ToolKind.CUSTOM:
            return {CUSTOM_INPUT_PARAM: self.arguments}
        return self.arguments


@dataclass
class Message:
    """One message of the canonical conversation.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The text (text parts joined with no separator, as chat templates do).
        reasoning: Assistant reasoning text (Anthropic ``thinking``, Responses
            ``reasoning`` summary, Chat ``reasoning_content``), or None.
        tool_calls: Assistant tool calls, in order.
        tool_call_id: For ``tool`` messages: the call answered.
        name: For ``tool`` messages: the tool's name when known.
        refs: Opaque references the harness echoed back that identify a turn
            this proxy generated: emitted item ids, tool-call ids, thinking
            signatures, ``encrypted_content``. Used only for token splicing.
        parts: Non-text content parts (images...) kept as sent; not rendered.
        extra: Fields of the wire message the canonical form has no place for.
    """

    role: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    refs: list[str] = field(default_factory=list)
    parts: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    _template: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _record: bytes | None = field(default=None, init=False, repr=False, compare=False)
    #: Splice fingerprint, computed once by :func:`openforge_proxy.domain.splice.message_fingerprint`.
    fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)
    #: Digest of role and stripped text, computed once by :func:`openforge_proxy.domain.turns.context_key`.
    text_digest: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it.

        Built once per message and shared (the call key, the comparisons with the model's
        view and the render all read it): treat it as read-only, and do not change a message
        once it was asked for (messages are complete when a protocol's ``parse`` returns).
        """
        d = self._template
        if d is None:
            d = self._template = self._build_template_dict()
        return d

    def _build_template_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            if self.reasoning is not None:
                d["reasoning_content"] = self.reasoning
            if self.tool_calls:
                d["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": tc.template_arguments()},
                    }
                    for tc in self.tool_calls
                ]
        elif self.role == "tool":
            d["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                d["name"] = self.name
        return d

    def record_json(self) -> bytes:
        """:meth:`to_json` as JSON bytes, identifiers scrubbed; built once per message.

        A protocol that reuses a session's unchanged messages across calls (Anthropic
        Messages) thereby serializes each message for the records once, not once per call.
        """
        b = self._record
        if b is None:
            b = self._record = scrub_json_bytes(orjson.dumps(self.to_json()))
        return b

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form for the call record (template fields plus refs, parts, extra)."""
        d = self._build_template_dict()
        for tc, out in zip(self.tool_calls, d.get("tool_calls", []), strict=True):
            out["kind"] = tc.kind.value
            if tc.namespace:
                out["namespace"] = tc.namespace
        if self.parts:
            d["parts"] = self.parts
        if self.extra:
            d["extra"] = self.extra
        return d


@dataclass
class CanonicalRequest:
    """One harness request in canonical form.

    Attributes:
        wire: The API called.
        model: The model name the harness asked for.
        messages: The conversation, oldest first.
        tools: Tools offered, in the order sent (hosted and deferred included).
        max_tokens: The harness's completion-token cap, if it sent one.
        stream: Whether it asked for a stream.
        include_usage: Chat Completions ``stream_options.include_usage``.
        want_reasoning: Whether the harness asked for reasoning output
            (Anthropic ``thinking`` enabled, Responses ``reasoning`` present).
        parallel_tool_calls: Whether more than one tool call per turn is allowed.
        logprobs: Chat Completions ``logprobs: true``: return the sampled tokens' logprobs.
        body: The request body as parsed (never modified).
    """

    wire: WireApi
    model: str
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    want_reasoning: bool = False
    parallel_tool_calls: bool = True
    logprobs: bool = False
    body: dict[str, Any] = field(default_factory=dict)

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name`` (first match), if offered."""
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def to_json(self) -> dict[str, Any]:
        """The canonical conversation for the call record."""
        return {
            "wire_api": self.wire.value,
            "model": self.model,
            "messages": [m.to_json() for m in self.messages],
            "tools": self._tools_json(),
        }

    def _tools_json(self) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "kind": t.kind.value,
                "namespace": t.namespace,
                "deferred": t.deferred,
                "rendered": t.rendered,
            }
            for t in self.tools
        ]

    def record_json(self) -> bytes:
        """:meth:`to_json` as JSON bytes with identifiers scrubbed (the record's ``canonical_json``).

        Equal, parsed, to ``scrub_json_bytes(orjson.dumps(self.to_json()))``; each message's
        bytes come from :meth:`Message.record_json` (built once per message object).
        """
        head = scrub_json_bytes(orjson.dumps({"wire_api": self.wire.value, "model": self.model}))
        tools = scrub_json_bytes(orjson.dumps(self._tools_json()))
        messages = b",".join([m.record_json() for m in self.messages])
        return b"".join([head[:-1], b',"messages":[', messages, b'],"tools":', tools, b"}"])


def text_of(content: Any) -> str:
    """Joins the text of a content value: a string, or a list of parts.

    Text parts are ``{"type": "text"|"input_text"|"output_text", "text": ...}``;
    a bare string in a list counts as text. Other parts contribute nothing.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                if part.get("type") in (None, "text", "input_text", "output_text", "summary_text"):
                    out.append(part["text"])
        return "".join(out)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return ""


def non_text_parts(content: Any) -> list[Any]:
    """The parts of a content list that are not text (images, documents...)."""
    if not isinstance(content, list):
        return []
    return [
        p
        for p in content
        if isinstance(p, dict) and p.get("type") not in (None, "text", "input_text", "output_text", "summary_text")
    ]
