"""Token-exact splice: prompts whose assistant turns are the exact ids the engine sampled.

ARCHITECTURE.md, data path step 3. For each call the proxy builds the prompt
ids as follows.

1. **Find its own turns.** Every assistant message of the request is matched
   to a turn this proxy generated in the session: first by an identifier the
   harness echoed back (item ids, tool-call ids compared after dropping
   non-alphanumerics and case, since OpenClaw rewrites ``call_x`` to
   ``callx``; the thinking ``signature`` / ``encrypted_content`` the proxy
   emitted), then by a fingerprint of what the turn says (text stripped, tool
   names and arguments compared as parsed JSON with sorted keys, so
   re-serialized argument JSON still matches; reasoning is left out, since
   harnesses may drop it). Identical turns (a model answering "OK." twice)
   are told apart by order: each generated turn remembers the generated turn
   before it in the model's view (its *parent*), and an assistant message
   matches, among the turns saying the same, the latest one whose parent is
   the turn the request's previous assistant message matched, so the n-th
   "OK." of a conversation is the n-th turn that said it.
2. **Keep the model's view.** The latest matched turn is the *anchor*. The
   proxy remembers, per generated turn, the conversation the model saw when
   it produced it (the *head*). When the request's messages before the anchor
   equal that view, the new conversation is ``view + messages after the
   anchor``. When they equal it except that a few ``user`` messages the model
   saw are gone (OpenClaw re-appends its ephemeral context message at the end
   of each request and removes the old copy; reference §4), the proxy keeps
   them where the model saw them, so the prompt still extends the previous
   call and the rollout stays one training sample; the splice report says so.
   Anything else (compaction, a sub-agent, an edited history) is rendered as
   the harness sent it, and the report names the cause.
3. **Render with placeholders.** The conversation is rendered with the chat
   template, each generated turn replaced by an assistant message whose
   content is a unique placeholder. The text from the end of that turn's
   assistant header to the placeholder (and the end-of-turn token after it,
   when the turn ended with one) is replaced by the exact ids: the tokens the
   generation prompt added after the header, then the sampled ids. Whatever
   the template does to past turns (drop reasoning, re-serialize arguments,
   move markers) no longer matters.
4. **Tokenize incrementally.** Text between splices is encoded in chunks cut
   before each message-start token, cached per session
   (:mod:`openforge_proxy.domain.tokens`), so a call encodes only its new
   messages.
5. **Report.** Spans reused (with the call that sampled them), spans rendered,
   and whether the prompt extends the anchor call's prompt + completion; if
   not, the first diverging position and a cause (RETRY, COMPACTION,
   SUB_AGENT, TEMPLATE_DRIFT, OTHER).

The generated turns and what messages are matched by live in :mod:`.turns`, the plan, the
report and the checks before a build in :mod:`.splice_plan`, and the memos that make a
session's next build cheaper in :mod:`.splice_memo`: a layer, off with ``memos=False``.
"""

from __future__ import annotations

import hashlib
import operator
import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from typing import Any

from openforge_proxy.domain.conversation import Message, Tool, ToolCall, ToolKind
from openforge_proxy.domain.families import Family
from openforge_proxy.domain.output import AssistantOutput
from openforge_proxy.domain.splice_memo import (
    BY_NONE,
    Forms,
    Mark,
    Matching,
    RenderMemo,
)
from openforge_proxy.domain.splice_plan import (
    BreakCause,
    PromptPlan,
    PromptTooLong,
    Span,
    SpliceReport,
    check_fits,
    tool_forms,
    turn_id_of,
)
from openforge_proxy.domain.template import ChatTemplate
from openforge_proxy.domain.template_loop import LoopCache, same_objects
from openforge_proxy.domain.tokens import ChunkCache, IdsBuilder, PackedIds, TokenizerCodec
from openforge_proxy.domain.turn_tree import TurnTree
from openforge_proxy.domain.turns import (
    GeneratedTurn,
    Head,
    context_key,
    fingerprint,
)

