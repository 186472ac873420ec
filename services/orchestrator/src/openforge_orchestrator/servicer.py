"""``openforge.orchestrator.v1.OrchestratorService``: proto ↔ domain translation only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.field_rules import require
from openforge_orchestrator.convert import rollout_to_proto
from openforge_orchestrator.domain.rollouts import RolloutLimits, RolloutRegistry, TaskRef
from openforge_orchestrator.domain.scheduler import Scheduler


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """Rollouts over gRPC, backed by a :class:`Scheduler` and its :class:`RolloutRegistry`.

    Every id, the harness name and each command word of a request are checked by the shared
    server against :mod:`openforge_core.field_rules` before a method runs; the methods only say
    which are required.
    """

    def __init__(self, rollouts: RolloutRegistry, scheduler: Scheduler) -> None:
        self._rollouts = rollouts
        self._scheduler = scheduler

    async def SubmitRollouts(
        self, request: orchestrator_pb2.SubmitRolloutsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> orchestrator_pb2.SubmitRolloutsResponse:
        """Accepts one group per task and schedules it; idempotent per ``request_id``.

        Errors: INVALID_ARGUMENT (bad request or task folder), NOT_FOUND (unknown task),
        FAILED_PRECONDITION (reason HARNESS_NOT_INSTALLED: the harness is not installed here).
        """
        created = await self._scheduler.submit(
            request_id=request.request_id,
            run_id=request.run_id,
            tasks=[TaskRef(task_id=t.task_id, task_set=t.task_set) for t in request.tasks],
            group_size=request.group_size,
            harness=request.harness,
            model_name=request.model_name,
            min_policy_version=request.min_policy_version,
            timeout_s=request.timeout.ToNanoseconds() / 1e9 if request.HasField("timeout") else 0.0,
            limits=RolloutLimits(
                max_turns=request.limits.max_turns,
                max_tokens_per_call=request.limits.max_tokens_per_call,
                max_total_tokens=request.limits.max_total_tokens,
            ),
            sampling=request.sampling if request.HasField("sampling") else None,
            command=tuple(request.command),
        )
        return orchestrator_pb2.SubmitRolloutsResponse(rollouts=[rollout_to_proto(r) for r in created])

    async def GetRollout(
        self, request: orchestrator_pb2.GetRolloutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> orchestrator_pb2.GetRolloutResponse:
        """One rollout. Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id)."""
        require(request, "rollout_id")
        return orchestrator_pb2.GetRolloutResponse(rollout=rollout_to_proto(self._rollouts.get(request.rollout_id)))

    async def WatchRollouts(
        self, request: orchestrator_pb2.WatchRolloutsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[orchestrator_pb2.WatchRolloutsResponse]:
        """Current state of matching rollouts, then every change, until the client cancels."""
        async for r in self._rollouts.watch(run_id=request.run_id, group_id=request.group_id):
            yield orchestrator_pb2.WatchRolloutsResponse(rollout=rollout_to_proto(r))

    async def CancelRollout(
        self, request: orchestrator_pb2.CancelRolloutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> orchestrator_pb2.CancelRolloutResponse:
        """Cancels a rollout (stops its sandbox, keeps its calls); idempotent on ended rollouts.

        Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id, overlong reason).
        """
        require(request, "rollout_id")
        r = await self._scheduler.cancel(request.rollout_id, request.reason)
        return orchestrator_pb2.CancelRolloutResponse(rollout=rollout_to_proto(r))

    async def CancelGroup(
        self, request: orchestrator_pb2.CancelGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> orchestrator_pb2.CancelGroupResponse:
        """Cancels every rollout of a group that has not ended; idempotent on ended rollouts.

        Errors: NOT_FOUND (unknown group); INVALID_ARGUMENT (missing or malformed id, overlong
        reason).
        """
        require(request, "group_id")
        rs = await self._scheduler.cancel_group(request.group_id, request.reason)
        return orchestrator_pb2.CancelGroupResponse(rollouts=[rollout_to_proto(r) for r in rs])
