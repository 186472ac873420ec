"""Trainer settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from openforge_core.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    """Settings of the trainer.

    Attributes:
        checkpoint_dir: Where run checkpoints, run records and metrics are written
            (``OPENFORGE_CHECKPOINT_DIR``); inference must read checkpoints at the same path.
        tensorboard_dir: TensorBoard event files, one folder per run
            (``OPENFORGE_TENSORBOARD_DIR``); empty: ``<checkpoint_dir>/tensorboard``.
        keep_checkpoints: Complete checkpoints kept per run (``OPENFORGE_KEEP_CHECKPOINTS``).
        resume_on_start: Resume the runs that were training when the process stopped
            (``OPENFORGE_RESUME_ON_START``).
        publish_events: Connect to NATS and publish ``step_completed`` events
            (``OPENFORGE_PUBLISH_EVENTS``).
        weight_sync: How checkpoints reach inference (``OPENFORGE_WEIGHT_SYNC``): ``file``,
            inference reads them at their path (``UpdateWeights``; needs a shared filesystem),
            or ``stream``, their safetensors files are streamed to inference (``PushWeights``;
            staged in memory there), falling back to ``file`` when the stream fails.
        weight_sync_timeout_s: Deadline of ``UpdateWeights`` or ``PushWeights``, seconds.
        submit_timeout_s: Deadline of ``SubmitRollouts``, seconds.
        stall_check_s: Seconds a run waits for a completed group before it checks that
            inference serves its policy version and the orchestrator still holds its pending
            groups, re-pushing the checkpoint or requesting lost groups again
            (``OPENFORGE_STALL_CHECK_S``; 0 = never).
    """

    service_name: ClassVar[str] = "trainer"

    checkpoint_dir: Path = Path("checkpoints")
    tensorboard_dir: Path | None = None
    keep_checkpoints: int = Field(default=3, ge=1)
    resume_on_start: bool = True
    publish_events: bool = True
    weight_sync: Literal["file", "stream"] = "file"
    weight_sync_timeout_s: float = Field(default=300.0, gt=0)
    submit_timeout_s: float = Field(default=30.0, gt=0)
    stall_check_s: float = Field(default=30.0, ge=0)
