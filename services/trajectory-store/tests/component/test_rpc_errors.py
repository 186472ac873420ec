"""Bad requests to the store's read RPCs, against the store as a process (SQLite, real NATS):
malformed page tokens and cursors, negative page sizes, empty or overlong ids are
INVALID_ARGUMENT naming the field; ids the store does not know are NOT_FOUND; never INTERNAL,
UNKNOWN or a status the client cannot even read."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from store_builders import make_rollout, submitted

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.trajectory.v1 import trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.settings import NatsSettings
from openforge_testing.servers import NatsServer, ServiceProcess

if TYPE_CHECKING:
    from openforge.trajectory.v1.trajectory_pb2_grpc import TrajectoryServiceAsyncStub as Stub
LONG = "x" * 5000
WIDE = "\u00e9" * 3000  # 2 bytes each in UTF-8, percent-encoded in grpc-message


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


async def _record(url: str, store: str) -> None:
    bus = EventBus(NatsSettings(url=url))
    await bus.connect()
    try:
        manifest = common_pb2.RunManifest(run_id="run", harness="mini-swe-agent", model="m")
        await bus.publish(
            subject_for("orchestrator", "run_registered"),
            orch.RunRegistered(event_id="run/run", manifest=manifest),
            event_id="run/run",
        )
        eid, ev = submitted(make_rollout("r0"))
        await bus.publish(subject_for("orchestrator", "rollouts_submitted"), ev, event_id=eid)
        step = trainer_events.StepCompleted(event_id="step/run/1", run_id="run", step=1, policy_version=1)
        await bus.publish(subject_for("trainer", "step_completed"), step, event_id=step.event_id)
    finally:
        await bus.close()
    async with grpc.aio.insecure_channel(store) as ch:
        for _ in range(300):
            runs = (await trajectory_pb2_grpc.TrajectoryServiceStub(ch).ListRuns(pb.ListRunsRequest())).runs
            if runs and runs[0].steps == 1 and runs[0].rollouts == 1:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the store did not record the run")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A store process holding run ``run`` (one rollout ``r0``, one step)."""
    tmp = tmp_path_factory.mktemp("store-errors")
    with NatsServer(tmp / "nats") as nats:
        env = {"OPENFORGE_NATS__URL": nats.url, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'store.db'}"}
        proc = ServiceProcess("openforge_trajectory_store", env, tmp / "store.log").start()
        try:
            asyncio.run(_record(nats.url, proc.address))
            yield proc.address
        finally:
            proc.stop()


Call = Callable[["Stub"], Awaitable[Any]]


async def _watch_first(stub: Stub, req: pb.WatchCompletedGroupsRequest) -> Any:
    async for item in stub.WatchCompletedGroups(req, timeout=5):
        return item
    return None


def _code(store: str, call: Call) -> tuple[grpc.StatusCode, str]:
    async def go() -> tuple[grpc.StatusCode, str]:
        async with grpc.aio.insecure_channel(store) as ch:
            try:
                await call(trajectory_pb2_grpc.TrajectoryServiceStub(ch))
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return grpc.StatusCode.OK, ""

    return asyncio.run(go())


INVALID: list[tuple[str, Call, str]] = [
    ("GetRun empty id", lambda s: s.GetRun(pb.GetRunRequest()), "run_id"),
    ("ListStepMetrics empty id", lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest()), "run_id"),
    ("GetRollout empty id", lambda s: s.GetRollout(pb.GetRolloutRequest()), "rollout_id"),
    ("GetSamples empty id", lambda s: s.GetSamples(pb.GetSamplesRequest()), "rollout_id"),
    ("ListRuns negative size", lambda s: s.ListRuns(pb.ListRunsRequest(page_size=-1)), "page_size"),
    (
        "ListStepMetrics negative size",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_size=-5)),
        "page_size",
    ),
    ("ListRuns garbage token", lambda s: s.ListRuns(pb.ListRunsRequest(page_token="garbage!!")), "page_token"),
    ("ListRuns rollout token", lambda s: s.ListRuns(pb.ListRunsRequest(page_token=_b64([1, "r0"]))), "page_token"),
    ("ListRuns id not str", lambda s: s.ListRuns(pb.ListRunsRequest(page_token=_b64(["run", 1, 5]))), "page_token"),
    (
        "ListRuns NaN time",
        lambda s: s.ListRuns(pb.ListRunsRequest(page_token=_b64(["run", float("nan"), "r"]))),
        "page_token",
    ),
    (
        "ListRuns huge time",
        lambda s: s.ListRuns(pb.ListRunsRequest(page_token=_b64(["run", 10**400, "r"]))),
        "page_token",
    ),
    ("ListRuns json null", lambda s: s.ListRuns(pb.ListRunsRequest(page_token=_b64(None))), "page_token"),
    (
        "ListStepMetrics garbage token",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_token="s:x")),
        "page_token",
    ),
    (
        "ListStepMetrics negative token",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_token="s:-1")),
        "page_token",
    ),
    (
        "ListStepMetrics non-ASCII digit token",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_token="s:\u00b2")),
        "page_token",
    ),
    (
        "ListStepMetrics huge token",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_token="s:" + "9" * 30)),
        "page_token",
    ),
    (
        "ListRollouts huge time in token",
        lambda s: s.ListRollouts(pb.ListRolloutsRequest(run_id="run", page_token=_b64([10**30, "r0"]))),
        "page_token",
    ),
    (
        "ListRollouts negative size",
        lambda s: s.ListRollouts(pb.ListRolloutsRequest(run_id="run", page_size=-1)),
        "page_size",
    ),
    (
        "Watch non-ASCII digit cursor",
        lambda s: _watch_first(s, pb.WatchCompletedGroupsRequest(run_id="run", cursor="g:\u00b2")),
        "cursor",
    ),
    (
        "Watch huge cursor",
        lambda s: _watch_first(s, pb.WatchCompletedGroupsRequest(run_id="run", cursor="g:" + "9" * 30)),
        "cursor",
    ),
    ("GetRun overlong id", lambda s: s.GetRun(pb.GetRunRequest(run_id=LONG)), "run_id"),
    ("GetRun wide id", lambda s: s.GetRun(pb.GetRunRequest(run_id=WIDE)), "run_id"),
    ("GetRun 129-byte id", lambda s: s.GetRun(pb.GetRunRequest(run_id="n" * 129)), "run_id"),
    (
        "ListStepMetrics overlong id",
        lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id=LONG)),
        "run_id",
    ),
    ("GetRollout overlong id", lambda s: s.GetRollout(pb.GetRolloutRequest(rollout_id=LONG)), "rollout_id"),
    ("GetCalls overlong id", lambda s: s.GetCalls(pb.GetCallsRequest(rollout_id=LONG)), "rollout_id"),
    ("GetSamples overlong id", lambda s: s.GetSamples(pb.GetSamplesRequest(rollout_id=WIDE)), "rollout_id"),
    ("ListRollouts overlong run", lambda s: s.ListRollouts(pb.ListRolloutsRequest(run_id=LONG)), "run_id"),
]


@pytest.mark.parametrize(("name", "call", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_bad_requests_are_invalid_argument_naming_the_field(store: str, name: str, call: Call, field: str) -> None:
    code, details = _code(store, call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, code, details[:300])
    assert details.startswith(f"{field}:"), details[:300]
    assert len(details) < 1000


NOT_FOUND: list[tuple[str, Call]] = [
    ("GetRun", lambda s: s.GetRun(pb.GetRunRequest(run_id="nope"))),
    ("ListStepMetrics", lambda s: s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="nope"))),
    ("GetRollout", lambda s: s.GetRollout(pb.GetRolloutRequest(rollout_id="nope"))),
    ("GetRun 128-byte id", lambda s: s.GetRun(pb.GetRunRequest(run_id="n" * 128))),
]


@pytest.mark.parametrize(("name", "call"), NOT_FOUND, ids=[c[0] for c in NOT_FOUND])
def test_unknown_ids_are_not_found(store: str, name: str, call: Call) -> None:
    code, details = _code(store, call)
    assert code == grpc.StatusCode.NOT_FOUND, (name, code, details[:300])


def test_valid_reads_still_answer(store: str) -> None:
    async def go(s: Stub) -> None:
        assert (await s.GetRun(pb.GetRunRequest(run_id="run"))).run.run_id == "run"
        steps = await s.ListStepMetrics(pb.ListStepMetricsRequest(run_id="run", page_token="s:0"))
        assert [m.step for m in steps.steps] == [1]
        assert [r.rollout_id for r in (await s.ListRollouts(pb.ListRolloutsRequest(run_id="run"))).rollouts] == ["r0"]
        assert [r.run_id for r in (await s.ListRuns(pb.ListRunsRequest(page_size=2**31 - 1))).runs] == ["run"]

    assert _code(store, go) == (grpc.StatusCode.OK, "")
