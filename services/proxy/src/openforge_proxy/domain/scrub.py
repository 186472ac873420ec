"""Removal of secrets and machine identifiers before anything is recorded.

Secrets (``x-api-key``, ``authorization``, cookies) are dropped from headers
and never logged. The identifiers the reference lists (§5.15) are replaced by
``<scrubbed>``: Claude Code's ``metadata.user_id`` ``device_id`` and
``account_uuid`` (a JSON string inside the body), Codex's ``installation_id``
(in the ``x-codex-turn-metadata`` header and in ``client_metadata``, also as
JSON inside a string), and OpenClaw's ``host=<name>`` in the runtime line of
its user message. Scrubbing works on the raw JSON bytes with regular
expressions that also match the escaped form inside JSON strings, so its cost
is one pass over the body, not a walk of every value.

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

_ID_KEYS = rb"device_id|installation_id|x-codex-installation-id|account_uuid|machine_id|deviceId|installationId"
# "key": "value" or \"key\":\"value\" (inside a JSON string); the value has no quote or backslash
_ID_RE = re.compile(rb'(\\?"(?:' + _ID_KEYS + rb')\\?"\s*:\s*\\?")([^"\\]+)')
_HOST_RE = re.compile(rb"(\bhost=)([^\s|\"\\]+)")


def scrub_json_bytes(raw: bytes) -> bytes:
    """The body with identifier values replaced (the JSON stays valid)."""
    out = _ID_RE.sub(lambda m: m.group(1) + REPLACEMENT, raw)
    return _HOST_RE.sub(lambda m: m.group(1) + REPLACEMENT, out)


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
