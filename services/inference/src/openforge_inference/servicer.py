"""``openforge.inference.v1.InferenceService``: proto ↔ domain translation only.

Generate, Abort, Pause, Resume and UpdateWeights answer UNIMPLEMENTED until an
engine is wired in; GetModelInfo describes the configured model directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.errors import FailedPrecondition
from openforge_inference.domain.model_dir import ModelDirInfo


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """The inference API over one model.

    Args:
        model_name: Name harnesses use for the model.
        engine: Engine name as configured.

    Attributes:
        model: Metadata of the served model directory, set once it is read;
            None when no model is configured.
    """

    def __init__(self, model_name: str, engine: str) -> None:
        self.model: ModelDirInfo | None = None
        self._model_name = model_name
        self._engine = engine
        self._policy_version = 0

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.GetModelInfoResponse:
        """Describes the served model. Errors: FAILED_PRECONDITION when no model is configured."""
        m = self.model
        if m is None:
            raise FailedPrecondition(
                "no model is configured (set OPENFORGE_MODEL_PATH to an HF model directory)",
                reason="NO_MODEL",
            )
        return inference_pb2.GetModelInfoResponse(
            model_path=str(m.path),
            model_name=self._model_name,
            vocab_size=m.vocab_size,
            context_length=m.context_length,
            tokenizer_hash=m.tokenizer_hash,
            chat_template_hash=m.chat_template_hash,
            chat_template=m.chat_template,
            policy_version=self._policy_version,
            engine=self._engine,
            eos_token_ids=list(m.eos_token_ids),
        )

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Not built yet: answers UNIMPLEMENTED (no engine wired in)."""
        raise NotImplementedError
        yield  # an async generator, as the streaming handler expects

    async def Abort(
        self, request: inference_pb2.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.AbortResponse:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError

    async def Pause(
        self, request: inference_pb2.PauseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.PauseResponse:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError

    async def Resume(
        self, request: inference_pb2.ResumeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.ResumeResponse:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError

    async def UpdateWeights(
        self, request: inference_pb2.UpdateWeightsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.UpdateWeightsResponse:
        """Not built yet: answers UNIMPLEMENTED."""
        raise NotImplementedError
