"""Removal of secrets and machine identifiers before anything is recorded.

Secrets (``x-api-key``, ``authorization``, cookies) are dropped from headers
and never logged. The identifiers the reference lists (§5.15) are replaced by
``<scrubbed>``: Claude Code's ``metadata.user_id`` ``device_id`` and
``account_uuid`` (a JSON string inside the body), Codex's ``installation_id``
(in the ``x-codex-turn-metadata`` header and in ``client_metadata``, also as
JSON inside a string), and OpenClaw's ``host=<name>`` in the runtime line of
its user message. Scrubbing works on the raw JSON bytes with key search
that also matches the escaped form inside JSON strings, so its cost is a few
fast scans of the body, not a walk of every value.

The prompt token ids are *not* scrubbed: they are what the model saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REPLACEMENT = b"<scrubbed>"

#: Header names whose values are secrets (compared in lower case); dropped.
SECRET_HEADERS = frozenset(
    {"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie", "api-key", "openai-api-key"}
)

_ID_KEYS: tuple[bytes, ...] = (
    b"device_id",
    b"installation_id",
    b"x-codex-installation-id",
    b"account_uuid",
    b"machine_id",
    b"deviceId",
    b"installationId",
)
# After a key that follows a quote: the key's closing quote, the colon and the value's opening quote
# (each quote optionally escaped, inside a JSON string); then the value, with no quote or backslash.
_VALUE_AFTER_KEY = re.compile(rb'\\?"\s*:\s*\\?"([^"\\]+)')
_HOST_VALUE = re.compile(rb'[^\s|"\\]+')
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


# A key right after a quote (only those are identifiers). No key contains a quote or is a
# prefix of another, so one left-to-right scan finds exactly the quote-preceded occurrences of
# every key, in one pass over the body instead of one ``bytes.find`` pass per key.
_QUOTED_KEY = re.compile(b'"(?:' + b"|".join(re.escape(k) for k in _ID_KEYS) + b")")


def _value_spans(raw: bytes) -> list[tuple[int, int]]:
    """Byte spans of identifier values to replace.

    Keys are found with one regular-expression scan anchored on the quote before them and
    ``host=`` with ``bytes.find``, and the value is matched from there, so the cost is two
    passes at close to memory speed, not a regular expression tried at every offset of a
    150 KB body.
    """
    spans: list[tuple[int, int]] = []
    for key in _QUOTED_KEY.finditer(raw):
        m = _VALUE_AFTER_KEY.match(raw, key.end())
        if m is not None:
            spans.append(m.span(1))
    i = raw.find(b"host=")
    while i >= 0:
        end = i + 5
        if i == 0 or raw[i - 1] not in _WORD:
            m = _HOST_VALUE.match(raw, end)
            if m is not None:
                spans.append(m.span())
        i = raw.find(b"host=", end)
    return spans


def scrub_json_bytes(raw: bytes) -> bytes:
    """The body with identifier values replaced (the JSON stays valid)."""
    spans = _value_spans(raw)
    if not spans:
        return raw
    spans.sort()
    parts: list[bytes] = []
    pos = 0
    for start, end in spans:
        if start < pos:  # overlapping matches (a key inside another's value): already replaced
            continue
        parts.append(raw[pos:start])
        parts.append(REPLACEMENT)
        pos = end
    parts.append(raw[pos:])
    return b"".join(parts)


def scrub_text(text: str) -> str:
    """:func:`scrub_json_bytes` for text."""
    return scrub_json_bytes(text.encode()).decode()


def scrub_headers(headers: Iterable[tuple[str, str]] | Mapping[str, str]) -> dict[str, str]:
    """Headers without secrets, identifiers in values replaced (names lower-cased)."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in SECRET_HEADERS:
            continue
        out[lower] = scrub_text(value)
    return out
