"""Sample assembly per call role and lineage: a sub-agent lineage is its own sample, a
compaction starts a new one, side calls stay apart, records without roles merge as before."""

from __future__ import annotations

from store_builders import conversation, make_call, make_rollout

from openforge.common.v1 import common_pb2
from openforge_trajectory_store.domain.assembly import assemble_records as assemble

MAIN, SUB, COMPACT, SIDE = (
    common_pb2.CALL_ROLE_MAIN,
    common_pb2.CALL_ROLE_SUB_AGENT,
    common_pb2.CALL_ROLE_COMPACTION,
    common_pb2.CALL_ROLE_SIDE,
)


def _tag(calls: list[common_pb2.CallRecord], role: int, lineage: str, prefix: str) -> list[common_pb2.CallRecord]:
    for c in calls:
        c.role = role  # type: ignore[assignment]
        c.lineage_id = lineage
        c.call_id = prefix + c.call_id
    return calls


def test_interleaved_sub_agent_is_its_own_sample_and_main_stays_one() -> None:
    main = _tag(conversation("r1", turns=4), MAIN, "l0", "m")
    sub = _tag(conversation("r1", turns=3, seed=5), SUB, "l1", "s")
    title = make_call("r1", "t0", [7, 8, 9], [10, 11])
    title.role = SIDE
    # arrival order: main, title, main, sub x3, main x2 (the main agent waits on its Task tool)
    order = [main[0], title, main[1], *sub, main[2], main[3]]
    samples = assemble(make_rollout("r1", reward=1.0), order)
    assert [(s.role, s.lineage_id, list(s.call_ids)) for s in samples] == [
        (MAIN, "l0", [c.call_id for c in main]),
        (SIDE, "", ["t0"]),
        (SUB, "l1", [c.call_id for c in sub]),
    ]
    assert [s.break_cause for s in samples] == [
        common_pb2.BREAK_CAUSE_NONE,
        common_pb2.BREAK_CAUSE_OTHER,
        common_pb2.BREAK_CAUSE_SUB_AGENT,
    ]
    assert [s.index for s in samples] == [0, 1, 2]
    full = list(samples[0].prompt_token_ids) + list(samples[0].response_token_ids)
    assert full == list(main[-1].prompt_token_ids) + list(main[-1].completion_token_ids)
    assert all(s.reward == 1.0 for s in samples)


def test_a_compaction_is_its_own_sample_and_the_next_main_lineage_is_labelled() -> None:
    before = _tag(conversation("r1", turns=2), MAIN, "l0", "a")
    compaction = _tag(conversation("r1", turns=1, seed=3), COMPACT, "", "x")
    after = _tag(conversation("r1", turns=2, seed=9), MAIN, "l1", "b")
    samples = assemble(make_rollout("r1", reward=0.0), [*before, *compaction, *after])
    assert [(s.role, s.lineage_id, len(s.call_ids), s.break_cause) for s in samples] == [
        (MAIN, "l0", 2, common_pb2.BREAK_CAUSE_NONE),
        (COMPACT, "", 1, common_pb2.BREAK_CAUSE_COMPACTION),
        (MAIN, "l1", 2, common_pb2.BREAK_CAUSE_COMPACTION),
    ]


def test_records_without_roles_merge_as_main_calls() -> None:
    [sample] = assemble(make_rollout("r1", reward=1.0), conversation("r1", turns=3))
    assert (sample.role, sample.lineage_id, len(sample.call_ids)) == (MAIN, "", 3)
