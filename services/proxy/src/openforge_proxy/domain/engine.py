"""The engine as the proxy sees it: model facts and token-in/token-out streaming.

The gRPC adapter (:mod:`openforge_proxy.adapters.inference`) implements
:class:`Engine` over ``openforge.inference.v1.InferenceService``; tests may
substitute any object with the same methods.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.tokens import PackedIds


@dataclass(frozen=True)
class ModelInfo:
    """What inference serves (``GetModelInfo``).

    Attributes:
        model_path: Model directory (holds ``tokenizer.json``).
        model_name: Served model name.
        chat_template: Jinja template text.
        chat_template_hash: ``sha256:<hex>`` of the template.
        tokenizer_hash: ``sha256:<hex>`` of ``tokenizer.json``.
        eos_token_ids: Ids that end a turn.
        context_length: Prompt + completion tokens the model takes.
        policy_version: Version serving now.
    """

    model_path: str
    model_name: str
    chat_template: str
    chat_template_hash: str
    tokenizer_hash: str
    eos_token_ids: tuple[int, ...]
    context_length: int
    policy_version: int = 0


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one call: the session's enforced ``SamplingParams`` with the call's
    completion cap (:meth:`enforced`), built once per call; the engine request, the call record
    and the Responses echo all read this value, and :meth:`to_proto` is its one conversion to
    the wire message.

    Attributes:
        max_tokens: Most tokens to sample (>= 1).
        temperature: Softmax temperature, or None for the engine default.
        top_p: Nucleus mass, or None.
        top_k: Top-k, or None.
        seed: Seed, or None.
        stop_token_ids: Extra stop ids (EOS ids always stop).
    """

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def enforced(cls, params: SamplingParams, max_tokens: int) -> Sampling:
        """The call's sampling: ``params`` (the session's, unset optionals = engine defaults; a
        ``top_k`` of 0 = no top-k filter) with ``max_tokens``, the cap the handler computed (which
        already counts ``params.max_tokens``). ``top_logprobs`` is not enforced."""
        return cls(
            max_tokens=max_tokens,
            temperature=_decimal(params.temperature) if params.HasField("temperature") else None,
            top_p=_decimal(params.top_p) if params.HasField("top_p") else None,
            top_k=params.top_k or None,
            seed=params.seed if params.HasField("seed") else None,
            stop_token_ids=tuple(params.stop_token_ids),
        )

    def to_proto(self) -> SamplingParams:
        """``SamplingParams`` of the engine request and the call record (None stays unset: the
        engine's default)."""
        msg = SamplingParams(max_tokens=self.max_tokens, stop_token_ids=self.stop_token_ids)
        if self.temperature is not None:
            msg.temperature = self.temperature
        if self.top_p is not None:
            msg.top_p = self.top_p
        if self.top_k is not None:
            msg.top_k = self.top_k
        if self.seed is not None:
            msg.seed = self.seed
        return msg


def _decimal(value: float) -> float:
    """The shortest decimal that is the same 32-bit float as ``value`` (a ``float`` field read
    back: 0.7, as the trainer wrote it and the Responses API echoes it, not 0.699999988079071).
    Nine significant digits always round-trip a 32-bit float."""
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", short))[0] == value:
            return short
    return value


@dataclass
class Delta:
    """One message of a generation stream.

    Attributes:
        token_ids: New sampled ids.
        logprobs: Their logprobs (parallel).
        policy_versions: The policy version of each (parallel).
        finish: Set on the last message.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish: Finish | None = None


class EngineUnavailable(Exception):
    """The engine could not be reached or refused to serve (retry later)."""


class EngineRejected(Exception):
    """The engine refused the request itself (e.g. prompt longer than the context)."""


class Engine(Protocol):
    """Token-in/token-out generation."""

    async def model_info(self) -> ModelInfo:
        """Describes the served model.

        Raises:
            EngineUnavailable: Not reachable or no model loaded.
        """
        ...

    def generate(self, request_id: str, prompt: PackedIds, sampling: Sampling) -> AsyncIterator[Delta]:
        """Streams the sampled tokens of one completion (the last delta has ``finish``).

        Raises:
            EngineUnavailable: Not reachable, before or during the stream.
            EngineRejected: The request is invalid for the engine.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stops a generation whose caller went away (best effort)."""
        ...
