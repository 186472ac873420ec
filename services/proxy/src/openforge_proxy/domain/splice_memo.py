"""The splicer's memos, a layer over its whole build (``Splicer(memos=False)`` turns them off):
the previous render and where building may resume (:class:`RenderMemo`), the previous build's
matching (:class:`Matching`) and template forms (:class:`Forms`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openforge_proxy.domain.conversation import Message
from openforge_proxy.domain.splice_plan import Span
from openforge_proxy.domain.tokens import PackedIds
from openforge_proxy.domain.turns import GeneratedTurn, message_fingerprint, norm_ref


@dataclass(frozen=True)
class Mark:
    """A point of a rendered prompt right after a reused span (or its start), where building may resume.

    Attributes:
        pos: Offset in the rendered text.
        ids: Prompt ids before it.
        packed: Bytes of their packed encoding.
        reused: Reused spans before it.
        rendered: Rendered spans before it.
    """

    pos: int
    ids: int
    packed: int
    reused: int
    rendered: int


@dataclass
class RenderMemo:
    """The previous render of a session: the turns it spliced and where building may resume.

    Everything before a mark is a function of the text before it and the turns spliced
    there: text segments are encoded in chunks cut before message-start tokens, and a
    mark sits right after a splice, where a segment (so a chunk) begins. A new render
    whose text equals this one up to a mark, splicing the same turns there, therefore has
    exactly the same ids, packed bytes and spans up to that mark; only the rest is
    encoded. Equality is checked on the text itself (the previous text is kept: comparing
    it is a memory compare, where hashing the new text segment by segment cost a tenth of
    a call), so it holds whatever the template does to earlier messages: when it renders
    them differently, the texts differ and building resumes earlier, or starts over. The
    template's incremental render may know already that a prefix of the text is unchanged
    (:attr:`~openforge_proxy.domain.template_loop.LoopCache.same_prefix`); up to there the
    text is not compared again.

    Attributes:
        renders: The session's template renders (``LoopCache.renders``) after this one's.
    """

    turns: list[str]
    marks: list[Mark]
    prompt: PackedIds
    reused: list[Span]
    rendered: list[Span]
    text: str
    renders: int

    def _holds(self, i: int, text: str, turns: list[str], known: int) -> bool:
        m = self.marks[i]
        return (
            m.pos <= len(text)
            and m.reused <= len(turns)
            and turns[: m.reused] == self.turns[: m.reused]
            and (m.pos <= known or text.startswith(self.text[: m.pos]))
        )

    def resume(self, text: str, turns: list[str], known: int = 0) -> int | None:
        """The index of the last mark up to which ``text`` (splicing ``turns``) equals this render.

        None when only the start does. Holding at a mark implies holding at every earlier
        one, so the last is tried first (a conversation that only grew), then found by
        bisection. ``known``: how many leading characters of ``text`` are known to equal
        this render's.
        """
        last = len(self.marks) - 1
        if last < 1:
            return None
        if self._holds(last, text, turns, known):
            return last
        lo, hi = 0, last - 1  # marks[lo] holds (the start always does); find the last that holds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._holds(mid, text, turns, known):
                lo = mid
            else:
                hi = mid - 1
        return lo or None


#: Which rule of :meth:`~openforge_proxy.domain.splice.Splicer.match` decided: a reference, the turn following the
#: predecessor's, any turn saying the same, none.
BY_REF, BY_AFTER, BY_FP, BY_NONE = range(4)


NEVER = 1 << 62


@dataclass
class Matching:
    """A build's matching, and the first message each kind of new turn could change.

    Attributes:
        messages: The request's messages.
        matched: Parallel: their generated turns.
        vias: Parallel: the rule that decided (:data:`BY_REF`...).
        previous: Parallel: the turn the previous assistant message matched, before each.
        commits: Turns committed before this build (``Splicer._commits``).
        by_ref: Normalized reference -> the first assistant message carrying it.
        by_key: (previous turn, fingerprint) -> the first assistant message the reference
            rule did not decide with them.
        by_fp: Fingerprint -> the first assistant message neither of the first two rules decided
            (:data:`BY_FP`: :meth:`~openforge_proxy.domain.splice.Splicer.match` weighed every turn saying the same).
    """

    messages: list[Message]
    matched: list[str | None]
    vias: list[int]
    previous: list[str | None]
    commits: int
    by_ref: dict[str, int] = field(default_factory=dict)
    by_key: dict[tuple[str | None, str], int] = field(default_factory=dict)
    by_fp: dict[str, int] = field(default_factory=dict)

    def index(self, start: int) -> None:
        """Adds the messages from ``start`` on to the maps (an earlier message keeps its place)."""
        for i in range(start, len(self.messages)):
            msg = self.messages[i]
            if msg.role != "assistant":
                continue
            for ref in msg.refs:
                if ref:  # an empty reference is never looked up
                    self.by_ref.setdefault(norm_ref(ref), i)
            via = self.vias[i]
            if via != BY_REF:
                fp = message_fingerprint(msg)
                self.by_key.setdefault((self.previous[i], fp), i)
                if via != BY_AFTER:
                    self.by_fp.setdefault(fp, i)

    def first_changed(self, gen: GeneratedTurn, refs: list[str]) -> int:
        """The first message whose match the new turn ``gen`` (its normalized references
        ``refs``) could change (:data:`NEVER` when none)."""
        first = min((self.by_ref.get(r, NEVER) for r in refs), default=NEVER)
        first = min(first, self.by_key.get((gen.parent, gen.fingerprint), NEVER))
        return min(first, self.by_fp.get(gen.fingerprint, NEVER))


@dataclass(frozen=True)
class Forms:
    """A render's conversation and its template forms.

    Attributes:
        view: The messages rendered.
        turns: Parallel: their generated turn ids.
        dicts: Parallel: their template forms.
        order: The generated turns rendered, in order.
    """

    view: list[Message]
    turns: list[str | None]
    dicts: list[dict[str, Any]]
    order: list[GeneratedTurn]
