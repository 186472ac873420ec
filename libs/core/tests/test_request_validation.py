"""Requests are decoded and checked by the shared server before a handler runs: bytes that are not
the message, strings that are not UTF-8 and fields breaking the id/path/text rules are
INVALID_ARGUMENT with a BadRequest naming the field, and the handler never sees them."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core import field_rules
from openforge_core.errors import InvalidArgument
from openforge_core.protowire import len_field, varint
from openforge_core.rpc.client import open_channel
from openforge_core.rpc.server import GrpcServer
from openforge_core.rpc.validation import locate
from openforge_core.settings import GrpcServerSettings

SERVICE = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name
METHOD = f"/{SERVICE}/GetRollout"


class Recording(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """Answers every request it is handed, remembering them."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def GetRollout(self, request: Any, context: Any) -> orchestrator_pb2.GetRolloutResponse:
        self.seen.append(request)
        return orchestrator_pb2.GetRolloutResponse()

    async def SubmitRollouts(self, request: Any, context: Any) -> orchestrator_pb2.SubmitRolloutsResponse:
        self.seen.append(request)
        return orchestrator_pb2.SubmitRolloutsResponse()

    async def WatchRollouts(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        yield orchestrator_pb2.WatchRolloutsResponse()


@pytest.fixture
async def server() -> Any:
    servicer = Recording()  # type: ignore[abstract]  # CancelRollout is left unimplemented
    srv = GrpcServer(
        GrpcServerSettings(port=0, graceful_shutdown_s=0.5),
        [SERVICE],
        [lambda s: orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(servicer, s)],
    )
    port = await srv.start()
    await srv.set_serving()
    yield servicer, f"127.0.0.1:{port}"
    await srv.stop()


def _violations(err: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    out: list[tuple[str, str]] = []
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            out += [(v.field, v.description) for v in bad.field_violations]
    return out


async def _raw(address: str, payload: bytes, method: str = METHOD) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as ch:
        call: Any = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(payload, timeout=10)
    return info.value


RAW = [
    ("truncated length", b"\x0a\x05ab", "rollout_id"),
    ("bad UTF-8", len_field(1, b"\xff\xfe"), "rollout_id"),
    ("invalid wire type", b"\x0f", "rollout_id"),
    ("invalid wire type, unknown field", b"\x4f", "[field 9]"),
    ("field number 0", b"\x00\x01", "request"),
    ("truncated varint", b"\x48\xff", "[field 9]"),
]


@pytest.mark.parametrize(("name", "payload", "field"), RAW, ids=[r[0] for r in RAW])
async def test_undecodable_bytes_are_invalid_argument_naming_the_field(
    server: Any, name: str, payload: bytes, field: str
) -> None:
    servicer, address = server
    err = await _raw(address, payload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, err.code(), err.details())
    fields = [f for f, _ in _violations(err)]
    assert fields == [field], (name, _violations(err))
    assert servicer.seen == []


async def test_a_nested_bad_string_is_named_by_its_path(server: Any) -> None:
    servicer, address = server
    good = len_field(3, len_field(1, b"t1"))
    bad = len_field(3, len_field(1, b"t2") + len_field(2, b"\xc3"))
    err = await _raw(address, good + bad, f"/{SERVICE}/SubmitRollouts")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in _violations(err)] == ["tasks[1].task_set"]
    assert servicer.seen == []


async def test_streaming_methods_are_checked_too(server: Any) -> None:
    servicer, address = server
    async with open_channel(address) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id="../x")):
                pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in _violations(info.value)] == ["run_id"]
    assert servicer.seen == []


async def test_every_bad_field_is_listed_and_good_requests_pass(server: Any) -> None:
    servicer, address = server
    big = "r" * (3 * 1024 * 1024)
    async with open_channel(address) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SubmitRollouts(
                orchestrator_pb2.SubmitRolloutsRequest(
                    request_id="ok/1",
                    run_id=big,
                    tasks=[orchestrator_pb2.TaskRef(task_id="a/b", task_set="train")],
                    command=["echo", "a\x00b"],
                )
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(info.value.details() or "") < 1000  # never echoes the 3 MiB value
        assert [f for f, _ in _violations(info.value)] == ["run_id", "tasks[0].task_id", "command[1]"]
        assert servicer.seen == []
        ok = orchestrator_pb2.SubmitRolloutsRequest(
            request_id="run-1/rollouts:0",
            run_id="run-1",
            tasks=[orchestrator_pb2.TaskRef(task_id="hello_world.v2", task_set="train")],
            harness="mini-swe-agent",
            model_name="Qwen/Qwen3-0.6B",
            command=["sh", "-c", "echo 'hi there'\n"],
        )
        await stub.SubmitRollouts(ok)
        assert servicer.seen == [ok]
        health = health_pb2_grpc.HealthStub(ch)
        checked = await health.Check(health_pb2.HealthCheckRequest())  # type: ignore[attr-defined]
        assert checked.status == health_pb2.HealthCheckResponse.SERVING


ID_CASES = [
    ("ro-0123abcd", True),
    ("run_1.v2", True),
    ("A" * 128, True),
    ("A" * 129, False),
    ("../x", False),
    ("a/b", False),
    (".x", False),
    ("-x", False),
    ("a\x00b", False),
    ("a b", False),
    ("a:b", False),
    ("caf\u00e9", False),
]


@pytest.mark.parametrize(("value", "ok"), ID_CASES)
def test_the_id_rule(value: str, ok: bool) -> None:
    assert (field_rules.ID.violation("run_id", value) is None) is ok


def test_keys_may_carry_slashes_but_paths_no_control_characters() -> None:
    assert field_rules.check("request_id", "ro-1/call-2/0") == "ro-1/call-2/0"
    assert field_rules.check("config_path", "/srv/runs/my run.yaml") == "/srv/runs/my run.yaml"
    for field, value in [("request_id", "/x"), ("request_id", "a b"), ("config_path", "a\x00b"), ("uri", "a\nb")]:
        with pytest.raises(InvalidArgument) as info:
            field_rules.check(field, value)
        assert [v.field for v in info.value.violations] == [field]
    with pytest.raises(InvalidArgument):
        field_rules.check("run_id", "")
    assert field_rules.check("run_id", "", required=False) == ""


def test_locate_finds_nothing_in_a_valid_message() -> None:
    msg = orchestrator_pb2.SubmitRolloutsRequest(tasks=[orchestrator_pb2.TaskRef(task_id="t")], group_size=3)
    assert locate(msg.DESCRIPTOR, msg.SerializeToString()) is None
    assert locate(msg.DESCRIPTOR, varint(1 << 3 | 2)) is not None