#: Stands for the k-th generated turn in a render. Private-use characters around a per-process
#: random nonce: no text a harness sends can hold it (it never leaves the process).
_SENTINEL = "\ue000ofsplice-" + secrets.token_hex(8) + "-{}\ue001"
#: The template form of the k-th generated turn of a render (never changed: templates are
#: sandboxed and cannot change what they are given).
_SENTINEL_MESSAGES: list[dict[str, Any]] = []


def _sentinel_message(k: int) -> dict[str, Any]:
    while len(_SENTINEL_MESSAGES) <= k:
        _SENTINEL_MESSAGES.append({"role": "assistant", "content": _SENTINEL.format(len(_SENTINEL_MESSAGES))})
    return _SENTINEL_MESSAGES[k]


#: Most user messages the model saw that may be missing before the anchor and still be kept.
MAX_MOVED_MESSAGES = 2


def _same(a: Message, b: Message) -> bool:
    if a is b:
        return True
    try:
        return a.template_dict() == b.template_dict()
    except RecursionError:  # nested deeper than Python compares: taken for different (rendered again)
        return False


@dataclass
class _Built:
    """A prompt being built from a render's text: its ids and spans so far, a mark after each
    spliced turn (:class:`~.splice_memo.Mark`), where in the text it stands and how many of the
    render's generated turns it spliced."""

    ids: IdsBuilder = field(default_factory=IdsBuilder)
    reused: list[Span] = field(default_factory=list)
    rendered: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=lambda: [Mark(0, 0, 0, 0, 0)])
    pos: int = 0
    turns: int = 0


