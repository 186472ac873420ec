"""The turns this proxy generated in a session, and what an assistant message is matched to one
by: echoed references (:func:`norm_ref`), what it says (:func:`message_fingerprint`) and what it
answered (:func:`context_key`); the conversation the model saw up to a turn (:class:`Head`)."""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from openforge_proxy.domain.conversation import Message

_NON_ALNUM = re.compile(r"[^0-9a-z]")


def norm_ref(ref: str) -> str:
    """A reference compared loosely: lower case, alphanumerics only."""
    return _NON_ALNUM.sub("", ref.lower())


def _integral(value: Any) -> Any:
    """``value`` with every float that is a whole number in orjson's integer range
    (-2**63 to 2**64 - 1) as an int.

    JavaScript has one number type: a client built on it (Claude Code, OpenClaw) sends the
    model's ``30.0``, ``1e3`` or ``1e17`` back as ``30``, ``1000`` or ``100000000000000000``
    (``JSON.stringify`` writes whole numbers below 1e21 as integer digits), which orjson reads
    back as an int within that range and as a float beyond it.
    """
    if isinstance(value, float):
        return int(value) if value.is_integer() and -(2**63) <= value < 2**64 else value
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _json_key(value: dict[str, Any] | list[Any]) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if b"." in text or b"e" in text or b"E" in text:  # floats possible: whole ones as ints
        text = orjson.dumps(_integral(value), option=orjson.OPT_SORT_KEYS)
    return text.decode()


def _args_key(arguments: Any) -> str:
    """Canonical text of tool-call arguments: parsed JSON with sorted keys and whole floats as
    ints (what a client's re-serialization keeps of them), else the stripped text."""
    if isinstance(arguments, dict | list):
        return _json_key(arguments)
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments.strip()
        if isinstance(parsed, dict | list):
            return _json_key(parsed)
        return arguments.strip()
    return orjson.dumps(_integral(arguments)).decode()


def fingerprint(content: str, calls: Sequence[tuple[str, Any]]) -> str:
    """Identity of what an assistant turn says: stripped text, tool names and canonical arguments."""
    h = hashlib.blake2b(digest_size=16)
    h.update(content.strip().encode())
    for name, arguments in calls:
        h.update(b"\x00" + name.encode() + b"\x01" + _args_key(arguments).encode())
    return h.hexdigest()


def message_fingerprint(msg: Message) -> str:
    """:func:`fingerprint` of a canonical assistant message (computed once per message object)."""
    fp = msg.fingerprint
    if fp is None:
        fp = msg.fingerprint = fingerprint(msg.content, [(tc.name, tc.arguments) for tc in msg.tool_calls])
    return fp


@dataclass
class GeneratedTurn:
    """An assistant turn this proxy generated.

    Attributes:
        turn_id: ``<call_id>/<attempt>``.
        call_id: The call that sampled it.
        ids: Generation-prompt ids after the assistant header, then the sampled ids.
        packed: Their packed encoding.
        ends_turn: The sampled ids end with an end-of-turn token.
        fingerprint: :func:`fingerprint` of its parsed output.
        message: Its canonical form (as the harness should send it back).
        parent: The generated turn before it in the conversation the model saw, or None.
    """

    turn_id: str
    call_id: str
    ids: array[int]
    packed: bytes
    ends_turn: bool
    fingerprint: str
    message: Message
    parent: str | None = None
    context: str = ""
    delivered: bool = True


def _text_digest(msg: Message | None) -> bytes:
    if msg is None:
        return b""
    d = msg.text_digest
    if d is None:
        d = msg.text_digest = hashlib.blake2b(
            msg.role.encode() + b"\x00" + msg.content.strip().encode(), digest_size=16
        ).digest()
    return d


def answering(gens: list[GeneratedTurn], context: str) -> GeneratedTurn | None:
    """The first of ``gens`` that answered ``context`` and reached the harness, else the first
    that answered it (None if none did)."""
    answered = [g for g in gens if g.context == context]
    return next((g for g in answered if g.delivered), answered[0] if answered else None)


def context_key(first: Message | None, before: Message | None) -> str:
    """What a turn answered: the role and stripped text of the conversation's first message
    (usually the system prompt) and of the message right before the turn.

    It tells apart turns that say the same after the same generated turn (or after none): a
    main agent's and a sub-agent's first "OK.", which answered different requests.
    """
    return (_text_digest(first) + _text_digest(before)).hex()


@dataclass
class Head:
    """The conversation the model saw up to and including one generated turn.

    Attributes:
        turn_id: The turn ending the view.
        call_id: The call that produced it.
        messages: The view (the last message is the turn).
        turns: Parallel to ``messages``: the generated turn id of each, or None.
        tools_key: Identity of the rendered tools.
        tokens: The call's prompt ids + sampled ids.
        packed: Their packed encoding (prefix checks compare bytes).
        kept: Positions of messages the harness no longer sends that the proxy kept.
    """

    turn_id: str
    call_id: str
    messages: list[Message]
    turns: list[str | None]
    tools_key: str
    tokens: array[int]
    packed: bytes
    kept: frozenset[int] = frozenset()
