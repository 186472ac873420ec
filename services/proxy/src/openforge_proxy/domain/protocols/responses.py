"""OpenAI Responses: ``POST /v1/responses`` in, response objects and SSE out.

Requests (observed: Codex 0.171.0 with a custom and with its default model,
OpenClaw 2026.9.6 ``openai-responses``, mini-swe-agent 2.4.6 via litellm):
``input`` items ``message`` (roles developer/system/user/assistant; also
without ``type``), ``additional_tools`` (tools inside ``input``, Codex
responses-lite), ``reasoning`` with ``summary`` and ``encrypted_content``
(resent with ``"content": null``), ``function_call`` / ``function_call_output``,
``custom_tool_call`` / ``custom_tool_call_output`` (output as a string or an
array of ``input_text``); tools ``function``, freeform ``custom`` (Lark
grammar), ``namespace`` (nested tools) and the hosted ``web_search``; no
``instructions`` required; unknown fields (``client_metadata``,
``prompt_cache_key``, ``text.verbosity``...) accepted and only recorded.

Stream: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` ... ``response.output_item.done``
(reasoning: ``reasoning_summary_part.added``, ``reasoning_summary_text.delta``/
``.done``, ``reasoning_summary_part.done``; message: ``content_part.added``,
``output_text.delta``/``.done``, ``content_part.done``; function call:
``function_call_arguments.delta``/``.done``; custom tool call:
``custom_tool_call_input.delta``/``.done``), then ``response.completed`` (or
``response.incomplete``) with usage including ``input_tokens_details.cached_tokens``
and ``output_tokens_details.reasoning_tokens``; ``response.failed`` mid-stream.
Every event carries ``sequence_number``. Codex runs a tool on its item's
``output_item.done``, so tool-call items are only emitted once generation
ended successfully (reference §3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from openforge_core.errors import InvalidArgument
from openforge_proxy.domain.conversation import (
    CUSTOM_INPUT_PARAM,
    CanonicalRequest,
    Message,
    Tool,
    ToolCall,
    ToolKind,
    WireApi,
    non_text_parts,
    text_of,
)
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import ApiError, AssistantOutput, ErrorKind, Finish, Usage, new_id
from openforge_proxy.domain.protocols import pieces, sse, token_cap

_ASSISTANT_ITEMS = {"reasoning", "function_call", "custom_tool_call"}

#: Error kind → OpenAI ``error.type`` / ``error.code``.
ERROR_TYPES: dict[ErrorKind, tuple[str, str | None]] = {
    ErrorKind.INVALID_REQUEST: ("invalid_request_error", None),
    ErrorKind.AUTHENTICATION: ("invalid_request_error", "invalid_api_key"),
    ErrorKind.NOT_FOUND: ("invalid_request_error", "model_not_found"),
    ErrorKind.TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.LIMIT_REACHED: ("invalid_request_error", "rollout_limit_reached"),
    ErrorKind.UNAVAILABLE: ("server_error", "server_error"),
    ErrorKind.INTERNAL: ("server_error", "server_error"),
}


def openai_error_body(err: ApiError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` (shared with Chat Completions)."""
    kind, code = ERROR_TYPES[err.kind]
    return {"error": {"message": err.message, "type": kind, "param": None, "code": code}}


def error_body(err: ApiError, request_id: str) -> dict[str, Any]:
    """The error body for ``err`` (the request id travels in ``x-request-id``)."""
    return openai_error_body(err)


def custom_tool_schema(raw: dict[str, Any]) -> dict[str, Any]:
    """The one-string-parameter schema a freeform custom tool is shown with."""
    fmt = raw.get("format")
    desc = "The raw input of the tool."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        desc += f" It must follow this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT_PARAM: {"type": "string", "description": desc}},
        "required": [CUSTOM_INPUT_PARAM],
    }


