"""Trainer settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from openforge_core.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    """Settings of the trainer.

    Attributes:
        checkpoint_dir: Where run checkpoints are written (``OPENFORGE_CHECKPOINT_DIR``).
    """

    service_name: ClassVar[str] = "trainer"

    checkpoint_dir: Path = Path("checkpoints")
