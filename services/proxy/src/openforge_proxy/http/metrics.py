"""The proxy's Prometheus metrics of its harness-facing HTTP server.

``openforge_proxy_http_responses_total{route, status, harness}`` counts every answer (``route``
is the API route's suffix, e.g. ``/messages``, ``/chat/completions``, ``/responses``, or
``other``; ``status`` the HTTP status sent, 499 when the client left before any; ``harness`` the
harness of the session the request's key names, as the orchestrator gave it at CreateSession,
empty without a known key), so refused calls show up by harness and cause (400 bad request, 401
no key, 413 too large, 408 too slow, 429/503 no capacity...);
``openforge_proxy_http_request_seconds{route}`` is the histogram of the time from the request's
headers to the handler's end (for a stream, its last byte). The sessions
(:class:`SessionCollector`): ``openforge_proxy_sessions{state}`` held now (``open``, and the
``closed`` / ``expired`` ones kept for a late client) and
``openforge_proxy_sessions_ended_total{how}`` (``closed``: the rollout ended;
``expired``: reclaimed by the sweep after its key's lifetime). Served with the process and gRPC
metrics (:mod:`openforge_core.metrics`) when ``OPENFORGE_METRICS__PORT`` is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from openforge_proxy.domain.sessions import SessionRegistry, SessionState

#: Bucket bounds of ``openforge_proxy_http_request_seconds``, seconds.
REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class HttpMetrics:
    """The HTTP server's counter and histogram, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter(
            "openforge_proxy_http_responses_total",
            "Harness-facing HTTP answers, by route, status and harness.",
            ("route", "status", "harness"),
            registry=registry,
        )
        self.seconds = Histogram(
            "openforge_proxy_http_request_seconds",
            "Harness-facing HTTP request time, headers to the handler's end, seconds.",
            ("route",),
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )

    def observe(self, route: str, status: int, seconds: float, harness: str = "") -> None:
        """Counts one answer."""
        self.responses.labels(route, str(status), harness).inc()
        self.seconds.labels(route).observe(seconds)


@cache
def default_http_metrics() -> HttpMetrics:
    """The process's one set of HTTP metrics, in ``prometheus_client``'s default registry."""
    return HttpMetrics(REGISTRY)


class SessionCollector(Collector):
    """The sessions' figures, read from the watched :class:`SessionRegistry` at scrape time
    (none before :meth:`watch`)."""

    def __init__(self) -> None:
        self._sessions: SessionRegistry | None = None

    def watch(self, sessions: SessionRegistry) -> None:
        """Reads ``sessions`` from now on (the app's registry; a new app replaces the old)."""
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        held = GaugeMetricFamily("openforge_proxy_sessions", "Sessions held now, by state.", labels=["state"])
        ended = CounterMetricFamily(
            "openforge_proxy_sessions_ended", "Sessions ended, by how (closed or expired).", labels=["how"]
        )
        if self._sessions is not None:
            now = self._sessions.held()
            for state in SessionState:
                held.add_metric([state.value], now[state])
            for state in (SessionState.CLOSED, SessionState.EXPIRED):
                ended.add_metric([state.value], self._sessions.ended_total[state])
        yield held
        yield ended


@cache
def default_session_collector() -> SessionCollector:
    """The process's one :class:`SessionCollector`, in ``prometheus_client``'s default registry."""
    collector = SessionCollector()
    REGISTRY.register(collector)
    return collector