def tools_of(raw_tools: Any, namespace: str | None = None) -> list[Tool]:
    """Flattens Responses tools (namespaces included) into canonical tools."""
    out: list[Tool] = []
    if not isinstance(raw_tools, list):
        return out
    for raw in raw_tools:
        if not isinstance(raw, dict):
            continue
        kind = raw.get("type")
        if kind == "namespace":
            out.extend(tools_of(raw.get("tools"), str(raw.get("name", ""))))
        elif kind == "function" and isinstance(raw.get("name"), str):
            params = raw.get("parameters")
            out.append(
                Tool(
                    name=raw["name"],
                    description=str(raw.get("description") or ""),
                    parameters=params if isinstance(params, dict) else {},
                    namespace=namespace,
                    raw=raw,
                )
            )
        elif kind == "custom" and isinstance(raw.get("name"), str):
            out.append(
                Tool(
                    name=raw["name"],
                    description=str(raw.get("description") or ""),
                    parameters=custom_tool_schema(raw),
                    kind=ToolKind.CUSTOM,
                    namespace=namespace,
                    raw=raw,
                )
            )
        else:
            out.append(
                Tool(
                    name=str(raw.get("name") or kind or ""),
                    kind=ToolKind.HOSTED,
                    namespace=namespace,
                    raw=raw,
                )
            )
    return out


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _output_text(output: Any) -> str:
    return output if isinstance(output, str) else text_of(output)


class _Items:
    """Reads a Responses ``input`` item by item into canonical messages (:func:`parse`)."""

    def __init__(self, tools: list[Tool], turn_of: Callable[[str], str | None] | None) -> None:
        self.messages: list[Message] = []
        self.tools = tools
        self._turn_of = turn_of
        self._names: dict[str, str] = {}  # call id -> tool name
        self._current: Message | None = None  # the assistant message items are added to
        self._current_turn: str | None = None  # the generated turn it is, when known

    def read(self, raw: dict[str, Any], index: int) -> None:
        """Adds one item. Other item types (web_search_call, compaction, item_reference...) are
        recorded with the request but have no canonical rendering."""
        kind = raw.get("type", "message")
        if kind == "message":
            self._message(raw)
        elif kind == "reasoning":
            self._reasoning(raw, index)
        elif kind in ("function_call", "custom_tool_call"):
            self._tool_call(raw, custom=kind == "custom_tool_call")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._tool_output(raw)
        elif kind == "additional_tools":
            self.tools.extend(tools_of(raw.get("tools")))

    def _assistant(self, refs: list[str]) -> Message:
        """The assistant message an item with references ``refs`` belongs to: the current one,
        unless ``turn_of`` says it is another generated turn."""
        turn_of = self._turn_of
        turn = next((t for t in (turn_of(r) for r in refs) if t), None) if turn_of else None
        current = self._current
        if current is None or (turn and self._current_turn and turn != self._current_turn):
            current = self._current = Message(role="assistant")
            self._current_turn = turn
            self.messages.append(current)
        elif turn and not self._current_turn:
            self._current_turn = turn
        return current

    def _message(self, raw: dict[str, Any]) -> None:
        role = raw.get("role")
        content = raw.get("content")
        item_id = raw.get("id")
        if role == "assistant":
            refs = [item_id] if isinstance(item_id, str) else []
            msg = self._assistant(refs)
            msg.content += text_of(content)  # text after a tool call in one turn stays in it
            msg.refs.extend(refs)
            return
        self._current = None
        extra = {k: v for k, v in raw.items() if k not in ("type", "role", "content", "id")}
        self.messages.append(
            Message(
                role="system" if role in ("system", "developer") else "user",
                content=text_of(content),
                parts=non_text_parts(content),
                extra=extra,
            )
        )

    def _reasoning(self, raw: dict[str, Any], index: int) -> None:
        refs = [r for r in (raw.get("id"), raw.get("encrypted_content")) if isinstance(r, str) and r]
        current = self._current
        if current is not None and (current.content or current.tool_calls):
            self._current = None  # reasoning after content starts another turn
        msg = self._assistant(refs)
        summary = raw.get("summary")
        if summary is None:
            summary = []
        elif not isinstance(summary, list):
            raise InvalidArgument.field(f"input[{index}].summary", "must be a list")
        text = "\n\n".join(text_of([p]) for p in summary if isinstance(p, dict))
        msg.reasoning = (msg.reasoning + "\n\n" + text) if msg.reasoning else text
        msg.refs.extend(refs)

    def _tool_call(self, raw: dict[str, Any], *, custom: bool) -> None:
        item_id = raw.get("id")
        call_id = str(raw.get("call_id", ""))
        refs = [r for r in (item_id, call_id) if isinstance(r, str) and r]
        msg = self._assistant(refs)
        name = str(raw.get("name", ""))
        self._names[call_id] = name
        msg.tool_calls.append(
            ToolCall(
                id=call_id,
                name=name,
                arguments=raw.get("input", "") if custom else _arguments(raw.get("arguments", "")),
                kind=ToolKind.CUSTOM if custom else ToolKind.FUNCTION,
                namespace=raw.get("namespace") if isinstance(raw.get("namespace"), str) else None,
                item_id=item_id if isinstance(item_id, str) else None,
            )
        )
        msg.refs.extend(refs)

    def _tool_output(self, raw: dict[str, Any]) -> None:
        self._current = None
        call_id = str(raw.get("call_id", ""))
        output = raw.get("output")
        self.messages.append(
            Message(
                role="tool",
                content=_output_text(output),
                tool_call_id=call_id,
                name=self._names.get(call_id),
                parts=non_text_parts(output),
            )
        )


