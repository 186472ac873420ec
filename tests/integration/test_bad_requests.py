"""Every bad request to every RPC of the five services, each service in its own process: bytes
that are not the request message, strings that are not UTF-8, NUL characters, path-like and
3 MiB ids -- each answered INVALID_ARGUMENT with a ``google.rpc.BadRequest`` naming the field,
never UNKNOWN, INTERNAL or a transport error.

The cases are built from the services' own descriptors: every method, every string field (and
the string fields of the messages inside a request), so an RPC or field added later is covered
without editing this table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from openforge.inference.v1 import inference_pb2
from openforge.orchestrator.v1 import orchestrator_pb2
from openforge.proxy.v1 import proxy_pb2
from openforge.trainer.v1 import trainer_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core import field_rules
from openforge_core.protowire import len_field
from openforge_testing.servers import NatsServer, ServiceProcess

SERVICES: dict[str, tuple[str, ServiceDescriptor]] = {
    "proxy": ("openforge_proxy", proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"]),
    "orchestrator": ("openforge_orchestrator", orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"]),
    "trajectory-store": (
        "openforge_trajectory_store",
        trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"],
    ),
    "trainer": ("openforge_trainer", trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"]),
    "inference": ("openforge_inference", inference_pb2.DESCRIPTOR.services_by_name["InferenceService"]),
}
BIG = b"r" * (3 * 1024 * 1024)  # fits in the default 64 MiB message limit: the service must answer


@dataclass(frozen=True)
class Case:
    """One bad request.

    Attributes:
        service: Key of :data:`SERVICES`.
        method: Full method path, ``/package.Service/Method``.
        streaming: Whether the method streams its responses.
        payload: The serialized request.
        field: The field the violation must name (None: any field).
    """

    service: str
    method: str
    streaming: bool
    payload: bytes
    field: str | None


def _string_paths(desc: Descriptor, depth: int = 0) -> Iterator[tuple[list[FieldDescriptor], str]]:
    """(field chain, violation path) of each string field, looking into nested messages."""
    for fd in desc.fields:
        index = "[0]" if fd.is_repeated else ""
        if fd.type == FieldDescriptor.TYPE_STRING:
            yield [fd], f"{fd.name}{index}"
        elif (
            fd.type == FieldDescriptor.TYPE_MESSAGE
            and fd.message_type is not None
            and depth < 2
            and not fd.message_type.full_name.startswith("google.protobuf.")
        ):
            for chain, path in _string_paths(fd.message_type, depth + 1):
                yield [fd, *chain], f"{fd.name}{index}.{path}"


def _encode(chain: list[FieldDescriptor], value: bytes) -> bytes:
    for fd in reversed(chain):
        value = len_field(fd.number, value)
    return value


def _bad_values(leaf: FieldDescriptor) -> list[tuple[str, bytes]]:
    values = [("not UTF-8", b"ok\xff\xfe"), ("NUL", b"a\x00b"), ("3 MiB", BIG)]
    rule = field_rules.rule_for(leaf.name)
    if rule in (field_rules.ID, field_rules.FILE_NAME):
        values += [("parent", b"../x"), ("slash", b"a/b"), ("leading dot", b".x"), ("space", b"a b")]
    elif rule is field_rules.KEY:
        values += [("leading slash", b"/x"), ("leading dot", b".x"), ("newline", b"a\nb")]
    elif rule is field_rules.PATH:
        values += [("newline", b"/tmp/a\nb")]
    return values


def _cases() -> list[tuple[str, Case]]:
    out: list[tuple[str, Case]] = []
    for service, (_, sd) in SERVICES.items():
        for m in sd.methods:
            method = f"/{sd.full_name}/{m.name}"
            streaming = m.server_streaming
            # Undecodable: field 1 claims 5 bytes and carries 2; an invalid wire type; a bad tag.
            for what, payload in [("truncated", b"\x0a\x05ab"), ("wire type 7", b"\x0f"), ("tag 0", b"\x00")]:
                out.append((f"{service}.{m.name}: {what}", Case(service, method, streaming, payload, None)))
            for chain, path in _string_paths(m.input_type):
                for what, value in _bad_values(chain[-1]):
                    case = Case(service, method, streaming, _encode(chain, value), path)
                    out.append((f"{service}.{m.name}.{path}: {what}", case))
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def addresses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The five services, each in its own process (inference without a model)."""
    tmp = tmp_path_factory.mktemp("bad-requests")
    with NatsServer(tmp / "nats") as nats:
        env = {
            "OPENFORGE_NATS__URL": nats.url,
            "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'store.db'}",
            "OPENFORGE_CONSUMER_NAME": "bad-requests",
        }
        procs: dict[str, ServiceProcess] = {}
        try:
            for name, (module, _) in SERVICES.items():
                service_env = env if name == "trajectory-store" else {"OPENFORGE_NATS__URL": nats.url}
                procs[name] = ServiceProcess(module, service_env, tmp / f"{name}.log").start()
            yield {name: p.address for name, p in procs.items()}
        finally:
            for p in procs.values():
                p.stop()


