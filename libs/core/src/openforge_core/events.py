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
  span whose parent is the publisher's, so one rollout is one trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import nats
import structlog
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import trace

from openforge_core.settings import NatsSettings
from openforge_core.telemetry import extract_context, inject_context

log = structlog.get_logger(__name__)
tracer = trace.get_tracer("openforge_core.events")

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
    """

    subject: str
    event_id: str
    num_delivered: int
    stream_sequence: int


Handler = Callable[[Message, Delivery], Awaitable[None]]


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

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("EventBus.connect() was not called")
        return self._js

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

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
        config = StreamConfig(
            name=name,
            subjects=[f"openforge.{domain}.v1.>"],
            storage=StorageType.FILE,
            num_replicas=self._settings.stream_replicas,
            duplicate_window=DUPLICATE_WINDOW.total_seconds(),
        )
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            await self.js.add_stream(config)
            log.info("nats.stream_created", stream=name)
        self._streams.add(name)

    async def publish(self, subject: str, message: Message, *, event_id: str) -> bool:
        """Publishes one event and waits for JetStream's acknowledgement.

        Args:
            subject: ``openforge.<domain>.v1.<event>``.
            message: The event proto.
            event_id: De-duplication id (``Nats-Msg-Id``); stable across retries.

        Returns:
            True when stored, False when JetStream dropped it as a duplicate.

        Raises:
            ValueError: ``subject`` is not an openforge event subject, or ``event_id`` is empty.
            nats.errors.TimeoutError: No acknowledgement in time (safe to retry: de-duplicated).
        """
        if not event_id:
            raise ValueError("event_id must not be empty")
        await self.ensure_stream(_domain_of(subject))
        with tracer.start_as_current_span(f"publish {subject}", kind=trace.SpanKind.PRODUCER):
            headers = {TYPE_HEADER: message.DESCRIPTOR.full_name, MSG_ID_HEADER: event_id}
            inject_context(headers)
            ack = await self.js.publish(subject, message.SerializeToString(), headers=headers)
        log.info("event.published", subject=subject, event_id=event_id, duplicate=bool(ack.duplicate))
        return not ack.duplicate

    async def consume(
        self,
        durable: str,
        subjects: Iterable[str],
        types: Iterable[type[Message]],
        handler: Handler,
        *,
        batch: int = 64,
        max_deliver: int = 20,
        ack_wait_s: float = 30.0,
        nak_delay_s: float = 1.0,
    ) -> None:
        """Starts a durable pull consumer per subject, running in the background.

        Each message is decoded to its proto type (by the ``Openforge-Type``
        header), handed to ``handler`` inside a span continuing the publisher's
        trace, acked after ``handler`` returns and nak'ed (redelivered after
        ``nak_delay_s``) when it raises. Undecodable messages are terminated
        (never redelivered) and logged.

        Args:
            durable: Durable consumer name; the position survives restarts.
            subjects: Event subjects to consume (each may be in another stream).
            types: The proto classes expected on these subjects.
            handler: ``async (message, delivery) -> None``; must be idempotent on
                ``delivery.event_id``.
            batch: Messages fetched per pull.
            max_deliver: Deliveries before JetStream gives up on a message.
            ack_wait_s: Seconds before an unacked message is redelivered.
            nak_delay_s: Redelivery delay after a handler error, seconds.
        """
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
                    max_deliver=max_deliver,
                    ack_wait=ack_wait_s,
                ),
            )
            task = asyncio.create_task(self._pull_loop(sub, by_name, handler, batch, nak_delay_s), name=name)
            self._tasks.append(task)
            log.info("nats.consumer_started", durable=name, subject=subject)

    async def _pull_loop(
        self,
        sub: JetStreamContext.PullSubscription,
        by_name: Mapping[str, type[Message]],
        handler: Handler,
        batch: int,
        nak_delay_s: float,
    ) -> None:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=5.0)
            except nats.errors.TimeoutError:
                continue
            except (nats.errors.ConnectionClosedError, asyncio.CancelledError):
                return
            for msg in msgs:
                await self._handle(msg, by_name, handler, nak_delay_s)

    async def _handle(
        self, msg: Any, by_name: Mapping[str, type[Message]], handler: Handler, nak_delay_s: float
    ) -> None:
        headers: dict[str, str] = dict(msg.headers or {})
        meta = msg.metadata
        delivery = Delivery(
            subject=msg.subject,
            event_id=headers.get(MSG_ID_HEADER, ""),
            num_delivered=meta.num_delivered,
            stream_sequence=meta.sequence.stream,
        )
        cls = by_name.get(headers.get(TYPE_HEADER, ""))
        if cls is None:
            log.error("event.unknown_type", subject=msg.subject, type=headers.get(TYPE_HEADER))
            await msg.term()
            return
        try:
            event = cls.FromString(msg.data)
        except DecodeError:
            log.error("event.undecodable", subject=msg.subject, event_id=delivery.event_id)
            await msg.term()
            return
        parent = extract_context(headers)
        with tracer.start_as_current_span(
            f"process {msg.subject}", context=parent, kind=trace.SpanKind.CONSUMER
        ):
            try:
                await handler(event, delivery)
            except Exception:
                log.exception(
                    "event.handler_failed",
                    subject=msg.subject,
                    event_id=delivery.event_id,
                    num_delivered=delivery.num_delivered,
                )
                await msg.nak(delay=nak_delay_s)
                return
            await msg.ack()

    async def close(self) -> None:
        """Stops consumers and drains the connection (pending publishes are flushed)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self._nc = None
        self._js = None
