"""The trainer's ``SamplingParams`` go through the orchestrator as the one message: into the
rollout, out to the proxy's ``CreateSession`` (with the rollout's own seed, derived from the
submission's) and the run's manifest, unchanged (``seed`` an int64 throughout, never the string
JSON would make of it)."""

from __future__ import annotations

from typing import Any, cast

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2
from openforge.proxy.v1 import proxy_pb2
from openforge_core.seeds import derive_seed
from openforge_orchestrator.adapters.events import run_manifest
from openforge_orchestrator.adapters.proxy import ProxySessions
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry
from openforge_orchestrator.domain.scheduler import Scheduler
from openforge_orchestrator.servicer import OrchestratorServicer

#: Above 2**53: a JSON number (a double) could not carry it, a JSON string would not be an int.
SEED = 2**53 + 1


class _Events:
    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        pass

    async def started(self, rollout: Rollout) -> None:
        pass

    async def finished(self, rollout: Rollout) -> None:
        pass


class _Scheduler:
    def __init__(self, registry: RolloutRegistry) -> None:
        self.registry = registry

    async def submit(self, **request: Any) -> list[Rollout]:
        return await self.registry.submit(**request)


class _ProxyStub:
    def __init__(self) -> None:
        self.requests: list[proxy_pb2.CreateSessionRequest] = []

    async def CreateSession(self, request: proxy_pb2.CreateSessionRequest) -> proxy_pb2.CreateSessionResponse:
        self.requests.append(request)
        return proxy_pb2.CreateSessionResponse(api_key="ofk-x")


async def _accept(sampling: common_pb2.SamplingParams | None, tasks: int = 1) -> list[Rollout]:
    """``SubmitRollouts`` (``tasks`` tasks, groups of 2) through the servicer; the rollouts
    accepted, in task then group order."""
    request = orchestrator_pb2.SubmitRolloutsRequest(
        request_id="q1",
        run_id="run",
        tasks=[orchestrator_pb2.TaskRef(task_id=f"t{i}", task_set="train") for i in range(tasks)],
        group_size=2,
        harness="mini-swe-agent",
        model_name="policy",
    )
    if sampling is not None:
        request.sampling.CopyFrom(sampling)
    registry = RolloutRegistry(_Events())
    servicer = OrchestratorServicer(registry, cast(Scheduler, _Scheduler(registry)))
    response = await servicer.SubmitRollouts(request, cast(Any, None))
    return [registry.get(r.rollout_id) for r in response.rollouts]


async def _create_session_request(rollout: Rollout) -> proxy_pb2.CreateSessionRequest:
    """The ``CreateSession`` request the proxy adapter sends for ``rollout``."""
    proxy = ProxySessions("127.0.0.1:1")
    stub = _ProxyStub()
    proxy._stub = cast(Any, stub)
    try:
        await proxy.open(rollout, attempt=1, ttl_s=60.0)
    finally:
        await proxy.aclose()
    return stub.requests[0]


async def test_the_trainers_message_reaches_the_proxy_session_and_the_manifest_unchanged() -> None:
    sent = common_pb2.SamplingParams(temperature=0.7, max_tokens=48, seed=SEED, stop_token_ids=[7])
    rollouts = await _accept(sent)
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert isinstance(rollout.sampling, common_pb2.SamplingParams) and rollout.sampling == sent
        assert type(rollout.sampling.seed) is int and rollout.sampling.seed == SEED
    sessions = [await _create_session_request(r) for r in rollouts]
    for index, request in enumerate(sessions):
        assert request.HasField("sampling")
        assert request.harness == "mini-swe-agent"  # the proxy counts its answers by it
        # the session samples with the rollout's own seed (task 0, its index), the rest as sent
        assert type(request.sampling.seed) is int and request.sampling.seed == derive_seed(SEED, "rollout", 0, index)
        request.sampling.seed = SEED
        assert request.sampling == sent
    manifest = run_manifest(rollouts[0])
    assert manifest.sampling == sent and manifest.sampling.seed == SEED


async def test_each_rollout_of_a_seeded_submission_has_its_own_seed_and_a_resubmission_the_same() -> None:
    sent = common_pb2.SamplingParams(temperature=1.0, seed=7)
    first, again = await _accept(sent, tasks=3), await _accept(sent, tasks=3)
    seeds = [r.seed for r in first]
    assert len(set(seeds)) == 6 and all(s is not None and 0 <= s < 2**63 for s in seeds)
    assert seeds == [r.seed for r in again]  # other rollout ids, the same seeds
    assert {r.rollout_id for r in first}.isdisjoint(r.rollout_id for r in again)
    assert [r.seed for r in await _accept(common_pb2.SamplingParams(temperature=1.0))] == [None, None]


async def test_no_sampling_or_an_empty_message_enforces_none() -> None:
    for sampling in (None, common_pb2.SamplingParams()):
        rollout = (await _accept(sampling))[0]
        assert rollout.sampling is None
        assert not run_manifest(rollout).HasField("sampling")
        assert not (await _create_session_request(rollout)).HasField("sampling")
