"""The vLLM options: CPU defaults as before, GPU defaults as vLLM practises, settings from env."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from openforge_inference.engines.vllm_args import VllmOptions, engine_arguments
from openforge_inference.settings import InferenceSettings


def _arguments(options: VllmOptions, *, on_cpu: bool, kv_cache_gib: float | None = 0.5) -> dict[str, Any]:
    return engine_arguments(
        options, on_cpu=on_cpu, context_length=512, max_num_seqs=8, seed=3, kv_cache_gib=kv_cache_gib
    )


def test_cpu_defaults_are_the_engines_former_fixed_arguments() -> None:
    arguments = _arguments(VllmOptions(), on_cpu=True)
    assert arguments == {
        "dtype": "float32",
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 2048,
        "tensor_parallel_size": 1,
        "max_num_seqs": 8,
        "seed": 3,
        "max_model_len": 512,
        "kv_cache_memory_bytes": 512 * 1024**2,
    }


def test_gpu_defaults_take_the_models_dtype_cuda_graphs_and_chunked_prefill() -> None:
    arguments = _arguments(VllmOptions(), on_cpu=False)
    assert arguments["dtype"] == "auto"
    assert arguments["enforce_eager"] is False
    assert arguments["enable_chunked_prefill"] is True
    assert arguments["max_num_batched_tokens"] is None
    assert arguments["gpu_memory_utilization"] == 0.9
    assert "enable_prefix_caching" not in arguments  # vLLM's default


def test_set_options_win_over_the_platform_defaults() -> None:
    options = VllmOptions(
        dtype="bfloat16",
        enforce_eager=True,
        gpu_memory_utilization=0.45,
        tensor_parallel_size=2,
        enable_prefix_caching=False,
    )
    gpu = _arguments(options, on_cpu=False)
    assert (gpu["dtype"], gpu["enforce_eager"], gpu["gpu_memory_utilization"]) == ("bfloat16", True, 0.45)
    assert (gpu["tensor_parallel_size"], gpu["enable_prefix_caching"]) == (2, False)
    cpu = _arguments(VllmOptions(enforce_eager=False, dtype="auto"), on_cpu=True)
    assert (cpu["dtype"], cpu["enforce_eager"]) == ("auto", False)
    assert "gpu_memory_utilization" not in cpu
    assert _arguments(VllmOptions(), on_cpu=True, kv_cache_gib=None)["kv_cache_memory_bytes"] is None


@pytest.mark.parametrize("on_cpu", [True, False])
def test_vllm_accepts_the_arguments(on_cpu: bool) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    arguments = _arguments(VllmOptions(enable_prefix_caching=True), on_cpu=on_cpu)
    args = AsyncEngineArgs(model="unused", **arguments)
    for name, value in arguments.items():
        assert getattr(args, name) == value


def test_settings_read_the_vllm_section_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_VLLM__DTYPE", "bfloat16")
    monkeypatch.setenv("OPENFORGE_VLLM__ENFORCE_EAGER", "false")
    monkeypatch.setenv("OPENFORGE_VLLM__GPU_MEMORY_UTILIZATION", "0.5")
    monkeypatch.setenv("OPENFORGE_VLLM__TENSOR_PARALLEL_SIZE", "4")
    monkeypatch.setenv("OPENFORGE_VLLM__ENABLE_PREFIX_CACHING", "true")
    settings = InferenceSettings()
    assert settings.vllm == VllmOptions(
        dtype="bfloat16",
        enforce_eager=False,
        gpu_memory_utilization=0.5,
        tensor_parallel_size=4,
        enable_prefix_caching=True,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GPU_MEMORY_UTILIZATION", "0"),
        ("GPU_MEMORY_UTILIZATION", "1.5"),
        ("TENSOR_PARALLEL_SIZE", "0"),
        ("DTYPE", "int8"),
        ("SLEEP", "true"),
    ],
)
def test_bad_vllm_settings_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(f"OPENFORGE_VLLM__{name}", value)
    with pytest.raises(ValidationError, match="vllm"):
        InferenceSettings()