def parse(body: dict[str, Any], turn_of: Callable[[str], str | None] | None = None) -> CanonicalRequest:
    """Maps a Responses request body into the canonical conversation.

    Consecutive assistant-side items (``reasoning``, assistant ``message``,
    ``function_call``, ``custom_tool_call``) form one assistant message; a new
    one starts after a tool output or user message, at a ``reasoning`` item
    that follows content, or where ``turn_of`` says the item belongs to
    another turn this proxy generated.

    Args:
        body: The parsed JSON body.
        turn_of: Maps an item reference (item id, call id, encrypted content)
            to the generated turn it belongs to, if known.

    Returns:
        The canonical request.

    Raises:
        InvalidArgument: ``model`` is not a string, ``input`` is neither a
            string nor a list, a ``reasoning`` item's ``summary`` is not a list, or
            ``max_output_tokens`` is a boolean.
    """
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidArgument.field("model", "must be a string")
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": raw_input}]
    elif isinstance(raw_input, list):
        items = raw_input
    else:
        raise InvalidArgument.field("input", "must be a string or a list of items")
    max_tokens = token_cap(body, "max_output_tokens")
    reader = _Items(tools_of(body.get("tools")), turn_of)
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        reader.messages.append(Message(role="system", content=body["instructions"]))
    for index, raw in enumerate(items):
        if isinstance(raw, dict):
            reader.read(raw, index)
    messages, tools = reader.messages, reader.tools
    for echoed in ("reasoning", "tool_choice"):  # in every response object: writable, or refused now
        if body.get(echoed) is not None:
            orjson.dumps(body[echoed])  # raises orjson.JSONEncodeError (too deep): the caller's 400
    return CanonicalRequest(
        wire=WireApi.OPENAI_RESPONSES,
        model=model,
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        want_reasoning=body.get("reasoning") is not None,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        body=body,
    )


def prepare_ids(out: AssistantOutput, request: CanonicalRequest) -> None:
    """Assigns item ids, call ids, ``encrypted_content`` and each call's kind/namespace."""
    out.ids.setdefault("response", new_id("resp"))
    out.ids.setdefault("reasoning", new_id("rs"))
    out.ids.setdefault("message", new_id("msg"))
    if not out.signature:
        out.signature = new_id("ofenc")
    for tc in out.tool_calls:
        if not tc.id:
            tc.id = new_id("call")
        if not tc.item_id:
            tc.item_id = new_id("ctc" if tc.kind is ToolKind.CUSTOM else "fc")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _call_item(tc: Any, status: str, *, empty: bool = False) -> dict[str, Any]:
    if tc.kind is ToolKind.CUSTOM:
        item = {
            "id": tc.item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": tc.id,
            "name": tc.name,
            "input": "" if empty else tc.arguments_json,
        }
    else:
        item = {
            "id": tc.item_id,
            "type": "function_call",
            "status": status,
            "arguments": "" if empty else tc.arguments_json,
            "call_id": tc.id,
            "name": tc.name,
        }
    if tc.namespace:
        item["namespace"] = tc.namespace
    return item