class Splicer:
    """Builds prompts for one session and remembers its generated turns.

    Args:
        template: The chat template.
        family: The model family (markers).
        codec: The tokenizer.
        generation_prompt: What ``add_generation_prompt`` appends.
        eot_ids: Token ids that end a turn.
        max_heads: Conversation views kept (one per live thread: main agent,
            sub-agents, recent retries).
        template_kwargs: Extra template variables.
        max_prompt_tokens: Longest prompt, tokens (0 = no limit): a conversation whose
            messages' text alone, or a rendered text whose length alone, shows the prompt
            would be longer is refused before it is rendered or tokenized
            (:class:`PromptTooLong`).
        now: The time the template's ``strftime_now`` gives in every render of the session
            (default: when the splicer is made, at the session's first call): a template that
            writes today's date (Llama 3.1-3.3) would otherwise render the history the model
            saw differently after midnight, and the rollout would break (TEMPLATE_DRIFT).
        memos: Reuse what earlier builds computed (the previous build's matching, render and
            template forms, the template's previous render, the tools' key, encoded chunks).
            False: every build is whole and its text encoded whole (the reference path; the
            same results).
    """

    def __init__(
        self,
        template: ChatTemplate,
        family: Family,
        codec: TokenizerCodec,
        generation_prompt: str,
        eot_ids: Sequence[int],
        *,
        max_heads: int = 4,
        max_cache_chars: int = 8_000_000,
        template_kwargs: dict[str, Any] | None = None,
        max_prompt_tokens: int = 0,
        now: datetime | None = None,
        memos: bool = True,
    ) -> None:
        self._memos = memos
        self._tpl = template
        self._max_prompt = max_prompt_tokens
        self._max_cache_chars = max_cache_chars
        self._fam = family
        self._codec = codec
        self._eot = set(eot_ids)
        self._eot_text = {i: codec.decode([i]) for i in self._eot}
        self._max_heads = max_heads
        self._kwargs = template_kwargs or {}
        self._now = now if now is not None else datetime.now()
        header = family.assistant_header
        if not generation_prompt.startswith(header):
            self._prefill = ""
        else:
            self._prefill = generation_prompt[len(header) :]
        self._prefill_ids = codec.packed(codec.encode(self._prefill) if self._prefill else [])
        self._no_prefill = codec.packed([])
        self._generation_prompt = generation_prompt
        self.cache = ChunkCache(max_cache_chars)
        self.tree = TurnTree()
        self.turns = self.tree.turns
        self.heads: OrderedDict[str, Head] = OrderedDict()
        self._memo: RenderMemo | None = None
        self._loop_cache = LoopCache()  # the template's previous render (template_loop)
        self._tools: tuple[Sequence[Tool], tuple[str, list[dict[str, Any]]]] | None = None
        self._forms: Forms | None = None  # the last render's template forms
        self._matching: Matching | None = None  # the last build's matching

    def drop_caches(self) -> None:
        """Forgets what was kept only to make the next build cheaper (the previous build's
        matching, render and template forms, the tools' key, the encoded chunks); the
        conversation views and generated turns stay. The next build is a whole one, its
        result the same."""
        self.cache = ChunkCache(self._max_cache_chars)
        self._memo = None
        self._loop_cache = LoopCache()
        self._tools = None
        self._forms = None
        self._matching = None

    # --- matching -----------------------------------------------------------

    def turn_of_ref(self, ref: str) -> str | None:
        """The generated turn an echoed identifier belongs to."""
        return self.tree.of_ref(ref)

    def forget_head(self, turn_id: str) -> None:
        """Drops the conversation view a committed turn ended (its prompt and sampled ids),
        for a turn whose answer was refused for good: a later request that holds the turn is
        rendered again instead of extending it."""
        if self.heads.pop(turn_id, None) is not None:
            self._matching = None
            self._memo = None

    def undelivered(self, turn_id: str) -> None:
        """Marks a committed turn whose answer never reached the harness (it left first): among
        turns that say the same, :meth:`.TurnTree.match` takes it last."""
        gen = self.turns.get(turn_id)
        if gen is not None and gen.delivered:
            gen.delivered = False
            self._matching = None  # matches kept from earlier builds may have taken it

    # --- building -----------------------------------------------------------

    def tools_key(self, tools: Sequence[Tool]) -> tuple[str, list[dict[str, Any]]]:
        """Identity of the rendered tools and their template form.

        Calls (of every session) offering the same tools get the same template form objects
        (:meth:`ChatTemplate.shared_tools`; equal JSON of parsed JSON values is equal values),
        so the template's ``tojson`` of them runs once, not once per call. The same list of
        tools as the previous call's (a protocol that reuses its parse, Anthropic Messages) is
        not serialized again.
        """
        last = self._tools
        if last is not None and last[0] is tools:
            return last[1]
        dicts, raw = tool_forms(tools)
        key = hashlib.blake2b(raw, digest_size=16).hexdigest()
        out = key, self._tpl.shared_tools(key, dicts)
        self._tools = (tools, out)
        return out

    def build(
        self,
        messages: list[Message],
        tools: Sequence[Tool],
        *,
        retry_of: str = "",
        tools_of: tuple[str, list[dict[str, Any]]] | None = None,
    ) -> PromptPlan:
        """Builds the prompt for a request.

        Args:
            messages: The request's canonical conversation.
            tools: Its tools.
            retry_of: The call id when this request repeats an earlier call.
            tools_of: :meth:`tools_key` of ``tools`` when the caller computed it already.

        Returns:
            The plan (prompt ids, model view, report).

        Raises:
            jinja2.TemplateError: The template refused the conversation.
            PromptTooLong: The prompt would be longer than ``max_prompt_tokens``.
        """
        if not self._memos:  # a whole build: nothing of an earlier one is reused
            self.drop_caches()
        self._check_fits(messages)
        tools_key, tool_dicts = tools_of if tools_of is not None else self.tools_key(tools)
        matched = self._match_all(messages)
        report = SpliceReport()
        view, turns, head, kept = self._reconcile(messages, matched, tools_key, report)
        prompt, reused, rendered, opened = self._render(view, turns, tool_dicts)
        report.reused, report.rendered = reused, rendered
        cached = 0
        if head is not None and report.break_cause is BreakCause.NONE:
            n = len(head.tokens)
            if prompt.packed.startswith(head.packed):  # varints are a prefix code: same as comparing ids
                cached = n
                report.extends_call_id = head.call_id
            else:
                at = _divergence(head.tokens, prompt.ids)
                report.break_cause = BreakCause.TEMPLATE_DRIFT
                report.break_detail = (
                    f"the prompt differs from call {head.call_id}'s prompt + completion at token {at} "
                    "although the conversation extends it"
                )
        if retry_of:
            report.retry(retry_of)
        prefill = self._prefill_ids if opened else self._no_prefill
        return PromptPlan(prompt, prefill, view, turns, tools_key, report, cached, kept, opened)

    def _match_all(self, messages: list[Message]) -> list[str | None]:
        """The generated turn of each message (:meth:`match` in order: each assistant message
        against the turns not matched before it, following the previous one's).

        The leading messages that are the previous build's same objects keep that build's
        turns unless a turn generated since could change them: :meth:`match` reads the turns
        of a message's references, the turns following its predecessor that say the same, and,
        when those gave nothing or the message has no predecessor, every turn saying the same.
        A new turn changes nothing for a message whose references it does not carry, whose
        (predecessor, fingerprint) it does not have, and, for one decided by weighing every turn
        saying the same (:data:`BY_FP`), whose fingerprint it does not have
        (:class:`Matching` finds the first message each new turn could change). A turn marked
        undelivered since drops every kept match (:meth:`undelivered`).
        """
        memo = self._matching
        k = 0
        if memo is not None:
            k = same_objects(messages, memo.messages)
            for gen, refs in self.tree.commits[memo.commits :]:
                k = min(k, memo.first_changed(gen, refs))
        matched: list[str | None] = []
        vias: list[int] = []
        prevs: list[str | None] = []
        if memo is not None and k:
            matched, vias, prevs = memo.matched[:k], memo.vias[:k], memo.previous[:k]
        used = set(filter(None, matched))
        previous = next((matched[j] for j in range(k - 1, -1, -1) if messages[j].role == "assistant"), None)
        for i in range(k, len(messages)):
            msg = messages[i]
            turn, via = None, BY_NONE
            prevs.append(previous)
            if msg.role == "assistant":
                turn, via = self.tree.match(msg, used, previous, messages[i - 1] if i else None, messages[0])
                previous = turn
            if turn is not None:
                used.add(turn)
            matched.append(turn)
            vias.append(via)
        out = Matching(list(messages), matched, vias, prevs, len(self.tree.commits))  # the caller's list may change
        if memo is not None and k == len(memo.messages):  # it only grew: the earlier entries are kept
            out.by_ref, out.by_key, out.by_fp = memo.by_ref, memo.by_key, memo.by_fp
            out.index(k)
        else:
            out.index(0)
        self._matching = out
        return list(matched)

    def _reconcile(
        self, messages: list[Message], matched: list[str | None], tools_key: str, report: SpliceReport
    ) -> tuple[list[Message], list[str | None], Head | None, frozenset[int]]:
        none: frozenset[int] = frozenset()
        anchor = next((i for i in range(len(matched) - 1, -1, -1) if matched[i] in self.heads), None)
        if anchor is None:
            if self.heads:
                self._no_anchor_cause(messages, matched, report)
            return messages, matched, None, none
        turn = matched[anchor]
        assert turn is not None
        head = self.heads[turn]
        self.heads.move_to_end(turn)
        if head.tools_key != tools_key:
            report.break_cause = BreakCause.OTHER
            report.break_detail = "the tools changed since the previous call"
            return messages, matched, None, none
        seen = head.messages[:-1]
        seen_turns = head.turns[:-1]
        before = messages[:anchor]
        before_turns = matched[:anchor]
        moved = _moved_user_messages(seen, seen_turns, before, before_turns, head.kept)
        if moved is None:
            report.break_cause = (
                BreakCause.COMPACTION if len(before) + MAX_MOVED_MESSAGES < len(seen) else BreakCause.OTHER
            )
            at = _first_diff(seen, seen_turns, before, before_turns)
            report.break_detail = (
                f"message {at} before the last generated turn differs from what the model saw at call {head.call_id}"
            )
            return messages, matched, None, none
        new = [i for i in moved if i not in head.kept]
        if new:
            report.notes.append(
                f"kept {len(new)} user message(s) at positions {new} where the model saw them "
                "(the harness moved or dropped them)"
            )
        view = head.messages + messages[anchor + 1 :]
        return view, head.turns + matched[anchor + 1 :], head, head.kept | frozenset(moved)

    def _no_anchor_cause(self, messages: list[Message], matched: list[str | None], report: SpliceReport) -> None:
        if any(matched):
            report.break_cause = BreakCause.OTHER
            report.break_detail = "the conversation holds generated turns whose view is no longer kept"
            return
        firsts = [h.messages[:2] for h in self.heads.values()]
        if any(len(f) == len(messages[:2]) and all(map(_same, f, messages[:2])) for f in firsts):
            report.break_cause = BreakCause.COMPACTION
            report.break_detail = "the history no longer holds any turn this session generated"
        else:
            report.break_cause = BreakCause.SUB_AGENT
            report.break_detail = "a conversation that starts unlike any earlier one of this session"

    def _check_fits(self, messages: list[Message]) -> None:
        """:func:`check_fits` with this session's tokenizer and most prompt tokens."""
        check_fits(messages, lambda text, above: self._codec.min_tokens(text, above=above), self._max_prompt)

    def _render(
        self, view: list[Message], turns: list[str | None], tool_dicts: list[dict[str, Any]]
    ) -> tuple[PackedIds, list[Span], list[Span], bool]:
        """The conversation rendered with placeholders, then built into ids: text encoded, each
        placeholder's turn spliced in as its sampled ids (resumed from the previous render
        where its text and turns are the same: :class:`~.splice_memo.RenderMemo`), and whether
        it ends with the generation prompt (not when the template opens the next turn with
        nothing: :attr:`~.families.Family.bare_turn_after`)."""
        text, order = self._template_text(view, turns, tool_dicts)
        order_ids = [g.turn_id for g in order]
        built = self._resumed(text, order_ids) or _Built()
        for k in range(built.turns, len(order)):
            self._splice_turn(text, k, order[k], built)
        tail = text[built.pos :]
        # one decision: the prompt ends with the generation prompt (so with its prefill, which is
        # then encoded on its own and becomes part of the committed turn), or it does not
        opened = text.endswith(self._generation_prompt)
        if opened and self._prefill:
            self._emit(tail[: len(tail) - len(self._prefill)], built)
            start = len(built.ids)
            built.ids.add(self._prefill_ids.ids, self._prefill_ids.packed)
            built.rendered.append(Span(start, len(built.ids)))
        else:
            self._emit(tail, built)
        prompt = built.ids.build()
        self._memo = RenderMemo(
            order_ids, built.marks, prompt, built.reused, built.rendered, text, self._loop_cache.renders
        )
        return prompt, list(built.reused), list(built.rendered), opened

    def _template_text(
        self, view: list[Message], turns: list[str | None], tool_dicts: list[dict[str, Any]]
    ) -> tuple[str, list[GeneratedTurn]]:
        """The template's text of ``view``, each generated turn a placeholder, and those turns
        in order. The template forms of the leading messages that are the previous render's
        same objects with the same turns are the previous render's (a message's is built once;
        the k-th generated turn's is one shared dict)."""
        last = self._forms
        k = 0
        if last is not None:
            k = same_objects(view, last.view)
            if turns[:k] != last.turns[:k]:
                k = min(k, _divergence(turns, last.turns))
        dicts: list[dict[str, Any]] = []
        order: list[GeneratedTurn] = []
        if last is not None and k:
            dicts, order = last.dicts[:k], last.order[: k - turns[:k].count(None)]
        for msg, turn in zip(view[k:], turns[k:], strict=True):
            if turn is None:
                dicts.append(msg.template_dict())
            else:
                dicts.append(_sentinel_message(len(order)))
                order.append(self.turns[turn])
        self._forms = Forms(view, turns, dicts, order)
        text = self._tpl.render(
            dicts, tool_dicts, add_generation_prompt=True, cache=self._loop_cache, now=self._now, **self._kwargs
        )
        return text, order

    def _resumed(self, text: str, order_ids: list[str]) -> _Built | None:
        """The build of ``text`` up to the last mark where it equals the previous render (None:
        from its start)."""
        memo = self._memo
        if memo is None:
            return None
        loops = self._loop_cache
        # the template's previous render is the memo's: what it knows unchanged is
        known = loops.same_prefix if loops.renders == memo.renders + 1 else 0
        at = memo.resume(text, order_ids, known)
        if at is None:
            return None
        mark = memo.marks[at]
        built = _Built(
            reused=memo.reused[: mark.reused],
            rendered=memo.rendered[: mark.rendered],
            marks=memo.marks[: at + 1],
            pos=mark.pos,
            turns=mark.reused,
        )
        built.ids.add(memo.prompt.ids[: mark.ids], memo.prompt.packed[: mark.packed])
        return built

    def _splice_turn(self, text: str, k: int, gen: GeneratedTurn, built: _Built) -> None:
        """Encodes the text before the ``k``-th placeholder's turn (to the end of its assistant
        header, or of a :attr:`~.families.Family.bare_turn_after` token right before it), then
        adds its sampled ids in place of the turn's text (through its end-of-turn token, when it
        ended with one)."""
        header = self._fam.assistant_header
        sentinel = _SENTINEL.format(k)
        at = text.find(sentinel, built.pos)
        if at >= 0 and any(text.startswith(m, at - len(m)) for m in self._fam.bare_turn_after):
            start = at  # a turn the template opens with nothing
        else:
            h = text.rfind(header, built.pos, at) if at >= 0 else -1
            if h < 0:
                raise ValueError(f"the chat template does not frame assistant turns with {header!r}")
            start = h + len(header)
        end = at + len(sentinel)
        if gen.ends_turn:
            eot = self._fam.end_of_turn
            if eot and text.startswith(eot, end):
                end += len(eot)
            else:
                # a family whose template writes no end-of-turn token (the model ends its
                # turn with the token that opens the next message): the sampled one stands
                # in for the template's copy when they are the same
                own = self._eot_text.get(gen.ids[-1], "")
                if own and text.startswith(own, end):
                    end += len(own)
        self._emit(text[built.pos : start], built)
        ids = built.ids
        s = len(ids)
        ids.add(gen.ids, gen.packed)
        built.reused.append(Span(s, len(ids), gen.call_id))
        built.pos = end
        built.turns = k + 1
        built.marks.append(Mark(end, len(ids), ids.packed_len, len(built.reused), len(built.rendered)))

    def _emit(self, chunk: str, built: _Built) -> None:
        """Encodes rendered text onto the build (refused first where its length alone shows the
        prompt cannot fit)."""
        if not chunk:
            return
        ids = built.ids
        start = len(ids)
        if self._max_prompt:
            room = self._max_prompt - start
            at_least = self._codec.min_tokens(chunk, above=room)
            if at_least > room:
                raise PromptTooLong(start + at_least, self._max_prompt)
        self._codec.encode_into(chunk, self.cache if self._memos else None, ids)
        if len(ids) > start:
            built.rendered.append(Span(start, len(ids)))

    # --- committing ---------------------------------------------------------

    def commit(
        self,
        plan: PromptPlan,
        *,
        call_id: str,
        attempt: int,
        output: AssistantOutput,
        sampled: Sequence[int],
    ) -> GeneratedTurn:
        """Remembers a finished generation: its turn, references and the model's view.

        Args:
            plan: The plan the prompt came from.
            call_id: The call.
            attempt: Its attempt number.
            output: The parsed output, ids assigned (the references the harness will echo).
            sampled: The sampled ids.

        Returns:
            The new turn.
        """
        turn_id = turn_id_of(call_id, attempt)
        gen = self._new_turn(plan, turn_id, call_id, output, sampled)
        self.tree.add(gen, output.refs())
        tokens = plan.prompt.ids + array("i", sampled)
        self.heads[turn_id] = Head(
            turn_id=turn_id,
            call_id=call_id,
            messages=[*plan.messages, gen.message],
            turns=[*plan.turns, turn_id],
            tools_key=plan.tools_key,
            tokens=tokens,
            packed=plan.prompt.packed + gen.packed[len(plan.prefill_ids.packed) :],  # + the sampled ids
            kept=plan.kept,
        )
        memo = self._memo
        if memo is not None and memo.prompt is plan.prompt:
            # the head's ids start with the prompt: keep one copy (marks never reach past the prompt)
            head = self.heads[turn_id]
            memo.prompt = PackedIds(head.tokens, head.packed)
        while len(self.heads) > self._max_heads:
            self.heads.popitem(last=False)
        return gen

    def _new_turn(
        self, plan: PromptPlan, turn_id: str, call_id: str, output: AssistantOutput, sampled: Sequence[int]
    ) -> GeneratedTurn:
        """The generated turn of a finished generation: its message as the harness will send it
        back, its ids (the prefill it followed, then the sampled ids), its place in the thread."""
        msg = Message(
            role="assistant",
            content=output.text,
            reasoning=output.reasoning or None,
            tool_calls=[
                ToolCall(id=tc.id, name=tc.name, arguments=tc.arguments, kind=tc.kind, namespace=tc.namespace)
                for tc in output.tool_calls
            ],
            refs=output.refs(),
        )
        fp = fingerprint(output.text, [(tc.name, _resent_arguments(tc)) for tc in output.tool_calls])
        sampled_packed = self._codec.pack(sampled)
        return GeneratedTurn(
            turn_id=turn_id,
            call_id=call_id,
            ids=plan.prefill_ids.ids + array("i", sampled),
            packed=plan.prefill_ids.packed + sampled_packed,
            ends_turn=bool(sampled) and sampled[-1] in self._eot,
            fingerprint=fp,
            message=msg,
            parent=next((t for t in reversed(plan.turns) if t is not None), None),
            context=context_key(plan.messages[0], plan.messages[-1]) if plan.messages else context_key(None, None),
        )


