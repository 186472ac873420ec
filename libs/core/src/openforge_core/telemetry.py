"""Logging and tracing, configured once from ``main``.

* Logs: structlog, one JSON object per line on stderr, with ``service``,
  ``trace_id`` and ``span_id`` (from the current OpenTelemetry span) on every
  line; stdlib ``logging`` records are routed through the same processors.
  Event names are constant strings, data goes in fields:
  ``log.info("rollout.finished", rollout_id=..., reward=...)``.
* Traces: an OpenTelemetry ``TracerProvider`` with the service name as
  resource. Spans are exported over OTLP when the standard
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) variable is set;
  otherwise they are only used for ids in logs and propagation.
* Propagation: W3C ``traceparent`` (https://www.w3.org/TR/trace-context/) in
  gRPC metadata (by the OpenTelemetry gRPC interceptors) and in NATS message
  headers (:func:`inject_context` / :func:`extract_context`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _add_trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


def configure_logging(service: str, level: str = "info", *, json_output: bool = True) -> None:
    """Routes structlog and stdlib logging to stderr with trace ids.

    Args:
        service: Service name added to every line as ``service``.
        level: ``debug``, ``info``, ``warning`` or ``error``.
        json_output: JSON lines when true, human console lines otherwise.
    """
    lvl = _LEVELS[level]
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
        structlog.processors.CallsiteParameterAdder({structlog.processors.CallsiteParameter.MODULE}),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)


def configure_tracing(service: str) -> TracerProvider:
    """Installs the global tracer provider for this process.

    Args:
        service: ``service.name`` resource attribute.

    Returns:
        The provider; call ``shutdown()`` on it at exit to flush spans.
    """
    global _exporting
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _exporting = True
    trace.set_tracer_provider(provider)
    return provider


_exporting = False


def exporting_spans() -> bool:
    """Whether :func:`configure_tracing` set up an exporter (spans leave the process)."""
    return _exporting


def inject_context(headers: MutableMapping[str, str]) -> None:
    """Writes the current trace context (``traceparent``) into message headers."""
    propagate.inject(headers)


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    """Reads a trace context from message headers (empty context if none)."""
    return propagate.extract(dict(headers or {}))


@contextmanager
def use_context(ctx: otel_context.Context | None) -> Iterator[None]:
    """Runs a block under a trace context (e.g. one extracted from an event's headers)."""
    if ctx is None:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)
