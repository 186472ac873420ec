"""JSON text as JavaScript clients write it.

``JSON.stringify`` writes a string holding half of a UTF-16 surrogate pair (a string cut in the
middle of an emoji, as a harness truncating a long tool output does) as a lone ``\\uD83D``
escape (ECMAScript 2019, "well-formed JSON.stringify"). RFC 8259 §8.2 allows such text, but a
lone surrogate is no Unicode scalar value: it cannot be UTF-8 encoded, tokenized or recorded,
and orjson refuses it. :func:`replace_lone_surrogates` writes U+FFFD (the replacement
character) for each, as a UTF-8 decoder does for a broken sequence.

:func:`parse_object` is how every request body is parsed: the one reference for what a body
means and which error a bad one gets, whether it is parsed on the event loop, in a worker
thread or in the large-body parser process (:mod:`openforge_proxy.adapters.body_parser`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from openforge_proxy.domain.output import ApiError, ErrorKind

# A ``\u`` escape is one only after an even number of backslashes (``\\u`` is a backslash and a
# "u"): the match starts at the first backslash of the run. A high surrogate followed by a low
# one is a pair (kept); a high one alone, or a low one alone, is lone.
_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)\\u([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|(?<!\\)((?:\\\\)*)\\u([dD][c-fC-F][0-9a-fA-F]{2})"
)


def _replace(m: re.Match[bytes]) -> bytes:
    if m.group(2) is not None:
        if m.group(3) is not None:
            return m.group(0)  # a pair
        return m.group(1) + b"\\ufffd"
    return m.group(4) + b"\\ufffd"


def replace_lone_surrogates(body: bytes) -> bytes | None:
    """``body`` with every lone surrogate escape replaced by ``\\ufffd``, or None if it holds none.

    Only escapes are looked at (raw UTF-8 cannot hold a surrogate); pairs are kept as they are.
    """
    if b"\\u" not in body and b"\\U" not in body:
        return None
    fixed = _SURROGATE.sub(_replace, body)
    return None if fixed == body else fixed


def parse_object(body: bytes, loads: Callable[[bytes], Any] = orjson.loads) -> tuple[dict[str, Any], bytes]:
    """A request body parsed as a JSON object.

    Args:
        body: The decoded request body.
        loads: Parses JSON as ``orjson.loads`` does (a session's
            :meth:`~openforge_proxy.domain.protocols.memo.BodyMemo.loads`, or ``orjson.loads``).

    Returns:
        The object and the body as it is recorded: ``body`` itself, or, when it holds lone
        surrogate escapes (which JavaScript clients write), a copy with U+FFFD for each.

    Raises:
        ApiError: Not JSON (``invalid_request``, 400), or JSON but not an object.
    """
    try:
        parsed = loads(body)
    except orjson.JSONDecodeError as exc:
        fixed = replace_lone_surrogates(body)
        if fixed is None:
            raise ApiError(ErrorKind.INVALID_REQUEST, f"the body is not valid JSON: {exc}") from exc
        try:
            parsed, body = orjson.loads(fixed), fixed
        except orjson.JSONDecodeError:
            raise ApiError(ErrorKind.INVALID_REQUEST, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ApiError(ErrorKind.INVALID_REQUEST, "the body must be a JSON object")
    return parsed, body
