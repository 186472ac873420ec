"""OpenAI Chat Completions: ``POST /v1/chat/completions`` in, completions and SSE chunks out.

Requests (observed: OpenClaw 2026.9.6 ``openai-completions``, mini-swe-agent
2.4.6 via litellm): ``messages`` with roles system/developer/user/assistant/
tool, user content as a string or parts (text, images), assistant
``tool_calls`` with ``arguments`` re-serialized by the harness (OpenClaw drops
the spaces) and ids rewritten (OpenClaw strips ``_``), ``reasoning_content``
replayed, ``max_completion_tokens`` (or ``max_tokens``), ``stream_options``;
unknown fields (``provider_specific_fields``...) accepted and recorded.

With ``logprobs: true`` each choice carries ``logprobs.content``: one entry per
sampled token (reasoning and tool-call tokens included, the end-of-turn token
not), with the logprob the engine reported; in a stream, each chunk carries the
tokens sampled since the previous chunk.

Stream: a role chunk (``{"role": "assistant", "content": ""}``), content
deltas, ``reasoning_content`` deltas, ``tool_calls`` deltas (``index``, ``id``,
``type``, ``function.name`` with empty arguments, then argument fragments), a
chunk with ``finish_reason``, a usage-only chunk (``choices: []``) when
``stream_options.include_usage``, then ``data: [DONE]``. A mid-stream error is
``data: {"error": {...}}`` (OpenClaw retries it).
"""

from __future__ import annotations

import time
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
from openforge_proxy.domain.output import ApiError, AssistantOutput, Finish, Usage, new_id
from openforge_proxy.domain.protocols import pieces, sse, token_cap
from openforge_proxy.domain.protocols.memo import ConversationMemo, begin, shared_tools
from openforge_proxy.domain.protocols.responses import custom_tool_schema, openai_error_body

_KNOWN_KEYS = {"role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name"}
_FINISH = {Finish.STOP: "stop", Finish.LENGTH: "length", Finish.ABORT: "stop", Finish.ERROR: "stop"}
FINGERPRINT = "fp_openforge"


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _tools(raw_tools: Any) -> list[Tool]:
    out: list[Tool] = []
    if raw_tools is None:
        return out
    if not isinstance(raw_tools, list):
        raise InvalidArgument.field("tools", "must be a list")
    for i, raw in enumerate(raw_tools):
        if not isinstance(raw, dict):
            raise InvalidArgument.field(f"tools[{i}]", "must be an object")
        fn: dict[str, Any] | None = raw["function"] if isinstance(raw.get("function"), dict) else None
        if raw.get("type", "function") == "function" and fn is not None and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out.append(
                Tool(
                    name=fn["name"],
                    description=str(fn.get("description") or ""),
                    parameters=params if isinstance(params, dict) else {},
                    raw=raw,
                )
            )
        elif raw.get("type") == "custom" and isinstance(raw.get("custom"), dict):
            custom = raw["custom"]
            out.append(
                Tool(
                    name=str(custom.get("name", "")),
                    description=str(custom.get("description") or ""),
                    parameters=custom_tool_schema(custom),
                    kind=ToolKind.CUSTOM,
                    raw=raw,
                )
            )
        else:
            out.append(Tool(name=str((fn or raw).get("name") or raw.get("type") or ""), kind=ToolKind.HOSTED, raw=raw))
    return out


