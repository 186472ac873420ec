"""Call records coded against an earlier record of their rollout (RecordDelta), on both backends.

The proxy sends each call of a growing conversation as what is new since its
previous record; the store must keep, assemble and serve exactly the records a
full event would have given, whether the base came in the same batch, an
earlier one, or only from the database (a restarted store).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_builders import conversation, finished, make_rollout, submitted

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.proxy.v1 import events_pb2 as proxy
from openforge_core.errors import InvalidArgument
from openforge_core.record_delta import FullParts, cut_record
from openforge_trajectory_store.adapters.sql import SqlRepository
from openforge_trajectory_store.domain.projection import BaseNotStored

DONE = common_pb2.ROLLOUT_STATUS_SUCCEEDED
TURNS = 6


def _full_calls(rollout_id: str) -> list[common_pb2.CallRecord]:
    """A conversation whose request and canonical JSON grow by a message per call."""
    calls = conversation(rollout_id, TURNS, prompt_len=3000)
    for i, c in enumerate(calls):
        messages = [{"role": "user", "content": f"step {k}: " + "words " * 200} for k in range(i + 1)]
        c.request_json = json.dumps({"messages": messages, "system": "s" * 5000, "tools": []}).encode()
        c.canonical_json = json.dumps({"messages": messages}).encode()
        c.response_body = b"answer"
    return calls


def _two_place_calls(rollout_id: str) -> list[common_pb2.CallRecord]:
    """As :func:`_full_calls`, with a flag after the system prompt that alternates (the request
    changes in two places)."""
    calls = _full_calls(rollout_id)
    for i, c in enumerate(calls):
        request = json.loads(c.request_json)
        request["stream"] = i % 2 == 0
        c.request_json = json.dumps(request).encode()
    return calls


def _events(calls: list[common_pb2.CallRecord]) -> list[tuple[str, proxy.CallRecorded, bytes]]:
    """CallRecorded events as the proxy publishes them: each call after the first coded against the
    previous one (with the event's wire bytes, as the consumer passes them)."""
    return [_event(c, calls[i - 1] if i else None) for i, c in enumerate(calls)]


def _event(c: common_pb2.CallRecord, prev: common_pb2.CallRecord | None) -> tuple[str, proxy.CallRecorded, bytes]:
    """The event of ``c``, coded against ``prev`` when given, with its wire bytes."""
    data = c.SerializeToString()
    if prev is not None:
        data = cut_record(data, FullParts.of(prev.SerializeToString()).as_base(prev.call_id, prev.attempt))
    eid = f"{c.rollout_id}/{c.call_id}/{c.attempt}"
    event = proxy.CallRecorded(event_id=eid, record=common_pb2.CallRecord.FromString(data))
    return eid, event, event.SerializeToString()


def _finish(rollout_id: str) -> tuple[str, orch.RolloutFinished]:
    r = make_rollout(rollout_id)
    r.status = DONE
    r.reward = 1.0
    return finished(r, TURNS)


def _check(repo: SqlRepository, rollout_id: str, full: list[common_pb2.CallRecord]) -> None:
    assert repo.calls(rollout_id) == full
    [sample] = repo.samples(rollout_id)
    last = full[-1]
    assert list(sample.prompt_token_ids) + list(sample.response_token_ids) == list(last.prompt_token_ids) + list(
        last.completion_token_ids
    )


def test_deltas_with_runs_of_the_base_are_rebuilt_exactly(repo: SqlRepository) -> None:
    # a request changed in two places (new messages, and a flag after the system prompt that
    # alternates): the system prompt between them travels as a run of the base
    full = _two_place_calls("r5")
    events = _events(full)
    for _, e, _ in events[1:]:
        d = e.record.delta.request_json
        assert len(d.copies) == 1 and d.copies[0].length >= 5000
        assert len(e.record.request_json) < 1500  # the new message and the flag
    repo.ingest([submitted(make_rollout("r5"))])
    repo.ingest([*events, _finish("r5")])
    _check(repo, "r5", full)


def test_deltas_in_one_batch_are_rebuilt_exactly(repo: SqlRepository) -> None:
    full = _full_calls("r0")
    events = _events(full)
    assert all(e.record.HasField("delta") for _, e, _ in events[1:])
    assert sum(len(raw) for _, _, raw in events[1:]) < sum(len(c.SerializeToString()) for c in full[1:]) // 5
    repo.ingest([submitted(make_rollout("r0"))])
    repo.ingest([*events, _finish("r0")])
    _check(repo, "r0", full)


def test_deltas_across_batches_and_a_restarted_store(repo: SqlRepository) -> None:
    full = _full_calls("r0")
    events = _events(full)
    repo.ingest([submitted(make_rollout("r0"))])
    repo.ingest(events[:3])
    repo.ingest(events[3:4])  # base from the previous batch
    restarted = SqlRepository(repo.dsn)  # nothing in memory: the base is read from the database
    restarted.open()
    try:
        restarted.ingest(events[4:])
        restarted.ingest([_finish("r0")])
        _check(restarted, "r0", full)
    finally:
        restarted.close()


def test_a_delta_before_its_base_is_redelivered_not_lost(repo: SqlRepository) -> None:
    full = _full_calls("r0")
    events = _events(full)
    repo.ingest([submitted(make_rollout("r0"))])
    with pytest.raises(BaseNotStored) as err:
        repo.ingest([events[1]])
    assert err.value.reason == "BASE_NOT_STORED" and "c0" in err.value.message
    assert repo.count_calls() == 0  # nothing committed, nothing marked seen
    repo.ingest([events[0]])
    repo.ingest(events[1:])  # the redelivery now succeeds
    repo.ingest([_finish("r0")])
    _check(repo, "r0", full)


def test_a_delta_that_does_not_fit_its_base_is_refused(repo: SqlRepository) -> None:
    full = _full_calls("r0")
    events = _events(full)
    repo.ingest([submitted(make_rollout("r0")), events[0]])
    eid, event, _ = events[1]
    event.record.delta.request_json.suffix = 10**6  # longer than the base's request
    with pytest.raises(InvalidArgument, match="does not fit its base"):
        repo.ingest([(eid, event)])
    assert repo.count_calls() == 1


def _threads(rollout_id: str) -> list[tuple[str, proxy.CallRecorded, bytes]]:
    """Three conversation threads of one rollout (main agent and two sub-agents) whose calls
    interleave, each call coded against the previous call of its own thread."""
    threads = [_full_calls(rollout_id) for _ in range(3)]
    out = []
    for turn in range(TURNS):
        for t, calls in enumerate(threads):
            c = calls[turn]
            c.call_id = f"t{t}-{c.call_id}"
            c.receive_time.FromNanoseconds(1_000_000_000 + turn * 1000 + t)
            out.append(_event(c, calls[turn - 1] if turn else None))
    return out


def test_interleaved_threads_are_rebuilt_from_memory_and_from_the_database(repo: SqlRepository) -> None:
    events = _threads("r0")
    assert sum(e.record.HasField("delta") for _, e, _ in events) == 3 * (TURNS - 1)
    for _, e, _ in events:  # one event per batch, as a slow stream delivers them
        repo.ingest([(e.event_id, e)])
    assert repo.delta_base_misses == 0  # each thread's base was still in memory
    want = [e.record for _, e, _ in _threads("r1")]  # the same calls in another rollout
    got = repo.calls("r0")
    assert len(got) == 3 * TURNS
    assert [(c.call_id, c.request_json, list(c.prompt_token_ids)) for c in got] == [
        (c.call_id, c.request_json, list(c.prompt_token_ids)) for c in _expanded(want)
    ]
    small = SqlRepository(repo.dsn, delta_base_bytes=1)  # nothing fits in memory: every base is read back
    small.open()
    try:
        for _, e, _ in _threads("r2"):
            small.ingest([(e.event_id, e)])
        assert small.delta_base_misses == 3 * (TURNS - 1)
        assert [c.request_json for c in small.calls("r2")] == [c.request_json for c in got]
    finally:
        small.close()


def _expanded(records: list[common_pb2.CallRecord]) -> list[common_pb2.CallRecord]:
    from openforge_core.record_delta import expand_records

    return expand_records(records)


@pytest.mark.parametrize(
    "spoil",
    [
        "prompt_prefix_tokens",
        "request_prefix",
        "empty_delta",
        "itself_as_base",
        "run_outside_base",
        "run_shorter",
    ],
)
def test_a_delta_inconsistent_with_its_base_is_refused_not_stored_wrong(repo: SqlRepository, spoil: str) -> None:
    full = _two_place_calls("r0")
    events = _events(full)
    repo.ingest([submitted(make_rollout("r0")), events[0]])
    eid, event, _ = events[1]
    d = event.record.delta
    if spoil == "prompt_prefix_tokens":
        d.prompt_prefix_tokens -= 1  # within the base: only the delta's own count tells
    elif spoil == "request_prefix":
        d.request_json.prefix -= 3  # within the base: only the delta's own size tells
    elif spoil == "run_outside_base":
        d.request_json.copies[0].offset = 10**6
    elif spoil == "run_shorter":
        d.request_json.copies[0].length -= 2  # a valid run: only the delta's own size tells
    elif spoil == "empty_delta":
        event.record.delta.Clear()
        event.record.delta.SetInParent()
    else:
        d.base_call_id, d.base_attempt = event.record.call_id, event.record.attempt
    with pytest.raises(InvalidArgument):
        repo.ingest([(eid, event)])
    assert repo.count_calls() == 1


def test_a_budget_a_little_over_the_live_bases_serves_every_delta_from_memory(tmp_path: Path) -> None:
    """A base is dropped once the record coded against it is kept: one entry per live thread, so
    round-robin rollouts fit in a budget just above their latest records."""
    rollouts = [_events(_full_calls(f"r{i}")) for i in range(12)]
    largest = max(FullParts.of(c.SerializeToString()).size for c in _full_calls("x"))  # the last call's
    repo = SqlRepository(f"sqlite:///{tmp_path / 'store.db'}", delta_base_bytes=int(12 * (largest * 1.3 + 512)))
    repo.open()
    try:
        for turn in range(TURNS):
            for ev in rollouts:
                eid, event, raw = ev[turn]
                repo.ingest([(eid, event, raw)])
        assert repo.delta_base_misses == 0
        assert len(repo.calls("r11")) == TURNS
    finally:
        repo.close()
