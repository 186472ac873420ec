"""What the trainer's orchestrator client puts on the wire: a real gRPC server (a recording
fake of the orchestrator) receives the ``SubmitRolloutsRequest`` the loop's request becomes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.errors import InvalidArgument
from openforge_core.run_config import RunConfig
from openforge_core.seeds import request_seed
from openforge_trainer.adapters.clients import OrchestratorClient
from openforge_trainer.domain.config import parse_run_config
from openforge_trainer.domain.loop import LoopDeps, TrainingLoop


class RecordingOrchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """Fake orchestrator: keeps each request and answers one rollout per group slot."""

    def __init__(self) -> None:
        self.requests: list[orchestrator_pb2.SubmitRolloutsRequest] = []
        self.cancels: list[orchestrator_pb2.CancelGroupRequest] = []

    async def SubmitRollouts(
        self, request: orchestrator_pb2.SubmitRolloutsRequest, context: Any
    ) -> orchestrator_pb2.SubmitRolloutsResponse:
        self.requests.append(request)
        return orchestrator_pb2.SubmitRolloutsResponse(
            rollouts=[
                common_pb2.Rollout(rollout_id=f"{t.task_id}-{i}", group_id=f"g-{t.task_id}", group_index=i)
                for t in request.tasks
                for i in range(request.group_size)
            ]
        )

    async def CancelGroup(
        self, request: orchestrator_pb2.CancelGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> orchestrator_pb2.CancelGroupResponse:
        self.cancels.append(request)
        if request.group_id == "g-lost":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no group 'g-lost'")
        return orchestrator_pb2.CancelGroupResponse()


@pytest.fixture
async def orchestrator() -> AsyncIterator[tuple[RecordingOrchestrator, str]]:
    servicer = RecordingOrchestrator()  # type: ignore[abstract]
    server = grpc.aio.server()
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(0)


def _loop(config: RunConfig, client: OrchestratorClient) -> TrainingLoop:
    unused: Any = None  # _submit_ahead touches only the submitter
    deps = LoopDeps(
        backend_factory=unused, submitter=client, groups=unused, weights=unused, checkpoints=unused, sinks=[]
    )
    return TrainingLoop("run-s", config, deps)


async def _first_submission(
    config: RunConfig, servicer: RecordingOrchestrator, target: str
) -> orchestrator_pb2.SubmitRolloutsRequest:
    """The one ``SubmitRollouts`` request the loop's first submission sends."""
    client = OrchestratorClient(target, timeout_s=5)
    try:
        await _loop(config, client)._submit_ahead()
    finally:
        await client.close()
    (req,) = servicer.requests
    return req


async def test_the_run_sampling_and_limits_go_into_submit_rollouts(
    orchestrator: tuple[RecordingOrchestrator, str],
) -> None:
    servicer, target = orchestrator
    config = parse_run_config(
        {
            "model": "m",
            "task_split": "train",
            "tasks": ["a", "b"],
            "group_size": 3,
            "groups_per_step": 2,
            "steps": 1,
            "temperature": 0.7,
            "max_tokens": 48,
            "max_turns": 5,
            "max_total_tokens": 4096,
            "rollout_timeout_s": 90.5,
            "command": ["python3", "-c", "print('{model}')"],
        }
    )
    req = await _first_submission(config, servicer, target)
    assert req.request_id == "run-s/step/1" and req.run_id == "run-s"
    assert sorted(t.task_id for t in req.tasks) == ["a", "b"] and {t.task_set for t in req.tasks} == {"train"}
    assert req.group_size == 3 and req.harness == "command" and req.model_name == "policy"
    assert req.HasField("sampling")
    assert req.sampling.HasField("temperature") and req.sampling.temperature == pytest.approx(0.7)
    assert req.sampling.max_tokens == 48
    assert not req.sampling.HasField("top_p") and not req.sampling.HasField("top_k")
    # the request's seed, from the run seed and the request key; the orchestrator derives one per
    # rollout from it (a seed shared by a group's rollouts would make them identical)
    assert req.sampling.seed == request_seed(0, "step/1")
    assert (req.limits.max_turns, req.limits.max_tokens_per_call, req.limits.max_total_tokens) == (5, 0, 4096)
    assert list(req.command) == ["python3", "-c", "print('{model}')"]
    assert req.timeout.seconds == 90 and req.timeout.nanos == 500_000_000


async def test_the_default_temperature_is_still_enforced(orchestrator: tuple[RecordingOrchestrator, str]) -> None:
    """Temperature 1 is sent explicitly, so a harness asking for another one does not get it."""
    servicer, target = orchestrator
    config = parse_run_config({"model": "m", "tasks": ["a"], "steps": 1})
    req = await _first_submission(config, servicer, target)
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 1.0
    assert req.sampling.max_tokens == 0
    assert not req.HasField("limits") and list(req.command) == []


async def test_a_run_without_seeded_sampling_sends_no_seed(orchestrator: tuple[RecordingOrchestrator, str]) -> None:
    servicer, target = orchestrator
    config = parse_run_config({"model": "m", "tasks": ["a"], "steps": 1, "seed": 7, "seeded_sampling": False})
    req = await _first_submission(config, servicer, target)
    assert not req.sampling.HasField("seed")


async def test_cancel_group_sends_the_reason_and_a_group_the_orchestrator_lost_is_nothing_to_cancel(
    orchestrator: tuple[RecordingOrchestrator, str],
) -> None:
    servicer, target = orchestrator
    client = OrchestratorClient(target, timeout_s=5)
    try:
        await client.cancel_group("g-a", "not needed")
        await client.cancel_group("g-lost", "not needed")  # NOT_FOUND: no error
    finally:
        await client.close()
    assert [(r.group_id, r.reason) for r in servicer.cancels] == [("g-a", "not needed"), ("g-lost", "not needed")]


@pytest.mark.parametrize(
    ("field", "value"), [("temperature", 0.0), ("temperature", 2.5), ("max_tokens", -1), ("max_turns", -2)]
)
def test_bad_sampling_values_name_the_field(field: str, value: float) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_run_config({"model": "m", "tasks": ["a"], field: value})
    assert [v.field for v in err.value.violations] == [field]
