"""veRL's ``TrainingWorker`` as the remote class of the Ray worker group.

Ray ships the class by reference: each worker process imports this module, which first loads
veRL's loss module the way :func:`~openforge_trainer.backends.verl_batch.load_verl_losses` does
(veRL's ``verl.utils.dataset`` package imports HF ``datasets`` for its data loaders, which the
trainer's install leaves out and the worker never uses), then veRL's worker module. The class
adds nothing to veRL's.
"""

from __future__ import annotations

import importlib
from typing import Any

from openforge_trainer.backends import verl_batch

verl_batch.load_verl_losses()
_engine_workers: Any = importlib.import_module("verl.workers.engine_workers")


class TrainingWorker(_engine_workers.TrainingWorker):  # type: ignore[misc]
    """veRL's ``verl.workers.engine_workers.TrainingWorker``, importable without HF ``datasets``."""
