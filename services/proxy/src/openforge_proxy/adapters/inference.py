"""The inference service over gRPC, as the proxy's :class:`~openforge_proxy.domain.engine.Engine`.

``Generate`` is a server stream consumed as it arrives; the stream's deadline
is the proxy's per-call generation timeout. ``GetModelInfo`` and ``Abort`` are
retried on UNAVAILABLE by the channel's retry policy (both are idempotent);
``Generate`` never is (a retried request samples again).

The ``GenerateRequest`` is serialized here, not by protobuf: its scalar fields
are serialized as usual and the prompt's packed encoding
(:class:`~openforge_proxy.domain.tokens.PackedIds`, kept per prompt chunk) is
appended as field 2 (a valid encoding: a message's fields may come in any
order). A 35k-token prompt thus costs a byte copy instead of 35k int
conversions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.protowire import LEN
from openforge_core.rpc.client import open_channel
from openforge_proxy.domain.engine import Delta, EngineRejected, EngineUnavailable, ModelInfo, Sampling
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.tokens import PackedIds, varint

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name

_FINISH = {
    common_pb2.FINISH_REASON_STOP: Finish.STOP,
    common_pb2.FINISH_REASON_LENGTH: Finish.LENGTH,
    common_pb2.FINISH_REASON_ABORT: Finish.ABORT,
    common_pb2.FINISH_REASON_ERROR: Finish.ERROR,
}
_REJECTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}
_GENERATE = f"/{SERVICE}/Generate"
#: Tag of ``GenerateRequest.prompt_token_ids`` (length-delimited: packed).
_PROMPT_TAG = varint(inference_pb2.GenerateRequest.PROMPT_TOKEN_IDS_FIELD_NUMBER << 3 | LEN)


def generate_request_bytes(request_id: str, prompt: PackedIds, sampling: Sampling) -> bytes:
    """A serialized ``GenerateRequest`` (the prompt appended as its packed encoding)."""
    head = inference_pb2.GenerateRequest(request_id=request_id, sampling=sampling.to_proto()).SerializeToString()
    if not prompt.packed:
        return head
    return head + _PROMPT_TAG + varint(len(prompt.packed)) + prompt.packed


def _identity(data: bytes) -> bytes:
    return data


def _error(exc: grpc.aio.AioRpcError) -> Exception:
    detail = f"{exc.code().name}: {exc.details() or ''}"
    if exc.code() in _REJECTED:
        return EngineRejected(detail)
    return EngineUnavailable(detail)


class GrpcEngine:
    """Inference over one channel.

    Args:
        target: ``host:port`` of the inference service.
        info_timeout_s: Deadline of ``GetModelInfo`` and ``Abort``, seconds.
        generate_timeout_s: Deadline of one whole ``Generate`` stream, seconds.
    """

    def __init__(self, target: str, *, info_timeout_s: float = 10.0, generate_timeout_s: float = 900.0) -> None:
        self._channel = open_channel(
            target,
            service=SERVICE,
            idempotent_methods=["GetModelInfo", "Abort"],
            default_timeout_s=info_timeout_s,
            stream_timeout_s=generate_timeout_s,
        )
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._generate = self._channel.unary_stream(
            _GENERATE,
            request_serializer=_identity,
            response_deserializer=inference_pb2.GenerateResponse.FromString,
        )

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()

    async def model_info(self) -> ModelInfo:
        """``GetModelInfo``. Raises :class:`EngineUnavailable` on any RPC error."""
        try:
            r = await self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
        except grpc.aio.AioRpcError as exc:
            raise EngineUnavailable(f"{exc.code().name}: {exc.details() or ''}") from exc
        return ModelInfo(
            model_path=r.model_path,
            model_name=r.model_name,
            chat_template=r.chat_template,
            chat_template_hash=r.chat_template_hash,
            tokenizer_hash=r.tokenizer_hash,
            eos_token_ids=tuple(r.eos_token_ids),
            context_length=r.context_length,
            policy_version=r.policy_version,
        )

    async def generate(self, request_id: str, prompt: PackedIds, sampling: Sampling) -> AsyncIterator[Delta]:
        """``Generate``, one :class:`Delta` per streamed message."""
        call = self._generate(generate_request_bytes(request_id, prompt, sampling))
        try:
            async for msg in call:
                yield Delta(
                    token_ids=list(msg.token_ids),
                    logprobs=list(msg.logprobs),
                    policy_versions=list(msg.policy_versions),
                    finish=_FINISH.get(msg.finish_reason),
                )
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from exc
        finally:
            call.cancel()

    async def abort(self, request_id: str) -> None:
        """``Abort`` (errors ignored: the generation may be over already)."""
        try:
            await self._stub.Abort(inference_pb2.AbortRequest(request_id=request_id))
        except grpc.aio.AioRpcError:
            return
