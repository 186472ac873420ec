"""The engine as the proxy sees it: model facts and token-in/token-out streaming.

The gRPC adapter (:mod:`openforge_proxy.adapters.inference`) implements
:class:`Engine` over ``openforge.inference.v1.InferenceService``; tests may
substitute any object with the same methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

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
    """Sampling parameters sent to the engine (``openforge.common.v1.SamplingParams``).

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

    def as_dict(self) -> dict[str, object]:
        """The set fields, for records and echoes."""
        out: dict[str, object] = {"max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        return out


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
