"""The orchestrator's Prometheus metrics: rollouts by harness and outcome, and its queue.

Served with the process and gRPC metrics (:mod:`openforge_core.metrics`) when
``OPENFORGE_METRICS__PORT`` is set:

* ``openforge_rollouts_submitted_total{harness}``, ``openforge_rollouts_started_total{harness}``;
* ``openforge_rollouts_finished_total{harness, status}`` (``succeeded``, ``failed``,
  ``timed_out``, ``cancelled``) and the histogram ``openforge_rollout_duration_seconds{harness,
  status}`` (start to end; a rollout cancelled before it started is counted, not timed);
* the histograms ``openforge_sandbox_cpu_seconds{harness}`` and
  ``openforge_sandbox_peak_memory_bytes{harness}``: each finished rollout's sandbox, from its
  cgroup (where one is accounted);
* ``openforge_rollouts_running`` and ``openforge_rollouts_waiting`` (accepted, waiting for a
  slot), read from the scheduler at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from openforge_orchestrator.domain.rollouts import Rollout, RolloutEvents

#: Bucket bounds of ``openforge_rollout_duration_seconds`` and ``openforge_sandbox_cpu_seconds``.
DURATION_BUCKETS_S = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)
#: Bucket bounds of ``openforge_sandbox_peak_memory_bytes``: 16 MiB to 64 GiB by fourfold steps.
MEMORY_BUCKETS_BYTES = tuple(float(16 * 2**20 * 4**i) for i in range(7))


class RolloutMetrics:
    """The orchestrator's metrics, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.submitted = Counter(
            "openforge_rollouts_submitted_total", "Rollouts accepted.", ("harness",), registry=registry
        )
        self.started = Counter(
            "openforge_rollouts_started_total", "Rollouts that got a slot and started.", ("harness",), registry=registry
        )
        self.finished = Counter(
            "openforge_rollouts_finished_total", "Rollouts ended, by status.", ("harness", "status"), registry=registry
        )
        self.duration = Histogram(
            "openforge_rollout_duration_seconds",
            "Rollout wall time from start to end, seconds.",
            ("harness", "status"),
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.sandbox_cpu = Histogram(
            "openforge_sandbox_cpu_seconds",
            "CPU time of a rollout's sandbox (its cgroup), seconds.",
            ("harness",),
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.sandbox_memory = Histogram(
            "openforge_sandbox_peak_memory_bytes",
            "Highest memory use of a rollout's sandbox (its cgroup), bytes.",
            ("harness",),
            buckets=MEMORY_BUCKETS_BYTES,
            registry=registry,
        )
        self.running = Gauge("openforge_rollouts_running", "Rollouts running now.", registry=registry)
        self.waiting = Gauge(
            "openforge_rollouts_waiting", "Rollouts accepted and waiting for a slot.", registry=registry
        )

    def watch_queue(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Reads the two gauges from these callables at each scrape."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)


@cache
def default_rollout_metrics() -> RolloutMetrics:
    """The process's one set of rollout metrics, in ``prometheus_client``'s default registry."""
    return RolloutMetrics(REGISTRY)


class MeteredRolloutEvents:
    """A :class:`RolloutEvents` that counts each fact, then hands it to ``inner``."""

    def __init__(self, inner: RolloutEvents, metrics: RolloutMetrics) -> None:
        self._inner = inner
        self._m = metrics

    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        await self._inner.submitted(request_id, rollouts)
        for r in rollouts:
            self._m.submitted.labels(r.harness).inc()

    async def started(self, rollout: Rollout) -> None:
        await self._inner.started(rollout)
        self._m.started.labels(rollout.harness).inc()

    async def finished(self, rollout: Rollout) -> None:
        await self._inner.finished(rollout)
        status = rollout.status.value
        self._m.finished.labels(rollout.harness, status).inc()
        if rollout.start_time and rollout.end_time >= rollout.start_time:
            self._m.duration.labels(rollout.harness, status).observe(rollout.end_time - rollout.start_time)
        if rollout.sandbox_cpu_s is not None:
            self._m.sandbox_cpu.labels(rollout.harness).observe(rollout.sandbox_cpu_s)
        if rollout.sandbox_peak_memory_bytes is not None:
            self._m.sandbox_memory.labels(rollout.harness).observe(rollout.sandbox_peak_memory_bytes)
