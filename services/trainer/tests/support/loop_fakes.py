"""Fakes of the training loop's backend and checkpoint store, shared by the loop's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from openforge_trainer.domain.ports import Checkpoint
from openforge_trainer.domain.samples import CompletedGroup, TrainBatch
from openforge_trainer.domain.state import TrainerState


class RecordingBackend:
    """Keeps every batch it is asked to train on; trains nothing."""

    def __init__(self) -> None:
        self.batches: list[TrainBatch] = []

    def load(self, model_dir: Path, checkpoint_dir: Path | None) -> None:
        return None

    def train_rl(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append(batch)
        return {}

    def train_sft(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append(batch)
        return {}

    def save_checkpoint(self, directory: Path) -> None:
        return None

    def close(self) -> None:
        return None


class MemoryCheckpoints:
    """A checkpoint store that keeps only the states; the latest checkpoint is the last written."""

    def __init__(self) -> None:
        self.states: list[TrainerState] = []

    def latest(self, run_id: str) -> Checkpoint | None:
        return self._of(self.states[-1]) if self.states else None

    def write(self, run_id: str, state: TrainerState, save: Callable[[Path], None]) -> Checkpoint:
        self.states.append(state)
        return self._of(state)

    @staticmethod
    def _of(state: TrainerState) -> Checkpoint:
        return Checkpoint(Path(f"/checkpoints/{state.step}"), f"sha256:{state.step}", state)


async def completed_after(
    completed: list[CompletedGroup], changed: asyncio.Condition, cursor: str
) -> AsyncIterator[CompletedGroup]:
    """A fake store's ``watch``: the groups of ``completed`` whose cursor (``c<n>``) is after
    ``cursor``, then each one appended later (``changed`` is notified on every append)."""
    after = int(cursor[1:]) if cursor else 0
    while True:
        fresh = [g for g in completed if int(g.cursor[1:]) > after]
        for g in fresh:
            after = int(g.cursor[1:])
            yield g
        if not fresh:
            async with changed:
                await changed.wait()
