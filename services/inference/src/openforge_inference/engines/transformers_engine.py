"""The reference engine: plain transformers, fp32 on CPU, one token per request per step.

It favours being obviously right over being fast: each in-flight request keeps its own KV cache
and is stepped in turn (no padding, no batching), on a worker thread so the event loop stays
responsive. Sampling and logprobs follow vLLM's definition exactly (``engines.base`` module
docstring); :func:`teacher_forced_logprobs` recomputes them from a full forward pass and is what
the tests compare every engine against.

A weight update waits for the step in progress, copies the new tensors into the parameters in
place, and drops every in-flight request's KV cache, so the next step recomputes the whole
prefix (prompt + tokens sampled so far) with the new weights -- what vLLM does for
``pause_generation(mode="keep", clear_cache=True)``. Tokens sampled after the update therefore
have exactly the logprobs a fresh forward pass on the new checkpoint gives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import structlog

from openforge_inference.engines._common import StaticModel, WeightState, describe_model
from openforge_inference.engines.base import (
    CheckpointError,
    DuplicateRequest,
    EngineConfig,
    EngineUnavailable,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    ModelInfo,
    PolicyVersionTooOld,
    TokenUsage,
    TopLogprobs,
    effective_temperature,
    validate_request,
)
from openforge_inference.model_files import resolve_checkpoint_uri, validate_checkpoint

if TYPE_CHECKING:
    import torch

__all__ = ["TransformersEngine", "process_logits", "teacher_forced_logprobs"]

_log = structlog.get_logger()

_EVENT_STARTED: Final = "engine.started"
_EVENT_CLOSED: Final = "engine.closed"
_EVENT_STEP_FAILED: Final = "engine.step_failed"
_EVENT_WEIGHTS_UPDATED: Final = "engine.weights_updated"
_EVENT_WEIGHTS_REFUSED: Final = "engine.weights_refused"
_ENGINE_NAME: Final = "transformers"


def process_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Turns raw logits into the logprobs an engine samples from and reports.

    Mirrors vLLM v1 with ``logprobs_mode="processed_logprobs"``: greedy (temperature 0) →
    ``log_softmax(logits)``; else divide by the temperature, apply top-k then top-p exactly as
    ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p`` does (top-k keeps every token whose
    logit is >= the k-th largest; top-p drops the ascending-sorted prefix whose cumulative
    probability is <= 1 - p, always keeping the most likely token), and ``log_softmax`` in fp32.

    Args:
        logits: Raw logits, shape ``[..., vocab]``.
        temperature: Effective temperature (``effective_temperature``; 0 = greedy).
        top_k: Top-k (None or 0 = off).
        top_p: Top-p (None or 1 = off).

    Returns:
        fp32 logprobs, shape ``[..., vocab]``; filtered tokens are -inf.
    """
    import torch

    x = logits.to(torch.float32)
    if temperature == 0.0:
        return torch.log_softmax(x, dim=-1)
    x = x / temperature
    use_k = top_k is not None and 0 < top_k < x.shape[-1]
    use_p = top_p is not None and top_p < 1.0
    if use_k or use_p:
        sorted_x, idx = x.sort(dim=-1, descending=False)
        if use_k:
            assert top_k is not None
            kth = sorted_x.narrow(-1, x.shape[-1] - top_k, 1)
            sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
        if use_p:
            assert top_p is not None
            cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
            drop = cum <= 1.0 - top_p
            drop[..., -1] = False
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(sorted_x).scatter_(-1, idx, sorted_x)
    return torch.log_softmax(x, dim=-1)


def teacher_forced_logprobs(
    model: Any,
    prompt_token_ids: Sequence[int],
    completion_token_ids: Sequence[int],
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> list[float]:
    """Recomputes the logprob of each completion token with one full forward pass.

    Args:
        model: A transformers causal LM (in eval mode).
        prompt_token_ids: Prompt, shape ``[P]``, P >= 1.
        completion_token_ids: Sampled tokens, shape ``[C]``.
        temperature: Requested temperature (None = 1.0; same clamping as the engines).
        top_k: Requested top-k.
        top_p: Requested top-p.

    Returns:
        ``[C]`` logprobs: position ``P - 1 + i`` of the forward pass scores token ``i``.
    """
    import torch

    if not completion_token_ids:
        return []
    ids = torch.tensor([list(prompt_token_ids) + list(completion_token_ids)], dtype=torch.long)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]
    start = len(prompt_token_ids) - 1
    rows = logits[start : start + len(completion_token_ids)]
    lp = process_logits(rows, effective_temperature(temperature), top_k, top_p)
    target = torch.tensor(list(completion_token_ids), dtype=torch.long).unsqueeze(-1)
    return [float(v) for v in lp.gather(-1, target).squeeze(-1).tolist()]


@dataclasses.dataclass(eq=False)
class _Request:
    """One in-flight generation (mutated on the event loop only, read by the step thread)."""

    request_id: str
    prompt: list[int]
    temperature: float
    top_k: int | None
    top_p: float | None
    top_logprobs: int
    max_new: int
    stops: frozenset[int]
    generator: torch.Generator
    queue: asyncio.Queue[GenerateDelta]
    generated: list[int] = dataclasses.field(default_factory=list)
    cache: Any = None
    done: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Sample:
    token: int
    logprob: float
    top: TopLogprobs | None
    cache: Any


