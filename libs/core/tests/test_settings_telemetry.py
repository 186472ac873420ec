"""Settings from the environment; JSON logs carrying trace ids."""

from __future__ import annotations

import json
import logging
from typing import ClassVar

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from openforge_core.settings import ServiceSettings
from openforge_core.telemetry import configure_logging, extract_context, inject_context


class DemoSettings(ServiceSettings):
    service_name: ClassVar[str] = "demo"
    model_name: str = "m"


def test_nested_env_vars_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_GRPC__PORT", "6001")
    monkeypatch.setenv("OPENFORGE_NATS__URL", "nats://nats:4222")
    monkeypatch.setenv("OPENFORGE_SERVICES__TRAJECTORY_STORE", "store:50051")
    monkeypatch.setenv("OPENFORGE_MODEL_NAME", "tiny")
    s = DemoSettings()
    assert s.grpc.port == 6001
    assert s.nats.url == "nats://nats:4222"
    assert s.services.trajectory_store == "store:50051"
    assert s.model_name == "tiny"


def test_bad_values_and_unknown_fields_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_GRPC__PORT", "70000")
    with pytest.raises(ValidationError):
        DemoSettings()
    monkeypatch.delenv("OPENFORGE_GRPC__PORT")
    with pytest.raises(ValidationError):
        DemoSettings(unknown_field=1)  # type: ignore[call-arg]


def test_json_logs_carry_service_and_trace_ids(capsys: pytest.CaptureFixture[str]) -> None:
    trace.set_tracer_provider(TracerProvider())
    configure_logging("demo", "info", json_output=True)
    log = structlog.get_logger("t")
    with trace.get_tracer("t").start_as_current_span("s") as span:
        log.info("rollout.finished", rollout_id="r1", reward=1.0)
        logging.getLogger("stdlib").warning("from stdlib")
        trace_id = format(span.get_span_context().trace_id, "032x")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    by_event = {line["event"]: line for line in lines}
    assert by_event["rollout.finished"]["rollout_id"] == "r1"
    assert by_event["rollout.finished"]["service"] == "demo"
    assert by_event["rollout.finished"]["trace_id"] == trace_id
    assert by_event["from stdlib"]["trace_id"] == trace_id
    assert by_event["from stdlib"]["level"] == "warning"


def test_traceparent_round_trip() -> None:
    trace.set_tracer_provider(TracerProvider())
    with trace.get_tracer("t").start_as_current_span("s") as span:
        headers: dict[str, str] = {}
        inject_context(headers)
    assert headers["traceparent"].split("-")[1] == format(span.get_span_context().trace_id, "032x")
    ctx = extract_context(headers)
    assert trace.get_current_span(ctx).get_span_context().trace_id == span.get_span_context().trace_id
