"""``openforge.trajectory.v1.TrajectoryService``: proto ↔ domain translation only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.errors import InvalidArgument
from openforge_core.field_rules import require
from openforge_trajectory_store.adapters import export
from openforge_trajectory_store.domain.ports import TrajectoryReads
from openforge_trajectory_store.domain.query import RolloutFilter, token_int

CURSOR_PREFIX = "g:"


class GroupNotifier:
    """Wakes group watchers when groups complete."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Returns on the next completion or after ``timeout_s`` (watchers then re-read)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return


def parse_cursor(cursor: str) -> int:
    """``"g:<seq>"`` → seq; "" → 0.

    Raises:
        InvalidArgument: Malformed cursor.
    """
    if not cursor:
        return 0
    seq = token_int(cursor[len(CURSOR_PREFIX) :]) if cursor.startswith(CURSOR_PREFIX) else None
    if seq is None:
        raise InvalidArgument.field("cursor", "malformed cursor (pass back a cursor this store sent)")
    return seq


class TrajectoryServicer(trajectory_pb2_grpc.TrajectoryServiceServicer):
    """Reads of the durable record.

    Every id in a request is checked by the shared server against
    :mod:`openforge_core.field_rules` before a method runs; the methods only say which are
    required.

    Args:
        repo: The repository (called in a worker thread).
        notifier: Signals completed groups to watchers.
        export_dir: The only folder ``Export`` writes into.
        poll_s: Watchers also re-read after this many seconds without a signal.
    """

    def __init__(self, repo: TrajectoryReads, notifier: GroupNotifier, export_dir: Path, poll_s: float = 5.0) -> None:
        self._repo = repo
        self._notifier = notifier
        self._export_dir = export_dir
        self._poll_s = poll_s

    async def GetRollout(
        self, request: trajectory_pb2.GetRolloutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetRolloutResponse:
        """One rollout as recorded. Errors: NOT_FOUND; INVALID_ARGUMENT (empty or malformed id)."""
        require(request, "rollout_id")
        rollout = await asyncio.to_thread(self._repo.rollout, request.rollout_id)
        return trajectory_pb2.GetRolloutResponse(rollout=rollout)

    async def ListRollouts(
        self, request: trajectory_pb2.ListRolloutsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ListRolloutsResponse:
        """A page of matching rollouts, newest first. Errors: INVALID_ARGUMENT (page token/size, malformed id)."""
        flt = RolloutFilter(
            run_id=request.run_id,
            task_id=request.task_id,
            status=request.status,
            min_reward=request.min_reward if request.HasField("min_reward") else None,
            max_reward=request.max_reward if request.HasField("max_reward") else None,
        )
        page, token = await asyncio.to_thread(self._repo.list_rollouts, flt, request.page_size, request.page_token)
        return trajectory_pb2.ListRolloutsResponse(rollouts=page, next_page_token=token)

    async def GetCalls(
        self, request: trajectory_pb2.GetCallsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetCallsResponse:
        """Every attempt of every call of a rollout. Errors: NOT_FOUND; INVALID_ARGUMENT (empty or malformed id)."""
        require(request, "rollout_id")
        return trajectory_pb2.GetCallsResponse(calls=await asyncio.to_thread(self._repo.calls, request.rollout_id))

    async def GetSamples(
        self, request: trajectory_pb2.GetSamplesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetSamplesResponse:
        """A rollout's samples. Errors: NOT_FOUND; FAILED_PRECONDITION (not ended/assembled yet);
        INVALID_ARGUMENT (empty or malformed id)."""
        require(request, "rollout_id")
        return trajectory_pb2.GetSamplesResponse(
            samples=await asyncio.to_thread(self._repo.samples, request.rollout_id)
        )

    async def WatchCompletedGroups(
        self, request: trajectory_pb2.WatchCompletedGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[trajectory_pb2.WatchCompletedGroupsResponse]:
        """Every completed group of the run after the cursor, then new ones. Errors: INVALID_ARGUMENT."""
        after = parse_cursor(request.cursor)
        while True:
            groups = await asyncio.to_thread(self._repo.completed_groups, request.run_id, after)
            for g in groups:
                rollouts, samples = await asyncio.to_thread(self._repo.group_contents, g.group_id)
                yield trajectory_pb2.WatchCompletedGroupsResponse(
                    group_id=g.group_id,
                    task_id=g.task_id,
                    rollouts=rollouts,
                    samples=samples,
                    cursor=f"{CURSOR_PREFIX}{g.seq}",
                )
                after = g.seq
            if not groups:
                await self._notifier.wait(self._poll_s)

    async def Export(
        self, request: trajectory_pb2.ExportRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ExportResponse:
        """Writes a run's samples to ``file_name`` in the export folder, never anywhere else.

        Errors: NOT_FOUND (run); INVALID_ARGUMENT (format unspecified; file_name missing, not a
        plain file name, or a symbolic link or folder in the export folder).
        """
        if request.format == trajectory_pb2.EXPORT_FORMAT_UNSPECIFIED:
            raise InvalidArgument.field("format", "choose EXPORT_FORMAT_PARQUET or EXPORT_FORMAT_JSONL")
        path = export.export_path(self._export_dir, request.file_name)
        rows = await asyncio.to_thread(self._export_rows, request.run_id, request.include_requests)
        if request.format == trajectory_pb2.EXPORT_FORMAT_PARQUET:
            n = await asyncio.to_thread(export.write_parquet, path, rows, request.include_requests)
        else:
            n = await asyncio.to_thread(export.write_jsonl, path, rows)
        return trajectory_pb2.ExportResponse(path=str(path), rows=n)

    async def ListRuns(
        self, request: trajectory_pb2.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ListRunsResponse:
        """A page of runs with manifests and counts, newest first. Errors: INVALID_ARGUMENT (page token/size)."""
        runs, token = await asyncio.to_thread(self._repo.list_runs, request.page_size, request.page_token)
        return trajectory_pb2.ListRunsResponse(runs=runs, next_page_token=token)

    async def GetRun(
        self, request: trajectory_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.GetRunResponse:
        """One run with its manifest and counts. Errors: NOT_FOUND; INVALID_ARGUMENT (empty or malformed id)."""
        require(request, "run_id")
        return trajectory_pb2.GetRunResponse(run=await asyncio.to_thread(self._repo.run_summary, request.run_id))

    async def ListStepMetrics(
        self, request: trajectory_pb2.ListStepMetricsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trajectory_pb2.ListStepMetricsResponse:
        """A page of a run's step metrics in step order. Errors: NOT_FOUND (run); INVALID_ARGUMENT."""
        require(request, "run_id")
        steps, token = await asyncio.to_thread(
            self._repo.step_metrics_page, request.run_id, request.page_size, request.page_token
        )
        return trajectory_pb2.ListStepMetricsResponse(steps=steps, next_page_token=token)

    def _export_rows(self, run_id: str, include_requests: bool) -> list[dict[str, object]]:
        items = self._repo.run_samples(run_id)
        requests: dict[str, dict[str, object]] | None = None
        if include_requests:
            requests = {}
            for rollout_id in dict.fromkeys(r.rollout_id for r, _ in items):
                requests.update(export.request_bodies(self._repo.calls(rollout_id)))
        return export.rows(items, requests)