def _assistant(raw: dict[str, Any], i: int, content: str, extra: dict[str, Any], names: dict[str, str]) -> Message:
    """An assistant message (``messages[i]``), its reasoning and tool calls; each call's name
    goes into ``names`` (call id -> tool name) for the tool messages that answer it.

    Raises:
        InvalidArgument: Its ``tool_calls`` is not a list.
    """
    msg = Message(role="assistant", content=content, extra=extra)
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if isinstance(reasoning, str):
        msg.reasoning = reasoning
    raw_calls = raw.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    elif not isinstance(raw_calls, list):
        raise InvalidArgument.field(f"messages[{i}].tool_calls", "must be a list")
    for tc in raw_calls:
        if not isinstance(tc, dict):
            continue
        fn_raw = tc.get("function")
        fn_obj: dict[str, Any] = fn_raw if isinstance(fn_raw, dict) else {}
        call_id = str(tc.get("id", ""))
        if tc.get("type") == "custom" and isinstance(tc.get("custom"), dict):
            call = ToolCall(
                id=call_id,
                name=str(tc["custom"].get("name", "")),
                arguments=tc["custom"].get("input", ""),
                kind=ToolKind.CUSTOM,
            )
        else:
            call = ToolCall(id=call_id, name=str(fn_obj.get("name", "")), arguments=_arguments(fn_obj.get("arguments")))
        msg.tool_calls.append(call)
        msg.refs.append(call_id)
        names[call_id] = call.name
    return msg


def _message(raw: Any, i: int, names: dict[str, str]) -> Message:
    """``messages[i]`` in canonical form (``names``: call id -> tool name, for tool messages).

    Raises:
        InvalidArgument: It is not an object, or its role is none of Chat Completions'.
    """
    if not isinstance(raw, dict):
        raise InvalidArgument.field(f"messages[{i}]", "must be an object")
    role = raw.get("role")
    content = raw.get("content")
    extra = {k: v for k, v in raw.items() if k not in _KNOWN_KEYS}
    if role in ("system", "developer"):
        return Message(role="system", content=text_of(content), extra=extra)
    if role == "user":
        return Message(role="user", content=text_of(content), parts=non_text_parts(content), extra=extra)
    if role == "assistant":
        return _assistant(raw, i, text_of(content), extra, names)
    if role in ("tool", "function"):
        call_id = str(raw.get("tool_call_id", ""))
        name = names.get(call_id, raw.get("name") if isinstance(raw.get("name"), str) else None)
        return Message(role="tool", content=text_of(content), tool_call_id=call_id, name=name, extra=extra)
    raise InvalidArgument.field(f"messages[{i}].role", "must be system, developer, user, assistant or tool")


def parse(body: dict[str, Any], memo: ConversationMemo | None = None) -> CanonicalRequest:
    """Maps a Chat Completions request body into the canonical conversation.

    Args:
        body: The parsed JSON body.
        memo: The session's previous Chat Completions request (:class:`.memo.ConversationMemo`,
            no head); updated to this one.

    Returns:
        The canonical request.

    Raises:
        InvalidArgument: ``model`` is not a string, ``messages`` or ``tools`` or an
            assistant message's ``tool_calls`` is not a list, or the token cap
            (``max_completion_tokens``, else ``max_tokens``) is a boolean.
    """
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidArgument.field("model", "must be a string")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise InvalidArgument.field("messages", "must be a list")
    max_tokens = token_cap(body, "max_completion_tokens", "max_tokens")
    resume = begin(memo, None, raw_messages)
    messages, ends, names = resume.messages, resume.ends, resume.names
    for i in range(resume.start, len(raw_messages)):
        messages.append(_message(raw_messages[i], i, names))
        ends.append(len(messages))
    raw_tools = body.get("tools")
    if memo is not None:
        tools = memo.tools("chat", raw_tools, _tools)
    else:
        tools = shared_tools("chat", raw_tools, _tools)
    if memo is not None:
        memo.commit(resume, messages, ends, 0)
    options = body.get("stream_options")
    return CanonicalRequest(
        wire=WireApi.OPENAI_CHAT,
        model=model,
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        want_reasoning=True,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        logprobs=body.get("logprobs") is True,
        body=body,
    )


def error_body(err: ApiError, request_id: str) -> dict[str, Any]:
    """The error body for ``err`` (the request id travels in ``x-request-id``)."""
    return openai_error_body(err)


def prepare_ids(out: AssistantOutput) -> None:
    """Assigns the completion id and the tool-call ids."""
    out.ids.setdefault("completion", new_id("chatcmpl"))
    for tc in out.tool_calls:
        if not tc.id:
            tc.id = new_id("call")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _finish_reason(out: AssistantOutput) -> str:
    if out.tool_calls and out.finish is Finish.STOP:
        return "tool_calls"
    return _FINISH[out.finish]


