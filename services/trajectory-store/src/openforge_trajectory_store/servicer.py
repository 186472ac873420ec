"""``openforge.trajectory.v1.TrajectoryService``: proto ↔ domain translation only.

GetSamples, WatchCompletedGroups and Export answer UNIMPLEMENTED until sample
assembly and exports are built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_trajectory_store.domain.record import Record, RolloutFilter


class TrajectoryServicer(trajectory_pb2_grpc.TrajectoryServiceServicer):
    """Reads of the record."""

    def __init__(self, record: Record) -> None:
        self._record = record

    async def GetRollout(
        self, request: trajectory_pb2.GetRolloutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetRolloutResponse:
        """One rollout as recorded. Errors: NOT_FOUND."""
        return trajectory_pb2.GetRolloutResponse(rollout=self._record.rollout(request.rollout_id))

    async def ListRollouts(
        self, request: trajectory_pb2.ListRolloutsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ListRolloutsResponse:
        """A page of matching rollouts, newest first. Errors: INVALID_ARGUMENT (page token/size)."""
        flt = RolloutFilter(
            run_id=request.run_id,
            task_id=request.task_id,
            status=request.status,
            min_reward=request.min_reward if request.HasField("min_reward") else None,
            max_reward=request.max_reward if request.HasField("max_reward") else None,
        )
        page, token = self._record.list_rollouts(flt, request.page_size, request.page_token)
        return trajectory_pb2.ListRolloutsResponse(rollouts=page, next_page_token=token)

    async def GetCalls(
        self, request: trajectory_pb2.GetCallsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetCallsResponse:
        """Every attempt of every call of a rollout. Errors: NOT_FOUND."""
        return trajectory_pb2.GetCallsResponse(calls=self._record.calls(request.rollout_id))

    async def GetSamples(
        self, request: trajectory_pb2.GetSamplesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetSamplesResponse:
        """Not built yet: answers UNIMPLEMENTED (sample assembly)."""
        raise NotImplementedError

    async def WatchCompletedGroups(
        self, request: trajectory_pb2.WatchCompletedGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[trajectory_pb2.WatchCompletedGroupsResponse]:
        """Not built yet: answers UNIMPLEMENTED (group completion)."""
        raise NotImplementedError
        yield  # an async generator, as the streaming handler expects

    async def Export(
        self, request: trajectory_pb2.ExportRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ExportResponse:
        """Not built yet: answers UNIMPLEMENTED (Parquet/JSONL export)."""
        raise NotImplementedError
