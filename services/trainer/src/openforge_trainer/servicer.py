"""``openforge.trainer.v1.TrainerService``: proto ↔ domain translation only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_core.field_rules import require
from openforge_core.timestamps import to_timestamp
from openforge_trainer.domain.runs import Run, RunManager, RunState

_STATES = {
    RunState.PENDING: trainer_pb2.RUN_STATE_PENDING,
    RunState.RUNNING: trainer_pb2.RUN_STATE_RUNNING,
    RunState.STOPPED: trainer_pb2.RUN_STATE_STOPPED,
    RunState.COMPLETED: trainer_pb2.RUN_STATE_COMPLETED,
    RunState.FAILED: trainer_pb2.RUN_STATE_FAILED,
}


def run_to_proto(run: Run) -> trainer_pb2.Run:
    """Domain run → proto."""
    return trainer_pb2.Run(
        run_id=run.run_id,
        config=json_format.ParseDict(run.config, struct_pb2.Struct()),
        state=_STATES[run.state],
        step=run.step,
        policy_version=run.policy_version,
        checkpoint_uri=run.checkpoint_uri,
        create_time=to_timestamp(run.create_time),
        error=run.error,
    )


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """Runs over gRPC, backed by a :class:`RunManager`.

    Every id and ``config_path`` of a request are checked by the shared server against
    :mod:`openforge_core.field_rules` (a run id never names a folder outside the trainer's, a
    path never holds a NUL) before a method runs; the methods only say which are required.
    """

    def __init__(self, runs: RunManager) -> None:
        self._runs = runs

    async def StartRun(
        self, request: trainer_pb2.StartRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.StartRunResponse:
        """Starts (or resumes) a run; idempotent per request_id.

        Errors: INVALID_ARGUMENT (config does not validate, malformed run id or config_path; a
        BadRequest lists the fields); FAILED_PRECONDITION (another run is training).
        """
        run = self._runs.start(
            request_id=request.request_id,
            run_id=request.run_id,
            config=json_format.MessageToDict(request.config) if request.HasField("config") else {},
            config_path=request.config_path,
        )
        return trainer_pb2.StartRunResponse(run=run_to_proto(run))

    async def GetRun(
        self, request: trainer_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.GetRunResponse:
        """One run. Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id)."""
        require(request, "run_id")
        return trainer_pb2.GetRunResponse(run=run_to_proto(self._runs.runs.get(request.run_id)))

    async def StopRun(
        self, request: trainer_pb2.StopRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.StopRunResponse:
        """Asks the run to stop after its current step; idempotent.

        Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id).
        """
        require(request, "run_id")
        return trainer_pb2.StopRunResponse(run=run_to_proto(self._runs.stop(request.run_id)))

    async def WatchMetrics(
        self, request: trainer_pb2.WatchMetricsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[trainer_pb2.WatchMetricsResponse]:
        """Every recorded step >= from_step, then new ones; ends with the run's loop.

        Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id).
        """
        require(request, "run_id")
        async for entry in self._runs.watch_metrics(request.run_id, request.from_step):
            yield trainer_pb2.WatchMetricsResponse(
                step=entry.step, metrics=entry.metrics, time=to_timestamp(entry.time_s)
            )