class TransformersEngine:
    """Reference :class:`~openforge_inference.engines.base.Engine` on transformers (fp32, CPU).

    Args:
        config: Model path and options (``threads`` sets torch's intra-op threads).
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._static: StaticModel | None = None
        self._model: Any = None
        self._weights = WeightState(uri=str(config.model_path))
        self._requests: dict[str, _Request] = {}
        self._paused = False
        self._updating = False
        self._closed = False
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._update_lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._seeds = random.Random(config.seed)

    @property
    def name(self) -> str:
        """``"transformers"``."""
        return _ENGINE_NAME

    @property
    def model(self) -> Any:
        """The loaded transformers model (for tests and teacher-forced recomputes)."""
        return self._model

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Loads the model in fp32 on CPU and starts the step loop.

        Raises:
            EngineUnavailable: The directory is malformed or the model fails to load.
        """
        if self._loop_task is not None:
            return
        self._static = describe_model(self._config, _ENGINE_NAME)
        try:
            self._model = await asyncio.to_thread(self._load)
        except Exception as exc:
            raise EngineUnavailable(f"cannot load {self._config.model_path}: {exc}") from exc
        self._loop_task = asyncio.create_task(self._run(), name="transformers-engine-loop")
        _log.info(_EVENT_STARTED, engine=_ENGINE_NAME, model=str(self._config.model_path))

    def _load(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        if self._config.threads is not None:
            torch.set_num_threads(self._config.threads)
        model = AutoModelForCausalLM.from_pretrained(str(self._config.model_path), dtype=torch.float32)
        model.eval()  # type: ignore[no-untyped-call]
        return model

    async def close(self) -> None:
        """Ends every stream with ABORT, stops the loop and releases the model. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for request in list(self._requests.values()):
            self._finish(request, FinishReason.ABORT)
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        self._model = None
        _log.info(_EVENT_CLOSED, engine=_ENGINE_NAME)

    async def healthy(self) -> bool:
        """Started, not closed, and the step loop is alive."""
        task = self._loop_task
        return task is not None and not task.done() and not self._closed

    async def model_info(self) -> ModelInfo:
        """The served model, with the serving policy version."""
        static = self._require_started()
        return dataclasses.replace(static.info, policy_version=self._weights.version)

    def _require_started(self) -> StaticModel:
        if self._static is None or self._loop_task is None or self._closed:
            raise EngineUnavailable("the transformers engine is not started")
        if self._loop_task.done():
            raise EngineUnavailable("the transformers engine's step loop has stopped")
        return self._static

    # -- generation ------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Streams a generation; see :meth:`Engine.generate`."""
        import torch

        static = self._require_started()
        info = static.info
        validate_request(request, info.vocab_size, info.context_length)
        if request.request_id in self._requests:
            raise DuplicateRequest(f"request {request.request_id} is already in flight")
        if request.min_policy_version > self._weights.version:
            raise PolicyVersionTooOld(
                f"serving policy version {self._weights.version}, request needs >= {request.min_policy_version}",
                metadata={"serving_version": str(self._weights.version)},
            )
        s = request.sampling
        seed = s.seed if s.seed is not None else self._seeds.getrandbits(63)
        prompt = [int(t) for t in request.prompt_token_ids]
        state = _Request(
            request_id=request.request_id,
            prompt=prompt,
            temperature=effective_temperature(s.temperature),
            top_k=s.top_k or None,
            top_p=s.top_p,
            top_logprobs=s.top_logprobs,
            max_new=min(s.max_tokens, info.context_length - len(prompt)),
            stops=frozenset(info.eos_token_ids) | frozenset(s.stop_token_ids),
            generator=torch.Generator().manual_seed(seed % (2**63)),
            queue=asyncio.Queue(),
        )
        self._requests[state.request_id] = state
        self._wake.set()
        try:
            while True:
                delta = await state.queue.get()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if not state.done:
                # The consumer went away (closed the stream or was cancelled): abort.
                self._finish(state, FinishReason.ABORT)

    async def abort(self, request_id: str) -> bool:
        """Ends an in-flight stream with ABORT; False if the id is unknown or finished."""
        state = self._requests.get(request_id)
        if state is None or state.done:
            return False
        self._finish(state, FinishReason.ABORT)
        return True

    def _finish(self, state: _Request, reason: FinishReason, delta: _Sample | None = None) -> None:
        """Pushes the last delta (with ``delta``'s token if given) and forgets the request."""
        state.done = True
        self._requests.pop(state.request_id, None)
        state.cache = None
        if delta is None:
            last = GenerateDelta((), (), ())
        else:
            last = self._delta(state, delta)
        state.queue.put_nowait(
            dataclasses.replace(
                last,
                finish_reason=reason,
                usage=TokenUsage(len(state.prompt), len(state.generated)),
            )
        )

    def _delta(self, state: _Request, sample: _Sample) -> GenerateDelta:
        return GenerateDelta(
            token_ids=(sample.token,),
            logprobs=(sample.logprob,),
            policy_versions=(self._weights.version,),
            top_logprobs=(sample.top,) if sample.top is not None else (),
        )

    # -- pause, resume, weights ------------------------------------------------------------

    async def pause(self) -> int:
        """Stops scheduling after the step in progress; returns the in-flight count."""
        self._require_started()
        self._paused = True
        async with self._step_lock:
            pass
        return len(self._requests)

    async def resume(self) -> None:
        """Resumes scheduling. Idempotent."""
        self._require_started()
        self._paused = False
        self._wake.set()

    async def update_weights(self, uri: str, version: int, checksum: str) -> datetime.timedelta:
        """Validates, then copies a checkpoint into the parameters in place; see
        :meth:`Engine.update_weights`."""
        static = self._require_started()
        async with self._update_lock:
            if self._weights.is_noop(uri, version, checksum):
                return datetime.timedelta(0)
            started = time.perf_counter()
            try:
                directory = resolve_checkpoint_uri(uri)
                await asyncio.to_thread(validate_checkpoint, directory, static.reference_shapes, checksum)
                tensors = await asyncio.to_thread(_load_tensors, directory)
            except Exception as exc:
                _log.warning(_EVENT_WEIGHTS_REFUSED, uri=uri, version=version, error=str(exc))
                raise
            self._updating = True
            try:
                async with self._step_lock:
                    await asyncio.to_thread(_copy_into, self._model, tensors)
                    self._weights = WeightState(version, uri, checksum)
                    for state in self._requests.values():
                        state.cache = None  # recompute the prefix with the new weights
            finally:
                self._updating = False
                self._wake.set()
            elapsed = datetime.timedelta(seconds=time.perf_counter() - started)
            _log.info(
                _EVENT_WEIGHTS_UPDATED,
                uri=uri,
                version=version,
                seconds=elapsed.total_seconds(),
                in_flight=len(self._requests),
            )
            return elapsed

    # -- the step loop ---------------------------------------------------------------------

    def _runnable(self) -> list[_Request]:
        if self._paused or self._updating or self._closed:
            return []
        return [r for r in self._requests.values() if not r.done]

    async def _run(self) -> None:
        while not self._closed:
            batch = self._runnable()
            if not batch:
                self._wake.clear()
                if not self._runnable() and not self._closed:
                    await self._wake.wait()
                continue
            async with self._step_lock:
                if self._paused or self._updating:
                    continue
                try:
                    samples = await asyncio.to_thread(self._step_all, batch)
                except Exception as exc:
                    _log.exception(_EVENT_STEP_FAILED, error=str(exc))
                    for state in batch:
                        if not state.done:
                            self._finish(state, FinishReason.ERROR)
                    continue
                # Dispatch under the lock: once pause() returns, every sampled token is queued.
                for state, sample in zip(batch, samples, strict=True):
                    if state.done:
                        continue  # aborted while the step ran
                    state.cache = sample.cache
                    state.generated.append(sample.token)
                    if sample.token in state.stops:
                        self._finish(state, FinishReason.STOP, sample)
                    elif len(state.generated) >= state.max_new:
                        self._finish(state, FinishReason.LENGTH, sample)
                    else:
                        state.queue.put_nowait(self._delta(state, sample))
            await asyncio.sleep(0)

    def _step_all(self, batch: list[_Request]) -> list[_Sample]:
        import torch

        with torch.inference_mode():
            return [self._step_one(state) for state in batch]

    def _step_one(self, state: _Request) -> _Sample:
        import torch

        if state.cache is None:
            ids = state.prompt + state.generated
        else:
            ids = state.generated[-1:]
        out = self._model(
            input_ids=torch.tensor([ids], dtype=torch.long),
            past_key_values=state.cache,
            use_cache=True,
        )
        logprobs = process_logits(out.logits[0, -1], state.temperature, state.top_k, state.top_p)
        if state.temperature == 0.0:
            token = int(torch.argmax(logprobs))
        else:
            token = int(torch.multinomial(logprobs.exp(), 1, generator=state.generator))
        top: TopLogprobs | None = None
        if state.top_logprobs > 0:
            values, indices = torch.topk(logprobs, state.top_logprobs)
            top = TopLogprobs(
                token_ids=tuple(int(i) for i in indices.tolist()),
                logprobs=tuple(float(v) for v in values.tolist()),
            )
        return _Sample(token, float(logprobs[token]), top, out.past_key_values)


def _load_tensors(directory: Any) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from openforge_inference.model_files import safetensors_files

    tensors: dict[str, torch.Tensor] = {}
    for path in safetensors_files(directory):
        tensors.update(load_file(str(path), device="cpu"))
    return tensors


def _copy_into(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    import torch

    state = model.state_dict()
    unknown = sorted(set(tensors) - set(state))
    if unknown:  # checked before any copy: a refused update must leave the weights untouched
        raise CheckpointError("uri", f"tensors the model does not have, e.g. {unknown[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            state[name].copy_(tensor.to(state[name].dtype))
