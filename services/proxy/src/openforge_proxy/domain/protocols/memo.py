"""Reusing the canonical form of what a session's harness sends again on every call.

A harness resends the whole conversation on every call and appends to it, with the same
tools each time. Two reuses keep a call's cost with its new part:

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

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

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


@dataclass
class Resume:
    """Where a parse starts: what :meth:`ConversationMemo.resume` found reusable.

    Attributes:
        start: Entries reused (convert from this one on).
        messages: Their canonical messages (the head's first, when :attr:`head_reused`);
            a new list, to be extended.
        ends: Canonical messages up to and including each reused entry; a new list.
        names: Tool-call id → tool name of the reused assistant messages (tool results
            name their tool from it).
        head_reused: The head (what precedes the entries) is the previous request's, and so
            are its messages at the start of :attr:`messages`; False: convert the head too.
    """

    start: int
    messages: list[Message]
    ends: list[int]
    names: dict[str, str]
    head_reused: bool
    _head: bytes = b""
    _entries: list[bytes] = field(default_factory=list)
    _joined: bytes = b""


@dataclass
class ConversationMemo:
    """A session's previous request of one protocol (see the module docstring).

    Attributes:
        head: The serialized value preceding the entries that their conversion depends on
            (Anthropic: ``system``; Chat Completions: none, ``null``); empty before the first request.
        raw: The entries, each serialized.
        joined: The entry list serialized (``[`` + :attr:`raw` joined by commas + ``]``).
        base: Canonical messages converted from the head.
        ends: Canonical messages up to and including each entry of :attr:`raw`.
        messages: The canonical messages.
    """

    head: bytes = b""
    raw: list[bytes] = field(default_factory=list)
    joined: bytes = b""
    base: int = 0
    ends: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def resume(self, head: Any, raws: list[Any]) -> Resume:
        """What of a new request (``head``, entries ``raws``) the previous one's parse covers.

        A conversation that only grew is recognized on the whole list's bytes (the previous
        list's bytes without their ``]``, then a comma or the end), so only the new entries
        are serialized one by one; otherwise every entry is, and compared in order.
        """
        head_json = orjson.dumps(head)
        joined = orjson.dumps(raws)
        old, prev = self.raw, self.joined
        if prev and joined.startswith(prev[:-1]) and (len(joined) == len(prev) or joined[len(prev) - 1] == 0x2C):
            entries = old + [orjson.dumps(r) for r in raws[len(old) :]]
            k = len(old)
        else:
            entries = [orjson.dumps(r) for r in raws]
            n = min(len(entries), len(old))
            k = 0
            while k < n and entries[k] == old[k]:
                k += 1
        if not self.messages or head_json != self.head:
            return Resume(0, [], [], {}, False, head_json, entries, joined)
        messages = self.messages[: self.ends[k - 1] if k else self.base]
        names: dict[str, str] = {}
        for m in messages:
            if m.tool_calls:
                names.update({tc.id: tc.name for tc in m.tool_calls})
        return Resume(k, messages, self.ends[:k], names, True, head_json, entries, joined)

    def commit(self, resume: Resume, messages: list[Message], ends: list[int], base: int) -> None:
        """Remembers a request parsed from ``resume`` (call only once it was accepted).

        Args:
            resume: What :meth:`resume` returned for it.
            messages: Its canonical messages.
            ends: Canonical messages up to and including each entry.
            base: Canonical messages converted from the head.
        """
        self.head, self.raw, self.joined = resume._head, resume._entries, resume._joined
        self.base, self.ends, self.messages = base, ends, list(messages)


def begin(memo: ConversationMemo | None, head: Any, raws: list[Any]) -> Resume:
    """Where a parse starts: :meth:`ConversationMemo.resume`, or nothing reused without a memo.

    A parse converts ``raws`` from :attr:`Resume.start` on into :attr:`Resume.messages`
    (converting the head first unless :attr:`Resume.head_reused`), then calls
    :meth:`ConversationMemo.commit` when it has a memo.
    """
    return memo.resume(head, raws) if memo is not None else Resume(0, [], [], {}, False)
