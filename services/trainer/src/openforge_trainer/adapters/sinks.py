"""Where step metrics go besides WatchMetrics: TensorBoard event files, the event bus and
Prometheus gauges."""

from __future__ import annotations

import asyncio
import importlib
from functools import cache
from pathlib import Path
from typing import Any

import structlog
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from openforge.trainer.v1 import events_pb2
from openforge_core.events import EventBus, subject_for

log = structlog.get_logger(__name__)


class TensorBoardSink:
    """Writes every metric as a scalar (tag = metric name, global step = step) with
    ``tensorboardX.SummaryWriter`` into ``<root>/<run_id>/``.

    Args:
        root: Directory of the runs' event files.

    Raises:
        ImportError: tensorboardX (requirements/trainer-cpu.txt) is not installed.
    """

    def __init__(self, root: Path) -> None:
        self._module: Any = importlib.import_module("tensorboardX")
        self._root = root
        self._writers: dict[str, Any] = {}

    def _writer(self, run_id: str) -> Any:
        if run_id not in self._writers:
            self._writers[run_id] = self._module.SummaryWriter(logdir=str(self._root / run_id), flush_secs=5)
        return self._writers[run_id]

    def _write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        writer = self._writer(run_id)
        for name, value in sorted(metrics.items()):
            writer.add_scalar(name, value, global_step=step, walltime=time_s)
        writer.flush()

    async def write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        """Adds the step's scalars and flushes."""
        await asyncio.to_thread(self._write, run_id, step, metrics, time_s)

    async def close(self) -> None:
        """Closes every writer."""
        for writer in self._writers.values():
            await asyncio.to_thread(writer.close)
        self._writers.clear()


class EventSink:
    """Publishes ``openforge.trainer.v1.step_completed`` (the store records the run's metrics
    from it).

    Args:
        bus: A connected event bus.
    """

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    async def write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        """Publishes one ``StepCompleted`` (de-duplicated per run and step)."""
        when = Timestamp()
        when.FromNanoseconds(int(time_s * 1e9))
        event = events_pb2.StepCompleted(
            event_id=f"step/{run_id}/{step}",
            run_id=run_id,
            step=step,
            policy_version=int(metrics.get("policy_version", step)),
            metrics=metrics,
            time=when,
        )
        await self._bus.publish(subject_for("trainer", "step_completed"), event, event_id=event.event_id)

    async def close(self) -> None:
        """Nothing to release (the bus belongs to the app)."""


class PrometheusSink:
    """The last step's metrics as Prometheus gauges, served with the trainer's process and gRPC
    metrics (:mod:`openforge_core.metrics`), so a dashboard shows reward beside the services'
    figures (``deploy/grafana``):

    * ``openforge_train_step{run_id}``: the run's last finished step;
    * ``openforge_train_metric{run_id, metric}``: each of that step's metrics under its own name
      (``reward/mean``, ``rollouts/excluded/failed``, ``time/train_s``...; the names are not
      Prometheus names, hence a label).

    A name the last step did not report keeps its older value (a step without an evaluation keeps
    the last ``eval/...``).

    Args:
        registry: Where the gauges live (the process's default registry in the service).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._step = Gauge("openforge_train_step", "The run's last finished step.", ("run_id",), registry=registry)
        self._metric = Gauge(
            "openforge_train_metric",
            "A metric of the run's last finished step (WatchMetrics names).",
            ("run_id", "metric"),
            registry=registry,
        )

    async def write(self, run_id: str, step: int, metrics: dict[str, float], time_s: float) -> None:
        """Sets the run's gauges to this step."""
        self._step.labels(run_id).set(step)
        for name, value in metrics.items():
            self._metric.labels(run_id, name).set(value)

    async def close(self) -> None:
        """Nothing to release (the gauges stay until the process ends)."""


@cache
def default_prometheus_sink() -> PrometheusSink:
    """The process's one :class:`PrometheusSink`, in ``prometheus_client``'s default registry."""
    return PrometheusSink(REGISTRY)
