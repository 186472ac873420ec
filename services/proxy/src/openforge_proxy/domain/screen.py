"""A large body whose prompt cannot fit, found from its parse alone (in the body parser's process).

A 30 MiB request is refused by :func:`~openforge_proxy.domain.splice_plan.check_fits` as soon as it is
converted, but to get there the proxy first builds every string of its parse: a fresh 30 MiB
``str`` is written to pages the process has not touched, about 15-20 ms holding the interpreter
lock (measured on two cores with ``tools/bench/proxy_big_body_bench.py``), during which no other
session is served. :func:`screen` runs the same conversion and the same check in the parser's
process instead, and its :class:`TooLong` (a few numbers and the model's name) is all that comes
back.

It answers only where the reference path would refuse the body for that very reason: the body
converts (:meth:`~openforge_proxy.domain.protocols.codec.WireCodec.parse` without the session's
memos, as a large body is converted), its tools can be written again, and its text
cannot fit. Otherwise (None) the body is parsed and served as any other. The proxy still checks,
in the reference path's order, what needs the session: that inference is up and that the model
is the session's (:meth:`~openforge_proxy.domain.admission.Admission.admit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from openforge_core.errors import InvalidArgument
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.protocols.codec import CODECS, ParseContext
from openforge_proxy.domain.splice_plan import PromptTooLong, check_fits, tool_forms
from openforge_proxy.domain.tokens import text_floor


@dataclass(frozen=True)
class Screen:
    """What :func:`screen` needs of a call (sent to the parser's process with the body).

    Attributes:
        wire: The API called.
        max_prompt: The most tokens a prompt may have (the context length - 1).
        longest_piece: The tokenizer's :attr:`~openforge_proxy.domain.tokens.TokenizerCodec.plain_floor_piece`
            (UTF-8 bytes; more than 0).
    """

    wire: WireApi
    max_prompt: int
    longest_piece: int


@dataclass(frozen=True)
class TooLong:
    """The body converts and its prompt cannot fit: what the proxy refuses it with.

    Attributes:
        model: The request's model.
        at_least: :class:`~openforge_proxy.domain.splice_plan.PromptTooLong`'s lower bound, tokens.
        maximum: Its most tokens.
    """

    model: str
    at_least: int
    maximum: int

    def error(self) -> PromptTooLong:
        """The refusal the reference path raises for this body."""
        return PromptTooLong(self.at_least, self.maximum)


#: Deepest nesting of a body the screen decides on. A deeper one (writing it for the record fails
#: past 254 levels; converting it may pass the interpreter's recursion limit, which differs
#: between this process and the proxy's) is left to the proxy, as the reference path serves it.
MAX_DEPTH = 200


def screen(parsed: dict[str, Any], call: Screen) -> TooLong | None:
    """:class:`TooLong` where the reference path converts ``parsed`` and refuses it as too long
    (:func:`~openforge_proxy.domain.splice_plan.check_fits`), else None (an invalid body, or one
    nested deeper than :data:`MAX_DEPTH`, included)."""
    if _deeper(parsed, MAX_DEPTH):
        return None
    try:
        # as a large body is converted: no memos; a Responses item's turn (what the session knows
        # of earlier responses) only groups assistant items, whose text check_fits does not count
        request = CODECS[call.wire].parse(parsed, ParseContext())
        tool_forms(request.tools)
    except (InvalidArgument, orjson.JSONEncodeError):
        return None
    try:
        check_fits(request.messages, lambda text, above: text_floor(text, call.longest_piece, above), call.max_prompt)
    except PromptTooLong as exc:
        return TooLong(request.model, exc.at_least, exc.maximum)
    return None


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` levels deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
