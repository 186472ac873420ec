"""The trainer backend interface and its lazy name → implementation registry.

A backend owns the policy's weights and optimizer. The loop hands it whole batches of samples
(:class:`~openforge_trainer.domain.samples.TrainBatch`) and asks for checkpoints; how it spreads
the work (one process on CPU or one GPU for ``torch``; Ray workers with FSDP/Megatron for a
distributed veRL backend) is its own business, so a new backend changes no line of the loop.

Backends are synchronous and may block for seconds: the loop calls them in a worker thread.
Implementations are imported only when chosen, so the service starts without torch installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from openforge_core.errors import InvalidArgument
from openforge_core.registry import LazyRegistry, UnknownName
from openforge_core.run_config import RunConfig
from openforge_trainer.domain.samples import TrainBatch

#: Backend name → ``"module:Class"``; the class is called with the run config.
BACKENDS = LazyRegistry(
    "backend",
    {
        "torch": "openforge_trainer.backends.torch_backend:TorchBackend",
        "verl": "openforge_trainer.backends.verl_backend:VerlBackend",
    },
)

#: Files a checkpoint directory holds besides the weights (``optimizer.pt``).
OPTIMIZER_FILE = "optimizer.pt"


@runtime_checkable
class TrainerBackend(Protocol):
    """Holds the policy and takes optimizer steps."""

    def load(self, model_dir: Path, checkpoint_dir: Path | None) -> None:
        """Loads the initial model, or a checkpoint written by :meth:`save_checkpoint`.

        Args:
            model_dir: The run's starting HF model directory (also the KL reference policy).
            checkpoint_dir: Resume from these weights and optimizer state; None = fresh start.

        Raises:
            FileNotFoundError: A directory or file is missing.
        """

    def train_rl(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step: advantages, current logprobs, policy loss with truncated importance
        sampling against the samples' behaviour logprobs, optimizer update(s).

        Args:
            batch: Samples of whole groups.

        Returns:
            Metrics of the step (names such as ``loss/policy``, ``actor/pg_clipfrac``,
            ``is/mean``, ``entropy``, ``grad_norm``).
        """

    def train_sft(self, batch: TrainBatch) -> dict[str, float]:
        """One supervised step: negative log-likelihood of the sampled (loss-mask) tokens only.

        Returns:
            Metrics of the step (``loss/sft`` and friends).
        """

    def save_checkpoint(self, directory: Path) -> None:
        """Writes HF safetensors weights, config, tokenizer files and the optimizer state
        (``optimizer.pt``) into ``directory`` (which exists and is empty)."""

    def close(self) -> None:
        """Releases the model and optimizer."""


def create_backend(name: str, config: RunConfig) -> TrainerBackend:
    """Builds the backend called ``name`` (imported now, not before).

    Raises:
        InvalidArgument: Unknown backend name.
        ImportError: Its dependencies (torch, transformers, verl) are not installed.
    """
    try:
        cls = BACKENDS.load(name)
    except UnknownName as exc:
        raise InvalidArgument.field("backend", str(exc)) from None
    backend = cls(config)
    if not isinstance(backend, TrainerBackend):
        raise TypeError(f"{BACKENDS.targets[name]} does not implement TrainerBackend")
    return backend
