"""Prometheus metrics of a service: process CPU and memory, and its gRPC server's calls.

Every service serves its metrics in the Prometheus text format over HTTP when
``OPENFORGE_METRICS__PORT`` is set (:class:`MetricsSettings`), with ``prometheus_client``:

* the process (``prometheus_client``'s process collector, from ``/proc``):
  ``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  ``process_start_time_seconds``, ``process_open_fds``...;
* the gRPC server, under the names and labels of go-grpc-prometheus
  (https://github.com/grpc-ecosystem/go-grpc-middleware, ``providers/prometheus``), so the usual
  dashboards and alerts apply: ``grpc_server_started_total``, ``grpc_server_handled_total``
  (with ``grpc_code``) and the histogram ``grpc_server_handling_seconds``, labelled
  ``grpc_type``, ``grpc_service``, ``grpc_method``. For a server-streaming method, handling
  lasts until the stream ends;
* the GPUs, from NVML (``nvidia-ml-py``) at each scrape (:class:`GpuCollector`):
  ``openforge_gpu_utilization_ratio{gpu}``, ``openforge_gpu_memory_used_bytes{gpu}``,
  ``openforge_gpu_memory_total_bytes{gpu}`` and ``openforge_gpu_process_memory_bytes{gpu}``
  (what this process holds); without a driver or GPU the families are served with no samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from openforge_core.rpc.wrap import GuardingInterceptor, wrap_handler
from openforge_core.settings import MetricsSettings

log = structlog.get_logger(__name__)

#: Bucket bounds of ``grpc_server_handling_seconds`` (go-grpc-prometheus's defaults, seconds),
#: with longer ones for the calls that wait on a model or a rollout.
HANDLING_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GrpcServerMetrics:
    """The gRPC server's counters and histogram (go-grpc-prometheus names), in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("grpc_type", "grpc_service", "grpc_method")
        self.started = Counter("grpc_server_started_total", "RPCs started on the server.", labels, registry=registry)
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure.",
            (*labels, "grpc_code"),
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Response latency (seconds) of gRPC that had been application-level handled by the server.",
            labels,
            buckets=HANDLING_BUCKETS_S,
            registry=registry,
        )


@cache
def default_grpc_metrics() -> GrpcServerMetrics:
    """The process's one set of gRPC server metrics, in ``prometheus_client``'s default registry."""
    return GrpcServerMetrics(REGISTRY)


def _code_name(context: grpc.aio.ServicerContext[Any, Any], default: grpc.StatusCode) -> str:
    code = context.code()
    if code is None:
        return default.name
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), default.name)


class MetricsInterceptor(GuardingInterceptor):
    """Counts and times every unary and server-streaming call (outermost, so the code counted is
    the one the client gets, after error mapping)."""

    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._m = metrics

    def wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        kind = (
            "unary"
            if handler.unary_unary is not None
            else "client_stream"
            if handler.stream_unary is not None
            else "server_stream"
        )
        service, _, name = method.lstrip("/").rpartition("/")
        m = self._m

        @contextlib.asynccontextmanager
        async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            m.started.labels(kind, service, name).inc()
            t0 = time.perf_counter()
            code = grpc.StatusCode.UNKNOWN.name
            try:
                yield
                code = _code_name(context, grpc.StatusCode.OK)
            except (asyncio.CancelledError, GeneratorExit):
                code = grpc.StatusCode.CANCELLED.name
                raise
            except BaseException:
                code = _code_name(context, grpc.StatusCode.UNKNOWN)
                raise
            finally:
                m.handled.labels(kind, service, name, code).inc()
                m.handling.labels(kind, service, name).observe(time.perf_counter() - t0)

        return wrap_handler(handler, observed)


def load_nvml() -> Any | None:
    """The ``pynvml`` module (``nvidia-ml-py``) after ``nvmlInit()``, or None where NVML cannot
    start (no NVIDIA driver: ``NVMLError_LibraryNotFound``; no GPU; a driver error)."""
    try:
        nvml: Any = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and its subclasses, or the import itself
        log.info("metrics.gpu_unavailable", reason=str(exc) or type(exc).__name__)
        return None
    return nvml


class GpuCollector(Collector):
    """Each GPU's utilisation and memory, read from NVML at scrape time (the figures
    ``nvidia-smi`` shows), and the memory this process holds on it.

    ``gpu`` is the NVML device index (every GPU of the machine, whatever
    ``CUDA_VISIBLE_DEVICES`` says). Process memory is matched by pid, so in a container whose pid
    namespace is not the host's it reads 0: read the device figures there.

    Args:
        nvml: An initialised ``pynvml`` module (:func:`load_nvml`), or None (no GPU: the four
            families are served empty, so a dashboard's queries stay valid).
    """

    def __init__(self, nvml: Any | None) -> None:
        self._nvml = nvml

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily(
            "openforge_gpu_utilization_ratio", "GPU busy share (0-1) over NVML's last sample period.", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "openforge_gpu_memory_used_bytes", "GPU memory in use, all processes, bytes.", labels=["gpu"]
        )
        total = GaugeMetricFamily("openforge_gpu_memory_total_bytes", "GPU memory, bytes.", labels=["gpu"])
        mine = GaugeMetricFamily(
            "openforge_gpu_process_memory_bytes", "GPU memory this process holds, bytes.", labels=["gpu"]
        )
        nvml = self._nvml
        if nvml is not None:
            try:
                for i in range(nvml.nvmlDeviceGetCount()):
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                    util.add_metric([str(i)], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
                    used.add_metric([str(i)], memory.used)
                    total.add_metric([str(i)], memory.total)
                    held = [
                        p.usedGpuMemory or 0
                        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                        if p.pid == os.getpid()
                    ]
                    mine.add_metric([str(i)], sum(held))
            except nvml.NVMLError as exc:  # a GPU fell off the bus, the driver was reloaded...
                log.warning("metrics.gpu_read_failed", error=str(exc))
        yield from (util, used, total, mine)


@cache
def register_gpu_collector(registry: CollectorRegistry = REGISTRY) -> GpuCollector:
    """Registers one :class:`GpuCollector` (over :func:`load_nvml`) in ``registry``, once."""
    collector = GpuCollector(load_nvml())
    registry.register(collector)
    return collector


@dataclass
class MetricsEndpoint:
    """A running ``/metrics`` HTTP endpoint (a daemon thread of ``prometheus_client``)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stops serving and releases the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_endpoint(settings: MetricsSettings, registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint | None:
    """Serves ``registry`` at ``http://host:port/metrics`` when ``settings.port`` is set.

    A port that cannot be bound is logged (``metrics.bind_failed``) and the service runs on
    without metrics: they are an aid, never a reason for a service not to start.

    Returns:
        The endpoint, or None (no port set, or the bind failed).
    """
    if settings.port is None:
        return None
    if registry is REGISTRY:  # the service's own endpoint: its GPUs too
        register_gpu_collector(registry)
    try:
        server, thread = start_http_server(settings.port, settings.host, registry)
    except OSError as exc:
        log.error("metrics.bind_failed", address=f"{settings.host}:{settings.port}", error=str(exc))
        return None
    endpoint = MetricsEndpoint(server, thread)
    log.info("metrics.started", address=f"{settings.host}:{endpoint.port}")
    return endpoint
