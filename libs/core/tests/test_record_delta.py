"""Call records coded against an earlier record (RecordDelta) and the wire helpers under them."""

from __future__ import annotations

import random

import pytest

from openforge.common.v1 import common_pb2
from openforge_core import protowire as pw
from openforge_core.record_delta import (
    MIN_SAVED_BYTES,
    BytesCut,
    FullParts,
    RecordCut,
    base_key,
    cut_record,
    expand_record,
    expand_records,
)


def _packed(ids: list[int]) -> bytes:
    return b"".join(pw.varint(i) for i in ids)


def test_varint_offset_is_the_end_of_the_nth_varint() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.choice([rng.randrange(128), rng.randrange(1 << 14), rng.randrange(1 << 21)]) for _ in range(60)]
        packed = _packed(ids)
        for k in range(len(ids) + 1):
            assert pw.varint_offset(packed, k) == len(_packed(ids[:k]))
    with pytest.raises(ValueError, match="3 ids asked"):
        pw.varint_offset(_packed([1, 300]), 3)


def test_common_prefix_and_suffix_match_a_direct_scan() -> None:
    rng = random.Random(11)
    for _ in range(500):
        shared = bytes(rng.randrange(4) for _ in range(rng.randrange(40)))
        a = bytes(rng.randrange(4) for _ in range(rng.randrange(8))) + shared
        b = bytes(rng.randrange(4) for _ in range(rng.randrange(8))) + shared
        limit = rng.randrange(50)
        n = 0
        while n < min(len(a), len(b), limit) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
            n += 1
        assert pw.common_suffix(a, b, limit) == n
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        assert pw.common_prefix(a, b) == p


def test_bytes_cut_rebuilds_the_full_string_without_overlap() -> None:
    rng = random.Random(3)
    for _ in range(500):
        base = bytes(rng.randrange(3) for _ in range(rng.randrange(30)))
        full = bytearray(base)
        for _ in range(rng.randrange(3)):  # edits: insert, delete or replace somewhere
            i = rng.randrange(len(full) + 1)
            full[i : i + rng.randrange(3)] = bytes(rng.randrange(3) for _ in range(rng.randrange(4)))
        cut = BytesCut.between(base, bytes(full))
        assert cut.prefix + cut.suffix <= min(len(base), len(full))
        assert cut.apply(base) == bytes(full)
    with pytest.raises(ValueError, match="base of 3 bytes"):
        BytesCut(2, 2, b"x").apply(b"abc")


def test_common_run_matches_a_direct_scan() -> None:
    rng = random.Random(13)
    for _ in range(500):
        a = bytes(rng.randrange(3) for _ in range(rng.randrange(40)))
        b = bytes(rng.randrange(3) for _ in range(rng.randrange(40)))
        a0, b0, limit = rng.randrange(len(a) + 1), rng.randrange(len(b) + 1), rng.randrange(45)
        n = 0
        while n < limit and a0 + n < len(a) and b0 + n < len(b) and a[a0 + n] == b[b0 + n]:
            n += 1
        assert pw.common_run(a, a0, b, b0, limit) == n


