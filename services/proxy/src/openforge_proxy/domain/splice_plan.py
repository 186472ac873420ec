"""What a splice gives (:class:`PromptPlan`: the prompt ids and :class:`SpliceReport`) and what
refuses a prompt before it is built (:func:`check_fits`, :class:`PromptTooLong`)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from openforge_proxy.domain.conversation import Message, Tool
from openforge_proxy.domain.tokens import PackedIds


class BreakCause(enum.Enum):
    """Why a prompt does not extend the previous call (``openforge.common.v1.BreakCause``)."""

    NONE = "none"
    COMPACTION = "compaction"
    SUB_AGENT = "sub_agent"
    RETRY = "retry"
    TEMPLATE_DRIFT = "template_drift"
    OTHER = "other"


@dataclass(frozen=True)
class Span:
    """Prompt positions ``[start, end)``; ``source_call_id`` set for reused sampled ids.

    A session's prompts share their leading span objects (the splicer resumes from its
    previous render), so what is derived from a span (its serialized form in the call
    record) is kept on it by :meth:`derived` and computed once per span, for as long as
    the span lives.
    """

    start: int
    end: int
    source_call_id: str = ""
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def derived(self, key: str, make: Callable[[Span], Any]) -> Any:
        """``make(self)``, computed once per ``key`` (``make`` must depend on the span alone)."""
        got = self._derived.get(key, _MISSING)
        if got is _MISSING:
            got = self._derived[key] = make(self)
        return got


_MISSING = object()


@dataclass
class SpliceReport:
    """How one prompt was built.

    Attributes:
        reused: Spans holding ids an earlier call sampled.
        rendered: Spans rendered from text.
        break_cause: Whether/why the prompt does not extend the anchor call.
        break_detail: Detail (first diverging position, what changed).
        notes: What the proxy did to keep the prompt extending (moved messages kept).
        extends_call_id: The call whose prompt + completion this prompt extends.
    """

    reused: list[Span] = field(default_factory=list)
    rendered: list[Span] = field(default_factory=list)
    break_cause: BreakCause = BreakCause.NONE
    break_detail: str = ""
    notes: list[str] = field(default_factory=list)
    extends_call_id: str = ""

    def retry(self, call_id: str) -> None:
        """Marks the prompt as a repeat of call ``call_id`` (cause RETRY)."""
        self.break_cause = BreakCause.RETRY
        self.break_detail = f"repeats call {call_id}"


@dataclass
class PromptPlan:
    """A built prompt and what the proxy needs to commit the call's outcome.

    Attributes:
        prompt: The prompt the engine will see (ids and packed encoding).
        prefill_ids: The ids after the last assistant header (part of the generation prompt;
            empty when the prompt does not end with the generation prompt).
        messages: The conversation rendered (the model's view).
        turns: Parallel to ``messages``: generated turn ids.
        tools_key: Identity of the rendered tools.
        report: The splice report.
        cached_tokens: Leading prompt ids equal to the anchor call's prompt + completion.
        kept: Positions in ``messages`` the proxy kept although the harness no longer sends them.
        opened: Whether the prompt ends with the template's generation prompt (not where the
            template opens the next turn with nothing: the model writes right after the last
            message, e.g. DeepSeek-V3.1 after tool results).
    """

    prompt: PackedIds
    prefill_ids: PackedIds
    messages: list[Message]
    turns: list[str | None]
    tools_key: str
    report: SpliceReport
    cached_tokens: int = 0
    kept: frozenset[int] = frozenset()
    opened: bool = True

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt ids as a list (diagnostics and tests; the call path uses :attr:`prompt`)."""
        return self.prompt.tolist()


class PromptTooLong(Exception):
    """The prompt cannot fit: refused before its text is tokenized.

    Attributes:
        at_least: A lower bound of its length, tokens.
        maximum: The most tokens a prompt may have.
    """

    def __init__(self, at_least: int, maximum: int) -> None:
        super().__init__(f"prompt is too long: at least {at_least} tokens > {maximum} maximum")
        self.at_least = at_least
        self.maximum = maximum


def tool_forms(tools: Sequence[Tool]) -> tuple[list[dict[str, Any]], bytes]:
    """The rendered tools' template forms and their JSON.

    Raises:
        orjson.JSONEncodeError: A tool's schema is nested deeper than orjson writes.
    """
    dicts = [t.template_dict() for t in tools if t.rendered]
    return dicts, orjson.dumps(dicts)


def check_fits(messages: Sequence[Message], min_tokens: Callable[[str, int], int], max_prompt: int) -> None:
    """Refuses, before anything is rendered, a conversation whose system, user and tool messages'
    text alone needs more than ``max_prompt`` tokens (chat templates render that text whole;
    assistant text is not counted: a template may drop part of it, such as reasoning left in it).

    Args:
        messages: The canonical conversation.
        min_tokens: ``(text, above)`` to a lower bound of the text's tokens
            (:meth:`~openforge_proxy.domain.tokens.TokenizerCodec.min_tokens`).
        max_prompt: The most tokens a prompt may have (0: no limit).

    Raises:
        PromptTooLong: It cannot fit; ``at_least`` is the sum up to the first message that
            passes ``max_prompt``.
    """
    if not max_prompt:
        return
    at_least = 0
    for m in messages:
        if m.role != "assistant" and m.content:
            at_least += min_tokens(m.content, max_prompt - at_least)
            if at_least > max_prompt:
                raise PromptTooLong(at_least, max_prompt)


def turn_id_of(call_id: str, attempt: int) -> str:
    """The id of the turn an attempt of a call generates: ``<call_id>/<attempt>``."""
    return f"{call_id}/{attempt}"
