"""Anthropic Messages: ``POST /v1/messages`` in, messages and SSE out.

Requests (observed: Claude Code 2.1.332, OpenClaw 2026.9.6 ``anthropic-messages``,
mini-swe-agent 2.4.6 via litellm): ``system`` as a string or text blocks;
``messages`` with ``role: "system"`` entries inside (Claude Code; string or
blocks); ``thinking`` blocks with ``signature`` resent verbatim; ``tool_use``
with ``input`` as an object; ``tool_result`` blocks whose ``content`` is a
string or blocks; ``cache_control`` on any block; tools ``{name, description,
input_schema}`` (``type: "custom"`` from litellm), some with
``defer_loading: true``; and unknown top-level fields (``context_management``,
``output_config``, ``metadata``...) that are accepted and only recorded.

Stream (what the harnesses accepted): ``message_start`` (with usage), ``ping``,
per block ``content_block_start`` / ``content_block_delta`` (``thinking_delta``
then one ``signature_delta``, ``text_delta``, ``input_json_delta`` starting
with an empty ``partial_json``) / ``content_block_stop``, ``message_delta``
(``stop_reason`` and usage), ``message_stop``; ``event: error`` mid-stream.
Errors: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.
"""

from __future__ import annotations

from typing import Any

import orjson

from openforge_core.errors import InvalidArgument
from openforge_proxy.domain.conversation import (
    CanonicalRequest,
    Message,
    Tool,
    ToolCall,
    ToolKind,
    WireApi,
    non_text_parts,
    text_of,
)
from openforge_proxy.domain.output import ApiError, AssistantOutput, ErrorKind, Finish, Usage, new_id
from openforge_proxy.domain.protocols import pieces, sse, token_cap
from openforge_proxy.domain.protocols.memo import ConversationMemo, begin, shared_tools

_KNOWN_MESSAGE_KEYS = {"role", "content"}

#: Error kind → Anthropic ``error.type`` (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES: dict[ErrorKind, str] = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.LIMIT_REACHED: "invalid_request_error",
    ErrorKind.UNAVAILABLE: "api_error",
    ErrorKind.INTERNAL: "api_error",
}

_STOP_REASONS = {Finish.STOP: "end_turn", Finish.LENGTH: "max_tokens"}


def _require_list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise InvalidArgument.field(key, "must be a list")
    return value


def _tool(raw: Any, index: int) -> Tool:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidArgument.field(f"tools[{index}].name", "must be a string")
    kind = raw.get("type")
    if kind not in (None, "custom") and "input_schema" not in raw:
        # Server tools (web_search_2025..., code_execution...) run at the provider.
        return Tool(name=raw["name"], kind=ToolKind.HOSTED, raw=raw)
    schema = raw.get("input_schema")
    return Tool(
        name=raw["name"],
        description=str(raw.get("description") or ""),
        parameters=schema if isinstance(schema, dict) else {},
        deferred=bool(raw.get("defer_loading")),
        raw=raw,
    )


def _tools(raw: Any) -> list[Tool]:
    if not isinstance(raw, list):
        raise InvalidArgument.field("tools", "must be a list")
    return [_tool(t, i) for i, t in enumerate(raw)]


def _assistant(content: Any, extra: dict[str, Any]) -> Message:
    msg = Message(role="assistant", extra=extra)
    if isinstance(content, str):
        msg.content = content
        return msg
    if not isinstance(content, list):
        return msg
    texts: list[str] = []
    reasoning: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
            if block.get("signature"):
                msg.refs.append(str(block["signature"]))
        elif kind == "redacted_thinking":
            if block.get("data"):
                msg.refs.append(str(block["data"]))
        elif kind in ("tool_use", "server_tool_use"):
            call_id = str(block.get("id", ""))
            msg.tool_calls.append(ToolCall(id=call_id, name=str(block.get("name", "")), arguments=block.get("input")))
            msg.refs.append(call_id)
        else:
            msg.parts.append(block)
    msg.content = "".join(texts)
    msg.reasoning = "".join(reasoning) if reasoning else None
    return msg


