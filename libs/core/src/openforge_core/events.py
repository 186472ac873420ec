"""Events on NATS JetStream: streams, publishing with de-duplication, durable consumers.

Conventions (STYLE.md, "Events"):

* Subjects are ``openforge.<domain>.v1.<event>``; the payload is the serialized
  proto message from the producer's ``events.proto``; the header
  ``Openforge-Type`` carries the message's full proto name.
* One stream per producing domain, ``OPENFORGE_<DOMAIN>`` over
  ``openforge.<domain>.v1.>``, file storage, created idempotently by whoever
  first needs it (producer or consumer) with the same configuration.
* ``Nats-Msg-Id`` is the event id, so JetStream drops a re-publish inside the
  stream's duplicate window (https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive#message-deduplication).
  Consumers are idempotent on the event id as well, since redelivery after the
  window is possible.
* Durable pull consumers; a message is acked only after its handler returned,
  nak'ed with a delay when the handler raised (so it is redelivered).
* W3C ``traceparent`` travels in the headers: the consumer's handler runs in a
  span whose parent is the publisher's, so one rollout is one trace. A publish
  has a producer span of its own when it is part of a trace (a recording span
  is current) or when spans are exported; otherwise (the proxy's call records,
  published from no trace) that span would be a root nobody sees, at tens of
  microseconds a publish, and the event carries no ``traceparent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import nats
import structlog
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NatsClient
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import trace

from openforge.common.v1 import common_pb2
from openforge_core.backoff import doubling_delay
from openforge_core.errors import ErrorCode, OpenForgeError
from openforge_core.settings import NatsSettings
from openforge_core.telemetry import exporting_spans, extract_context, inject_context

log = structlog.get_logger(__name__)
tracer = trace.get_tracer("openforge_core.events")


def _producer_span(subject: str) -> contextlib.AbstractContextManager[Any]:
    """The producer span of a publish: one when the publish is part of a trace or spans are
    exported (:func:`~openforge_core.telemetry.exporting_spans`), else none (see the module
    docstring)."""
    if trace.get_current_span().is_recording() or exporting_spans():
        return tracer.start_as_current_span(f"publish {subject}", kind=trace.SpanKind.PRODUCER)
    return contextlib.nullcontext()


TYPE_HEADER = "Openforge-Type"
MSG_ID_HEADER = "Nats-Msg-Id"
DUPLICATE_WINDOW = timedelta(minutes=10)

M = TypeVar("M", bound=Message)


def stream_name(domain: str) -> str:
    """``OPENFORGE_<DOMAIN>``, the stream holding ``openforge.<domain>.v1.>``."""
    return f"OPENFORGE_{domain.upper()}"


def subject_for(domain: str, event: str) -> str:
    """``openforge.<domain>.v1.<event>``."""
    return f"openforge.{domain}.v1.{event}"


def _domain_of(subject: str) -> str:
    parts = subject.split(".")
    if len(parts) < 4 or parts[0] != "openforge" or parts[2] != "v1":
        raise ValueError(f"not an openforge event subject: {subject!r}")
    return parts[1]


@dataclass(frozen=True)
class Delivery:
    """Metadata of one delivered event.

    Attributes:
        subject: The subject it was published on.
        event_id: Its ``Nats-Msg-Id``.
        num_delivered: 1 on first delivery, more on redelivery.
        stream_sequence: Position in the stream.
        context: The publisher's trace context (from ``traceparent``).
        data: The payload as received (the serialized event).
    """

    subject: str
    event_id: str
    num_delivered: int
    stream_sequence: int
    context: otel_context.Context | None = None
    data: bytes = field(default=b"", repr=False)


Handler = Callable[[Message, Delivery], Awaitable[None]]
BatchHandler = Callable[[Sequence[tuple[Message, Delivery]]], Awaitable[None]]


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying the event can never succeed (it is invalid, not the system unavailable)."""
    return isinstance(exc, OpenForgeError) and exc.code is ErrorCode.INVALID_ARGUMENT


