"""The generated turns of one session as a tree, and which of them an assistant message is.

Each turn the proxy generated remembers its *parent*: the generated turn before it in the
model's view (None for the first, or after a turn the proxy did not generate). A harness
sends a turn back as an assistant message; :meth:`TurnTree.match` finds the turn it is, by the
identifiers the harness echoed, else by what it says (its fingerprint) among the children of
the previous message's turn, else among all turns saying the same.

The one tie-break, among several candidate turns that say the same: prefer one that answered
the same (:func:`~.turns.context_key` of the conversation's first message and the message
before it) and reached the harness, then one that answered the same, then one that reached
the harness; the latest first at each step (the n-th "OK." of a conversation is the n-th turn
that said it).
"""

from __future__ import annotations

from openforge_proxy.domain.conversation import Message
from openforge_proxy.domain.splice_memo import BY_AFTER, BY_FP, BY_NONE, BY_REF
from openforge_proxy.domain.turns import GeneratedTurn, answering, context_key, message_fingerprint, norm_ref


class TurnTree:
    """A session's generated turns: by id, by echoed identifier, by fingerprint, by parent and
    fingerprint, and in commit order.

    Attributes:
        turns: Turn id -> turn.
        commits: Each turn in commit order, with its normalized references.
    """

    def __init__(self) -> None:
        self.turns: dict[str, GeneratedTurn] = {}
        self.commits: list[tuple[GeneratedTurn, list[str]]] = []
        self._refs: dict[str, str] = {}
        self._fps: dict[str, list[str]] = {}
        self._after: dict[tuple[str | None, str], list[str]] = {}  # (parent, fingerprint) -> turns

    def add(self, gen: GeneratedTurn, refs: list[str]) -> None:
        """Adds a committed turn and the identifiers the harness will echo (as given)."""
        normalized = [norm_ref(ref) for ref in refs]
        self.turns[gen.turn_id] = gen
        for ref in normalized:
            self._refs[ref] = gen.turn_id
        self.commits.append((gen, normalized))
        self._fps.setdefault(gen.fingerprint, []).append(gen.turn_id)
        self._after.setdefault((gen.parent, gen.fingerprint), []).append(gen.turn_id)

    def of_ref(self, ref: str) -> str | None:
        """The turn an echoed identifier belongs to."""
        return self._refs.get(norm_ref(ref)) if ref else None

    def match(
        self,
        msg: Message,
        used: set[str],
        previous: str | None = None,
        before: Message | None = None,
        first: Message | None = None,
    ) -> tuple[str | None, int]:
        """The generated turn an assistant message is, or None, and which rule decided.

        Args:
            msg: An assistant message of the request.
            used: Turns matched to earlier messages of the request (never matched twice).
            previous: The turn the request's previous assistant message matched (None when
                it matched none or this is the first one).
            before: The message before ``msg`` in the request, if any.
            first: The request's first message, if any.

        Returns:
            The turn whose echoed identifier the message carries (:data:`BY_REF`); else,
            among the unused turns saying the same and following ``previous``, the one the
            tie-break picks (:data:`BY_AFTER`); else, among all unused turns saying the same,
            the one the tie-break picks (:data:`BY_FP`); else None (:data:`BY_NONE`).
        """
        fp = message_fingerprint(msg)
        for ref in msg.refs:
            turn = self.of_ref(ref)
            if turn is not None and self.turns[turn].fingerprint == fp:
                return turn, BY_REF
        after = [self.turns[t] for t in reversed(self._after.get((previous, fp), ())) if t not in used]
        if len(after) == 1 and previous is not None:
            return after[0].turn_id, BY_AFTER  # no choice
        same = [self.turns[t] for t in reversed(self._fps.get(fp, ())) if t not in used]
        if not after and len(same) <= 1:
            return (same[0].turn_id, BY_FP) if same else (None, BY_NONE)
        context = context_key(first, before)
        # With no predecessor (the first turn, or one after an edited turn), a turn that
        # answered the same counts more than following no turn.
        gen = answering(after, context)
        if gen is not None:
            return gen.turn_id, BY_AFTER
        weigh_all = previous is None or not after
        if weigh_all and (gen := answering(same, context)) is not None:
            return gen.turn_id, BY_FP
        # nothing answered the same; a decision that weighed every turn saying the same is one a
        # new such turn can change (:data:`BY_FP`)
        rule = BY_FP if weigh_all else BY_AFTER
        for gens in (after, same):
            if gens:
                return next((g for g in gens if g.delivered), gens[0]).turn_id, rule
        return None, BY_NONE
