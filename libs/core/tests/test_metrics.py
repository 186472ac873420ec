"""Prometheus metrics: the gRPC server's calls counted by code, the GPUs, and the ``/metrics`` endpoint."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.errors import NotFound
from openforge_core.metrics import GpuCollector, GrpcServerMetrics, load_nvml, start_metrics_endpoint
from openforge_core.rpc.client import open_channel
from openforge_core.rpc.server import GrpcServer
from openforge_core.settings import GrpcServerSettings, MetricsSettings

SERVICE = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name


class Orchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """GetRollout answers, fails as not found, or crashes; WatchRollouts streams two events."""

    async def GetRollout(self, request: Any, context: Any) -> orchestrator_pb2.GetRolloutResponse:
        if request.rollout_id == "missing":
            raise NotFound("no such rollout")
        if request.rollout_id == "crash":
            raise RuntimeError("bug")
        return orchestrator_pb2.GetRolloutResponse()

    async def SubmitRollouts(self, request: Any, context: Any) -> orchestrator_pb2.SubmitRolloutsResponse:
        raise NotImplementedError

    async def CancelRollout(self, request: Any, context: Any) -> orchestrator_pb2.CancelRolloutResponse:
        raise NotImplementedError

    async def CancelGroup(self, request: Any, context: Any) -> orchestrator_pb2.CancelGroupResponse:
        raise NotImplementedError

    async def WatchRollouts(self, request: Any, context: Any) -> AsyncIterator[orchestrator_pb2.WatchRolloutsResponse]:
        for _ in range(2):
            yield orchestrator_pb2.WatchRolloutsResponse()


@pytest.fixture
async def served() -> Any:
    registry = CollectorRegistry()
    srv = GrpcServer(
        GrpcServerSettings(port=0, graceful_shutdown_s=0.5),
        [SERVICE],
        [lambda s: orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(Orchestrator(), s)],
        metrics=GrpcServerMetrics(registry),
    )
    port = await srv.start()
    yield registry, f"127.0.0.1:{port}"
    await srv.stop()


async def test_calls_are_counted_by_method_and_the_code_the_client_got(served: Any) -> None:
    registry, address = served
    async with open_channel(address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        for _ in range(2):
            await stub.GetRollout(orchestrator_pb2.GetRolloutRequest(rollout_id="r1"))
        for rid, code in (("missing", grpc.StatusCode.NOT_FOUND), ("crash", grpc.StatusCode.INTERNAL)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetRollout(orchestrator_pb2.GetRolloutRequest(rollout_id=rid))
            assert info.value.code() == code
        assert len([m async for m in stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest())]) == 2

    def value(name: str, method: str, kind: str = "unary", **extra: str) -> float | None:
        labels = {"grpc_type": kind, "grpc_service": SERVICE, "grpc_method": method, **extra}
        found: float | None = registry.get_sample_value(name, labels)
        return found

    assert value("grpc_server_started_total", "GetRollout") == 4
    assert value("grpc_server_handled_total", "GetRollout", grpc_code="OK") == 2
    assert value("grpc_server_handled_total", "GetRollout", grpc_code="NOT_FOUND") == 1
    assert value("grpc_server_handled_total", "GetRollout", grpc_code="INTERNAL") == 1
    assert value("grpc_server_handling_seconds_count", "GetRollout") == 4
    assert value("grpc_server_handled_total", "WatchRollouts", "server_stream", grpc_code="OK") == 1


def test_the_endpoint_serves_the_registry_in_the_prometheus_format() -> None:
    registry = CollectorRegistry()
    Gauge("openforge_test_depth", "A queue depth.", registry=registry).set(3)
    assert start_metrics_endpoint(MetricsSettings(), registry) is None  # no port: no endpoint
    endpoint = start_metrics_endpoint(MetricsSettings(port=0), registry)
    assert endpoint is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["openforge_test_depth"].samples[0].value == 3
        taken = start_metrics_endpoint(MetricsSettings(port=endpoint.port), registry)
        assert taken is None  # a port in use is logged, not fatal
    finally:
        endpoint.close()


def test_the_gpus_are_read_from_nvml_and_served_empty_without_one() -> None:
    """On a machine without an NVIDIA driver (NVML cannot start) the four families are there with
    no samples; with one, a sample per GPU."""
    registry = CollectorRegistry()
    nvml = load_nvml()
    registry.register(GpuCollector(nvml))
    endpoint = start_metrics_endpoint(MetricsSettings(port=0), registry)
    assert endpoint is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=5) as resp:
            families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    finally:
        endpoint.close()
    names = ("utilization_ratio", "memory_used_bytes", "memory_total_bytes", "process_memory_bytes")
    gpu = {n: families[f"openforge_gpu_{n}"].samples for n in names}
    if nvml is None:
        assert all(samples == [] for samples in gpu.values()), gpu
        return
    count = nvml.nvmlDeviceGetCount()
    assert all(len(samples) == count for samples in gpu.values()), gpu
    for used, total in zip(gpu["memory_used_bytes"], gpu["memory_total_bytes"], strict=True):
        assert 0 <= used.value <= total.value and total.value > 2**30
    assert all(0 <= s.value <= 1 for s in gpu["utilization_ratio"])
