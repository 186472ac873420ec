"""gRPC clients of the orchestrator, the trajectory store and inference (proto ↔ domain here).

Every unary call has a deadline; only idempotent methods are retried (SubmitRollouts and
UpdateWeights carry ``request_id``; CancelGroup leaves ended rollouts as they are; the store's
methods are reads). The completed-groups watch
reconnects after a transient failure from the cursor of the last group it delivered, so the
caller sees no repeat and no gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Final, Literal

import grpc
import structlog
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.errors import Unavailable
from openforge_core.rpc.client import open_channel
from openforge_trainer.domain.ports import RolloutRequest
from openforge_trainer.domain.samples import CompletedGroup, ExcludedRollout, ExclusionReason, TrainSample

log = structlog.get_logger(__name__)

#: ``Sample.role`` → :attr:`TrainSample.role` (UNSPECIFIED, from stores before roles: main).
_ROLES: Final[dict[int, str]] = {
    common_pb2.CALL_ROLE_MAIN: "main",
    common_pb2.CALL_ROLE_SUB_AGENT: "sub_agent",
    common_pb2.CALL_ROLE_COMPACTION: "compaction",
    common_pb2.CALL_ROLE_SIDE: "side",
}

#: Inference refused the weights themselves: the file path would refuse them too.
_REFUSED_WEIGHTS: Final = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS}

#: How the trainer hands checkpoints to inference (:class:`InferenceClient`).
WeightSyncMode = Literal["file", "stream"]

_RETRYABLE_STREAM = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}

#: Start of the ``failure_reason`` of a rollout the orchestrator flagged for bypassing the proxy.
BYPASS_PREFIX: Final = "bypass:"

_REASON_OF_STATUS: Final[dict[int, ExclusionReason]] = {
    common_pb2.ROLLOUT_STATUS_FAILED: "failed",
    common_pb2.ROLLOUT_STATUS_CANCELLED: "cancelled",
    common_pb2.ROLLOUT_STATUS_TIMED_OUT: "timed_out",
}


def group_from_proto(msg: trajectory_pb2.WatchCompletedGroupsResponse) -> CompletedGroup:
    """``WatchCompletedGroupsResponse`` → :class:`CompletedGroup`.

    A rollout is trainable iff its ``Rollout.reward`` is set (the verifier scored it; a rollout
    that timed out and was still scored is trainable). The samples of the other rollouts are
    left out, never trained as reward 0 (the store leaves their ``Sample.reward`` at its default),
    and each such rollout is listed in ``excluded`` with :func:`exclusion_reason`. A sample whose
    rollout is not in ``msg.rollouts`` has no reward either (reason ``no_reward``). Each kept
    sample takes its rollout's group id, task and reward.
    """
    rollouts: dict[str, common_pb2.Rollout] = {r.rollout_id: r for r in msg.rollouts}
    rewards = {r.rollout_id: r.reward for r in msg.rollouts if r.HasField("reward")}
    samples: list[TrainSample] = []
    left_out: dict[str, int] = {r.rollout_id: 0 for r in msg.rollouts if r.rollout_id not in rewards}
    # each rollout's samples in the group's order (the store's is by rollout id, a random id):
    # the same rollouts make the same batch
    position = {r.rollout_id: (r.group_index, i) for i, r in enumerate(msg.rollouts)}
    last = (len(position), len(position))
    for s in sorted(msg.samples, key=lambda s: (position.get(s.rollout_id, last), s.index)):
        if s.rollout_id not in rewards:
            left_out[s.rollout_id] = left_out.get(s.rollout_id, 0) + 1
            continue
        samples.append(
            TrainSample(
                sample_id=s.sample_id,
                rollout_id=s.rollout_id,
                group_id=msg.group_id,
                task_id=rollouts[s.rollout_id].task_id,
                prompt_ids=tuple(s.prompt_token_ids),
                response_ids=tuple(s.response_token_ids),
                loss_mask=tuple(s.loss_mask),
                behaviour_logprobs=tuple(s.rollout_logprobs),
                policy_versions=tuple(s.policy_versions),
                reward=rewards[s.rollout_id],
                calls=len(s.call_ids),
                role=_ROLES.get(s.role, "main"),
            )
        )
    excluded = tuple(
        ExcludedRollout(rid, exclusion_reason(rollouts[rid]) if rid in rollouts else "no_reward", n)
        for rid, n in left_out.items()
    )
    return CompletedGroup(
        group_id=msg.group_id,
        task_id=msg.task_id,
        rewards=rewards,
        samples=tuple(samples),
        cursor=msg.cursor,
        excluded=excluded,
    )


def exclusion_reason(rollout: common_pb2.Rollout) -> ExclusionReason:
    """Why a rollout without a reward is not trained on, from its status and failure reason.

    ``bypass`` when ``failure_reason`` starts with ``"bypass:"`` (the orchestrator's flag for a
    harness that reached the model around the proxy or made no proxy call; such a rollout is
    FAILED or TIMED_OUT), else ``failed``, ``cancelled`` or ``timed_out`` by ``status``, else
    ``no_reward``.
    """
    if rollout.failure_reason.startswith(BYPASS_PREFIX):
        return "bypass"
    return _REASON_OF_STATUS.get(rollout.status, "no_reward")


class OrchestratorClient:
    """``SubmitRollouts`` and ``CancelGroup`` on the orchestrator.

    Args:
        target: ``host:port``.
        timeout_s: Deadline of each call, seconds.
    """

    SERVICE = "openforge.orchestrator.v1.OrchestratorService"

    def __init__(self, target: str, timeout_s: float = 30.0) -> None:
        self._channel = open_channel(
            target,
            service=self.SERVICE,
            idempotent_methods=["SubmitRollouts", "CancelGroup"],
            default_timeout_s=timeout_s,
        )
        self._stub = orchestrator_pb2_grpc.OrchestratorServiceStub(self._channel)

    async def submit(self, request: RolloutRequest) -> list[str]:
        """Submits the groups; returns their group ids in task order (idempotent per request id).

        The run's temperature always goes in ``sampling`` (the proxy then enforces it on every
        call, whatever the harness sends), with ``max_tokens`` and ``seed`` when set; ``limits`` carries
        the per-rollout turn and token limits when set.
        """
        sampling = common_pb2.SamplingParams(temperature=request.temperature, max_tokens=request.max_tokens)
        if request.seed is not None:
            sampling.seed = request.seed
        msg = orchestrator_pb2.SubmitRolloutsRequest(
            request_id=request.request_id,
            run_id=request.run_id,
            tasks=[orchestrator_pb2.TaskRef(task_id=t, task_set=request.task_set) for t in request.task_ids],
            group_size=request.group_size,
            harness=request.harness,
            model_name=request.model_name,
            min_policy_version=request.min_policy_version,
            sampling=sampling,
            command=list(request.command),
        )
        if request.max_turns or request.max_total_tokens:
            msg.limits.CopyFrom(
                orchestrator_pb2.RolloutLimits(max_turns=request.max_turns, max_total_tokens=request.max_total_tokens)
            )
        if request.timeout_s > 0:
            msg.timeout.CopyFrom(Duration(seconds=int(request.timeout_s), nanos=int(request.timeout_s % 1 * 1e9)))
        resp = await self._stub.SubmitRollouts(msg)
        return _unique(r.group_id for r in resp.rollouts)

    async def cancel_group(self, group_id: str, reason: str) -> None:
        """Cancels the group's rollouts that have not ended (idempotent); a group the orchestrator
        does not know (NOT_FOUND: it restarted since) is nothing to cancel.

        Raises:
            grpc.aio.AioRpcError: Any other error, once the retries are spent.
        """
        try:
            await self._stub.CancelGroup(orchestrator_pb2.CancelGroupRequest(group_id=group_id, reason=reason))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()


class StoreClient:
    """``WatchCompletedGroups`` on the trajectory store, resumable.

    Args:
        target: ``host:port``.
        reconnect_s: Wait before reconnecting after a transient failure, seconds.
        max_message_bytes: Largest group message accepted, bytes.
    """

    SERVICE = "openforge.trajectory.v1.TrajectoryService"

    def __init__(self, target: str, reconnect_s: float = 1.0, max_message_bytes: int = 256 * 1024 * 1024) -> None:
        self._channel = open_channel(
            target,
            service=self.SERVICE,
            idempotent_methods=["WatchCompletedGroups"],
            max_message_bytes=max_message_bytes,
        )
        self._stub = trajectory_pb2_grpc.TrajectoryServiceStub(self._channel)
        self._reconnect_s = reconnect_s

    async def watch(self, run_id: str, cursor: str) -> AsyncIterator[CompletedGroup]:
        """Completed groups of ``run_id`` after ``cursor``, forever (reconnecting as needed)."""
        while True:
            call = self._stub.WatchCompletedGroups(
                trajectory_pb2.WatchCompletedGroupsRequest(run_id=run_id, cursor=cursor), timeout=None
            )
            try:
                async for msg in call:
                    group = group_from_proto(msg)
                    cursor = group.cursor
                    yield group
                log.warning("store.watch_ended", run_id=run_id, cursor=cursor)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRYABLE_STREAM:
                    raise
                log.warning("store.watch_reconnecting", run_id=run_id, cursor=cursor, code=exc.code().name)
            finally:
                call.cancel()
            await asyncio.sleep(self._reconnect_s)

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()


class InferenceClient:
    """``UpdateWeights`` (or ``PushWeights``) and ``GetModelInfo`` on inference.

    Args:
        target: ``host:port``.
        timeout_s: Deadline of the call (loading weights takes a while), seconds.
        weight_sync: ``file``: inference reads the checkpoint at its path (``UpdateWeights``; a
            shared filesystem); ``stream``: the checkpoint's safetensors files are streamed in
            the call (``PushWeights``; no shared filesystem), falling back to ``file`` when the
            stream fails for any reason but a refusal of the weights themselves.
        chunk_bytes: Bytes per ``PushWeights`` message.
    """

    SERVICE = "openforge.inference.v1.InferenceService"

    def __init__(
        self, target: str, timeout_s: float = 300.0, weight_sync: WeightSyncMode = "file", chunk_bytes: int = 1 << 20
    ) -> None:
        self._channel = open_channel(
            target,
            service=self.SERVICE,
            idempotent_methods=["UpdateWeights", "GetModelInfo"],
            default_timeout_s=timeout_s,
        )
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._info_timeout_s = min(timeout_s, 10.0)
        self._timeout_s = timeout_s
        self._weight_sync = weight_sync
        self._chunk_bytes = chunk_bytes

    async def update_weights(self, request_id: str, uri: str, version: int, checksum: str) -> int:
        """Loads the checkpoint at ``uri`` (a local directory when streamed) as ``version``;
        returns the version serving.

        Raises:
            grpc.aio.AioRpcError: Inference refused the weights (INVALID_ARGUMENT, DATA_LOSS) or
                the file path failed too.
        """
        if self._weight_sync == "stream":
            try:
                return await self.push_weights(request_id, Path(uri), version, checksum)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REFUSED_WEIGHTS:
                    raise
                log.warning(
                    "inference.push_failed", request_id=request_id, code=exc.code().name, fallback="UpdateWeights"
                )
        resp = await self._stub.UpdateWeights(
            inference_pb2.UpdateWeightsRequest(request_id=request_id, uri=uri, version=version, checksum=checksum)
        )
        return int(resp.version)

    async def push_weights(self, request_id: str, directory: Path, version: int, checksum: str) -> int:
        """Streams the ``*.safetensors`` files of ``directory`` (by name) in ``PushWeights``;
        returns the version serving."""
        files = await asyncio.to_thread(_safetensors_files, directory)
        header = inference_pb2.PushWeightsHeader(
            request_id=request_id,
            version=version,
            checksum=checksum,
            files=[inference_pb2.PushedFile(name=p.name, size=size) for p, size in files],
        )

        async def messages() -> AsyncIterator[inference_pb2.PushWeightsRequest]:
            yield inference_pb2.PushWeightsRequest(header=header)
            for path, _size in files:
                with path.open("rb") as f:
                    while chunk := await asyncio.to_thread(f.read, self._chunk_bytes):
                        yield inference_pb2.PushWeightsRequest(chunk=chunk)

        resp = await self._stub.PushWeights(messages(), timeout=self._timeout_s)
        return int(resp.version)

    async def serving_version(self) -> int:
        """The policy version inference serves now.

        Raises:
            Unavailable: Inference cannot be reached.
        """
        try:
            info = await self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=self._info_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"inference GetModelInfo failed: {exc.code().name}") from exc
        return int(info.policy_version)

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


def _safetensors_files(directory: Path) -> list[tuple[Path, int]]:
    """The directory's ``*.safetensors`` files by name, with their sizes in bytes."""
    files = sorted((p for p in directory.glob("*.safetensors") if p.is_file()), key=lambda p: p.name)
    return [(p, p.stat().st_size) for p in files]
