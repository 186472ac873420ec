"""The gRPC kit against a real in-process server: errors, health, reflection, deadlines, retries."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.errors import InvalidArgument, NotFound, Unavailable
from openforge_core.rpc.client import open_channel
from openforge_core.rpc.server import GrpcServer
from openforge_core.settings import GrpcServerSettings

SERVICE = proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"].full_name


class ScriptedProxy(proxy_pb2_grpc.ProxyServiceServicer):
    """Each method fails in a chosen way, counting its calls."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.unavailable_first = 0
        self.sleep_s = 0.0

    def _count(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    async def CreateSession(self, request: Any, context: Any) -> proxy_pb2.CreateSessionResponse:
        n = self._count("CreateSession")
        if n <= self.unavailable_first:
            raise Unavailable("not yet")
        if not request.rollout_id:
            raise InvalidArgument.field("rollout_id", "must not be empty", reason="EMPTY_ROLLOUT_ID")
        raise RuntimeError("secret internal detail")

    async def GetSession(self, request: Any, context: Any) -> proxy_pb2.GetSessionResponse:
        n = self._count("GetSession")
        if n <= self.unavailable_first:
            raise Unavailable("not yet")
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        if request.rollout_id == "missing":
            raise NotFound("no such rollout", metadata={"rollout_id": "missing"})
        return proxy_pb2.GetSessionResponse(session=proxy_pb2.Session(rollout_id=request.rollout_id))

    async def CloseSession(self, request: Any, context: Any) -> proxy_pb2.CloseSessionResponse:
        raise NotImplementedError


@pytest.fixture
async def server() -> Any:
    servicer = ScriptedProxy()
    srv = GrpcServer(
        GrpcServerSettings(port=0, graceful_shutdown_s=0.5),
        [SERVICE],
        [lambda s: proxy_pb2_grpc.add_ProxyServiceServicer_to_server(servicer, s)],
    )
    port = await srv.start()
    yield srv, servicer, f"127.0.0.1:{port}"
    await srv.stop()


async def test_domain_error_becomes_status_with_rich_details(server: Any) -> None:
    _, _, address = server
    async with open_channel(address) as channel:
        stub = proxy_pb2_grpc.ProxyServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateSession(proxy_pb2.CreateSessionRequest())
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "rollout_id: must not be empty"
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    kinds = {d.type_url.rsplit("/", 1)[-1]: d for d in status.details}
    info_msg = error_details_pb2.ErrorInfo()
    kinds["google.rpc.ErrorInfo"].Unpack(info_msg)
    assert info_msg.reason == "EMPTY_ROLLOUT_ID"
    assert info_msg.domain == "openforge.dev"
    bad = error_details_pb2.BadRequest()
    kinds["google.rpc.BadRequest"].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [("rollout_id", "must not be empty")]


async def test_not_found_keeps_metadata_and_internal_errors_do_not_leak(server: Any) -> None:
    _, _, address = server
    async with open_channel(address) as channel:
        stub = proxy_pb2_grpc.ProxyServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as nf:
            await stub.GetSession(proxy_pb2.GetSessionRequest(rollout_id="missing"))
        with pytest.raises(grpc.aio.AioRpcError) as internal:
            await stub.CreateSession(proxy_pb2.CreateSessionRequest(rollout_id="r1"))
    assert nf.value.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(nf.value)  # type: ignore[arg-type]
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert dict(info.metadata) == {"rollout_id": "missing"}
    assert internal.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (internal.value.details() or "")
    assert "RuntimeError" in (internal.value.details() or "")


async def test_unbuilt_method_answers_unimplemented(server: Any) -> None:
    _, _, address = server
    async with open_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await proxy_pb2_grpc.ProxyServiceStub(channel).CloseSession(proxy_pb2.CloseSessionRequest())
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_follows_readiness_and_shutdown(server: Any) -> None:
    srv, _, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=name))  # type: ignore[attr-defined]
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await srv.set_serving(True)
        for name in ("", SERVICE):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=name))  # type: ignore[attr-defined]
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))  # type: ignore[attr-defined]
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        await srv.set_serving(False)
        second = await watch.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()


async def test_reflection_lists_services(server: Any) -> None:
    _, _, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = set()
        async for resp in call:
            names = {s.name for s in resp.list_services_response.service}
            break
    assert {SERVICE, "grpc.health.v1.Health"} <= names


async def test_client_sets_a_default_deadline(server: Any) -> None:
    _, servicer, address = server
    servicer.sleep_s = 2.0
    async with open_channel(address, default_timeout_s=0.2) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await proxy_pb2_grpc.ProxyServiceStub(channel).GetSession(proxy_pb2.GetSessionRequest(rollout_id="x"))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_retries_only_idempotent_methods(server: Any) -> None:
    _, servicer, address = server
    servicer.unavailable_first = 2
    async with open_channel(address, service=SERVICE, idempotent_methods=["GetSession"]) as channel:
        stub = proxy_pb2_grpc.ProxyServiceStub(channel)
        resp = await stub.GetSession(proxy_pb2.GetSessionRequest(rollout_id="r1"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateSession(proxy_pb2.CreateSessionRequest(rollout_id="r1"))
    assert resp.session.rollout_id == "r1"
    assert servicer.calls["GetSession"] == 3
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls["CreateSession"] == 1
