"""Sample assembly: merging, loss masks, logprobs, attempts, break causes."""

from __future__ import annotations

from store_builders import conversation, make_call, make_rollout

from openforge.common.v1 import common_pb2
from openforge_trajectory_store.domain.assembly import assemble_records as assemble


def _done(reward: float = 1.0, status: int = common_pb2.ROLLOUT_STATUS_SUCCEEDED) -> common_pb2.Rollout:
    return make_rollout("r1", status=status, reward=reward)


def test_extending_calls_merge_into_one_sample_aligned_token_by_token() -> None:
    calls = conversation("r1", turns=6)
    [sample] = assemble(_done(0.5), calls)
    last = calls[-1]
    full = list(sample.prompt_token_ids) + list(sample.response_token_ids)
    assert full == list(last.prompt_token_ids) + list(last.completion_token_ids)
    assert list(sample.prompt_token_ids) == list(calls[0].prompt_token_ids)
    n = len(sample.response_token_ids)
    assert len(sample.loss_mask) == len(sample.rollout_logprobs) == len(sample.policy_versions) == n
    # Every masked position is exactly a sampled token with its logprob; every other is not trained on.
    sampled_positions = set()
    for c in calls:
        start = len(c.prompt_token_ids) - len(sample.prompt_token_ids)
        for k, tok in enumerate(c.completion_token_ids):
            pos = start + k
            sampled_positions.add(pos)
            assert sample.response_token_ids[pos] == tok
            assert sample.loss_mask[pos] == 1
            assert abs(sample.rollout_logprobs[pos] - (-tok / 1000)) < 1e-6
            assert sample.policy_versions[pos] == 1
    for pos in range(n):
        if pos not in sampled_positions:
            assert sample.loss_mask[pos] == 0
            assert sample.rollout_logprobs[pos] == 0.0 and sample.policy_versions[pos] == 0
    assert list(sample.call_ids) == [c.call_id for c in calls]
    assert sample.reward == 0.5 and not sample.partial
    assert sample.break_cause == common_pb2.BREAK_CAUSE_NONE


def test_only_the_attempt_the_harness_continued_with_enters() -> None:
    calls = conversation("r1", turns=3)
    first = calls[1]
    failed = make_call(
        "r1",
        first.call_id,
        list(first.prompt_token_ids),
        [777, 778],
        attempt=1,
        t=1000,
        finish=common_pb2.FINISH_REASON_ERROR,
    )
    retried = make_call(
        "r1", first.call_id, list(first.prompt_token_ids), list(first.completion_token_ids), attempt=2, t=1500
    )
    [sample] = assemble(_done(), [calls[0], failed, retried, calls[2]])
    assert 777 not in sample.response_token_ids
    assert list(sample.call_ids) == ["c0", "c1", "c2"]


def test_forced_divergence_and_resent_prompt_are_labelled() -> None:
    calls = conversation("r1", turns=4)
    drift = list(calls[2].prompt_token_ids)
    drift[5] = 4999  # history re-rendered differently
    diverged = make_call("r1", "c2", drift, list(calls[2].completion_token_ids), t=2000)
    resent = make_call("r1", "c3", list(calls[0].prompt_token_ids), [601, 602], t=3000)
    samples = assemble(_done(), [calls[0], calls[1], diverged, resent])
    assert [s.break_cause for s in samples] == [
        common_pb2.BREAK_CAUSE_NONE,
        common_pb2.BREAK_CAUSE_OTHER,
        common_pb2.BREAK_CAUSE_RETRY,
    ]
    assert "at token 5" in samples[1].break_detail
    assert [list(s.call_ids) for s in samples] == [["c0", "c1"], ["c2"], ["c3"]]
    assert [s.index for s in samples] == [0, 1, 2]


def test_the_proxy_reported_cause_wins_and_timeouts_are_partial() -> None:
    calls = conversation("r1", turns=2)
    compacted = make_call("r1", "c2", [1, 2, 3], [604], t=5000)
    compacted.splice.break_cause = common_pb2.BREAK_CAUSE_COMPACTION
    compacted.splice.break_detail = "summary replaced 40 messages"
    samples = assemble(_done(0.0, common_pb2.ROLLOUT_STATUS_TIMED_OUT), [*calls, compacted])
    assert samples[1].break_cause == common_pb2.BREAK_CAUSE_COMPACTION
    assert samples[1].break_detail == "summary replaced 40 messages"
    assert all(s.partial for s in samples)
    assert assemble(_done(), []) == []