class MessageTooLarge(ValueError):
    """A message (payload and headers) is larger than the NATS server accepts.

    Args:
        size: The message with its header block, bytes.
        limit: The server's ``max_payload``, bytes.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the message is {size} bytes with its headers, over the server's limit of {limit} bytes")
        self.size = size
        self.limit = limit


#: What a publish raises while the server is unreachable or JetStream not ready (retried).
_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)

#: Longest redelivery delay after a transient handler error, seconds.
MAX_NAK_DELAY_S = 60.0

#: Bytes of a header block besides its lines: ``NATS/1.0\r\n`` and the closing ``\r\n``.
_HEADER_BLOCK = len(b"NATS/1.0\r\n\r\n")


class EventBus:
    """A NATS connection with JetStream publishing and durable consumers.

    Args:
        settings: Server URL and stream replicas.
    """

    def __init__(self, settings: NatsSettings) -> None:
        self._settings = settings
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: set[str] = set()
        self._consumed: set[str] = set()
        self._purger: asyncio.Task[None] | None = None

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("EventBus.connect() was not called")
        return self._js

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    def _check_size(self, data: bytes, headers: Mapping[str, str]) -> None:
        """Refuses a message the server would refuse: it counts the header block (``NATS/1.0``,
        one ``Name: value`` line per header, a blank line) with the payload against its
        ``max_payload`` and closes the connection of a client that exceeds it, a condition the
        client library does not check for headers."""
        size = (
            len(data) + _HEADER_BLOCK + sum(len(k.encode()) + len(v.strip().encode()) + 4 for k, v in headers.items())
        )
        if size > self.max_payload:
            raise MessageTooLarge(size, self.max_payload)

    @property
    def max_payload(self) -> int:
        """The largest message the server accepts, bytes (its ``max_payload``; 1 MiB by default).

        Raises:
            RuntimeError: Not connected.
        """
        if self._nc is None:
            raise RuntimeError("EventBus.connect() was not called")
        return self._nc.max_payload

    async def connect(self) -> None:
        """Connects to NATS (retrying while the server starts).

        Raises:
            nats.errors.NoServersError: The server could not be reached.
        """
        self._nc = await nats.connect(
            self._settings.url,
            connect_timeout=self._settings.connect_timeout_s,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            name="openforge",
        )
        self._js = self._nc.jetstream()
        log.info("nats.connected", url=self._settings.url)

    async def ensure_stream(self, domain: str) -> None:
        """Creates the domain's stream if missing (idempotent, same config everywhere)."""
        name = stream_name(domain)
        if name in self._streams:
            return
        st = self._settings
        config = StreamConfig(
            name=name,
            subjects=[f"openforge.{domain}.v1.>"],
            storage=StorageType.FILE,
            num_replicas=st.stream_replicas,
            duplicate_window=DUPLICATE_WINDOW.total_seconds(),
            max_bytes=st.stream_max_bytes or -1,
            max_age=st.stream_max_age_s or None,
            discard=DiscardPolicy.NEW,
        )
        try:
            info = await self.js.stream_info(name)
        except NotFoundError:
            await self.js.add_stream(config)
            log.info("nats.stream_created", stream=name)
        else:
            have = info.config
            if (have.max_bytes, have.max_age or 0.0, have.discard) != (
                config.max_bytes,
                config.max_age or 0.0,
                config.discard,
            ):
                await self.js.update_stream(
                    dataclasses.replace(
                        have, max_bytes=config.max_bytes, max_age=config.max_age, discard=config.discard
                    )
                )
                log.info("nats.stream_limits_updated", stream=name, max_bytes=config.max_bytes)
        self._streams.add(name)

    async def publish(self, subject: str, message: Message, *, event_id: str) -> bool:
        """Publishes one event and waits for JetStream's acknowledgement.

        Args:
            subject: ``openforge.<domain>.v1.<event>``.
            message: The event proto.
            event_id: De-duplication id (``Nats-Msg-Id``); stable across retries.

        Returns:
            True when stored, False when JetStream dropped it as a duplicate.

        While JetStream does not acknowledge (NATS restarting), the event is sent again with
        backoff for up to ``NatsSettings.publish_retry_s``.

        Raises:
            ValueError: ``subject`` is not an openforge event subject, or ``event_id`` is empty.
            nats.errors.TimeoutError: No acknowledgement within the retry time (safe to retry:
                de-duplicated), or another of the errors of an unreachable server.
            MessageTooLarge: The event and its headers exceed the server's ``max_payload``.
        """
        if not event_id:
            raise ValueError("event_id must not be empty")
        deadline = time.monotonic() + self._settings.publish_retry_s
        retry = 0
        while True:
            try:
                return await self._publish_once(subject, message, event_id)
            except _UNAVAILABLE:
                delay = doubling_delay(0.5, retry, 10.0)
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("event.publish_retry", subject=subject, event_id=event_id, retry_in_s=delay)
                await asyncio.sleep(delay)
                retry += 1

    async def _publish_once(self, subject: str, message: Message, event_id: str) -> bool:
        await self.ensure_stream(_domain_of(subject))
        with _producer_span(subject):
            headers = {TYPE_HEADER: message.DESCRIPTOR.full_name, MSG_ID_HEADER: event_id}
            inject_context(headers)
            data = message.SerializeToString()
            self._check_size(data, headers)
            ack = await self.js.publish(subject, data, headers=headers)
        log.info("event.published", subject=subject, event_id=event_id, duplicate=bool(ack.duplicate))
        return not ack.duplicate

    async def publish_bytes(self, subject: str, data: bytes, *, type_name: str, event_id: str) -> bool:
        """Publishes one event already serialized and waits for JetStream's acknowledgement.

        For producers that build an event's wire bytes themselves (the proxy appends its large
        fields by hand). Consumers see exactly what :meth:`publish` of the parsed message sends.
        Logged at debug level only: such producers log the outcome themselves.

        Args:
            subject: ``openforge.<domain>.v1.<event>``.
            data: The serialized event message.
            type_name: Its full proto name (``openforge.proxy.v1.CallRecorded``), the
                ``Openforge-Type`` header consumers decode by.
            event_id: De-duplication id (``Nats-Msg-Id``); stable across retries.

        Returns:
            True when stored, False when JetStream dropped it as a duplicate.

        Raises:
            ValueError: ``subject`` is not an openforge event subject, or ``event_id`` or
                ``type_name`` is empty.
            nats.errors.TimeoutError: No acknowledgement in time (safe to retry: de-duplicated).
            MessageTooLarge: The event and its headers exceed the server's ``max_payload``.
        """
        if not event_id:
            raise ValueError("event_id must not be empty")
        if not type_name:
            raise ValueError("type_name must not be empty")
        await self.ensure_stream(_domain_of(subject))
        with _producer_span(subject):
            headers = {TYPE_HEADER: type_name, MSG_ID_HEADER: event_id}
            inject_context(headers)
            self._check_size(data, headers)
            ack = await self.js.publish(subject, data, headers=headers)
        log.debug("event.published", subject=subject, event_id=event_id, duplicate=bool(ack.duplicate))
        return not ack.duplicate

    async def consume(
        self,
        durable: str,
        subjects: Iterable[str],
        types: Iterable[type[Message]],
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        dead_letter_domain: str | None = None,
        batch: int = 64,
        max_deliver: int = 20,
        ack_wait_s: float = 30.0,
        nak_delay_s: float = 1.0,
    ) -> None:
        """Starts a durable pull consumer per subject, running in the background.

        Each message is decoded to its proto type (by the ``Openforge-Type``
        header) and handed to ``handler`` inside a span continuing the
        publisher's trace, or, with ``batch_handler``, every decoded message of
        one fetch at once (to commit them in one transaction). Messages are
        acked only after their handler returned. A handler that raises an
        invalid-argument error (:func:`is_permanent`) has its event dead-lettered;
        any other error naks it for redelivery after ``nak_delay_s`` (doubled on each
        further failure, up to :data:`MAX_NAK_DELAY_S`), except on its
        last allowed delivery (``max_deliver``), where it is dead-lettered too rather
        than dropped by JetStream unseen. A batch that fails is retried one event at
        a time, so only the failing event is naked or dead-lettered and the others
        are applied (a batch naked whole would take its good events down with a bad
        one once their deliveries run out).

        Dead letters: an undecodable message, an unknown type (e.g. a newer
        version) or an invalid event is published as ``common.v1.DeadLetter`` on
        ``openforge.<dead_letter_domain>.v1.dead_letter`` with the reason, then
        acked, so it never crash-loops the consumer. Without a dead-letter
        domain such messages are logged and terminated.

        Args:
            durable: Durable consumer name; the position survives restarts.
            subjects: Event subjects to consume (each may be in another stream).
            types: The proto classes expected on these subjects.
            handler: ``async (message, delivery) -> None``; must be idempotent on
                ``delivery.event_id``.
            batch_handler: ``async ([(message, delivery), ...]) -> None``; used
                instead of ``handler`` when given.
            dead_letter_domain: Domain whose ``dead_letter`` subject receives rejects.
            batch: Messages fetched per pull.
            max_deliver: Deliveries after which a failing message is dead-lettered (JetStream
                itself redelivers without limit, so none is dropped unhandled).
            ack_wait_s: Seconds before an unacked message is redelivered.
            nak_delay_s: Redelivery delay after a first transient handler error, seconds.

        Raises:
            ValueError: Neither or both of ``handler`` and ``batch_handler`` given.
        """
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")
        by_name: Mapping[str, type[Message]] = {t.DESCRIPTOR.full_name: t for t in types}
        for subject in subjects:
            domain = _domain_of(subject)
            await self.ensure_stream(domain)
            name = f"{durable}-{subject.rsplit('.', 1)[-1]}".replace(".", "_")
            sub = await self.js.pull_subscribe(
                subject,
                durable=name,
                stream=stream_name(domain),
                config=ConsumerConfig(
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    max_deliver=-1,  # redelivered until handled: dead-lettered here at max_deliver
                    ack_wait=ack_wait_s,
                ),
            )
            # an existing durable keeps the max_deliver it was created with: dead-letter by that one
            info = await sub.consumer_info()
            have = info.config.max_deliver if info.config is not None else None
            server_max = have if have is not None and have > 0 else max_deliver
            loop = _PullLoop(
                self, sub, name, by_name, handler, batch_handler, dead_letter_domain, nak_delay_s, server_max
            )
            task = asyncio.create_task(loop.run(batch), name=name)
            self._tasks.append(task)
            self._consumed.add(stream_name(domain))
            log.info("nats.consumer_started", durable=name, subject=subject)
        if self._settings.purge_consumed_s and self._purger is None:
            self._purger = asyncio.create_task(self._purge_loop(self._settings.purge_consumed_s), name="purge")
            self._tasks.append(self._purger)

    async def purge_consumed(self, streams: Iterable[str] | None = None) -> int:
        """Removes the events every consumer that reads them has acknowledged.

        Per stream (default: those this bus consumes) and per subject stored in it, the events
        at or below the lowest ack floor of the consumers whose filters match the subject (NATS
        wildcards included; a consumer without a filter reads every subject) are purged. A
        subject no consumer reads (dead letters) is kept, and so is one read by a consumer with a
        finite ``max_deliver`` (JetStream moves its ack floor past a message whose deliveries ran
        out unacknowledged; this bus's consumers redeliver without limit and dead-letter in the
        application instead). Unacknowledged and naked events stay. A durable created later with
        deliver-all does not see purged events.

        Returns:
            Events removed (less any published meanwhile).
        """
        removed = 0
        for stream in sorted(self._consumed if streams is None else streams):
            consumers = await self.js.consumers_info(stream)
            if not consumers:
                continue
            info = await self.js.stream_info(stream, subjects_filter=">")
            for subject in sorted(info.state.subjects or {}):
                readers = [c for c in consumers if _reads(c, subject)]
                if not readers or any(_may_drop(c) for c in readers):
                    continue
                floor = min(c.ack_floor.stream_seq if c.ack_floor is not None else 0 for c in readers)
                if floor > 0:
                    await self.js.purge_stream(stream, seq=floor + 1, subject=subject)
            removed += max(info.state.messages - (await self.js.stream_info(stream)).state.messages, 0)
        if removed:
            log.info("nats.consumed_purged", events=removed)
        return removed

    async def _purge_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await asyncio.wait_for(self.purge_consumed(), timeout=max(every_s, 10.0))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS restarting: the next round purges what this one did not
                log.warning("nats.purge_failed", error=repr(exc))

    async def close(self) -> None:
        """Stops consumers and closes the connection (every publish was already acknowledged)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._purger = None
        if self._nc is not None and not self._nc.is_closed:
            # close, not drain: every publish already waited for JetStream's ack, and draining
            # pull subscriptions with fetches outstanding can stall shutdown for its whole timeout.
            await self._nc.close()
        self._nc = None
        self._js = None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` matches one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def _reads(consumer: ConsumerInfo, subject: str) -> bool:
    cfg = consumer.config
    filters = [*(cfg.filter_subjects or []), *([cfg.filter_subject] if cfg.filter_subject else [])] if cfg else []
    return not filters or any(subject_matches(f, subject) for f in filters)


def _may_drop(consumer: ConsumerInfo) -> bool:
    """Whether JetStream may have dropped a message of this consumer unacknowledged."""
    return consumer.config is not None and (consumer.config.max_deliver or 0) > 0


class _PullLoop:
    """Fetches, decodes, dispatches and acks for one durable consumer."""

    def __init__(
        self,
        bus: EventBus,
        sub: JetStreamContext.PullSubscription,
        durable: str,
        by_name: Mapping[str, type[Message]],
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        dead_letter_domain: str | None,
        nak_delay_s: float,
        max_deliver: int = 0,
    ) -> None:
        self.max_deliver = max_deliver
        self.bus = bus
        self.sub = sub
        self.durable = durable
        self.by_name = by_name
        self.handler = handler
        self.batch_handler = batch_handler
        self.dead_domain = dead_letter_domain
        self.nak_delay_s = nak_delay_s

    async def run(self, batch: int) -> None:
        """Fetches and dispatches until cancelled or the connection closes.

        An unexpected error never ends the loop silently: it is logged, and the
        loop goes on after a short pause (unacked messages are redelivered
        after the consumer's ack wait).
        """
        while True:
            try:
                await self._once(batch)
            except (nats.errors.TimeoutError, TimeoutError):  # no message within the fetch timeout
                continue
            except (nats.errors.ConnectionClosedError, asyncio.CancelledError):
                return
            except Exception:
                log.exception("nats.consumer_error", durable=self.durable)
                await asyncio.sleep(1.0)

    async def _once(self, batch: int) -> None:
        msgs = await self.sub.fetch(batch, timeout=5.0)
        decoded: list[tuple[Any, Message, Delivery]] = []
        for msg in msgs:
            item = await self._decode(msg)
            if item is not None:
                decoded.append((msg, *item))
        if not decoded:
            return
        if self.batch_handler is not None:
            await self._dispatch_batch(decoded)
        else:
            for msg, event, delivery in decoded:
                await self._dispatch_one(msg, event, delivery)

    async def _decode(self, msg: Any) -> tuple[Message, Delivery] | None:
        headers: dict[str, str] = dict(msg.headers or {})
        meta = msg.metadata
        delivery = Delivery(
            subject=msg.subject,
            event_id=headers.get(MSG_ID_HEADER, ""),
            num_delivered=meta.num_delivered,
            stream_sequence=meta.sequence.stream,
            context=extract_context(headers),
            data=msg.data,
        )
        type_name = headers.get(TYPE_HEADER, "")
        cls = self.by_name.get(type_name)
        if cls is None:
            await self._reject(msg, delivery, type_name, f"unknown event type {type_name!r}")
            return None
        try:
            event = cls.FromString(msg.data)
        except DecodeError as exc:
            await self._reject(msg, delivery, type_name, f"undecodable {type_name}: {exc}")
            return None
        return event, delivery

    async def _reject(self, msg: Any, delivery: Delivery, type_name: str, reason: str) -> None:
        log.error("event.dead_lettered", subject=delivery.subject, event_id=delivery.event_id, reason=reason)
        if self.dead_domain is None:
            await msg.term()
            return
        stream = msg.metadata.stream
        dead = common_pb2.DeadLetter(
            event_id=f"dead/{stream}/{delivery.stream_sequence}",
            subject=delivery.subject,
            original_event_id=delivery.event_id,
            original_type=type_name,
            reason=reason,
            data=msg.data,
            consumer=self.durable,
        )
        subject = subject_for(self.dead_domain, "dead_letter")
        try:
            await self.bus.publish(subject, dead, event_id=dead.event_id)
        except MessageTooLarge:  # the event itself was near the limit: keep the letter without it
            dead.data = b""
            dead.reason += f" (the event's {len(msg.data)} bytes are not kept: too large for a dead letter)"
            await self.bus.publish(subject, dead, event_id=dead.event_id)
        await msg.ack()

    async def _dispatch_one(self, msg: Any, event: Message, delivery: Delivery) -> None:
        with tracer.start_as_current_span(
            f"process {msg.subject}", context=delivery.context, kind=trace.SpanKind.CONSUMER
        ):
            try:
                if self.handler is not None:
                    await self.handler(event, delivery)
                else:
                    assert self.batch_handler is not None
                    await self.batch_handler([(event, delivery)])
            except Exception as exc:
                if is_permanent(exc):
                    await self._reject(msg, delivery, event.DESCRIPTOR.full_name, str(exc))
                    return
                if self.max_deliver > 0 and delivery.num_delivered >= self.max_deliver:
                    reason = f"still failing after {delivery.num_delivered} deliveries: {type(exc).__name__}: {exc}"
                    await self._reject(msg, delivery, event.DESCRIPTOR.full_name, reason)
                    return
                log.exception(
                    "event.handler_failed",
                    subject=msg.subject,
                    event_id=delivery.event_id,
                    num_delivered=delivery.num_delivered,
                )
                await msg.nak(delay=self.nak_delay(delivery.num_delivered))
                return
            await msg.ack()

    def nak_delay(self, num_delivered: int) -> float:
        """Redelivery delay after the ``num_delivered``-th delivery failed: ``nak_delay_s``
        doubled each time, at most :data:`MAX_NAK_DELAY_S`, so that the deliveries JetStream
        allows span an outage (20 deliveries from 1 s: about 15 minutes), not 20 seconds."""
        return doubling_delay(self.nak_delay_s, max(num_delivered - 1, 0), MAX_NAK_DELAY_S)

    async def _dispatch_batch(self, items: list[tuple[Any, Message, Delivery]]) -> None:
        assert self.batch_handler is not None
        if len(items) == 1:
            await self._dispatch_one(*items[0])
            return
        links = [trace.Link(trace.get_current_span(d.context).get_span_context()) for _, _, d in items if d.context]
        try:
            with tracer.start_as_current_span(
                f"process {len(items)} events", kind=trace.SpanKind.CONSUMER, links=links
            ):
                await self.batch_handler([(e, d) for _, e, d in items])
        except Exception as exc:
            log.warning("event.batch_failed", events=len(items), error=type(exc).__name__, permanent=is_permanent(exc))
            for msg, event, delivery in items:  # find the failing events: one at a time
                await self._dispatch_one(msg, event, delivery)
            return
        for msg, _, _ in items:
            await msg.ack()
