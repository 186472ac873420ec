"""The engine interface: token ids in; token ids, logprobs and policy versions out.

Every engine (vLLM, the transformers reference engine) implements :class:`Engine` over the plain
dataclasses below; the gRPC servicer translates proto messages to and from them, so nothing in
``engines/`` imports grpc or generated code. Errors are ``openforge_core.errors`` subclasses,
which the server interceptor maps to status codes (INVALID_ARGUMENT, ALREADY_EXISTS, ...).

Logprob definition (both engines, and what ``GenerateResponse.logprobs`` carries): the natural
log of the probability of the sampled token under the distribution the engine sampled from,
computed in fp32 as ``log_softmax(filtered(logits / T))`` over the full vocabulary, where
``filtered`` sets every token removed by top-k / top-p to -inf. Without top-k and top-p (the RL
setting) this is exactly ``log_softmax(logits / T)``, the quantity a trainer recomputes. For
greedy requests (T = 0) it is ``log_softmax(logits)``. This is vLLM's
``logprobs_mode="processed_logprobs"`` (vllm/v1/sample/sampler.py, ``Sampler.sample`` and
``TopKTopPSampler.forward_native``); vLLM also clamps 0 < T < 0.01 to 0.01
(vllm/sampling_params.py, ``_MAX_TEMP``), and so do we.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol, runtime_checkable

from openforge_core.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    Unavailable,
)
from openforge_inference.engines.vllm_args import VllmOptions

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "GREEDY_TEMPERATURE_EPS",
    "MAX_TOP_LOGPROBS",
    "MIN_TEMPERATURE",
    "CheckpointError",
    "ChecksumMismatch",
    "DuplicateRequest",
    "Engine",
    "EngineConfig",
    "EngineUnavailable",
    "FinishReason",
    "GenerateDelta",
    "GenerateRequest",
    "InvalidRequest",
    "ModelInfo",
    "PolicyVersionTooOld",
    "SamplingOptions",
    "TokenUsage",
    "TopLogprobs",
    "effective_temperature",
    "validate_request",
]

#: Temperatures below this are greedy (vLLM ``_SAMPLING_EPS``).
GREEDY_TEMPERATURE_EPS: Final = 1e-5
#: Temperatures in (0, MIN_TEMPERATURE) are raised to it (vLLM ``_MAX_TEMP``).
MIN_TEMPERATURE: Final = 1e-2
#: Most alternatives per token a request may ask for (proto: "At most 20").
MAX_TOP_LOGPROBS: Final = 20
#: Temperature range the proto allows.
MAX_TEMPERATURE: Final = 2.0
_INT64_MAX: Final = 2**63 - 1


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class InvalidRequest(InvalidArgument):
    """A request field is invalid (INVALID_ARGUMENT); retrying it unchanged cannot succeed.

    Args:
        field: Path of the field in the request, e.g. ``"sampling.max_tokens"``; kept as
            ``field_name`` and in ``violations``.
        message: Why the value is invalid, for a human.
    """

    default_reason = "INVALID_REQUEST"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", violations=[FieldViolation(field, message)])
        self.field_name = field
        self.description = message


class DuplicateRequest(AlreadyExists):
    """A generation with the same ``request_id`` is already in flight (ALREADY_EXISTS)."""

    default_reason = "REQUEST_IN_FLIGHT"


class EngineUnavailable(Unavailable):
    """The engine is not started, closed, or failed (UNAVAILABLE); retry later."""

    default_reason = "ENGINE_UNAVAILABLE"


class PolicyVersionTooOld(FailedPrecondition):
    """The serving weights are older than the request's ``min_policy_version``."""

    default_reason = "POLICY_VERSION_TOO_OLD"


class CheckpointError(InvalidRequest):
    """A weight update was refused: bad URI, missing files, wrong tensor names or shapes, or a
    version not greater than the serving one (INVALID_ARGUMENT). The old weights keep serving."""

    default_reason = "BAD_CHECKPOINT"


