"""Each service in its own process: SERVING on the standard health check, real read
RPCs over its (empty) state, UNIMPLEMENTED for what is not built yet, clean SIGTERM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_orchestrator.adapters.proxy import ProxySessions
from openforge_orchestrator.domain.rollouts import Rollout, RolloutStatus
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_proxy_sessions(nats_server: NatsServer, service_process: ServiceFactory) -> None:
    svc = service_process("openforge_proxy", {"OPENFORGE_NATS__URL": nats_server.url})

    async def run() -> None:
        async with open_channel(svc.address) as ch:
            stub = proxy_pb2_grpc.ProxyServiceStub(ch)
            assert await _code(stub.GetSession(proxy_pb2.GetSessionRequest(rollout_id="r1"))) == (
                grpc.StatusCode.NOT_FOUND
            )
            created = await stub.CreateSession(
                proxy_pb2.CreateSessionRequest(
                    request_id="q", rollout_id="r1", run_id="run", model_name="tiny", ttl=Duration(seconds=60)
                )
            )
            assert created.api_key.startswith("ofk-")
            got = await stub.GetSession(proxy_pb2.GetSessionRequest(rollout_id="r1"))
            assert got.session.state == proxy_pb2.SESSION_STATE_OPEN
            closed = await stub.CloseSession(proxy_pb2.CloseSessionRequest(rollout_id="r1"))
            assert closed.session.state == proxy_pb2.SESSION_STATE_CLOSED
            assert closed.session.rollout_attempt == 1
            # the orchestrator re-runs the rollout: its second attempt's session says so (and
            # every call record of it carries the attempt, so the store never mixes the two)
            sessions = ProxySessions(svc.address)
            try:
                rollout = Rollout(
                    rollout_id="r1",
                    run_id="run",
                    task_id="t",
                    task_set="train",
                    group_id="g",
                    group_index=0,
                    harness="command",
                    model_name="tiny",
                    status=RolloutStatus.RUNNING,
                    min_policy_version=0,
                    timeout_s=0.0,
                    create_time=0.0,
                )
                assert (await sessions.open(rollout, 2, 60.0)).api_key.startswith("ofk-")
                again = await stub.GetSession(proxy_pb2.GetSessionRequest(rollout_id="r1"))
                assert (again.session.state, again.session.rollout_attempt) == (proxy_pb2.SESSION_STATE_OPEN, 2)
                assert await sessions.close("r1") == 0
            finally:
                await sessions.aclose()
            assert await _code(stub.CreateSession(proxy_pb2.CreateSessionRequest())) == (
                grpc.StatusCode.INVALID_ARGUMENT
            )

    asyncio.run(run())
    assert svc.stop() == 0  # SIGTERM → graceful exit
    assert "ofk-" not in svc.log()  # keys are never logged


def test_orchestrator_store_trainer_reads(
    nats_server: NatsServer, service_process: ServiceFactory, tmp_path: Path
) -> None:
    env = {"OPENFORGE_NATS__URL": nats_server.url}
    orch = service_process("openforge_orchestrator", env)
    store = service_process(
        "openforge_trajectory_store",
        {**env, "OPENFORGE_CONSUMER_NAME": "reads", "OPENFORGE_STORE__DSN": f"sqlite:///{tmp_path / 'store.db'}"},
    )
    trainer = service_process("openforge_trainer", env)

    async def run() -> None:
        async with (
            open_channel(orch.address) as o,
            open_channel(store.address) as s,
            open_channel(trainer.address) as t,
        ):
            ostub = orchestrator_pb2_grpc.OrchestratorServiceStub(o)
            sstub = trajectory_pb2_grpc.TrajectoryServiceStub(s)
            tstub = trainer_pb2_grpc.TrainerServiceStub(t)
            assert await _code(ostub.GetRollout(orchestrator_pb2.GetRolloutRequest(rollout_id="x"))) == (
                grpc.StatusCode.NOT_FOUND
            )
            assert await _code(sstub.GetRollout(trajectory_pb2.GetRolloutRequest(rollout_id="x"))) == (
                grpc.StatusCode.NOT_FOUND
            )
            page = await sstub.ListRollouts(trajectory_pb2.ListRolloutsRequest(run_id="none"))
            assert list(page.rollouts) == [] and page.next_page_token == ""
            assert await _code(sstub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id="x"))) == (
                grpc.StatusCode.NOT_FOUND
            )
            assert await _code(sstub.Export(trajectory_pb2.ExportRequest(run_id="x"))) == (
                grpc.StatusCode.INVALID_ARGUMENT
            )
            assert await _code(tstub.GetRun(trainer_pb2.GetRunRequest(run_id="x"))) == grpc.StatusCode.NOT_FOUND
            # A run needs a config: an empty request is refused, naming what is missing.
            assert await _code(tstub.StartRun(trainer_pb2.StartRunRequest())) == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(run())


def test_inference_without_a_model(nats_server: NatsServer, service_process: ServiceFactory) -> None:
    without = service_process("openforge_inference", {"OPENFORGE_NATS__URL": nats_server.url})

    async def run() -> None:
        async with open_channel(without.address) as b:
            stub_b = inference_pb2_grpc.InferenceServiceStub(b)
            assert await _code(stub_b.GetModelInfo(inference_pb2.GetModelInfoRequest())) == (
                grpc.StatusCode.FAILED_PRECONDITION
            )
            gen = stub_b.Generate(inference_pb2.GenerateRequest(prompt_token_ids=[1]))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await gen.read()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(run())


def test_a_bad_model_dir_never_reports_serving(
    tmp_path: Path, nats_server: NatsServer, service_process: ServiceFactory
) -> None:
    with pytest.raises(RuntimeError, match=r"does not exist|cannot serve"):
        service_process(
            "openforge_inference",
            {
                "OPENFORGE_NATS__URL": nats_server.url,
                "OPENFORGE_ENGINE": "transformers",
                "OPENFORGE_MODEL_PATH": str(tmp_path / "missing"),
            },
        )
