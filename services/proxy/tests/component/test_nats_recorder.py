"""The proxy's recorder against a real NATS server (JetStream): deltas and the message limit."""

from __future__ import annotations

import dataclasses
import json

import nats
import pytest
from record_builders import coded_against, make_record

from openforge.proxy.v1 import events_pb2
from openforge_core.events import EventBus
from openforge_core.record_delta import expand_records
from openforge_core.settings import NatsSettings
from openforge_proxy.adapters.publisher import SUBJECT, NatsRecorder, event_bytes, record_proto
from openforge_proxy.domain.record import CallRecordData, RecordTooLarge
from openforge_testing.servers import NatsServer


def _record(call_id: str, turns: int, *, filler: int = 400) -> CallRecordData:
    messages = [{"role": "user", "content": f"turn {i} " + "x" * filler} for i in range(turns)]
    return make_record(
        call_id,
        rollout_id="ro-1",
        run_id="run-1",
        prompt=[i % 50_000 for i in range(turns * 100)],
        request_json=json.dumps({"messages": messages, "system": "s" * 4000}).encode(),
        canonical_json=json.dumps({"messages": messages}).encode(),
    )


async def test_deltas_cross_the_bus_and_a_record_over_its_limit_is_refused(nats_server_fn: NatsServer) -> None:
    bus = EventBus(NatsSettings(url=nats_server_fn.url))
    await bus.connect()
    try:
        assert bus.max_payload == 1024 * 1024  # nats-server's default
        recorder = NatsRecorder(bus)
        first = _record("c1", 20)
        await recorder.record(first)
        second = coded_against(_record("c2", 21), first.as_base())
        await recorder.record(second)
        # a first record too large for the server: refused before publishing, nothing sent
        huge = _record("c3", 3, filler=200_000)
        with pytest.raises(RecordTooLarge) as err:
            await recorder.record(huge)
        assert err.value.limit == bus.max_payload and err.value.size > bus.max_payload
        # the same conversation as a delta on a base that holds most of it fits
        grown = coded_against(_record("c4", 4, filler=200_000), huge.as_base())
        await recorder.record(grown)
    finally:
        await bus.close()
    nc = await nats.connect(nats_server_fn.url)
    try:
        sub = await nc.jetstream().pull_subscribe(SUBJECT, durable="recorder-test")
        msgs = await sub.fetch(3, timeout=5)
        sent = [events_pb2.CallRecorded.FromString(m.data).record for m in msgs]
    finally:
        await nc.close()
    assert [r.call_id for r in sent] == ["c1", "c2", "c4"]
    assert [r.HasField("delta") for r in sent] == [False, True, True]
    assert len(msgs[1].data) < len(msgs[0].data) // 4
    # c4's base (c3) never reached the stream: only c1 -> c2 can be rebuilt from it
    assert expand_records(sent[:2]) == [record_proto(first), record_proto(second)]
    with pytest.raises(ValueError, match="base"):
        expand_records(sent)


async def test_a_record_just_under_the_limit_with_its_headers_over_it_is_refused_and_the_bus_lives(
    nats_server_fn: NatsServer,
) -> None:
    """The server counts the header block with the payload and closes the connection of a client
    that exceeds max_payload: an event that fits alone but not with its headers is refused here."""
    bus = EventBus(NatsSettings(url=nats_server_fn.url))
    await bus.connect()
    try:
        recorder = NatsRecorder(bus)
        rec = _record("c1", 1, filler=10)
        small = len(event_bytes(rec))
        pad = bus.max_payload - small - 20  # the event alone: 20 bytes under the limit
        rec = dataclasses.replace(rec, response_body=b"x" * (pad - 4))  # the field's tag and length
        assert bus.max_payload - 40 < len(event_bytes(rec)) <= bus.max_payload
        with pytest.raises(RecordTooLarge):
            await recorder.record(rec)
        await recorder.record(_record("c2", 2))  # the connection is still usable
        assert bus.connected
    finally:
        await bus.close()
