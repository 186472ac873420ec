"""Export writes only into the store's export folder, against the store as a process: the caller
names a file, and anything that is not a plain file name -- a path, a parent folder, a leading
dot, a NUL, a symbolic link or a folder in the export folder, the removed ``path`` field -- is
INVALID_ARGUMENT naming ``file_name``, with nothing written anywhere."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from store_builders import conversation, finished, make_rollout, recorded, submitted

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.trajectory.v1 import trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.protowire import len_field, varint_field
from openforge_core.settings import NatsSettings
from openforge_testing.servers import NatsServer, ServiceProcess
from openforge_trajectory_store.settings import StoreSettings

JSONL = pb.EXPORT_FORMAT_JSONL


@dataclass(frozen=True)
class Store:
    address: str
    exports: Path
    outside: Path


async def _record(url: str, address: str) -> None:
    bus = EventBus(NatsSettings(url=url))
    await bus.connect()
    try:
        r0 = make_rollout("r0")
        eid, sub = submitted(r0)
        await bus.publish(subject_for("orchestrator", "rollouts_submitted"), sub, event_id=eid)
        for c in conversation("r0", 2):
            eid, rec = recorded(c)
            await bus.publish(subject_for("proxy", "call_recorded"), rec, event_id=eid)
        done = common_pb2.Rollout()
        done.CopyFrom(r0)
        done.status = common_pb2.ROLLOUT_STATUS_SUCCEEDED
        done.reward = 1.0
        eid, fin = finished(done, 2)
        await bus.publish(subject_for("orchestrator", "rollout_finished"), fin, event_id=eid)
    finally:
        await bus.close()
    async with grpc.aio.insecure_channel(address) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        for _ in range(300):
            try:
                if (await stub.GetSamples(pb.GetSamplesRequest(rollout_id="r0"))).samples:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("the store did not assemble the rollout")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A store process with run ``run`` assembled and its export folder set."""
    tmp = tmp_path_factory.mktemp("store-export")
    exports, outside = tmp / "exports", tmp / "outside"
    outside.mkdir()
    with NatsServer(tmp / "nats") as nats:
        env = {
            "OPENFORGE_NATS__URL": nats.url,
            "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'db' / 'store.db'}",
            "OPENFORGE_EXPORT_DIR": str(exports),
        }
        proc = ServiceProcess("openforge_trajectory_store", env, tmp / "store.log").start()
        try:
            asyncio.run(_record(nats.url, proc.address))
            yield Store(proc.address, exports, outside)
        finally:
            proc.stop()


def _export(store: Store, request: pb.ExportRequest | bytes) -> pb.ExportResponse | grpc.aio.AioRpcError:
    async def go() -> pb.ExportResponse | grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(store.address) as ch:
            try:
                if isinstance(request, bytes):
                    raw: Any = ch.unary_unary(
                        "/openforge.trajectory.v1.TrajectoryService/Export",
                        request_serializer=None,
                        response_deserializer=pb.ExportResponse.FromString,
                    )
                    return await raw(request, timeout=30)  # type: ignore[no-any-return]
                return await trajectory_pb2_grpc.TrajectoryServiceStub(ch).Export(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                return exc

    return asyncio.run(go())


def _violated_fields(err: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    fields: list[str] = []
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            fields += [v.field for v in bad.field_violations]
    return fields


def _files(root: Path) -> set[Path]:
    """Files and links under ``root``, but NATS's own (JetStream writes its state files there
    while the test runs)."""
    nats = root / "nats"
    return {p for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and not p.is_relative_to(nats)}


def test_a_file_name_is_written_in_the_export_folder_owner_only(store: Store) -> None:
    got = _export(store, pb.ExportRequest(run_id="run", format=JSONL, file_name="run.jsonl"))
    assert isinstance(got, pb.ExportResponse), got
    out = store.exports / "run.jsonl"
    assert got.path == str(out) and got.rows == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == ["r0"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    again = _export(store, pb.ExportRequest(run_id="run", format=JSONL, file_name="run.jsonl"))
    assert isinstance(again, pb.ExportResponse) and again.rows == 1  # idempotent: replaced in place


BAD_NAMES = [
    ("missing", ""),
    ("parent", "../escape.jsonl"),
    ("parent only", ".."),
    ("absolute", "/tmp/openforge-escape.jsonl"),
    ("nested", "sub/run.jsonl"),
    ("backslash", "sub\\run.jsonl"),
    ("hidden", ".bashrc"),
    ("NUL", "run\x00.jsonl"),
    ("newline", "run\n.jsonl"),
    ("overlong", "r" * 129),
    ("3 MiB", "r" * (3 * 1024 * 1024)),
]


@pytest.mark.parametrize(("case", "name"), BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_anything_but_a_plain_file_name_is_refused(store: Store, case: str, name: str) -> None:
    before = _files(store.exports.parent)
    got = _export(store, pb.ExportRequest(run_id="run", format=JSONL, file_name=name))
    assert isinstance(got, grpc.aio.AioRpcError), (case, got)
    assert got.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, got.code(), got.details())
    assert _violated_fields(got) == ["file_name"], case
    assert _files(store.exports.parent) - before == set(), case
    assert not Path("/tmp/openforge-escape.jsonl").exists()


def test_a_symbolic_link_or_folder_in_the_export_folder_is_not_written_through(store: Store) -> None:
    store.exports.mkdir(exist_ok=True)
    target = store.outside / "victim.txt"
    target.write_text("keep me")
    (store.exports / "link.jsonl").symlink_to(target)
    (store.exports / "folder.jsonl").mkdir()
    for name in ("link.jsonl", "folder.jsonl"):
        got = _export(store, pb.ExportRequest(run_id="run", format=JSONL, file_name=name))
        assert isinstance(got, grpc.aio.AioRpcError), (name, got)
        assert got.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, got.code(), got.details())
        assert _violated_fields(got) == ["file_name"]
    assert target.read_text() == "keep me"
    assert list(store.outside.iterdir()) == [target]


def test_the_removed_path_field_writes_nothing(store: Store) -> None:
    """An old client still sending field 3 (the path) gets INVALID_ARGUMENT, not a file there."""
    victim = store.outside / "old-client.jsonl"
    old = len_field(1, b"run") + varint_field(2, JSONL) + len_field(3, str(victim).encode())
    got = _export(store, old)
    assert isinstance(got, grpc.aio.AioRpcError), got
    assert got.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violated_fields(got) == ["file_name"]
    assert not victim.exists()


def test_the_default_export_folder_is_next_to_the_database(tmp_path: Path) -> None:
    db = tmp_path / "state" / "trajectories.db"
    assert StoreSettings(store={"dsn": f"sqlite:///{db}"}).exports_folder() == tmp_path / "state" / "exports"
    assert StoreSettings(export_dir=tmp_path / "x").exports_folder() == tmp_path / "x"
    relative = StoreSettings(store={"dsn": "sqlite:///rel/t.db"}).exports_folder()
    assert relative == Path(os.getcwd()) / "rel" / "exports"
