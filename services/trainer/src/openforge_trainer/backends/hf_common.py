"""HF checkpoint writing, the clipped optimizer step and throughput metrics of the ``torch`` backend;
the ``verl`` backend (whose checkpoints and steps are veRL's own) shares only the throughput metrics,
the list of model files and the choice of precision."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Final

import structlog

from openforge_trainer.backends.base import OPTIMIZER_FILE
from openforge_trainer.domain.samples import TrainBatch

log = structlog.get_logger(__name__)

#: Files a checkpoint writes itself; everything else of the model directory (tokenizer, chat
#: template) is copied over so the checkpoint loads on its own.
MODEL_FILES: Final = {"config.json", "generation_config.json", "model.safetensors.index.json", OPTIMIZER_FILE}


def uses_bf16(precision: str, device: str) -> bool:
    """Whether a run config's ``precision`` means bf16 mixed precision on ``device``.

    ``auto`` is bf16 on a CUDA device with native bf16 (compute capability 8.0 and up: Ampere and
    later; older GPUs only emulate it), fp32 elsewhere, CPU included, where bf16 autocast is slower
    than fp32 on most CPUs.
    """
    if precision != "auto":
        return precision == "bf16"
    if not device.startswith("cuda"):
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.get_device_capability(torch.device(device)) >= (8, 0))


def save_checkpoint(model: Any, optimizer: Any, model_dir: Path | None, directory: Path) -> None:
    """Writes ``model.safetensors`` (HF layout), config, ``optimizer.pt`` and the model
    directory's other files (tokenizer, chat template) into ``directory``."""
    import torch

    model.save_pretrained(str(directory), safe_serialization=True)
    torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)
    if model_dir is not None:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and path.suffix not in (".safetensors", ".bin") and path.name not in MODEL_FILES:
                target = directory / path.name
                if not target.exists():
                    shutil.copy2(path, target)


def clip_and_step(model: Any, optimizer: Any, max_norm: float, event: str) -> float:
    """Clips the gradient norm to ``max_norm`` and steps, unless the norm is not finite (then
    logs ``event`` and skips the step). Gradients stay until the next update zeroes them.

    Returns:
        The gradient norm before clipping.
    """
    import torch

    params = [p for p in model.parameters() if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if math.isfinite(norm):
        optimizer.step()
    else:
        log.warning(event, grad_norm=norm)
    return norm


def throughput(batch: TrainBatch, seconds: float) -> dict[str, float]:
    """Token counts and tokens/s of one backend step taking ``seconds``."""
    return {
        "tokens/total": float(batch.num_tokens),
        "tokens/sampled": float(batch.num_sampled_tokens),
        "tokens/per_s": batch.num_tokens / seconds if seconds > 0 else 0.0,
        "time/backend_s": seconds,
    }