def _user(content: Any, extra: dict[str, Any], names: dict[str, str]) -> list[Message]:
    """A user turn: its tool results become ``tool`` messages, then its text one ``user`` message."""
    if not isinstance(content, list):
        return [Message(role="user", content=text_of(content), extra=extra)]
    out: list[Message] = []
    rest: list[Any] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            call_id = str(block.get("tool_use_id", ""))
            out.append(
                Message(
                    role="tool",
                    content=text_of(block.get("content")),
                    tool_call_id=call_id,
                    name=names.get(call_id),
                    parts=non_text_parts(block.get("content")),
                )
            )
        else:
            rest.append(block)
    if rest or not out:
        out.append(Message(role="user", content=text_of(rest), parts=non_text_parts(rest), extra=extra))
    return out


def _messages(raw: Any, i: int, names: dict[str, str]) -> list[Message]:
    """``messages[i]`` in canonical form: one message, or a user message's tool results and
    text as several (``names``: call id -> tool name, updated with an assistant's calls).

    Raises:
        InvalidArgument: It is not an object, or its role is none of Messages'.
    """
    if not isinstance(raw, dict):
        raise InvalidArgument.field(f"messages[{i}]", "must be an object")
    role = raw.get("role")
    extra = {k: v for k, v in raw.items() if k not in _KNOWN_MESSAGE_KEYS}
    content = raw.get("content")
    if role == "assistant":
        msg = _assistant(content, extra)
        names.update({tc.id: tc.name for tc in msg.tool_calls})
        return [msg]
    if role == "user":
        return _user(content, extra, names)
    if role == "system":
        return [Message(role="system", content=text_of(content), extra=extra)]
    raise InvalidArgument.field(f"messages[{i}].role", "must be user, assistant or system")


def parse(body: dict[str, Any], memo: ConversationMemo | None = None) -> CanonicalRequest:
    """Maps a Messages request body into the canonical conversation.

    Args:
        body: The parsed JSON body.
        memo: The session's previous Messages request (:class:`.memo.ConversationMemo`, whose
            head is ``system``); updated to this one.

    Returns:
        The canonical request (``body`` kept as is).

    Raises:
        InvalidArgument: ``model`` is not a string, ``messages`` is not a list,
            ``max_tokens`` is a boolean or ``tool_choice`` is not an object (unknown
            fields never raise).
    """
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidArgument.field("model", "must be a string")
    max_tokens = token_cap(body, "max_tokens")
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, dict):
        raise InvalidArgument.field("tool_choice", "must be an object")
    system = body.get("system")
    raws = _require_list(body, "messages")
    resume = begin(memo, system, raws)
    messages, ends, names = resume.messages, resume.ends, resume.names
    if not resume.head_reused and system is not None:
        messages.append(Message(role="system", content=text_of(system), parts=non_text_parts(system)))
    base = 1 if system is not None else 0
    for i in range(resume.start, len(raws)):
        messages.extend(_messages(raws[i], i, names))
        ends.append(len(messages))
    raw_tools = body.get("tools") or []
    if memo is not None:
        tools = memo.tools("anthropic", raw_tools, _tools)
    else:
        tools = shared_tools("anthropic", raw_tools, _tools)
    if memo is not None:
        memo.commit(resume, messages, ends, base)
    thinking = body.get("thinking")
    want_reasoning = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    return CanonicalRequest(
        wire=WireApi.ANTHROPIC_MESSAGES,
        model=model,
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        want_reasoning=want_reasoning,
        parallel_tool_calls=not (tool_choice or {}).get("disable_parallel_tool_use"),
        body=body,
    )


def error_body(err: ApiError, request_id: str) -> dict[str, Any]:
    """The error body for ``err``."""
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES[err.kind], "message": err.message},
        "request_id": request_id,
    }


def _usage(usage: Usage, *, output_tokens: int | None = None) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens if output_tokens is None else output_tokens,
    }


