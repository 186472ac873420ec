"""Sample assembly: a rollout's calls → training sequences with a loss mask.

Consecutive calls whose prompt extends the previous call's prompt plus
completion are merged into one sequence (ARCHITECTURE.md, data path step 7):

    sample.prompt_token_ids   = calls[0].prompt_token_ids
    sample.response_token_ids = c0.completion + (c1.prompt − c0.prompt − c0.completion) + c1.completion + ...
    loss_mask                 = 1 on every completion token (sampled by the policy),
                                0 on the harness/tool tokens between calls

with the behaviour logprob and policy version of each sampled token carried
alongside (0 where the mask is 0). A call whose prompt does not extend the
running sequence starts a new sample, labelled with the cause: the proxy's own
splice report when it named one (compaction, sub-agent, template drift...),
RETRY when the prompt re-sends an earlier call's prompt, OTHER otherwise (with
the first diverging token position). The layout is what veRL's multi-turn agent
loop produces (``AgentLoopOutput``: prompt_ids, response_ids, response_mask,
response_logprobs).

Roles and lineages (``CallRecord.role``, ``lineage_id``, decided by the proxy): a call extends
the latest sample of its own role and lineage, not merely the previous sample, so a main
agent's calls interleaved with a sub-agent's make one main sample and one sub-agent sample.
A sub-agent's first call starts a sample labelled SUB_AGENT; a compaction call is a sample
of its own (COMPACTION), and a main call that starts a new lineage after one is labelled
COMPACTION too (the history was replaced); a side call (title, probe) is a sample of its own
(OTHER), kept for inspection. Each sample carries the role and lineage of its calls; which
roles are trained is the trainer's choice (``RunConfig.trainer.roles``). Records written
before roles read as main calls of one lineage: assembled as before.

Retried attempts: of the attempts of one call, only the one the harness
continued with enters a sample — the attempt whose prompt + completion the next
call's prompt extends, or else the last attempt that completed. A failed
attempt (``CallRecord.error``: no tokens) never does. Of a rollout the
orchestrator re-ran after an infrastructure failure, only the calls of its last
attempt are assembled (the caller selects them: :func:`last_rollout_attempt`).

Rewards: every sample carries its rollout's verifier reward. A rollout without
one (failed, cancelled, timed out before its verifier ran, or flagged for
bypassing the proxy) still gets its samples, for inspection, with ``reward``
left unset (it reads 0.0: ``Sample.reward`` has no presence); a consumer tells
trainable samples by ``Rollout.reward`` being set, never by ``Sample.reward``
(the trainer leaves such rollouts out and counts them).

The work happens on packed varints (:mod:`.wire`): prefix tests are byte
prefix tests, and samples are written as serialized ``Sample`` messages, so a
100-call rollout of 30k-token prompts assembles without unpacking a token.
"""

from __future__ import annotations

from collections.abc import Sequence

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trajectory_store.domain import wire
from openforge_trajectory_store.domain.wire import CallView

_NO_BREAK = (common_pb2.BREAK_CAUSE_UNSPECIFIED, common_pb2.BREAK_CAUSE_NONE)
_OK_FINISH = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
_PARTIAL = (common_pb2.ROLLOUT_STATUS_TIMED_OUT, common_pb2.ROLLOUT_STATUS_FAILED, common_pb2.ROLLOUT_STATUS_CANCELLED)

_Sample = trajectory_pb2.Sample
_S_ID = _Sample.SAMPLE_ID_FIELD_NUMBER
_S_ROLLOUT = _Sample.ROLLOUT_ID_FIELD_NUMBER
_S_INDEX = _Sample.INDEX_FIELD_NUMBER
_S_PROMPT = _Sample.PROMPT_TOKEN_IDS_FIELD_NUMBER
_S_RESPONSE = _Sample.RESPONSE_TOKEN_IDS_FIELD_NUMBER
_S_MASK = _Sample.LOSS_MASK_FIELD_NUMBER
_S_LOGPROBS = _Sample.ROLLOUT_LOGPROBS_FIELD_NUMBER
_S_VERSIONS = _Sample.POLICY_VERSIONS_FIELD_NUMBER
_S_CAUSE = _Sample.BREAK_CAUSE_FIELD_NUMBER
_S_CALLS = _Sample.CALL_IDS_FIELD_NUMBER
_S_REWARD = _Sample.REWARD_FIELD_NUMBER
_S_PARTIAL = _Sample.PARTIAL_FIELD_NUMBER
_S_DETAIL = _Sample.BREAK_DETAIL_FIELD_NUMBER
_S_ROLE = _Sample.ROLE_FIELD_NUMBER
_S_LINEAGE = _Sample.LINEAGE_ID_FIELD_NUMBER
#: Roles whose calls merge into one sample per lineage; any other call is a sample of its own.
_MERGED = (common_pb2.CALL_ROLE_MAIN, common_pb2.CALL_ROLE_SUB_AGENT)


