"""``openforge.inference.v1.InferenceService``: proto ↔ domain translation only.

Engine errors carry their own gRPC code (``engines.base``: INVALID_ARGUMENT for a bad request or
checkpoint, ALREADY_EXISTS for a duplicate request id, FAILED_PRECONDITION for a too-old policy,
DATA_LOSS for a checksum mismatch, UNAVAILABLE when the engine is down), mapped by the shared
interceptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.errors import FailedPrecondition, Unavailable
from openforge_core.field_rules import require
from openforge_inference.engines.base import (
    CheckpointError,
    Engine,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    ModelInfo,
    SamplingOptions,
)
from openforge_inference.pushed_weights import PushedFile, PushStaging

_FINISH = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}
#: UpdateWeights and PushWeights answers remembered for idempotent retries (by request_id).
_UPDATE_MEMORY = 256
_DEFAULT_PUSH_MAX_BYTES = 64 * 1024**3
_Response = TypeVar("_Response", inference_pb2.UpdateWeightsResponse, inference_pb2.PushWeightsResponse)

WeightsListener = Callable[[str, int, str], Awaitable[None]]


def sampling_options(p: common_pb2.SamplingParams) -> SamplingOptions:
    """``SamplingParams`` → engine options (unset optional fields stay None = engine default)."""
    return SamplingOptions(
        max_tokens=p.max_tokens,
        temperature=p.temperature if p.HasField("temperature") else None,
        top_p=p.top_p if p.HasField("top_p") else None,
        top_k=p.top_k if p.HasField("top_k") else None,
        stop_token_ids=tuple(p.stop_token_ids),
        seed=p.seed if p.HasField("seed") else None,
        top_logprobs=p.top_logprobs,
    )


def delta_to_proto(d: GenerateDelta) -> inference_pb2.GenerateResponse:
    """Engine delta → ``GenerateResponse``."""
    msg = inference_pb2.GenerateResponse(
        token_ids=d.token_ids,
        logprobs=d.logprobs,
        policy_versions=d.policy_versions,
        top_logprobs=[inference_pb2.TopLogprobs(token_ids=t.token_ids, logprobs=t.logprobs) for t in d.top_logprobs],
    )
    if d.finish_reason is not None:
        msg.finish_reason = _FINISH[d.finish_reason]
    if d.usage is not None:
        msg.usage.prompt_tokens = d.usage.prompt_tokens
        msg.usage.completion_tokens = d.usage.completion_tokens
    return msg


def model_info_to_proto(m: ModelInfo) -> inference_pb2.GetModelInfoResponse:
    """Engine model info → ``GetModelInfoResponse``."""
    return inference_pb2.GetModelInfoResponse(
        model_path=m.model_path,
        model_name=m.model_name,
        vocab_size=m.vocab_size,
        context_length=m.context_length,
        tokenizer_hash=m.tokenizer_hash,
        chat_template_hash=m.chat_template_hash,
        chat_template=m.chat_template,
        policy_version=m.policy_version,
        engine=m.engine,
        eos_token_ids=list(m.eos_token_ids),
    )


_END: Any = object()


def _merge(deltas: list[GenerateDelta]) -> GenerateDelta:
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return GenerateDelta(
        token_ids=tuple(t for d in deltas for t in d.token_ids),
        logprobs=tuple(x for d in deltas for x in d.logprobs),
        policy_versions=tuple(v for d in deltas for v in d.policy_versions),
        top_logprobs=tuple(t for d in deltas for t in d.top_logprobs),
        finish_reason=last.finish_reason,
        usage=last.usage,
    )


async def _coalesced(stream: AsyncIterator[GenerateDelta]) -> AsyncIterator[GenerateDelta]:
    """Yields the engine's deltas, merging those that arrived while the previous message was
    being sent, so a slow reader gets fewer, larger messages instead of falling behind (tokens,
    logprobs and versions keep their order; the finish reason and usage stay on the last).

    Closing this generator (the client went away) closes the engine stream, which aborts the
    request.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for delta in stream:
                queue.put_nowait(delta)
        except Exception as exc:
            queue.put_nowait(exc)
        queue.put_nowait(_END)

    task = asyncio.create_task(pump())
    try:
        done = False
        while not done:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            batch: list[GenerateDelta] = []
            for item in items:
                if item is _END:
                    done = True
                    break
                if isinstance(item, Exception):
                    raise item
                batch.append(item)
            if batch:
                yield _merge(batch)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await stream.aclose()  # type: ignore[attr-defined]


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """The inference API over one engine.

    Args:
        engine: The engine, or None when no model is configured.
        on_weights: Called after new weights serve (uri, version, checksum), e.g. to publish
            ``WeightsLoaded``.
        pushes: Where ``PushWeights`` stages the files it receives (None = a tmpfs folder, at
            most 64 GiB a push).
    """

    def __init__(
        self,
        engine: Engine | None,
        on_weights: WeightsListener | None = None,
        pushes: PushStaging | None = None,
    ) -> None:
        self._engine = engine
        self._on_weights = on_weights
        self._pushes = pushes or PushStaging(None, _DEFAULT_PUSH_MAX_BYTES)
        self._updates: OrderedDict[str, inference_pb2.UpdateWeightsResponse] = OrderedDict()
        self._pushed: OrderedDict[str, inference_pb2.PushWeightsResponse] = OrderedDict()

    def _require(self) -> Engine:
        if self._engine is None:
            raise Unavailable(
                "no model is configured (set OPENFORGE_MODEL_PATH to an HF model directory)", reason="NO_MODEL"
            )
        return self._engine

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.GetModelInfoResponse:
        """Describes the served model. Errors: FAILED_PRECONDITION when no model is configured."""
        if self._engine is None:
            raise FailedPrecondition(
                "no model is configured (set OPENFORGE_MODEL_PATH to an HF model directory)", reason="NO_MODEL"
            )
        return model_info_to_proto(await self._engine.model_info())

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Streams a completion as deltas; the last carries finish reason and usage.

        Errors: INVALID_ARGUMENT, ALREADY_EXISTS, FAILED_PRECONDITION, UNAVAILABLE (see the proto).
        A client that goes away aborts the generation.
        """
        engine = self._require()
        req = GenerateRequest(
            request_id=request.request_id or f"gen-{uuid.uuid4().hex}",
            prompt_token_ids=request.prompt_token_ids,
            sampling=sampling_options(request.sampling),
            min_policy_version=request.min_policy_version,
        )
        async for delta in _coalesced(engine.generate(req)):
            yield delta_to_proto(delta)

    async def Abort(
        self, request: inference_pb2.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.AbortResponse:
        """Aborts an in-flight generation; idempotent. Errors: INVALID_ARGUMENT (missing or malformed id)."""
        require(request, "request_id")
        return inference_pb2.AbortResponse(found=await self._require().abort(request.request_id))

    async def Pause(
        self, request: inference_pb2.PauseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.PauseResponse:
        """Stops scheduling; in-flight requests wait. Idempotent."""
        return inference_pb2.PauseResponse(in_flight=await self._require().pause())

    async def Resume(
        self, request: inference_pb2.ResumeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.ResumeResponse:
        """Resumes scheduling. Idempotent."""
        await self._require().resume()
        return inference_pb2.ResumeResponse()

    async def UpdateWeights(
        self, request: inference_pb2.UpdateWeightsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.UpdateWeightsResponse:
        """Loads new weights in place; idempotent per request_id and per (version, checksum).

        Errors: INVALID_ARGUMENT (bad checkpoint or version), DATA_LOSS (checksum), UNAVAILABLE.
        """
        engine = self._require()
        if request.request_id and request.request_id in self._updates:
            return self._updates[request.request_id]
        took = await engine.update_weights(request.uri, request.version, request.checksum)
        if took.total_seconds() > 0:
            self._pushes.release_serving()  # the engine serves (and restores from) the file now
        info = await engine.model_info()
        resp = inference_pb2.UpdateWeightsResponse(version=info.policy_version, load_time=_duration(took))
        _remember(self._updates, request.request_id, resp)
        if self._on_weights is not None and took.total_seconds() > 0:
            await self._on_weights(request.uri, info.policy_version, request.checksum)
        return resp

    async def PushWeights(
        self,
        request_iterator: AsyncIterator[inference_pb2.PushWeightsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> inference_pb2.PushWeightsResponse:
        """Stages the streamed files (:mod:`~openforge_inference.pushed_weights`), then loads them
        as :meth:`UpdateWeights` loads a checkpoint; idempotent per request_id and per (version,
        checksum).

        Errors: as UpdateWeights; INVALID_ARGUMENT for a stream that does not match its header.
        A refused stream is read to its end before the error is returned (a gRPC aio client
        still sending when the call ends gets INTERNAL instead of the error's own status).
        """
        messages = aiter(request_iterator)
        try:
            engine = self._require()
            first = await anext(messages, None)
            if first is None or first.WhichOneof("part") != "header":
                raise CheckpointError("header", "a PushWeights stream starts with its header")
            header = first.header
            if header.request_id and header.request_id in self._pushed:
                return self._pushed[header.request_id]
            files = [PushedFile(f.name, f.size) for f in header.files]
            folder, received = await self._pushes.receive(files, _chunks(messages))
        finally:
            async for _ in messages:  # drain what a refused stream still sends
                pass
        # The load and the clean-up run to their end even when the call is cancelled (a client
        # gone or past its deadline): a cancelled load would leave the engine reading a folder
        # that the clean-up removes.
        took = await asyncio.shield(asyncio.ensure_future(self._load_pushed(engine, folder, header)))
        info = await engine.model_info()
        resp = inference_pb2.PushWeightsResponse(version=info.policy_version, load_time=_duration(took), bytes=received)
        _remember(self._pushed, header.request_id, resp)
        if self._on_weights is not None and took.total_seconds() > 0:
            await self._on_weights(folder.as_uri(), info.policy_version, header.checksum)
        return resp

    async def _load_pushed(
        self, engine: Engine, folder: Path, header: inference_pb2.PushWeightsHeader
    ) -> datetime.timedelta:
        served = False
        try:
            took = await engine.update_weights(str(folder), header.version, header.checksum)
            served = took.total_seconds() > 0
        finally:
            self._pushes.settle(folder, serving=served)
        return took

    def close(self) -> None:
        """Removes the staged pushed checkpoints."""
        self._pushes.close()


async def _chunks(messages: AsyncIterator[inference_pb2.PushWeightsRequest]) -> AsyncIterator[bytes]:
    async for message in messages:
        if message.WhichOneof("part") != "chunk":
            raise CheckpointError("header", "a PushWeights stream has one header, first")
        yield message.chunk


def _duration(took: datetime.timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(took)
    return duration


def _remember(memory: OrderedDict[str, _Response], request_id: str, resp: _Response) -> None:
    """Keeps an answer for retries of ``request_id`` (the last :data:`_UPDATE_MEMORY`)."""
    if request_id:
        memory[request_id] = resp
        while len(memory) > _UPDATE_MEMORY:
            memory.popitem(last=False)
