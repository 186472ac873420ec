"""The store as a process on a real NATS: exactly-once ingestion across kill -9, groups
emitted once across restarts, dead letters, and the gRPC reads."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import nats
import pytest
from store_builders import conversation, finished, make_call, make_rollout, recorded, submitted

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import events_pb2 as traj_events
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.settings import NatsSettings
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer, ServiceProcess

ROLLOUTS_SUBMITTED = subject_for("orchestrator", "rollouts_submitted")
ROLLOUT_FINISHED = subject_for("orchestrator", "rollout_finished")
CALL_RECORDED = subject_for("proxy", "call_recorded")


@pytest.fixture(params=["sqlite", "postgresql"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = request.getfixturevalue("postgres_dsn")
    import psycopg

    schema = f"p_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _store(factory: ServiceFactory, nats_url: str, dsn: str) -> ServiceProcess:
    return factory(
        "openforge_trajectory_store",
        {"OPENFORGE_NATS__URL": nats_url, "OPENFORGE_STORE__DSN": dsn, "OPENFORGE_LOG__LEVEL": "info"},
    )


async def _publish(url: str, items: list[tuple[str, str, Any]]) -> None:
    bus = EventBus(NatsSettings(url=url))
    await bus.connect()
    try:
        for subject, event_id, msg in items:
            await bus.publish(subject, msg, event_id=event_id)
    finally:
        await bus.close()


def _count(dsn: str) -> int:
    """Stored calls, read without taking the writer's lock."""
    if dsn.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{dsn.removeprefix('sqlite:///')}?mode=ro", uri=True, timeout=30)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0])
        except sqlite3.OperationalError:  # the store has not created the schema yet
            return 0
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as pg:
        try:
            row = pg.execute("SELECT COUNT(*) FROM calls").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0


def test_kill_9_during_ingest_loses_and_duplicates_nothing(
    nats_server_fn: NatsServer, service_process: ServiceFactory, dsn: str
) -> None:
    n = 10_000
    calls = [make_call(f"r{i % 100}", f"c{i // 100}", [1, 2, 3, i % 50], [7, 8], t=i) for i in range(n)]
    store = _store(service_process, nats_server_fn.url, dsn)
    publisher = threading.Thread(
        target=lambda: asyncio.run(_publish(nats_server_fn.url, [(CALL_RECORDED, *recorded(c)) for c in calls]))
    )
    publisher.start()  # the proxy keeps publishing while the store ingests, is killed, and restarts
    deadline = time.monotonic() + 60
    while _count(dsn) < n // 10:
        assert time.monotonic() < deadline, "ingestion did not start"
        time.sleep(0.01)
    os.killpg(store.pid, signal.SIGKILL)
    store.stop()
    at_kill = _count(dsn)
    assert at_kill < n, "the kill came too late to test anything"
    _store(service_process, nats_server_fn.url, dsn)
    publisher.join(120)
    deadline = time.monotonic() + 120
    while (got := _count(dsn)) < n:
        assert time.monotonic() < deadline, f"only {got} of {n} calls after restart"
        time.sleep(0.1)
    time.sleep(0.5)
    assert _count(dsn) == n  # exactly once: the UNIQUE key makes any duplicate impossible to hide


def test_groups_are_emitted_once_across_restarts(
    nats_server_fn: NatsServer, service_process: ServiceFactory, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    url = nats_server_fn.url
    store = _store(service_process, url, dsn)
    r0, r1 = make_rollout("r0", index=0), make_rollout("r1", index=1)
    events: list[tuple[str, str, Any]] = [(ROLLOUTS_SUBMITTED, *submitted(r0, r1))]
    for r in (r0, r1):
        events += [(CALL_RECORDED, *recorded(c)) for c in conversation(r.rollout_id, 3)]
        done = common_pb2.Rollout()
        done.CopyFrom(r)
        done.status = common_pb2.ROLLOUT_STATUS_SUCCEEDED
        done.reward = 1.0
        events.append((ROLLOUT_FINISHED, *finished(done, 3)))
    asyncio.run(_publish(url, events))

    async def first_watch() -> str:
        async with grpc.aio.insecure_channel(store.address) as ch:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
            call = stub.WatchCompletedGroups(trajectory_pb2.WatchCompletedGroupsRequest(run_id="run"), timeout=30)
            got = cast(trajectory_pb2.WatchCompletedGroupsResponse, await call.read())
            call.cancel()
            assert got.group_id == "g1" and len(got.rollouts) == 2 and len(got.samples) == 2
            assert [s.reward for s in got.samples] == [1.0, 1.0]
            samples = await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id="r0"))
            assert sum(samples.samples[0].loss_mask) > 0
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.WatchCompletedGroups(
                    trajectory_pb2.WatchCompletedGroupsRequest(run_id="run", cursor="nope")
                ).read()
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            out = tmp_path / "exports" / "export.parquet"  # the default export folder: next to the database
            exported = await stub.Export(
                trajectory_pb2.ExportRequest(
                    run_id="run", format=trajectory_pb2.EXPORT_FORMAT_PARQUET, file_name="export.parquet"
                )
            )
            assert exported.rows == 2 and out.exists() and exported.path == str(out)
            return got.cursor

    cursor = asyncio.run(first_watch())
    store.stop()
    store = _store(service_process, url, dsn)  # restart: nothing is emitted again
    asyncio.run(_publish(url, [(ROLLOUTS_SUBMITTED, *submitted(make_rollout("r9", group_id="g2"), event_id="s2"))]))
    done9 = make_rollout("r9", group_id="g2", status=common_pb2.ROLLOUT_STATUS_FAILED)
    asyncio.run(_publish(url, [(ROLLOUT_FINISHED, *finished(done9, 0))]))

    async def resume() -> list[str]:
        async with grpc.aio.insecure_channel(store.address) as ch:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
            call = stub.WatchCompletedGroups(
                trajectory_pb2.WatchCompletedGroupsRequest(run_id="run", cursor=cursor), timeout=30
            )
            got = cast(trajectory_pb2.WatchCompletedGroupsResponse, await call.read())
            call.cancel()
            return [got.group_id]

    assert asyncio.run(resume()) == ["g2"]

    async def group_events() -> list[str]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject_for("trajectory", "group_completed"), durable=None)
        msgs = await sub.fetch(10, timeout=2)
        await nc.close()
        return [traj_events.GroupCompleted.FromString(m.data).group_id for m in msgs]

    assert sorted(asyncio.run(group_events())) == ["g1", "g2"]