def _resent_arguments(tc: Any) -> Any:
    """The arguments as a harness sends them back (custom tools: the raw input)."""
    if tc.kind is ToolKind.CUSTOM:
        return tc.arguments_json
    return tc.arguments


def _moved_user_messages(
    seen: list[Message],
    seen_turns: list[str | None],
    sent: list[Message],
    sent_turns: list[str | None],
    kept: frozenset[int],
) -> list[int] | None:
    """Positions of ``seen`` missing from ``sent`` when ``sent`` is ``seen`` minus a few user messages.

    Positions in ``kept`` (missing already from an earlier request) do not count
    towards :data:`MAX_MOVED_MESSAGES`.

    Returns:
        ``[]`` when equal, the missing positions when only user messages are
        missing and at most :data:`MAX_MOVED_MESSAGES` of them newly, else None.
    """
    if (
        len(sent) == len(seen)
        and sent_turns == seen_turns
        and all(map(operator.or_, map(operator.is_, seen, sent), map(operator.is_not, seen_turns, repeat(None))))
    ):
        # each message is the same object or the same generated turn (the usual next call of a
        # conversation): every step of the comparison would match, at C speed here
        return []
    return _moved_step_by_step(seen, seen_turns, sent, sent_turns, kept)


def _moved_step_by_step(
    seen: list[Message],
    seen_turns: list[str | None],
    sent: list[Message],
    sent_turns: list[str | None],
    kept: frozenset[int],
) -> list[int] | None:
    """:func:`_moved_user_messages`, one message at a time."""
    if len(sent) > len(seen):
        return None
    missing: list[int] = []
    j = 0
    for i, msg in enumerate(seen):
        if j < len(sent) and _equal(msg, seen_turns[i], sent[j], sent_turns[j]):
            j += 1
            continue
        if i not in kept and (msg.role != "user" or seen_turns[i] is not None):
            return None
        missing.append(i)
        if len([m for m in missing if m not in kept]) > MAX_MOVED_MESSAGES:
            return None
    return missing if j == len(sent) else None


def _equal(a: Message, ta: str | None, b: Message, tb: str | None) -> bool:
    if ta is not None or tb is not None:
        return ta == tb
    return _same(a, b)


def _first_diff(
    seen: list[Message], seen_turns: list[str | None], sent: list[Message], sent_turns: list[str | None]
) -> int:
    for i, (a, b) in enumerate(zip(seen, sent, strict=False)):
        if not _equal(a, seen_turns[i], b, sent_turns[i]):
            return i
    return min(len(seen), len(sent))


def _divergence(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    # binary search on equal prefixes (slices compare in C)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo
