"""An event published by one service process is consumed by another, in one trace.

The client starts a trace and calls the orchestrator's SubmitRollouts; the
orchestrator publishes RolloutsSubmitted on NATS; the trajectory store consumes
it and records the rollouts. Both services' logs carry the client's trace id.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_event_consumed_across_processes_with_one_trace(
    nats_server_fn: NatsServer, service_process: ServiceFactory, tmp_path: Path
) -> None:
    env = {"OPENFORGE_NATS__URL": nats_server_fn.url}
    store = service_process(
        "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp_path / 'store.db'}"}
    )
    orch = service_process("openforge_orchestrator", env)

    async def run() -> list[str]:
        async with (
            grpc.aio.insecure_channel(orch.address) as o,
            grpc.aio.insecure_channel(store.address) as s,
        ):
            resp = await orchestrator_pb2_grpc.OrchestratorServiceStub(o).SubmitRollouts(
                orchestrator_pb2.SubmitRolloutsRequest(
                    request_id="req-1",
                    run_id="run-1",
                    tasks=[orchestrator_pb2.TaskRef(task_id="hello-world", task_set="train")],
                    group_size=2,
                    harness="mini-swe-agent",
                ),
                metadata=(("traceparent", TRACEPARENT),),
                timeout=10,
            )
            ids = [r.rollout_id for r in resp.rollouts]
            sstub = trajectory_pb2_grpc.TrajectoryServiceStub(s)
            deadline = time.monotonic() + 15
            while True:
                try:
                    got = await sstub.GetRollout(trajectory_pb2.GetRolloutRequest(rollout_id=ids[1]), timeout=5)
                    assert got.rollout.task_id == "hello-world" and got.rollout.group_index == 1
                    return ids
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND
                    assert time.monotonic() < deadline, "the store never recorded the rollouts"
                    await asyncio.sleep(0.1)

    ids = asyncio.run(run())
    assert len(ids) == 2
    published = [e for e in _lines(orch.log()) if e["event"] == "event.published"]
    ingested = [e for e in _lines(store.log()) if e["event"] == "rollouts.ingested"]
    assert published and published[0]["trace_id"] == TRACE_ID
    assert ingested and ingested[0]["trace_id"] == TRACE_ID
    assert ingested[0]["rollouts"] == 2