def _reasoning_item(out: AssistantOutput, done: bool) -> dict[str, Any]:
    item: dict[str, Any] = {"id": out.ids["reasoning"], "type": "reasoning", "summary": []}
    if done:
        item["summary"] = [{"type": "summary_text", "text": out.reasoning}]
        item["encrypted_content"] = out.signature
    return item


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(out: AssistantOutput, status: str, text: str | None) -> dict[str, Any]:
    return {
        "id": out.ids["message"],
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [_text_part(text)],
    }


def output_items(out: AssistantOutput, want_reasoning: bool) -> list[dict[str, Any]]:
    """The final ``output`` list."""
    items: list[dict[str, Any]] = []
    if out.reasoning and want_reasoning:
        items.append(_reasoning_item(out, True))
    if out.text:
        items.append(_message_item(out, "completed", out.text))
    items.extend(_call_item(tc, "completed") for tc in out.tool_calls)
    return items


def _status(out: AssistantOutput) -> str:
    return "incomplete" if out.finish is Finish.LENGTH else "completed"


def response_object(
    request: CanonicalRequest,
    out: AssistantOutput,
    sampling: Sampling,
    *,
    status: str,
    created_at: int,
    output: list[dict[str, Any]],
    usage: Usage | None,
) -> dict[str, Any]:
    """The ``response`` object (for events and the non-streaming body)."""
    body = request.body
    return {
        "id": out.ids["response"],
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions") if isinstance(body.get("instructions"), str) else None,
        "max_output_tokens": request.max_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0 if sampling.temperature is None else sampling.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [],
        "top_p": 1.0 if sampling.top_p is None else sampling.top_p,
        "truncation": "disabled",
        "usage": None if usage is None else _usage(usage),
        "user": None,
        "metadata": {},
    }


def response_body(request: CanonicalRequest, out: AssistantOutput, usage: Usage, sampling: Sampling) -> dict[str, Any]:
    """The non-streaming response object."""
    prepare_ids(out, request)
    return response_object(
        request,
        out,
        sampling,
        status=_status(out),
        created_at=int(time.time()),
        output=output_items(out, request.want_reasoning),
        usage=usage,
    )


