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

from openforge_core.record_delta import BytesCut

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


# Whether an occurrence (a key after its quote, or ``host=``) starts at an offset is decided by
# at most this many bytes from there: the longest key and its quote. (The byte before ``host=``
# and the value decide whether it is replaced: they are read again on each body.)
_WINDOW = 1 + max(len(k) for k in _ID_KEYS)


def _key_starts(raw: bytes, start: int, stop: int) -> list[int]:
    """Offsets in ``[start, stop)`` of an identifier key after its quote.

    No key contains a quote, so occurrences never overlap: a scan from any offset finds
    exactly the occurrences that start there or later.
    """
    end = min(len(raw), stop + _WINDOW)
    return [m.start() for m in _QUOTED_KEY.finditer(raw, start, end) if m.start() < stop]


def _host_starts(raw: bytes, start: int, stop: int) -> list[int]:
    """Offsets in ``[start, stop)`` of ``host=`` (which cannot overlap itself)."""
    out: list[int] = []
    i = raw.find(b"host=", start, min(len(raw), stop + 5))
    while i >= 0:
        out.append(i)
        i = raw.find(b"host=", i + 5, min(len(raw), stop + 5))
    return out


def _spans_at(raw: bytes, keys: list[int], hosts: list[int]) -> list[tuple[int, int]]:
    """Byte spans of the identifier values after the given key and ``host=`` occurrences.

    Each occurrence is checked again, and ``keys`` and ``hosts`` are left holding only those
    that are occurrences of ``raw``.
    """
    spans: list[tuple[int, int]] = []
    kept = 0
    for at in keys:
        key = _QUOTED_KEY.match(raw, at)
        if key is None:
            continue
        keys[kept] = at
        kept += 1
        m = _VALUE_AFTER_KEY.match(raw, key.end())
        if m is not None:
            spans.append(m.span(1))
    del keys[kept:]
    kept = 0
    for i in hosts:
        if not raw.startswith(b"host=", i):
            continue
        hosts[kept] = i
        kept += 1
        if i == 0 or raw[i - 1] not in _WORD:
            m = _HOST_VALUE.match(raw, i + 5)
            if m is not None:
                spans.append(m.span())
    del hosts[kept:]
    return spans


def _value_spans(raw: bytes) -> list[tuple[int, int]]:
    """Byte spans of identifier values to replace.

    Keys are found with one regular-expression scan anchored on the quote before them and
    ``host=`` with ``bytes.find``, and the value is matched from there, so the cost is two
    passes at close to memory speed, not a regular expression tried at every offset of a
    150 KB body.
    """
    return _spans_at(raw, _key_starts(raw, 0, len(raw)), _host_starts(raw, 0, len(raw)))


def _replace(raw: bytes, spans: list[tuple[int, int]]) -> bytes:
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


def scrub_json_bytes(raw: bytes) -> bytes:
    """The body with identifier values replaced (the JSON stays valid)."""
    return _replace(raw, _value_spans(raw))


class BodyScrubber:
    """:func:`scrub_json_bytes` for the successive bodies of one session, scanning only what
    changed since the previous body.

    A harness sends its whole conversation again with each call, so most of a body is bytes of
    the previous one: its common prefix and suffix with it and long runs between them
    (:meth:`BytesCut.between`, the cut the call records use). Whether an occurrence (a key
    after its quote, or ``host=``) starts at an offset is decided by the ``_WINDOW`` bytes from
    there, so the previous body's occurrences whose window lies inside such a shared stretch are
    occurrences of the new body at the shifted offset, and only the rest of the body (the
    changed bytes and a window's margin before each) is scanned. What decides the replacement
    (the byte before ``host=``, the value after the occurrence, which may run past a stretch's
    end) is read again on the new body. The result equals :func:`scrub_json_bytes` of the body.

    Args:
        min_bytes: Bodies shorter than this are scanned whole.
    """

    def __init__(self, min_bytes: int = 8192) -> None:
        self._min = min_bytes
        self._raw: bytes | None = None
        self._keys: list[int] = []
        self._hosts: list[int] = []

    def scrub(self, raw: bytes) -> bytes:
        """``raw`` with identifier values replaced (bytes in, bytes out)."""
        prev = self._raw
        if prev is None or len(raw) < self._min or len(prev) < self._min:
            keys, hosts = _key_starts(raw, 0, len(raw)), _host_starts(raw, 0, len(raw))
        else:
            keys, hosts = self._occurrences(prev, raw)
        spans = _spans_at(raw, keys, hosts)
        self._raw, self._keys, self._hosts = raw, keys, hosts
        return _replace(raw, spans)

    def _occurrences(self, prev: bytes, raw: bytes) -> tuple[list[int], list[int]]:
        cut = BytesCut.between(prev, raw)
        # shared stretches: (offset in raw, offset in prev, length), in order in both
        shared = [(0, 0, cut.prefix)]
        carried = 0
        n = cut.prefix
        for at, offset, length in cut.copies:
            n += at - carried
            carried = at
            shared.append((n, offset, length))
            n += length
        shared.append((len(raw) - cut.suffix, len(prev) - cut.suffix, cut.suffix))
        keys: list[int] = []
        hosts: list[int] = []
        scanned = 0  # raw offsets below this are decided
        for n0, p0, length in shared:
            # occurrences starting in [lo, hi) have their whole window inside the stretch
            lo, hi = n0, n0 + length - _WINDOW + 1
            if hi <= lo:
                continue
            keys += _key_starts(raw, scanned, lo)
            hosts += _host_starts(raw, scanned, lo)
            shift = n0 - p0
            keys += [p + shift for p in self._keys if lo <= p + shift < hi]
            hosts += [p + shift for p in self._hosts if lo <= p + shift < hi]
            scanned = hi
        keys += _key_starts(raw, scanned, len(raw))
        hosts += _host_starts(raw, scanned, len(raw))
        return keys, hosts


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
