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
the first diverging position). The same layout is what veRL's multi-turn
agent loop produces (``AgentLoopOutput``: prompt_ids, response_ids,
response_mask, response_logprobs).

Retried attempts: of the attempts of one call, only the one the harness
continued with enters a sample — the attempt whose prompt + completion the
next call's prompt extends, or else the last attempt that completed.
"""

from __future__ import annotations

from collections.abc import Sequence

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2

_NO_BREAK = (common_pb2.BREAK_CAUSE_UNSPECIFIED, common_pb2.BREAK_CAUSE_NONE)
_OK_FINISH = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)


def _extends(prefix: Sequence[int], tokens: Sequence[int]) -> bool:
    return len(tokens) >= len(prefix) and tokens[: len(prefix)] == prefix


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def select_attempts(calls: Sequence[common_pb2.CallRecord]) -> list[common_pb2.CallRecord]:
    """One attempt per call, in the order the calls were first received.

    Args:
        calls: Every attempt of every call of one rollout, in receive order.

    Returns:
        The attempt the harness continued with, per call id.
    """
    order: list[str] = []
    attempts: dict[str, list[common_pb2.CallRecord]] = {}
    for c in calls:
        if c.call_id not in attempts:
            order.append(c.call_id)
            attempts[c.call_id] = []
        attempts[c.call_id].append(c)
    chosen: list[common_pb2.CallRecord] = []
    for i, call_id in enumerate(order):
        cands = attempts[call_id]
        if len(cands) == 1:
            chosen.append(cands[0])
            continue
        nxt = attempts[order[i + 1]][0] if i + 1 < len(order) else None
        pick = None
        if nxt is not None:
            for c in reversed(cands):
                if _extends([*c.prompt_token_ids, *c.completion_token_ids], nxt.prompt_token_ids):
                    pick = c
                    break
        if pick is None:
            done = [c for c in cands if c.finish_reason in _OK_FINISH and c.completion_token_ids]
            pick = done[-1] if done else cands[-1]
        chosen.append(pick)
    return chosen


class _Builder:
    def __init__(self, rollout_id: str, index: int, first: common_pb2.CallRecord, cause: int, detail: str) -> None:
        self.sample = trajectory_pb2.Sample(
            sample_id=f"{rollout_id}/{index}",
            rollout_id=rollout_id,
            index=index,
            prompt_token_ids=first.prompt_token_ids,
            break_cause=cause,  # type: ignore[arg-type]
            break_detail=detail,
        )
        self.sequence: list[int] = list(first.prompt_token_ids)
        self.prompts: list[list[int]] = []
        self._append_completion(first)

    def _append_completion(self, call: common_pb2.CallRecord) -> None:
        s = self.sample
        n = len(call.completion_token_ids)
        logprobs = list(call.completion_logprobs) or [0.0] * n
        versions = list(call.completion_policy_versions) or [0] * n
        if len(logprobs) != n or len(versions) != n:
            raise ValueError(
                f"call {call.call_id}: {n} sampled tokens but {len(logprobs)} logprobs and "
                f"{len(versions)} policy versions"
            )
        s.response_token_ids.extend(call.completion_token_ids)
        s.loss_mask.extend([1] * n)
        s.rollout_logprobs.extend(logprobs)
        s.policy_versions.extend(versions)
        s.call_ids.append(call.call_id)
        self.sequence.extend(call.completion_token_ids)
        self.prompts.append(list(call.prompt_token_ids))

    def try_extend(self, call: common_pb2.CallRecord) -> bool:
        if not _extends(self.sequence, call.prompt_token_ids):
            return False
        between = list(call.prompt_token_ids[len(self.sequence) :])
        s = self.sample
        s.response_token_ids.extend(between)
        s.loss_mask.extend([0] * len(between))
        s.rollout_logprobs.extend([0.0] * len(between))
        s.policy_versions.extend([0] * len(between))
        self.sequence.extend(between)
        self._append_completion(call)
        return True


def _cause(call: common_pb2.CallRecord, builders: Sequence[_Builder]) -> tuple[int, str]:
    reported = call.splice.break_cause
    if reported not in _NO_BREAK:
        return reported, call.splice.break_detail
    prompt = list(call.prompt_token_ids)
    for b in builders:
        if prompt in b.prompts:
            return common_pb2.BREAK_CAUSE_RETRY, "prompt re-sends an earlier call's prompt"
    at = _first_divergence(builders[-1].sequence, prompt)
    return common_pb2.BREAK_CAUSE_OTHER, f"diverges from the previous sequence at token {at}"


def assemble(rollout: common_pb2.Rollout, calls: Sequence[common_pb2.CallRecord]) -> list[trajectory_pb2.Sample]:
    """Builds a rollout's training samples.

    Args:
        rollout: The rollout (its reward and status are copied onto the samples).
        calls: Every recorded attempt of its calls, in receive order.

    Returns:
        Samples in order; empty when the rollout made no call. Each sample's
        ``response_token_ids``, ``loss_mask``, ``rollout_logprobs`` and
        ``policy_versions`` have equal length.

    Raises:
        ValueError: A call's logprobs or policy versions do not match its sampled tokens.
    """
    chosen = select_attempts(calls)
    builders: list[_Builder] = []
    for call in chosen:
        if builders and builders[-1].try_extend(call):
            continue
        if builders:
            cause, detail = _cause(call, builders)
        else:
            cause, detail = common_pb2.BREAK_CAUSE_NONE, ""
        builders.append(_Builder(rollout.rollout_id, len(builders), call, cause, detail))
    partial = rollout.status in (
        common_pb2.ROLLOUT_STATUS_TIMED_OUT,
        common_pb2.ROLLOUT_STATUS_FAILED,
        common_pb2.ROLLOUT_STATUS_CANCELLED,
    )
    out = []
    for b in builders:
        b.sample.reward = rollout.reward if rollout.HasField("reward") else 0.0
        b.sample.partial = partial
        out.append(b.sample)
    return out