async def _call(address: str, case: Case) -> grpc.aio.AioRpcError | None:
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            if case.streaming:
                stream: Any = ch.unary_stream(case.method, request_serializer=None, response_deserializer=None)
                async for _ in stream(case.payload, timeout=30):
                    break
            else:
                unary: Any = ch.unary_unary(case.method, request_serializer=None, response_deserializer=None)
                await unary(case.payload, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc
    return None


async def _code(address: str, method: str, request: Message) -> grpc.StatusCode:
    """The status of one unary call of ``request`` (OK when it succeeds)."""
    async with grpc.aio.insecure_channel(address) as ch:
        unary: Any = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            await unary(request.SerializeToString(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _violations(err: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    found: list[tuple[str, str]] = []
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            found += [(v.field, v.description) for v in bad.field_violations]
    return found


def test_the_table_covers_every_rpc_and_the_reported_shapes() -> None:
    methods = {c.method for _, c in CASES}
    assert len(methods) == sum(len(sd.methods) for _, sd in SERVICES.values())
    names = {n for n, _ in CASES}
    for expected in (
        "trainer.StartRun.config_path: NUL",
        "trainer.StartRun.run_id: parent",
        "trainer.StartRun.run_id: slash",
        "trainer.StartRun.run_id: leading dot",
        "proxy.CreateSession.rollout_id: 3 MiB",
        "orchestrator.SubmitRollouts.tasks[0].task_id: not UTF-8",
        "trajectory-store.Export.file_name: parent",
        "inference.UpdateWeights.uri: NUL",
    ):
        assert expected in names


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_a_bad_request_is_invalid_argument_naming_the_field(addresses: dict[str, str], case: Case) -> None:
    err = asyncio.run(_call(addresses[case.service], case))
    assert err is not None, "the bad request was answered OK"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), (err.details() or "")[:300])
    assert len(err.details() or "") < 1000  # the value is never echoed
    fields = [f for f, _ in _violations(err)]
    assert fields, "no field violation"
    if case.field is not None:
        assert fields == [case.field], fields


SAME_RULE = ["ro-1a2b", "run.v2_x", "r" * 128, "r" * 129, "../x", "a/b", ".x", "a:b", "caf\u00e9", "a b"]


@pytest.mark.parametrize("rollout_id", SAME_RULE)
def test_the_proxy_opens_sessions_exactly_for_the_rollout_ids_the_store_looks_up(
    addresses: dict[str, str], rollout_id: str
) -> None:
    async def go() -> tuple[grpc.StatusCode, grpc.StatusCode]:
        codes: list[grpc.StatusCode] = []
        calls = [
            (
                addresses["proxy"],
                "/openforge.proxy.v1.ProxyService/CreateSession",
                proxy_pb2.CreateSessionRequest(request_id=f"q-{len(rollout_id)}", rollout_id=rollout_id, run_id="run"),
            ),
            (
                addresses["trajectory-store"],
                "/openforge.trajectory.v1.TrajectoryService/GetRollout",
                trajectory_pb2.GetRolloutRequest(rollout_id=rollout_id),
            ),
        ]
        for address, method, request in calls:
            codes.append(await _code(address, method, request))
        return codes[0], codes[1]

    proxy_code, store_code = asyncio.run(go())
    valid = field_rules.ID.violation("rollout_id", rollout_id) is None
    # A valid id opens a session (OK) and is looked up (NOT_FOUND: nothing recorded); an invalid
    # one is refused by both.
    assert (proxy_code, store_code) == (
        (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)
        if valid
        else (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT)
    )


def test_services_still_answer_a_valid_request(addresses: dict[str, str]) -> None:
    """The checks refuse only what is bad: a well-formed read reaches its handler."""

    async def go() -> list[grpc.StatusCode]:
        reads = [
            ("orchestrator", "/openforge.orchestrator.v1.OrchestratorService/GetRollout",
             orchestrator_pb2.GetRolloutRequest(rollout_id="ro-0123abcd")),
            ("trainer", "/openforge.trainer.v1.TrainerService/GetRun", trainer_pb2.GetRunRequest(run_id="run-1")),
            ("inference", "/openforge.inference.v1.InferenceService/Abort",
             inference_pb2.AbortRequest(request_id="ro-1/call-2/0")),
        ]  # fmt: skip
        return [await _code(addresses[service], method, request) for service, method, request in reads]

    # Not found (orchestrator, trainer); no model configured (inference): each past validation.
    assert asyncio.run(go()) == [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE]
