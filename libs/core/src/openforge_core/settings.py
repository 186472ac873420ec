"""Settings shared by every service, read once in ``main`` from the environment.

Every service defines one ``BaseSettings`` subclass of :class:`ServiceSettings`.
Environment variables use the prefix ``OPENFORGE_`` and ``__`` between nested
fields, e.g. ``OPENFORGE_GRPC__PORT=50051`` or ``OPENFORGE_NATS__URL=nats://nats:4222``.
Unknown fields are refused (``extra="forbid"``). Telemetry export uses the
standard ``OTEL_*`` variables, read by OpenTelemetry itself.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "OPENFORGE_"
ENV_NESTED_DELIMITER = "__"


class SettingsSection(BaseModel):
    """Base of every settings section and config block: unknown fields are refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class GrpcServerSettings(SettingsSection):
    """Where and how a service serves gRPC.

    Attributes:
        host: Interface to bind; ``127.0.0.1`` on one machine, ``0.0.0.0`` in a container.
        port: TCP port; 0 picks a free port (the bound port is logged and returned).
        graceful_shutdown_s: Seconds in-flight RPCs get to finish after SIGTERM.
        max_message_bytes: Largest message accepted or sent, in bytes.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    graceful_shutdown_s: float = Field(default=10.0, ge=0)
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)


class NatsSettings(SettingsSection):
    """The NATS JetStream connection.

    Attributes:
        url: Server URL, e.g. ``nats://127.0.0.1:4222``.
        connect_timeout_s: Seconds to wait for each connection attempt.
        stream_replicas: JetStream replicas of the streams this service creates.
        publish_retry_s: How long an event (``EventBus.publish``) is sent again while JetStream
            does not acknowledge it (NATS restarting), seconds, with backoff; safe, as events are
            de-duplicated by id. 0 = one try. Call records (``publish_bytes``) are tried once:
            the harness retries the call.
        stream_max_bytes: Size at which a stream this service creates refuses new events
            (discard ``new``: nothing stored is ever dropped to make room; a refused call record
            is answered 503). Events leave the stream by ``stream_max_age_s`` or, once every
            consumer acknowledged them, by ``purge_consumed_s``; in a stream nobody consumes the
            limit is a lifetime cap (then every publish fails until it is raised). 0 = no limit.
        stream_max_age_s: Age after which events are removed whether consumed or not, seconds
            (the one limit that can drop an event the store never read: set it well above the
            longest time the store may be down). 0 = no limit.
        purge_consumed_s: How often a consuming service removes from its streams the events
            every consumer of their subject has acknowledged (below each subject's lowest ack
            floor; subjects nobody consumes, dead letters included, are kept), seconds. 0 = never.
    """

    url: str = "nats://127.0.0.1:4222"
    connect_timeout_s: float = Field(default=5.0, gt=0)
    stream_replicas: int = Field(default=1, ge=1, le=5)
    publish_retry_s: float = Field(default=120.0, ge=0)
    stream_max_bytes: int = Field(default=0, ge=0)
    stream_max_age_s: float = Field(default=0.0, ge=0)
    purge_consumed_s: float = Field(default=60.0, ge=0)


class LogSettings(SettingsSection):
    """Logging.

    Attributes:
        level: Minimum level.
        format: ``json`` (one JSON object per line) or ``console`` (for people).
    """

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class MetricsSettings(SettingsSection):
    """Where a service serves its Prometheus metrics (``GET /metrics``).

    Attributes:
        host: Interface to bind; ``0.0.0.0`` in a container for the cluster's scraper.
        port: TCP port; 0 picks a free one (logged as ``metrics.started``); unset: no endpoint.
    """

    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)


class ServiceAddresses(SettingsSection):
    """``host:port`` of each service's gRPC endpoint, as seen by this service."""

    proxy: str = "127.0.0.1:50051"
    orchestrator: str = "127.0.0.1:50052"
    trajectory_store: str = "127.0.0.1:50053"
    inference: str = "127.0.0.1:50054"
    trainer: str = "127.0.0.1:50055"


class ServiceSettings(BaseSettings):
    """Base of every service's settings: gRPC, NATS, logs, metrics, peer addresses.

    Subclasses add their own fields and set ``service_name``.
    """

    service_name: ClassVar[str] = "openforge"

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    grpc: GrpcServerSettings = GrpcServerSettings()
    nats: NatsSettings = NatsSettings()
    log: LogSettings = LogSettings()
    metrics: MetricsSettings = MetricsSettings()
    services: ServiceAddresses = ServiceAddresses()