def test_malformed_and_invalid_events_are_dead_lettered(
    nats_server_fn: NatsServer, service_process: ServiceFactory, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    url = nats_server_fn.url
    store = _store(service_process, url, dsn)
    bad_call = make_call("r0", "c0", [1], [2, 3])
    del bad_call.completion_policy_versions[:]
    bad_call.completion_policy_versions.append(1)  # 2 tokens, 1 version

    async def run() -> list[str]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.publish(
            CALL_RECORDED,
            b"\xff\xff\xff",
            headers={"Openforge-Type": "openforge.proxy.v1.CallRecorded", "Nats-Msg-Id": "garbage"},
        )
        await js.publish(
            CALL_RECORDED, b"", headers={"Openforge-Type": "openforge.proxy.v2.CallRecorded", "Nats-Msg-Id": "future"}
        )
        await nc.close()
        await _publish(
            url, [(CALL_RECORDED, *recorded(bad_call)), (CALL_RECORDED, *recorded(make_call("r1", "c0", [1], [2])))]
        )
        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject_for("trajectory", "dead_letter"), durable=None)
        reasons: list[str] = []
        deadline = time.monotonic() + 60
        while len(reasons) < 3 and time.monotonic() < deadline:
            try:
                for m in await sub.fetch(10, timeout=1):
                    dead = common_pb2.DeadLetter.FromString(m.data)
                    reasons.append(f"{dead.original_event_id}: {dead.reason}")
            except nats.errors.TimeoutError:
                pass
        await nc.close()
        return sorted(reasons)

    reasons = asyncio.run(run())
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("future: unknown event type")
    assert reasons[1].startswith("garbage: undecodable")
    assert reasons[2].startswith("r0/c0/1:") and "policy versions" in reasons[2]
    deadline = time.monotonic() + 60
    while _count(dsn) < 1:  # the good event after the bad ones is still ingested
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _count(dsn) == 1
    assert store.stop() == 0


def test_runs_and_step_metrics_over_grpc(nats_server_fn: NatsServer, service_process: ServiceFactory, dsn: str) -> None:
    from openforge.orchestrator.v1 import events_pb2 as orch
    from openforge.trainer.v1 import events_pb2 as trainer_events

    url = nats_server_fn.url
    store = _store(service_process, url, dsn)
    manifest = common_pb2.RunManifest(run_id="run", harness="mini-swe-agent", model="models/tiny")
    events: list[tuple[str, str, Any]] = [
        (
            subject_for("orchestrator", "run_registered"),
            "run/run",
            orch.RunRegistered(event_id="run/run", manifest=manifest),
        ),
        (ROLLOUTS_SUBMITTED, *submitted(make_rollout("r0"))),
    ]
    for n in (1, 2, 3):
        ev = trainer_events.StepCompleted(event_id=f"step/run/{n}", run_id="run", step=n, policy_version=n)
        ev.metrics["reward/mean"] = n / 4
        events.append((subject_for("trainer", "step_completed"), ev.event_id, ev))
    asyncio.run(_publish(url, events))

    async def reads() -> None:
        async with grpc.aio.insecure_channel(store.address) as ch:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
            for _ in range(300):
                run = (await stub.ListRuns(trajectory_pb2.ListRunsRequest())).runs
                if run and run[0].steps == 3:
                    break
                await asyncio.sleep(0.1)
            [summary] = run
            assert (summary.run_id, summary.manifest, summary.rollouts, summary.last_policy_version) == (
                "run",
                manifest,
                1,
                3,
            )
            assert (await stub.GetRun(trajectory_pb2.GetRunRequest(run_id="run"))).run == summary
            first = await stub.ListStepMetrics(trajectory_pb2.ListStepMetricsRequest(run_id="run", page_size=2))
            rest = await stub.ListStepMetrics(
                trajectory_pb2.ListStepMetricsRequest(run_id="run", page_token=first.next_page_token)
            )
            assert [s.metrics["reward/mean"] for s in [*first.steps, *rest.steps]] == [0.25, 0.5, 0.75]
            assert rest.next_page_token == ""
            for call, code in (
                (stub.GetRun(trajectory_pb2.GetRunRequest(run_id="nope")), grpc.StatusCode.NOT_FOUND),
                (stub.GetRun(trajectory_pb2.GetRunRequest()), grpc.StatusCode.INVALID_ARGUMENT),
                (stub.ListRuns(trajectory_pb2.ListRunsRequest(page_token="x")), grpc.StatusCode.INVALID_ARGUMENT),
                (
                    stub.ListStepMetrics(trajectory_pb2.ListStepMetricsRequest(run_id="nope")),
                    grpc.StatusCode.NOT_FOUND,
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == code

    asyncio.run(reads())