class ChecksumMismatch(DataLoss):
    """The checkpoint's files do not hash to the given checksum (DATA_LOSS). The old weights keep
    serving."""

    default_reason = "CHECKSUM_MISMATCH"


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


class FinishReason(enum.Enum):
    """Why a generation ended (``openforge.common.v1.FinishReason``)."""

    STOP = "stop"
    """A stop token (EOS or one of ``stop_token_ids``) was sampled; it is the last token."""
    LENGTH = "length"
    """``max_tokens`` or the context length was reached."""
    ABORT = "abort"
    """Aborted by :meth:`Engine.abort`, by the consumer going away, or by engine shutdown."""
    ERROR = "error"
    """The engine failed while generating."""


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling parameters of one generation (``openforge.common.v1.SamplingParams``).

    Attributes:
        max_tokens: Most tokens to sample; >= 1. Also capped by the context length.
        temperature: Softmax temperature in [0, 2]; 0 is greedy; None means 1.0.
        top_p: Nucleus mass in (0, 1]; None means 1.0 (no filter).
        top_k: Keep the k most likely tokens; None or 0 means no filter.
        stop_token_ids: Sampling any of these ends the generation (the token is included).
            EOS ids of the model always stop too.
        seed: Per-request seed for reproducible sampling on one engine; None is random.
        top_logprobs: Alternatives to report per sampled token, 0..20.
    """

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation request.

    Attributes:
        request_id: Caller-chosen id, unique among in-flight requests.
        prompt_token_ids: The rendered prompt, shape ``[prompt_len]``.
        sampling: Sampling parameters.
        min_policy_version: Refuse to start if the serving version is older (0 = any).
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingOptions
    min_policy_version: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TopLogprobs:
    """The most likely alternatives at one sampled position.

    Attributes:
        token_ids: Candidate ids, most likely first, shape ``[k]``.
        logprobs: Their logprobs (same definition as the sampled token's), shape ``[k]``.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TokenUsage:
    """Token counts of one generation.

    Attributes:
        prompt_tokens: Tokens in the prompt the engine saw.
        completion_tokens: Tokens sampled.
    """

    prompt_tokens: int
    completion_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateDelta:
    """One streamed piece of a generation; arrays are parallel, shape ``[n]`` (n may be 0 on the
    last delta).

    Attributes:
        token_ids: Newly sampled ids, in order.
        logprobs: Logprob of each sampled token (module docstring gives the definition).
        policy_versions: Version of the weights that sampled each token; non-decreasing along a
            generation.
        top_logprobs: One entry per token when the request asked for ``top_logprobs > 0``,
            else empty.
        finish_reason: Set on the last delta only.
        usage: Set on the last delta only.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    top_logprobs: tuple[TopLogprobs, ...] = ()
    finish_reason: FinishReason | None = None
    usage: TokenUsage | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ModelInfo:
    """What an engine serves (``GetModelInfoResponse``).

    Attributes:
        model_path: Model directory as configured.
        model_name: Served model name.
        vocab_size: Rows of the embedding (``config.json`` ``vocab_size``); valid ids are
            ``[0, vocab_size)``.
        context_length: Most tokens of prompt + completion.
        tokenizer_hash: ``sha256:<hex>`` of ``tokenizer.json``.
        chat_template_hash: ``sha256:<hex>`` of the chat template text ("" if none).
        chat_template: The Jinja chat template text.
        policy_version: Version serving now (0 = the initial weights).
        engine: Engine implementation name (``vllm``, ``transformers``).
        eos_token_ids: Ids that end an assistant turn; sampling one always stops generation.
    """

    model_path: str
    model_name: str
    vocab_size: int
    context_length: int
    tokenizer_hash: str
    chat_template_hash: str
    chat_template: str
    policy_version: int
    engine: str
    eos_token_ids: tuple[int, ...]


#: The ``scripted-oracle`` demonstrator's kinds of error: ``plan`` (a conversation follows another
#: task's plan) or ``unwritten`` (a command's redirection of its output into a file is dropped).
ScriptedErrorKind = Literal["plan", "unwritten"]


@dataclasses.dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build an engine; the composition root fills it from settings.

    Attributes:
        model_path: An HF-format model directory.
        model_name: Served model name ("" = the directory's name).
        max_model_len: Context length override (None = ``max_position_embeddings``).
        max_num_seqs: Most sequences decoded together (vLLM ``max_num_seqs``).
        seed: Engine seed for requests that give none.
        kv_cache_gib: vLLM CPU KV-cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``); None keeps
            vLLM's default.
        threads: Torch intra-op threads for the transformers engine (None = torch default).
        tasks_root: Task sets whose oracle solutions the ``scripted-oracle`` engine replays
            (unused by the model engines).
        scripted_error_rate: The ``scripted-oracle`` engine's error rate (see
            :func:`~openforge_inference.engines.scripted_oracle.oracle_completion`).
        scripted_error_kind: Its kind of error (:data:`ScriptedErrorKind`, same function).
        vllm: The vLLM engine's dtype, CUDA graphs, GPU memory, tensor parallelism and prefix
            caching (:class:`~openforge_inference.engines.vllm_args.VllmOptions`).
    """

    model_path: Path
    model_name: str = ""
    max_model_len: int | None = None
    max_num_seqs: int = 64
    seed: int = 0
    kv_cache_gib: float | None = None
    threads: int | None = None
    tasks_root: Path | None = None
    scripted_error_rate: float = 0.0
    scripted_error_kind: ScriptedErrorKind = "plan"
    vllm: VllmOptions = dataclasses.field(default_factory=VllmOptions)


# --------------------------------------------------------------------------------------------
# Protocol
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Engine(Protocol):
    """A generation engine serving one model, with in-place weight updates.

    Concurrency contract: any number of :meth:`generate` streams run at once; :meth:`pause`
    stops scheduling (in-flight and new requests wait, none is dropped) until :meth:`resume`;
    :meth:`update_weights` pauses, swaps the weights and resumes (staying paused if the caller
    paused first), so every token is sampled by exactly one version and reports it.
    """

    @property
    def name(self) -> str:
        """Engine implementation name (``vllm``, ``transformers``)."""
        ...

    async def start(self) -> None:
        """Loads the model; returns when the engine can serve.

        Raises:
            EngineUnavailable: The model could not be loaded.
        """
        ...

    async def close(self) -> None:
        """Aborts in-flight requests (their streams end with ABORT) and releases the model.
        Idempotent."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Samples a completion and streams it as deltas; the last carries finish_reason and
        usage. Closing the iterator early aborts the request.

        Raises:
            InvalidRequest: On the first ``__anext__``: a field fails :func:`validate_request`.
            DuplicateRequest: ``request_id`` is already in flight.
            PolicyVersionTooOld: ``min_policy_version`` is above the serving version.
            EngineUnavailable: The engine is not started or has failed.
        """
        ...

    async def abort(self, request_id: str) -> bool:
        """Aborts an in-flight request; its stream ends with FinishReason.ABORT.

        Returns:
            Whether the request was in flight (unknown or finished ids return False).
        """
        ...

    async def pause(self) -> int:
        """Stops scheduling; returns after the current step. Idempotent.

        Returns:
            Number of requests in flight (now waiting).
        """
        ...

    async def resume(self) -> None:
        """Resumes scheduling after :meth:`pause`. Idempotent."""
        ...

    async def update_weights(self, uri: str, version: int, checksum: str) -> datetime.timedelta:
        """Loads new weights in place from an HF safetensors checkpoint directory.

        Requests in flight are paused, then continue on the new weights (their KV cache is
        recomputed with them); tokens report the version that sampled them. Loading the version
        already serving with the same checksum (or, with no checksum, the same URI) is a no-op.

        Args:
            uri: Checkpoint directory: a path or ``file://`` URI.
            version: The policy version these weights become; > the serving version.
            checksum: ``sha256:<hex>`` over the directory's ``*.safetensors`` files in name
                order (see ``model_files.checkpoint_checksum``); "" skips the check.

        Returns:
            Time spent validating and loading (zero for a no-op).

        Raises:
            CheckpointError: Bad URI, missing files, tensor names or shapes unlike the served
                model's, or a version not greater than the serving one.
            ChecksumMismatch: The files do not hash to ``checksum``.
            EngineUnavailable: The engine is not started or failed while loading.
        """
        ...

    async def model_info(self) -> ModelInfo:
        """Describes the served model and the serving policy version."""
        ...

    async def healthy(self) -> bool:
        """Whether the engine is started and able to generate."""
        ...


# --------------------------------------------------------------------------------------------
# Validation shared by engines
# --------------------------------------------------------------------------------------------


def effective_temperature(temperature: float | None) -> float:
    """The temperature an engine samples with: None → 1.0; (0, 0.01) → 0.01 (vLLM's clamp);
    values below ``GREEDY_TEMPERATURE_EPS`` mean greedy and return 0.0.

    Args:
        temperature: Requested temperature, already validated to [0, 2].

    Returns:
        The temperature actually used (0.0 = greedy).
    """
    if temperature is None:
        return 1.0
    if temperature < GREEDY_TEMPERATURE_EPS:
        return 0.0
    return max(temperature, MIN_TEMPERATURE)


def validate_request(request: GenerateRequest, vocab_size: int, context_length: int) -> None:
    """Checks a request against the model; raises on the first invalid field.

    Args:
        request: The request.
        vocab_size: Embedding rows; token ids must be in ``[0, vocab_size)``.
        context_length: Most tokens of prompt + completion; the prompt must leave room for at
            least one sampled token (``len(prompt) < context_length``).

    Raises:
        InvalidRequest: Empty ``request_id`` or prompt; a prompt or stop token id outside the
            vocabulary; a prompt of ``context_length`` tokens or more; ``max_tokens < 1``;
            temperature outside [0, 2] or not finite; ``top_p`` outside (0, 1]; ``top_k < 0``;
            ``top_logprobs`` outside [0, 20]; a seed outside int64; a negative
            ``min_policy_version``.
    """
    if not request.request_id:
        raise InvalidRequest("request_id", "must not be empty")
    prompt = request.prompt_token_ids
    if len(prompt) == 0:
        raise InvalidRequest("prompt_token_ids", "must not be empty")
    _check_ids("prompt_token_ids", prompt, vocab_size)
    if len(prompt) >= context_length:
        raise InvalidRequest(
            "prompt_token_ids",
            f"prompt of {len(prompt)} tokens leaves no room in the context of {context_length} tokens",
        )
    if request.min_policy_version < 0:
        raise InvalidRequest("min_policy_version", "must be >= 0")
    s = request.sampling
    if s.max_tokens < 1:
        raise InvalidRequest("sampling.max_tokens", f"must be >= 1, got {s.max_tokens}")
    if s.temperature is not None and not (math.isfinite(s.temperature) and 0.0 <= s.temperature <= MAX_TEMPERATURE):
        raise InvalidRequest("sampling.temperature", f"must be in [0, 2], got {s.temperature}")
    if s.top_p is not None and not (math.isfinite(s.top_p) and 0.0 < s.top_p <= 1.0):
        raise InvalidRequest("sampling.top_p", f"must be in (0, 1], got {s.top_p}")
    if s.top_k is not None and s.top_k < 0:
        raise InvalidRequest("sampling.top_k", f"must be >= 0, got {s.top_k}")
    if not 0 <= s.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest("sampling.top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {s.top_logprobs}")
    if s.seed is not None and not -_INT64_MAX - 1 <= s.seed <= _INT64_MAX:
        raise InvalidRequest("sampling.seed", "must fit in int64")
    _check_ids("sampling.stop_token_ids", s.stop_token_ids, vocab_size)


def _check_ids(field: str, ids: Sequence[int], vocab_size: int) -> None:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise InvalidRequest(field, f"token id {token} at index {i} is outside the vocabulary [0, {vocab_size})")
