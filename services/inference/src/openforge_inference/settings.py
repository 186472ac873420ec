"""Inference settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from openforge_core.settings import ServiceSettings


class InferenceSettings(ServiceSettings):
    """Settings of the inference service.

    Attributes:
        model_path: An HF-format model directory (``OPENFORGE_MODEL_PATH``);
            None serves no model (GetModelInfo answers FAILED_PRECONDITION).
        model_name: Name harnesses use for the model; defaults to the
            directory's name.
        engine: Engine implementation: ``vllm`` or ``transformers``.
    """

    service_name: ClassVar[str] = "inference"

    model_path: Path | None = None
    model_name: str = ""
    engine: str = "vllm"