class StreamEncoder:
    """Builds the Responses SSE stream of one response.

    Args:
        request: The canonical request (model, reasoning wish, body fields echoed).
        out: The output being filled (its ids are assigned here).
        sampling: The call's sampling parameters (``temperature``, ``top_p`` echoed).
    """

    def __init__(self, request: CanonicalRequest, out: AssistantOutput, sampling: Sampling) -> None:
        prepare_ids(out, request)
        self._req = request
        self._out = out
        self._sampling = sampling
        self._seq = 0
        self._index = -1
        self._open: str | None = None
        self._created = int(time.time())
        self._reasoning = ""
        self._text = ""
        self._done_items: list[dict[str, Any]] = []

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        payload = {"type": name, "sequence_number": self._seq, **data}
        self._seq += 1
        return sse(name, payload)

    def _response(self, status: str, usage: Usage | None = None) -> dict[str, Any]:
        return response_object(
            self._req,
            self._out,
            self._sampling,
            status=status,
            created_at=self._created,
            output=list(self._done_items),
            usage=usage,
        )

    def start(self, usage: Usage) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        return self._event("response.created", {"response": self._response("in_progress")}) + self._event(
            "response.in_progress", {"response": self._response("in_progress")}
        )

    def _close(self) -> bytes:
        out = self._out
        data = b""
        if self._open == "reasoning":
            ids = {"item_id": out.ids["reasoning"], "output_index": self._index, "summary_index": 0}
            data += self._event("response.reasoning_summary_text.done", {**ids, "text": self._reasoning})
            data += self._event(
                "response.reasoning_summary_part.done",
                {**ids, "part": {"type": "summary_text", "text": self._reasoning}},
            )
            item = {
                "id": out.ids["reasoning"],
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": self._reasoning}],
                "encrypted_content": out.signature,
            }
            self._done_items.append(item)
            data += self._event("response.output_item.done", {"output_index": self._index, "item": item})
        elif self._open == "text":
            ids = {"item_id": out.ids["message"], "output_index": self._index, "content_index": 0}
            data += self._event("response.output_text.done", {**ids, "text": self._text, "logprobs": []})
            data += self._event("response.content_part.done", {**ids, "part": _text_part(self._text)})
            item = _message_item(out, "completed", self._text)
            self._done_items.append(item)
            data += self._event("response.output_item.done", {"output_index": self._index, "item": item})
        self._open = None
        return data

    def reasoning(self, delta: str) -> bytes:
        """A ``reasoning_summary_text.delta`` (adding the reasoning item first)."""
        if not self._req.want_reasoning or not delta or self._open == "text":
            return b""
        data = b""
        ids = {"item_id": self._out.ids["reasoning"], "summary_index": 0}
        if self._open != "reasoning":
            data += self._close()
            self._index += 1
            self._open = "reasoning"
            data += self._event(
                "response.output_item.added",
                {"output_index": self._index, "item": _reasoning_item(self._out, False)},
            )
            data += self._event(
                "response.reasoning_summary_part.added",
                {**ids, "output_index": self._index, "part": {"type": "summary_text", "text": ""}},
            )
        self._reasoning += delta
        return data + self._event(
            "response.reasoning_summary_text.delta", {**ids, "output_index": self._index, "delta": delta}
        )

    def text(self, delta: str) -> bytes:
        """A ``response.output_text.delta`` (adding the message item first)."""
        if not delta:
            return b""
        data = b""
        ids = {"item_id": self._out.ids["message"], "content_index": 0}
        if self._open != "text":
            data += self._close()
            self._index += 1
            self._open = "text"
            data += self._event(
                "response.output_item.added",
                {"output_index": self._index, "item": _message_item(self._out, "in_progress", None)},
            )
            data += self._event(
                "response.content_part.added", {**ids, "output_index": self._index, "part": _text_part("")}
            )
        self._text += delta
        return data + self._event(
            "response.output_text.delta", {**ids, "output_index": self._index, "delta": delta, "logprobs": []}
        )

    def finish(self, usage: Usage) -> bytes:
        """Tool-call items (each final when its ``.done`` leaves) and ``response.completed``."""
        data = self._close()
        for tc in self._out.tool_calls:
            self._index += 1
            custom = tc.kind is ToolKind.CUSTOM
            data += self._event(
                "response.output_item.added",
                {"output_index": self._index, "item": _call_item(tc, "in_progress", empty=True)},
            )
            prefix = "response.custom_tool_call_input" if custom else "response.function_call_arguments"
            ids = {"item_id": tc.item_id, "output_index": self._index}
            for piece in pieces(tc.arguments_json):
                data += self._event(prefix + ".delta", {**ids, "delta": piece})
            data += self._event(prefix + ".done", {**ids, ("input" if custom else "arguments"): tc.arguments_json})
            item = _call_item(tc, "completed")
            self._done_items.append(item)
            data += self._event("response.output_item.done", {"output_index": self._index, "item": item})
        status = _status(self._out)
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return data + self._event(name, {"response": self._response(status, usage)})

    def error(self, message: str) -> bytes:
        """``response.failed``: Codex reconnects (no tool-call item was emitted yet)."""
        response = self._response("failed")
        response["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", {"response": response})