def logprobs_json(entries: list[tuple[bytes, float | None]] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}``.

    One entry per sampled token: ``bytes`` are the token's own bytes (a multi-byte character
    split over tokens has part of its bytes in each, as OpenAI reports them), ``token`` is their
    text with bytes that are no complete character written as ``\\xNN``. The engine reports the
    sampled token's logprob only, so ``top_logprobs`` is always ``[]`` (also when the request
    asked for ``top_logprobs``). None when logprobs were not asked for.
    """
    if entries is None:
        return None
    return {
        "content": [
            {"token": raw.decode("utf-8", "backslashreplace"), "logprob": lp, "bytes": list(raw), "top_logprobs": []}
            for raw, lp in entries
        ],
        "refusal": None,
    }


def _call(tc: Any) -> dict[str, Any]:
    if tc.kind is ToolKind.CUSTOM:
        return {"id": tc.id, "type": "custom", "custom": {"name": tc.name, "input": tc.arguments_json}}
    return {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments_json}}


def response_body(out: AssistantOutput, usage: Usage, model: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    prepare_ids(out)
    message: dict[str, Any] = {"role": "assistant", "content": out.text or None}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [_call(tc) for tc in out.tool_calls]
    return {
        "id": out.ids["completion"],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs_json(out.token_logprobs),
                "finish_reason": _finish_reason(out),
            }
        ],
        "usage": _usage(usage),
        "system_fingerprint": FINGERPRINT,
    }


class StreamEncoder:
    """Builds the Chat Completions SSE chunks of one completion.

    Args:
        out: The output being filled (its ids are assigned here).
        model: Model name echoed back.
        include_usage: Send the usage-only chunk before ``[DONE]``.
    """

    def __init__(self, out: AssistantOutput, model: str, include_usage: bool) -> None:
        prepare_ids(out)
        self._out = out
        self._model = model
        self._include_usage = include_usage
        self._created = int(time.time())
        self._sent_logprobs = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        logprobs = None
        entries = self._out.token_logprobs
        if entries is not None:  # the tokens sampled since the previous chunk
            logprobs = logprobs_json(entries[self._sent_logprobs :])
            self._sent_logprobs = len(entries)
        return sse(
            None,
            {
                "id": self._out.ids["completion"],
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._model,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            },
        )

    def start(self, usage: Usage) -> bytes:
        """The role chunk."""
        return self._chunk({"role": "assistant", "content": ""})

    def reasoning(self, delta: str) -> bytes:
        """A ``reasoning_content`` delta."""
        return self._chunk({"reasoning_content": delta}) if delta else b""

    def text(self, delta: str) -> bytes:
        """A ``content`` delta."""
        return self._chunk({"content": delta}) if delta else b""

    def finish(self, usage: Usage) -> bytes:
        """Tool-call deltas, the ``finish_reason`` chunk, the usage chunk and ``[DONE]``."""
        data = b""
        for index, tc in enumerate(self._out.tool_calls):
            head = _call(tc)
            if tc.kind is ToolKind.CUSTOM:
                head["custom"]["input"] = ""
            else:
                head["function"]["arguments"] = ""
            data += self._chunk({"tool_calls": [{"index": index, **head}]})
            for piece in pieces(tc.arguments_json):
                field = (
                    {"custom": {"input": piece}} if tc.kind is ToolKind.CUSTOM else {"function": {"arguments": piece}}
                )
                data += self._chunk({"tool_calls": [{"index": index, **field}]})
        data += self._chunk({}, _finish_reason(self._out))
        if self._include_usage:
            data += sse(
                None,
                {
                    "id": self._out.ids["completion"],
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": _usage(usage),
                },
            )
        return data + b"data: [DONE]\n\n"

    def error(self, message: str) -> bytes:
        """``data: {"error": ...}``: OpenClaw retries the call."""
        return sse(None, {"error": {"message": message, "type": "server_error", "param": None, "code": None}})
