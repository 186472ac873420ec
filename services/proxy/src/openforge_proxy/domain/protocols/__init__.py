"""Wire protocols: each maps its requests into the canonical conversation and
the model's output back into its own response and SSE shapes.

* :mod:`.anthropic` — Anthropic Messages (``POST /v1/messages``).
* :mod:`.responses` — OpenAI Responses (``POST /v1/responses``).
* :mod:`.chat` — OpenAI Chat Completions (``POST /v1/chat/completions``).

Each module exposes ``parse(body) -> CanonicalRequest``, ``error_body(err,
request_id) -> dict``, a ``StreamEncoder`` (SSE bytes for the preamble, each
reasoning/text delta, the end, and a mid-stream error) and
``response_body(...) -> dict`` for non-streaming answers; :mod:`.codec` gives
the call pipeline each API as one :class:`~.codec.WireCodec`. Event names, field
order and usage placement follow what Claude Code 2.1.332, Codex 0.171.0 and
OpenClaw 2026.9.6 accepted (``reference/harness-protocols.md`` §2-§6 and the
harness captures).
"""

from __future__ import annotations

from typing import Any

import orjson

from openforge_core.errors import InvalidArgument

#: Largest tool-argument piece per SSE delta, characters (clients reassemble any split).
ARGUMENT_PIECE = 64


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (UTF-8, no spaces)."""
    return orjson.dumps(obj)


def token_cap(body: dict[str, Any], *fields: str) -> int | None:
    """The output-token cap a request asks for: the value of the first of ``fields`` present.

    Returns:
        That value when it is a positive integer, else ``None`` (absent, ``null``, a
        non-positive number, a float or a string leave the proxy's default cap).

    Raises:
        InvalidArgument: The value is a JSON boolean (``true`` is not a token count).
    """
    for field in fields:
        if field in body:
            value = body[field]
            if isinstance(value, bool):
                raise InvalidArgument.field(field, "must be an integer, not a boolean")
            return value if isinstance(value, int) and value > 0 else None
    return None


def sse(event: str | None, data: Any) -> bytes:
    """One server-sent event: ``event: NAME`` (if given) and one ``data:`` line of JSON.

    JSON never contains a raw newline, so one ``data:`` line always suffices
    and no malformed SSE line can be produced (reference §5.7).
    """
    payload = dumps(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def pieces(text: str, size: int = ARGUMENT_PIECE) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters (at least one piece)."""
    if not text:
        return [""]
    return [text[i : i + size] for i in range(0, len(text), size)]
