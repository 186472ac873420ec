"""The trainer service as a real process, against fake orchestrator/store/inference gRPC servers
(the ``FakeWorld`` of conftest behind the real protos): StartRun from a config file, WatchMetrics,
TensorBoard event files, and a SIGKILL mid-run followed by a restart that resumes from the last
checkpoint without repeating or skipping a step."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_testing.servers import ServiceProcess, free_port
from openforge_trainer.domain.ports import RolloutRequest


class FakeOrchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    def __init__(self, world: Any) -> None:
        self.world = world

    async def SubmitRollouts(
        self, request: orchestrator_pb2.SubmitRolloutsRequest, context: Any
    ) -> orchestrator_pb2.SubmitRolloutsResponse:
        ids = await self.world.submit(
            RolloutRequest(
                request_id=request.request_id,
                run_id=request.run_id,
                task_set=request.tasks[0].task_set,
                task_ids=tuple(t.task_id for t in request.tasks),
                group_size=request.group_size,
                harness=request.harness,
                model_name=request.model_name,
                min_policy_version=request.min_policy_version,
            )
        )
        rollouts = [
            common_pb2.Rollout(rollout_id=f"{g}-r{i}", run_id=request.run_id, group_id=g, group_index=i)
            for g in ids
            for i in range(request.group_size)
        ]
        return orchestrator_pb2.SubmitRolloutsResponse(rollouts=rollouts)

    async def CancelGroup(
        self, request: orchestrator_pb2.CancelGroupRequest, context: Any
    ) -> orchestrator_pb2.CancelGroupResponse:
        await self.world.cancel_group(request.group_id, request.reason)
        return orchestrator_pb2.CancelGroupResponse()


class FakeStore(trajectory_pb2_grpc.TrajectoryServiceServicer):
    def __init__(self, world: Any) -> None:
        self.world = world

    async def WatchCompletedGroups(
        self, request: trajectory_pb2.WatchCompletedGroupsRequest, context: Any
    ) -> AsyncIterator[trajectory_pb2.WatchCompletedGroupsResponse]:
        async for g in self.world.watch(request.run_id, request.cursor):
            yield trajectory_pb2.WatchCompletedGroupsResponse(
                group_id=g.group_id,
                task_id=g.task_id,
                cursor=g.cursor,
                rollouts=[
                    common_pb2.Rollout(
                        rollout_id=rid,
                        group_id=g.group_id,
                        task_id=g.task_id,
                        status=common_pb2.ROLLOUT_STATUS_SUCCEEDED,
                        reward=r,
                    )
                    for rid, r in g.rewards.items()
                ],
                samples=[
                    trajectory_pb2.Sample(
                        sample_id=s.sample_id,
                        rollout_id=s.rollout_id,
                        prompt_token_ids=s.prompt_ids,
                        response_token_ids=s.response_ids,
                        loss_mask=s.loss_mask,
                        rollout_logprobs=s.behaviour_logprobs,
                        policy_versions=s.policy_versions,
                        reward=s.reward,
                    )
                    for s in g.samples
                ],
            )


class FakeInference(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, world: Any) -> None:
        self.world = world

    async def UpdateWeights(
        self, request: inference_pb2.UpdateWeightsRequest, context: Any
    ) -> inference_pb2.UpdateWeightsResponse:
        try:
            version = await self.world.update_weights(
                request.request_id, request.uri, request.version, request.checksum
            )
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return inference_pb2.UpdateWeightsResponse(version=version)


def read_scalar_tags(directory: Path) -> dict[str, list[int]]:
    """Tag → steps of every scalar in the TFRecord event files under ``directory``."""
    event_pb2: Any = importlib.import_module("tensorboardX.proto.event_pb2")
    tags: dict[str, list[int]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            record = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_start_run_from_file_kill_and_resume(
    micro_model_dir: Path, fake_world_factory: Any, tmp_path: Path
) -> None:
    world = fake_world_factory(sample=False)
    world.limit = 2  # the store completes two groups, then step 3 waits
    server = grpc.aio.server()
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(FakeOrchestrator(world), server)  # type: ignore[abstract]
    trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(FakeStore(world), server)  # type: ignore[abstract]
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(FakeInference(world), server)  # type: ignore[abstract]
    fake_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fakes = f"127.0.0.1:{fake_port}"

    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {micro_model_dir}\n"
        "task_split: toy\ntasks: [a, b]\ngroup_size: 2\ngroups_per_step: 1\nsteps: 4\n"
        "max_staleness: 1\nlearning_rate: 0.01\n"
    )
    env = {
        "OPENFORGE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "OPENFORGE_PUBLISH_EVENTS": "false",
        "OPENFORGE_SERVICES__ORCHESTRATOR": fakes,
        "OPENFORGE_SERVICES__TRAJECTORY_STORE": fakes,
        "OPENFORGE_SERVICES__INFERENCE": fakes,
        "OPENFORGE_LOG__FORMAT": "console",
    }
    port = free_port()
    first = ServiceProcess("openforge_trainer", env, tmp_path / "logs" / "trainer-1.log", port=port)
    second = ServiceProcess("openforge_trainer", env, tmp_path / "logs" / "trainer-2.log", port=port)
    try:
        await asyncio.to_thread(first.start)
        async with grpc.aio.insecure_channel(first.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            started = await stub.StartRun(
                trainer_pb2.StartRunRequest(request_id="req-1", run_id="run-k", config_path=str(config)), timeout=10
            )
            assert started.run.config["steps"] == 4
            again = await stub.StartRun(
                trainer_pb2.StartRunRequest(request_id="req-1", run_id="run-k", config_path=str(config)), timeout=10
            )
            assert again.run.run_id == "run-k"

            async def at_step_2() -> bool:
                run = (await stub.GetRun(trainer_pb2.GetRunRequest(run_id="run-k"), timeout=10)).run
                assert run.state != trainer_pb2.RUN_STATE_FAILED, run.error
                return run.step >= 2

            await wait_for(at_step_2, 120, "step 2")
        os.kill(first.pid, signal.SIGKILL)
        first.stop()
        await world.release()

        await asyncio.to_thread(second.start)  # resumes run-k on start
        async with grpc.aio.insecure_channel(second.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            seen: list[trainer_pb2.WatchMetricsResponse] = []
            async for msg in stub.WatchMetrics(trainer_pb2.WatchMetricsRequest(run_id="run-k"), timeout=180):
                seen.append(msg)
            run = (await stub.GetRun(trainer_pb2.GetRunRequest(run_id="run-k"), timeout=10)).run
        assert run.state == trainer_pb2.RUN_STATE_COMPLETED, run.error
        assert run.step == 4 and run.policy_version == 4
        assert [m.step for m in seen] == [1, 2, 3, 4]
        # Group n (reward n/100) trained step n: none repeated or skipped across the kill.
        assert [m.metrics["reward/mean"] for m in seen] == pytest.approx([0.01, 0.02, 0.03, 0.04])
        assert [v for _, v in world.weight_updates] == [1, 2, 3, 4]
        assert "run.resumed" in second.log()
        tags = read_scalar_tags(tmp_path / "ckpt" / "tensorboard" / "run-k")
        assert sorted(set(tags["reward/mean"])) == [1, 2, 3, 4]
        assert {"time/train_s", "samples/dropped", "entropy", "is/mean"} <= set(tags)
    finally:
        first.stop()
        second.stop()
        await server.stop(0)