def _stop_reason(out: AssistantOutput) -> str:
    if out.tool_calls and out.finish is Finish.STOP:
        return "tool_use"
    return _STOP_REASONS.get(out.finish, "end_turn")


def prepare_ids(out: AssistantOutput) -> None:
    """Assigns the message id, the thinking signature and the tool-use ids."""
    out.ids.setdefault("message", new_id("msg"))
    if not out.signature:
        out.signature = new_id("ofsig")
    for tc in out.tool_calls:
        if not tc.id:
            tc.id = new_id("toolu")


def response_body(out: AssistantOutput, usage: Usage, model: str, want_reasoning: bool) -> dict[str, Any]:
    """The non-streaming ``message`` object."""
    prepare_ids(out)
    content: list[dict[str, Any]] = []
    if out.reasoning and want_reasoning:
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": out.signature})
    if out.text:
        content.append({"type": "text", "text": out.text})
    for tc in out.tool_calls:
        content.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": _input(tc.arguments)})
    return {
        "id": out.ids["message"],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(out),
        "stop_sequence": None,
        "usage": _usage(usage),
    }


def _input(arguments: Any) -> Any:
    return arguments if isinstance(arguments, dict) else {"input": arguments}


class StreamEncoder:
    """Builds the Messages SSE stream of one response, block by block.

    Args:
        out: The output being filled (its ids are assigned here).
        model: Model name echoed back.
        want_reasoning: Emit thinking blocks (only when the request enabled thinking).
    """

    def __init__(self, out: AssistantOutput, model: str, want_reasoning: bool) -> None:
        prepare_ids(out)
        self._out = out
        self._model = model
        self._want_reasoning = want_reasoning
        self._index = -1
        self._open: str | None = None

    def start(self, usage: Usage) -> bytes:
        """``message_start`` (usage with the prompt tokens) and ``ping``."""
        message: dict[str, Any] = {
            "id": self._out.ids["message"],
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(usage, output_tokens=1),
        }
        return sse("message_start", {"type": "message_start", "message": message}) + sse("ping", {"type": "ping"})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        data = b""
        if self._open == "thinking":
            data += sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._index,
                    "delta": {"type": "signature_delta", "signature": self._out.signature},
                },
            )
        self._open = None
        return data + sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _switch(self, kind: str, block: dict[str, Any]) -> bytes:
        if self._open == kind:
            return b""
        data = self._close()
        self._index += 1
        self._open = kind
        return data + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def reasoning(self, delta: str) -> bytes:
        """A ``thinking_delta`` (opening the thinking block first)."""
        if not self._want_reasoning or not delta:
            return b""
        data = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return data + sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": self._index,
                "delta": {"type": "thinking_delta", "thinking": delta},
            },
        )

    def text(self, delta: str) -> bytes:
        """A ``text_delta`` (opening a text block first)."""
        if not delta:
            return b""
        data = self._switch("text", {"type": "text", "text": ""})
        return data + sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": self._index,
                "delta": {"type": "text_delta", "text": delta},
            },
        )

    def finish(self, usage: Usage) -> bytes:
        """The tool-use blocks (complete, final), ``message_delta`` and ``message_stop``."""
        data = self._close()
        for tc in self._out.tool_calls:
            self._index += 1
            data += sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": self._index,
                    "content_block": {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}},
                },
            )
            arguments = tc.arguments_json if isinstance(tc.arguments, dict) else _json_text(_input(tc.arguments))
            for piece in ["", *pieces(arguments)]:
                data += sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
            data += sse("content_block_stop", {"type": "content_block_stop", "index": self._index})
        data += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(self._out), "stop_sequence": None},
                "usage": _usage(usage),
            },
        )
        return data + sse("message_stop", {"type": "message_stop"})

    def error(self, message: str) -> bytes:
        """``event: error`` (``overloaded_error``): Claude Code then re-asks without streaming."""
        return sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": message}})


def _json_text(obj: Any) -> str:
    return orjson.dumps(obj).decode()