def last_rollout_attempt(calls: Sequence[CallView], attempts: int) -> list[CallView]:
    """The calls of a rollout's last attempt.

    Args:
        calls: Every recorded call of the rollout.
        attempts: The orchestrator's attempts of the rollout (``RolloutFinished.attempts``);
            0 when not known (every call is kept).

    Returns:
        The calls whose ``rollout_attempt`` is ``attempts``, in the given order.
    """
    if attempts <= 0:
        return list(calls)
    return [c for c in calls if c.rollout_attempt == attempts]


def select_attempts(calls: Sequence[CallView]) -> list[CallView]:
    """One attempt per call, in the order the calls were first received.

    Args:
        calls: Every attempt of every call of one rollout, in receive order.

    Returns:
        The attempt the harness continued with, per call id; a call whose every attempt failed
        (``error`` set) has none.
    """
    order: list[str] = []
    attempts: dict[str, list[CallView]] = {}
    for c in calls:
        if c.error:
            continue
        if c.call_id not in attempts:
            order.append(c.call_id)
            attempts[c.call_id] = []
        attempts[c.call_id].append(c)
    chosen: list[CallView] = []
    for i, call_id in enumerate(order):
        cands = attempts[call_id]
        if len(cands) == 1:
            chosen.append(cands[0])
            continue
        nxt = attempts[order[i + 1]][0] if i + 1 < len(order) else None
        pick = None
        if nxt is not None:
            pick = next((c for c in reversed(cands) if nxt.prompt.startswith(c.prompt + c.completion)), None)
        if pick is None:
            done = [c for c in cands if c.finish_reason in _OK_FINISH and c.completion]
            pick = done[-1] if done else cands[-1]
        chosen.append(pick)
    return chosen


class _Builder:
    def __init__(self, rollout_id: str, index: int, first: CallView, cause: int, detail: str) -> None:
        self.rollout_id = rollout_id
        self.index = index
        self.prompt = first.prompt
        self.cause = cause
        self.detail = detail
        self.role = first.role
        self.lineage_id = first.lineage_id
        self.sequence = bytearray(first.prompt)
        self.prompts: list[bytes] = []
        self.response: list[bytes] = []
        self.mask: list[bytes] = []
        self.logprobs: list[bytes] = []
        self.versions: list[bytes] = []
        self.call_ids: list[str] = []
        self._append_completion(first)

    def _append_completion(self, call: CallView) -> None:
        n = call.completion_len
        logprobs = call.logprobs if call.logprobs else b"\x00" * (4 * n)
        versions = call.versions if call.versions else b"\x00" * n
        if len(logprobs) != 4 * n or wire.count_varints(versions) != n:
            raise ValueError(
                f"call {call.call_id}: {n} sampled tokens but {len(call.logprobs) // 4} logprobs and "
                f"{wire.count_varints(call.versions)} policy versions"
            )
        self.response.append(call.completion)
        self.mask.append(b"\x01" * n)
        self.logprobs.append(logprobs)
        self.versions.append(versions)
        self.call_ids.append(call.call_id)
        self.sequence += call.completion
        self.prompts.append(call.prompt)

    def try_extend(self, call: CallView) -> bool:
        if not call.prompt.startswith(self.sequence):
            return False
        between = call.prompt[len(self.sequence) :]
        m = wire.count_varints(between)
        self.response.append(between)
        self.mask.append(b"\x00" * m)
        self.logprobs.append(b"\x00" * (4 * m))
        self.versions.append(b"\x00" * m)
        self.sequence += between
        self._append_completion(call)
        return True

    def serialize(self, reward: float, partial: bool) -> bytes:
        parts = [
            wire.len_field(_S_ID, f"{self.rollout_id}/{self.index}".encode()),
            wire.len_field(_S_ROLLOUT, self.rollout_id.encode()),
            wire.varint_field(_S_INDEX, self.index),
            wire.len_field(_S_PROMPT, self.prompt),
            wire.len_field(_S_RESPONSE, b"".join(self.response)),
            wire.len_field(_S_MASK, b"".join(self.mask)),
            wire.len_field(_S_LOGPROBS, b"".join(self.logprobs)),
            wire.len_field(_S_VERSIONS, b"".join(self.versions)),
            wire.varint_field(_S_CAUSE, self.cause),
            *(wire.len_field(_S_CALLS, c.encode()) for c in self.call_ids),
            wire.double_field(_S_REWARD, reward),
            wire.varint_field(_S_PARTIAL, int(partial)),
            wire.len_field(_S_DETAIL, self.detail.encode()) if self.detail else b"",
            wire.varint_field(_S_ROLE, self.role),
            wire.len_field(_S_LINEAGE, self.lineage_id.encode()) if self.lineage_id else b"",
        ]
        return b"".join(parts)


