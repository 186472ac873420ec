"""``openforge.trainer.v1.TrainerService``: proto ↔ domain translation only.

StartRun, StopRun and WatchMetrics answer UNIMPLEMENTED until the training
loop is built; GetRun reads the run registry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_trainer.domain.runs import Run, RunRegistry, RunState

_STATES = {
    RunState.PENDING: trainer_pb2.RUN_STATE_PENDING,
    RunState.RUNNING: trainer_pb2.RUN_STATE_RUNNING,
    RunState.STOPPED: trainer_pb2.RUN_STATE_STOPPED,
    RunState.COMPLETED: trainer_pb2.RUN_STATE_COMPLETED,
    RunState.FAILED: trainer_pb2.RUN_STATE_FAILED,
}


def run_to_proto(run: Run) -> trainer_pb2.Run:
    """Domain run → proto."""
    created = Timestamp()
    created.FromNanoseconds(int(run.create_time * 1e9))
    return trainer_pb2.Run(
        run_id=run.run_id,
        config=json_format.ParseDict(run.config, struct_pb2.Struct()),
        state=_STATES[run.state],
        step=run.step,
        policy_version=run.policy_version,
        checkpoint_uri=run.checkpoint_uri,
        create_time=created,
        error=run.error,
    )


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """Runs over gRPC, backed by a :class:`RunRegistry`."""

    def __init__(self, runs: RunRegistry) -> None:
        self._runs = runs

    async def GetRun(
        self, request: trainer_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.GetRunResponse:
        """One run. Errors: NOT_FOUND."""
        return trainer_pb2.GetRunResponse(run=run_to_proto(self._runs.get(request.run_id)))

    async def StartRun(
        self, request: trainer_pb2.StartRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.StartRunResponse:
        """Not built yet: answers UNIMPLEMENTED (the training loop)."""
        raise NotImplementedError

    async def StopRun(
        self, request: trainer_pb2.StopRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.StopRunResponse:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError

    async def WatchMetrics(
        self, request: trainer_pb2.WatchMetricsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[trainer_pb2.WatchMetricsResponse]:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError
        yield  # an async generator, as the streaming handler expects