def _text(rng: random.Random, n: int) -> bytes:
    # words from a small vocabulary: repeats, as JSON bodies have, so that anchors can mislead
    words = [b"role", b"user", b"content", b"tool_result", b'"type":"text"', b"x" * 7, b"{", b"},"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + bytes([rng.randrange(97, 123)])
    return bytes(out[:n])


def test_bytes_cut_copies_the_base_between_two_changed_places() -> None:
    # the bench's and a real harness's shape: new messages in the middle of the body, a flag
    # at its end changed ("stream": true -> false), 150 KB of system prompt and tools between
    rng = random.Random(5)
    head, between = _text(rng, 20_000), _text(rng, 150_000)
    base = b'{"messages":[' + head + b'],"system":"' + between + b'","stream":true}'
    full = b'{"messages":[' + head + b',{"new":1}],"system":"' + between + b'","stream":false}'
    cut = BytesCut.between(base, full)
    assert cut.apply(base) == full and cut.size == len(full)
    assert len(cut.middle) < 100  # the 150 KB between the two changes is a copy
    assert len(cut.copies) == 1 and cut.saved == len(full) - len(cut.middle)
    # the proto carries the runs; rebuilt from it, the same bytes
    assert BytesCut.of_proto(cut.proto(), cut.middle).apply(base) == full


def test_bytes_cut_with_runs_rebuilds_random_edits() -> None:
    rng = random.Random(17)
    copied = 0
    for _ in range(300):
        base = _text(rng, rng.randrange(0, 6000))
        full = bytearray(base)
        for _ in range(rng.randrange(6)):  # edits anywhere: insert, delete or replace
            i = rng.randrange(len(full) + 1)
            full[i : i + rng.randrange(0, 700)] = _text(rng, rng.randrange(0, 300))
        cut = BytesCut.between(base, bytes(full))
        assert cut.apply(base) == bytes(full)
        assert cut.size == len(full) == cut.saved + len(cut.middle)
        assert len(cut.copies) <= 8 and all(n >= 256 for _, _, n in cut.copies)
        ats = [a for a, _, _ in cut.copies]
        assert ats == sorted(ats)
        copied += len(cut.copies)
    assert copied > 50  # the runs are found, not only the prefix and suffix (97 with this seed)


def test_bytes_cut_refuses_runs_that_do_not_fit() -> None:
    base = b"0123456789"
    with pytest.raises(ValueError, match="a run of 4 bytes at 8"):
        BytesCut(0, 0, b"ab", ((1, 8, 4),)).apply(base)
    with pytest.raises(ValueError, match="a run at 3 of 2 carried bytes"):
        BytesCut(0, 0, b"ab", ((3, 0, 2),)).apply(base)
    with pytest.raises(ValueError, match="a run at 0 of 2 carried bytes, after 1"):
        BytesCut(0, 0, b"ab", ((1, 0, 2), (0, 0, 2))).apply(base)
    assert BytesCut(1, 1, b"ab", ((1, 2, 3),)).apply(base) == b"0a234b9"
    # runs repeat no base byte and stay between the prefix and the suffix, as between() makes them
    with pytest.raises(ValueError, match=r"outside 4\.\.9"):
        BytesCut(1, 1, b"ab", ((0, 2, 2), (1, 3, 2))).apply(base)
    with pytest.raises(ValueError, match=r"a run of 2 bytes at 0 .* outside 1\.\.9"):
        BytesCut(1, 1, b"ab", ((0, 0, 2),)).apply(base)
    with pytest.raises(ValueError, match="rebuilt to 7 bytes, the delta says 8"):
        BytesCut(1, 1, b"ab", ((1, 2, 3),)).apply(base, 8)


def test_a_delta_that_would_repeat_its_base_is_refused_before_anything_is_built() -> None:
    # a small record whose runs would copy a 1 MB base thousands of times (gigabytes)
    base = bytes(range(256)) * 4096
    cut = BytesCut(0, 0, b"", tuple((0, 0, len(base)) for _ in range(3000)))
    with pytest.raises(ValueError, match="outside"):
        cut.apply(base, cut.size)


def _record(call_id: str, prompt: list[int], completion: list[int], request: bytes, canonical: bytes) -> bytes:
    return common_pb2.CallRecord(
        rollout_id="ro",
        call_id=call_id,
        attempt=1,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        request_json=request,
        canonical_json=canonical,
        response_body=b"answer",
        model="m",
    ).SerializeToString()


def _conversation(turns: int) -> tuple[bytes, bytes]:
    msgs = [{"role": "user", "content": f"turn {i} " + "x" * 300} for i in range(turns)]
    request = ('{"messages":' + str(msgs) + ',"system":"' + "s" * 3000 + '","tools":[]}').encode()
    canonical = ('{"messages":' + str(msgs) + "}").encode()
    return request, canonical


def _delta_event(base: bytes, full: bytes) -> bytes:
    """``full`` coded against ``base`` as the proxy publishes it."""
    b = common_pb2.CallRecord.FromString(base)
    event = cut_record(full, FullParts.of(base).as_base(b.call_id, b.attempt))
    assert event is not full
    return event


def test_a_growing_conversation_is_sent_as_its_new_part_and_rebuilt_exactly() -> None:
    req1, can1 = _conversation(10)
    req2, can2 = _conversation(11)
    p1, c1 = list(range(1000, 5000)), [7, 8, 9]
    # the next prompt extends the first prompt + completion, re-tokenized at the seam
    p2 = p1 + c1[:2] + [40000, 300] + list(range(200))
    first = _record("c1", p1, c1, req1, can1)
    second = _record("c2", p2, [5], req2, can2)
    event = _delta_event(first, second)
    assert len(event) < len(second) // 10
    assert base_key(event) == ("c1", 1) and base_key(second) is None
    rebuilt = expand_record(event, FullParts.of(first))
    assert common_pb2.CallRecord.FromString(rebuilt) == common_pb2.CallRecord.FromString(second)
    assert expand_record(second, FullParts.of(first)) is second  # a full record is returned as it is


def test_expand_records_follows_the_stream_and_names_a_missing_base() -> None:
    records = []
    prompt: list[int] = []
    for turn in range(1, 6):
        req, can = _conversation(turn * 3)
        prompt = prompt + [turn] * 900
        records.append(_record(f"c{turn}", prompt, [turn, turn], req, can))
        prompt += [turn, turn]
    events = [records[0]] + [_delta_event(records[i - 1], records[i]) for i in range(1, len(records))]
    parsed = [common_pb2.CallRecord.FromString(e) for e in events]
    assert all(p.HasField("delta") for p in parsed[1:])
    assert expand_records(parsed) == [common_pb2.CallRecord.FromString(r) for r in records]
    with pytest.raises(ValueError, match=r"call c3: base \('c2', 1\) is not an earlier record"):
        expand_records([parsed[0], parsed[2]])


def test_a_small_saving_is_sent_in_full_and_a_base_must_be_full() -> None:
    base = FullParts(b'{"a":1}', b"{}", _packed([1, 2, 3])).as_base("c1", 1)
    assert RecordCut.of(base, _packed([1, 2, 3, 4]), b'{"a":1,"b":2}', b"{}") is None
    small = _record("c2", [1, 2, 3, 4], [5], b'{"a":1,"b":2}', b"{}")
    assert cut_record(small, base) is small
    assert MIN_SAVED_BYTES > 0
    req, can = _conversation(5)
    full = _record("c1", list(range(3000)), [1], req, can)
    event = _delta_event(full, _record("c2", list(range(3001)), [1], req, can))
    with pytest.raises(ValueError, match="must be a full record"):
        FullParts.of(event)


def test_a_base_that_is_not_the_one_coded_against_is_refused() -> None:
    req, can = _conversation(10)
    first = _record("c1", list(range(3000)), [1], req, can)
    event = _delta_event(first, _record("c2", list(range(3001)), [1], req, can))
    with pytest.raises(ValueError):
        expand_record(event, FullParts(b"{}", b"{}", _packed([1])))