def _start_cause(call: CallView, builders: Sequence[_Builder], own: _Builder | None) -> tuple[int, str]:
    """Why ``call`` starts a sample; ``own`` is the latest sample of its role and lineage."""
    if call.role == common_pb2.CALL_ROLE_COMPACTION:
        return common_pb2.BREAK_CAUSE_COMPACTION, "a compaction call: its answer replaces the history"
    if call.role not in _MERGED:
        return common_pb2.BREAK_CAUSE_OTHER, "a side call (title, probe): not the agent acting on the task"
    if own is not None:
        return _cause(call, builders, own)
    if call.role == common_pb2.CALL_ROLE_SUB_AGENT:
        return common_pb2.BREAK_CAUSE_SUB_AGENT, f"sub-agent lineage {call.lineage_id}"
    mains = [b for b in builders if b.role == common_pb2.CALL_ROLE_MAIN]
    if not mains:
        return common_pb2.BREAK_CAUSE_NONE, ""
    if any(b.role == common_pb2.CALL_ROLE_COMPACTION for b in builders):
        return common_pb2.BREAK_CAUSE_COMPACTION, "the history was replaced after a compaction"
    return _cause(call, builders, mains[-1])


def _cause(call: CallView, builders: Sequence[_Builder], ref: _Builder) -> tuple[int, str]:
    if call.break_cause not in _NO_BREAK:
        return call.break_cause, call.break_detail
    for b in builders:
        if call.prompt in b.prompts:
            return common_pb2.BREAK_CAUSE_RETRY, "prompt re-sends an earlier call's prompt"
    seq = bytes(ref.sequence)
    at = wire.count_varints(seq[: wire.token_boundary(seq, wire.common_prefix(seq, call.prompt))])
    return common_pb2.BREAK_CAUSE_OTHER, f"diverges from the previous sequence at token {at}"


def assemble(rollout: common_pb2.Rollout, calls: Sequence[CallView]) -> list[bytes]:
    """Builds a rollout's training samples.

    Args:
        rollout: The rollout (its reward, when set, and status are copied onto the
            samples; without a reward ``Sample.reward`` is left unset).
        calls: Every recorded attempt of its calls, in receive order.

    Returns:
        Serialized ``Sample`` messages in order; empty when the rollout made no
        call. In each, ``response_token_ids``, ``loss_mask``, ``rollout_logprobs``
        and ``policy_versions`` have equal length.

    Raises:
        ValueError: A call's logprobs or policy versions do not match its sampled tokens.
    """
    builders: list[_Builder] = []
    latest: dict[tuple[int, str], _Builder] = {}  # the latest sample per (role, lineage)
    for call in select_attempts(calls):
        key = (call.role, call.lineage_id)
        own = latest.get(key) if call.role in _MERGED else None
        if own is not None and own.try_extend(call):
            continue
        cause, detail = _start_cause(call, builders, own)
        builder = _Builder(rollout.rollout_id, len(builders), call, cause, detail)
        builders.append(builder)
        latest[key] = builder
    reward = rollout.reward if rollout.HasField("reward") else 0.0  # 0.0: the field is not written
    partial = rollout.status in _PARTIAL
    return [b.serialize(reward, partial) for b in builders]


def assemble_records(
    rollout: common_pb2.Rollout, records: Sequence[common_pb2.CallRecord]
) -> list[trajectory_pb2.Sample]:
    """:func:`assemble` over call record messages, returning ``Sample`` messages."""
    views = [CallView.parse(r.SerializeToString()) for r in records]
    return [trajectory_pb2.Sample.FromString(b) for b in assemble(rollout, views)]
