"""Reusing the canonical form of what a session's harness sends again on every call.

A harness resends the whole conversation on every call and appends to it, with the same
tools each time. Three reuses keep a call's cost with its new part:

* :class:`BodyMemo` (per session): a request body that differs from the previous one only
  inside one top-level value (``messages``, or ``input``) is parsed as that value alone; the
  other values are the previous parse's objects (the system prompt and the tools are most
  of a Claude Code body).
* :class:`ConversationMemo` (per session and protocol): when what precedes the message
  entries (Anthropic's ``system``) and the first ``k`` entries are the same JSON as the
  previous request's, their canonical messages are the previous parse's — the same
  objects, with the template form, splice fingerprint and record JSON each built once —
  and only the entries after them are converted. Whatever differs (an edited or compacted
  history, another system prompt) is converted again from that point on.
* :func:`shared_tools` (process-wide): canonical tool lists kept by the JSON they came
  from, so every call of every session offering the same tools gets the same list object
  (the splicer then hashes it once).

"The same JSON" is compared on serialized bytes, not with ``==``: Python's equality
ignores key order and takes ``1``, ``1.0`` and ``true`` for one another, and either can
change what is rendered or recorded (re-serialized tool arguments keep the order the
harness sent). Canonical messages and tools are never changed once a protocol's
``parse`` returned them, which is what makes sharing them safe.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from openforge_core.protowire import common_prefix, common_run, common_suffix
from openforge_proxy.domain.conversation import Message, Tool

#: Distinct tool lists kept by :func:`shared_tools`.
TOOL_LISTS_KEPT = 64
_TOOL_LISTS: OrderedDict[tuple[str, bytes], list[Tool]] = OrderedDict()


def shared_tools(protocol: str, raw: Any, convert: Callable[[Any], list[Tool]]) -> list[Tool]:
    """The canonical tools of a ``tools`` value, converted once per distinct JSON.

    Args:
        protocol: Which protocol's ``tools`` (their shapes differ).
        raw: The request's ``tools`` value.
        convert: The protocol's conversion (called for a value not seen recently, and for
            any value that is not a list, which it refuses or converts as it does).

    Returns:
        The tools; the same list object for the same JSON (never change it).
    """
    if not isinstance(raw, list):
        return convert(raw)
    key = (protocol, orjson.dumps(raw))
    kept = _TOOL_LISTS.get(key)
    if kept is not None:
        _TOOL_LISTS.move_to_end(key)
        return kept
    tools = convert(raw)
    _TOOL_LISTS[key] = tools
    if len(_TOOL_LISTS) > TOOL_LISTS_KEPT:
        _TOOL_LISTS.popitem(last=False)
    return tools


_NOTHING: Any = object()  # no value yet (None is one)

#: Bytes of the next value looked for after a changed one, to find where the changed one ends.
_PROBE = 64

#: Most top-level keys of a kept body (a request has a few dozen at most).
_MAX_KEYS = 256
#: Top-level values that may differ from a kept body's for it to be reused.
_MAX_CHANGED = 8
#: Longest list whose elements' ends are kept (each is serialized once to find them).
_MAX_ELEMENTS = 10_000
#: Bodies in a row parsed whole before a :class:`BodyMemo` tries only one in ``_RETRY_EVERY``.
_MISSES_BEFORE_BACKOFF = 4
_RETRY_EVERY = 8

#: Bodies a :class:`BodyMemo` keeps (a session's threads: the main conversation, sub-agents).
BODIES_KEPT = 2


@dataclass
class _Body:
    data: bytes
    values: dict[str, Any]
    spans: list[tuple[str, int, int]]  # key, start and end of its value in data
    ends: dict[str, list[int]]  # of a list value: where each element ends (from the value's start)


class BodyMemo:
    """A session's latest request bodies, each with where its top-level values lie.

    :meth:`loads` reads a body with the same keys, in the same order, as a kept one value by
    value: a value whose bytes are the kept value's, followed by the same bytes, is the kept
    parse's object (the same object: never change what a parse returns); any other value is
    parsed alone, from where the previous one ended to where the next key and the start of
    its kept value (else the key alone) are found (``memcmp`` and ``bytes.find``: the common
    prefix and suffix of the two bodies bound where values can differ). A list value that
    keeps the kept list's leading elements (a conversation that grew: ``messages``,
    ``input``) parses only the elements after them. JSON's grammar makes this exact: the keys
    and separators are checked byte for byte, every value either equals the kept one's
    bytes or parses as exactly one JSON value (``orjson`` refuses trailing bytes, and no
    complete JSON value is a proper prefix of another except a number, which no separator
    continues), so the body is a valid document with these values. Anything else (another
    key, another order, bytes that do not parse) is parsed whole.

    A body's value spans are known when each value serialized by ``orjson`` is the body's
    own bytes at that place: compact JSON as Claude Code, Codex and OpenClaw send it
    (JavaScript ``JSON.stringify``, Rust ``serde_json``). A body written otherwise (spaces
    after separators, escaped non-ASCII) is not kept, and its session parses every body
    whole, as without this memo.
    """

    def __init__(self) -> None:
        self._bodies: list[_Body] = []
        self.reused = 0
        self._misses = 0  # bodies in a row parsed whole

    def loads(self, body: bytes) -> Any:
        """The parsed body (as ``orjson.loads``).

        A session whose bodies keep missing (more threads than :data:`BODIES_KEPT`, or
        changes this memo does not follow) stops trying but for one body in
        :data:`_RETRY_EVERY`, so that it costs little more than parsing whole.

        Raises:
            orjson.JSONDecodeError: Not valid JSON (nothing is kept of it).
        """
        if self._misses >= _MISSES_BEFORE_BACKOFF and self._misses % _RETRY_EVERY:
            self._misses += 1
            return orjson.loads(body)
        for i, kept in enumerate(self._bodies):
            values = self._replace(kept, body)
            if values is not None:
                self.reused += 1
                self._misses = 0
                self._bodies.insert(0, self._bodies.pop(i))
                return values
        parsed = orjson.loads(body)
        self._misses += 1
        if type(parsed) is dict and len(parsed) <= _MAX_KEYS:
            spans = _spans(body, parsed)
            if spans is not None:
                ends = {k: e for k, a, _ in spans if (e := _element_ends(parsed[k], body, a)) is not None}
                self._bodies.insert(0, _Body(body, parsed, spans, ends))
                del self._bodies[BODIES_KEPT:]
        return parsed

    @staticmethod
    def _replace(kept: _Body, body: bytes) -> dict[str, Any] | None:
        old = kept.data
        p = common_prefix(old, body)
        if p == len(old) == len(body):
            return kept.values  # the same body (a retry)
        s = common_suffix(old, body, min(len(old), len(body)) - p)
        hi, d = len(old) - s, len(body) - len(old)  # old[hi:] is the common suffix
        view = memoryview(old)
        values: dict[str, Any] = {}
        spans: list[tuple[str, int, int]] = []
        ends: dict[str, list[int]] = {}
        pos = prev = 0  # where the new body and the kept one are read
        changed = 0
        for i, (key, a, b) in enumerate(kept.spans):
            if not body.startswith(view[prev:a], pos):  # the key and separators, as kept
                return None
            pos += a - prev
            prev = b
            nxt = kept.spans[i + 1] if i + 1 < len(kept.spans) else None
            after = view[b : nxt[1]] if nxt is not None else view[b:]
            if (b <= p and pos == a) or (a >= hi and pos == a + d) or body.startswith(view[a:b], pos):
                if body.startswith(after, pos + b - a):  # the same bytes, then what follows them
                    values[key] = kept.values[key]
                    spans.append((key, pos, pos + b - a))
                    if key in kept.ends:
                        ends[key] = kept.ends[key]
                    pos += b - a
                    continue
            changed += 1
            if changed > _MAX_CHANGED:  # each costs a search to the end of the body at worst
                return None
            if nxt is None:  # the last value ends where the kept closing bytes begin
                end = len(body) - len(after) if body.endswith(after) else -1
            else:  # ... else where the next key and the start of its kept value are (or the key)
                end = body.find(view[b : nxt[1] + min(_PROBE, nxt[2] - nxt[1])], pos)
                if end < 0:
                    end = body.find(view[b : nxt[1]], pos)
            if end <= pos:
                return None
            old_ends = kept.ends.get(key)
            grown = _grown_list(kept.values[key], old_ends, old, a, b, body, pos, end) if old_ends else None
            if grown is not None:
                values[key], new_ends = grown
            else:
                try:
                    values[key] = orjson.loads(memoryview(body)[pos:end])
                except orjson.JSONDecodeError:
                    return None
                new_ends = _element_ends(values[key], body, pos)
            if new_ends is not None:
                ends[key] = new_ends
            spans.append((key, pos, end))
            pos = end
        if body[pos:] != view[prev:]:
            return None
        kept.data, kept.values, kept.spans, kept.ends = body, values, spans, ends
        return values


def _grown_list(
    items: list[Any], ends: list[int], old: bytes, a: int, b: int, body: bytes, start: int, end: int
) -> tuple[list[Any], list[int] | None] | None:
    """A list value ``body[start:end]`` whose leading elements are those of the kept list
    ``old[a:b]`` (element ``j`` ending at ``a + ends[j]``): those elements (the same objects)
    and the rest parsed alone, with where each element ends; None when no element is shared or
    the bytes after the shared ones do not continue a list.

    The shared elements are the ones whose bytes and the byte before them lie in the two
    values' common prefix; the bytes after them must be ``]`` or ``,`` and more elements,
    which parse as those elements when ``[`` replaces the comma (a comma then only ``]`` is
    refused: it parses so, to no element, but is not JSON).
    """
    shared = common_run(old, a, body, start, min(b - a, end - start))
    k = bisect_right(ends, shared)
    if k == 0:
        return None
    at = start + ends[k - 1]  # after the last shared element
    if end - at == 1 and body[at] == 0x5D:  # "]"
        return items[:k], ends[:k]
    if body[at : at + 1] != b",":
        return None
    try:
        tail = orjson.loads(b"[" + memoryview(body)[at + 1 : end])
    except orjson.JSONDecodeError:
        return None
    if not tail:  # a comma, maybe whitespace, then "]": not JSON
        return None
    out = items[:k] + tail
    new = _ends_of(tail, body, at, start)
    if new is None or start + new[-1] + 1 != end:
        return out, None
    return out, ends[:k] + new


def _element_ends(value: Any, body: bytes, start: int) -> list[int] | None:
    """Where each element of a list value written at ``body[start:]`` ends (from ``start``),
    when each is written as ``orjson`` writes it; else (or not a list) None."""
    if type(value) is not list or len(value) > _MAX_ELEMENTS or body[start : start + 1] != b"[":
        return None
    if not value:
        return [] if body[start + 1 : start + 2] == b"]" else None
    ends = _ends_of(value, body, start, start)
    return ends if ends is not None and body[start + ends[-1] : start + ends[-1] + 1] == b"]" else None


def _ends_of(items: list[Any], body: bytes, at: int, start: int) -> list[int] | None:
    """Where each of ``items`` ends (from ``start``) when they are written one after another
    after ``body[at]`` (``[`` or a comma), each after a one-byte separator, as ``orjson``
    writes them; else None."""
    ends: list[int] = []
    try:
        for item in items:
            one = orjson.dumps(item)
            if not body.startswith(one, at + 1):
                return None
            at += 1 + len(one)
            ends.append(at - start)
    except orjson.JSONEncodeError:  # integers past 64 bits: parsed, not serializable
        return None
    return ends


def _spans(body: bytes, parsed: dict[str, Any]) -> list[tuple[str, int, int]] | None:
    """Where each top-level value of ``parsed`` lies in ``body``, or None unless the body is
    exactly the compact serialization of ``parsed``, key by key, as ``orjson`` writes it."""
    if not body.startswith(b"{"):
        return None
    spans: list[tuple[str, int, int]] = []
    pos = 1
    last = len(parsed) - 1
    try:
        for i, (key, value) in enumerate(parsed.items()):
            k = orjson.dumps(key)
            if not body.startswith(k, pos) or body[pos + len(k) : pos + len(k) + 1] != b":":
                return None
            pos += len(k) + 1
            v = orjson.dumps(value)
            if not body.startswith(v, pos):
                return None
            spans.append((key, pos, pos + len(v)))
            pos += len(v)
            if body[pos : pos + 1] != (b"}" if i == last else b","):
                return None
            pos += 1
    except orjson.JSONEncodeError:  # integers past 64 bits: parsed, not serializable
        return None
    if not parsed and body[pos : pos + 1] == b"}":
        pos += 1
    if body[pos:].strip() or len(spans) != len(parsed):
        return None
    return spans


@dataclass
class Resume:
    """Where a parse starts: what :meth:`ConversationMemo.resume` found reusable.

    Attributes:
        start: Entries reused (convert from this one on).
        messages: Their canonical messages (the head's first, when :attr:`head_reused`);
            a new list, to be extended.
        ends: Canonical messages up to and including each reused entry; a new list.
        names: Tool-call id → tool name of the reused assistant messages (tool results
            name their tool from it); the parse adds those of the messages it converts, and
            :meth:`ConversationMemo.commit` keeps the whole map for the next request.
        head_reused: The head (what precedes the entries) is the previous request's, and so
            are its messages at the start of :attr:`messages`; False: convert the head too.
    """

    start: int
    messages: list[Message]
    ends: list[int]
    names: dict[str, str]
    head_reused: bool
    _head: bytes = b""
    _head_value: Any = None
    _entries: list[bytes] = field(default_factory=list)
    _objs: list[Any] = field(default_factory=list)


@dataclass
class ConversationMemo:
    """A session's previous request of one protocol (see the module docstring).

    Attributes:
        head: The serialized value preceding the entries that their conversion depends on
            (Anthropic: ``system``; Chat Completions: none, ``null``); empty before the first request.
        raw: The entries, each serialized.
        base: Canonical messages converted from the head.
        ends: Canonical messages up to and including each entry of :attr:`raw`.
        messages: The canonical messages.
    """

    head: bytes = b""
    raw: list[bytes] = field(default_factory=list)
    base: int = 0
    ends: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    _head_value: Any = _NOTHING
    _tools_value: Any = _NOTHING
    _tools: list[Tool] = field(default_factory=list)
    _objs: list[Any] = field(default_factory=list)  # the previous request's entry objects
    _names: dict[str, str] = field(default_factory=dict)  # tool-call id -> name, all its messages

    def tools(self, protocol: str, raw: Any, convert: Callable[[Any], list[Tool]]) -> list[Tool]:
        """:func:`shared_tools` of ``raw``; the previous request's list when ``raw`` is the same
        object (a :class:`BodyMemo` parse keeps it), without serializing it again."""
        if raw is self._tools_value:
            return self._tools
        tools = shared_tools(protocol, raw, convert)
        self._tools_value, self._tools = raw, tools
        return tools

    def resume(self, head: Any, raws: list[Any]) -> Resume:
        """What of a new request (``head``, entries ``raws``) the previous one's parse covers.

        A conversation that only grew is recognized by its leading entries being the previous
        request's objects (a :class:`BodyMemo` parse keeps them), else on the whole list's
        bytes (the previous list's bytes without their ``]``, then a comma or the end), so only
        the new entries are serialized one by one; otherwise every entry is, and compared in
        order.
        """
        # the same object as the previous head (a BodyMemo parse): the same JSON
        head_json = self.head if head is self._head_value else orjson.dumps(head)
        old, objs = self.raw, self._objs
        if old and len(raws) >= len(objs) and all(map(operator.is_, raws, objs)):
            entries = old + [orjson.dumps(r) for r in raws[len(old) :]]
            k = len(old)
        elif (
            old
            and (joined := orjson.dumps(raws)).startswith(prev := b"[" + b",".join(old))
            and (len(joined) == len(prev) + 1 or joined[len(prev)] == 0x2C)
        ):
            entries = old + [orjson.dumps(r) for r in raws[len(old) :]]
            k = len(old)
        else:
            entries = [orjson.dumps(r) for r in raws]
            n = min(len(entries), len(old))
            k = 0
            while k < n and entries[k] == old[k]:
                k += 1
        if not self.messages or head_json != self.head:
            return Resume(0, [], [], {}, False, head_json, head, entries, list(raws))
        messages = self.messages[: self.ends[k - 1] if k else self.base]
        if k and k == len(old):  # every message of the previous request: its names, as its parse left them
            names = dict(self._names)
        else:
            names = {}
            for m in messages:
                if m.tool_calls:
                    names.update({tc.id: tc.name for tc in m.tool_calls})
        return Resume(k, messages, self.ends[:k], names, True, head_json, head, entries, list(raws))

    def commit(self, resume: Resume, messages: list[Message], ends: list[int], base: int) -> None:
        """Remembers a request parsed from ``resume`` (call only once it was accepted).

        Args:
            resume: What :meth:`resume` returned for it.
            messages: Its canonical messages.
            ends: Canonical messages up to and including each entry.
            base: Canonical messages converted from the head.
        """
        self.head, self.raw, self._objs = resume._head, resume._entries, resume._objs
        self._head_value = resume._head_value
        self.base, self.ends, self.messages = base, ends, list(messages)
        self._names = resume.names  # the parse added the names of the messages it converted


def begin(memo: ConversationMemo | None, head: Any, raws: list[Any]) -> Resume:
    """Where a parse starts: :meth:`ConversationMemo.resume`, or nothing reused without a memo.

    A parse converts ``raws`` from :attr:`Resume.start` on into :attr:`Resume.messages`
    (converting the head first unless :attr:`Resume.head_reused`), then calls
    :meth:`ConversationMemo.commit` when it has a memo.
    """
    return memo.resume(head, raws) if memo is not None else Resume(0, [], [], {}, False)
