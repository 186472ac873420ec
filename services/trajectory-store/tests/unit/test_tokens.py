"""Delta storage of prompts and the wire helpers it rests on."""

from __future__ import annotations

import pytest
from store_builders import conversation, make_call

from openforge.common.v1 import common_pb2
from openforge_trajectory_store.domain import tokens, wire


def test_round_trip_and_compaction() -> None:
    calls = conversation("r", turns=30, prompt_len=2000)
    stored, base = [], None
    for c in calls:
        s = tokens.encode(c.SerializeToString(), base)
        stored.append(s)
        base = (s.key, s.sequence)
    full_bytes = sum(len(c.SerializeToString()) for c in calls)
    stored_bytes = sum(len(s.data) for s in stored)
    assert stored_bytes * 10 < full_bytes
    views = tokens.decode((s.data, s.base, s.prefix_len) for s in stored)
    assert [common_pb2.CallRecord.FromString(v.data) for v in views] == calls


def test_prefix_is_cut_at_a_token_boundary() -> None:
    # 300 and 301 share their first varint byte (0xAC / 0xAD vs 0x02): the cut must not split a token.
    base_call = make_call("r", "c0", [5] * 40 + [300], [])
    nxt = make_call("r", "c1", [5] * 40 + [301, 7], [1])
    b = tokens.encode(base_call.SerializeToString(), None)
    s = tokens.encode(nxt.SerializeToString(), (b.key, b.sequence))
    assert s.base == ("c0", 1) and s.prefix_len == 40
    [_, view] = tokens.decode([(b.data, None, 0), (s.data, s.base, s.prefix_len)])
    assert common_pb2.CallRecord.FromString(view.data).prompt_token_ids == nxt.prompt_token_ids


@pytest.mark.parametrize(
    ("a", "b"),
    [([1, 2, 3], [1, 2, 3, 4]), ([1, 2], [2]), ([], [1]), (list(range(1000)), [*range(517), 9, 9]), ([300], [301])],
)
def test_byte_prefix_matches_token_prefix(a: list[int], b: list[int]) -> None:
    pa, pb = b"".join(wire.varint(x) for x in a), b"".join(wire.varint(x) for x in b)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    cut = wire.token_boundary(pa, wire.common_prefix(pa, pb))
    assert wire.count_varints(pa[:cut]) == n
    assert wire.count_varints(pa) == len(a)


def test_missing_base_is_an_error() -> None:
    c = conversation("r", turns=2, prompt_len=100)
    first = tokens.encode(c[0].SerializeToString(), None)
    second = tokens.encode(c[1].SerializeToString(), (first.key, first.sequence))
    with pytest.raises(ValueError, match="not stored before"):
        tokens.decode([(second.data, second.base, second.prefix_len)])


def test_call_view_reads_what_assembly_needs() -> None:
    c = make_call("r", "c7", [1, 2, 300], [4, 5], attempt=2, t=123)
    c.splice.break_cause = common_pb2.BREAK_CAUSE_COMPACTION
    c.splice.break_detail = "summary"
    v = wire.CallView.parse(c.SerializeToString())
    assert (v.call_id, v.attempt, v.completion_len, v.receive_ns) == ("c7", 2, 2, 1_000_000_123)
    assert (v.break_cause, v.break_detail) == (common_pb2.BREAK_CAUSE_COMPACTION, "summary")
    assert v.prompt == b"".join(wire.varint(x) for x in [1, 2, 300])
    assert len(v.logprobs) == 8 and wire.count_varints(v.versions) == 2
