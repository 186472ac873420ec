"""Pieces both engines share: the static model description, weight-version bookkeeping and the
request table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from openforge_core.errors import FailedPrecondition
from openforge_inference.domain.model_dir import read_model_dir
from openforge_inference.engines.base import (
    CheckpointError,
    EngineConfig,
    EngineUnavailable,
    ModelInfo,
)
from openforge_inference.model_files import read_checkpoint_tensors


@dataclasses.dataclass(frozen=True, slots=True)
class StaticModel:
    """What does not change with a weight update.

    Attributes:
        info: Model description with ``policy_version`` 0.
        reference_shapes: ``{tensor name: shape}`` of the served checkpoint; new checkpoints
            must match it exactly.
    """

    info: ModelInfo
    reference_shapes: dict[str, tuple[int, ...]]


def describe_model(config: EngineConfig, engine: str) -> StaticModel:
    """Reads the model directory's metadata and tensor shapes (no weights are loaded).

    Args:
        config: Engine configuration.
        engine: Engine name for ``ModelInfo.engine``.

    Returns:
        The static description.

    Raises:
        EngineUnavailable: The directory is missing or malformed.
    """
    path = Path(config.model_path)
    try:
        meta = read_model_dir(path)
        shapes = {name: t.shape for name, t in read_checkpoint_tensors(path).items()}
    except (FailedPrecondition, CheckpointError) as exc:
        raise EngineUnavailable(f"cannot serve {path}: {exc.message}") from exc
    context = meta.context_length
    if config.max_model_len is not None:
        context = min(context, config.max_model_len) if context > 0 else config.max_model_len
    if context <= 1:
        raise EngineUnavailable(f"cannot serve {path}: no usable context length in config.json")
    info = ModelInfo(
        model_path=str(path),
        model_name=config.model_name or path.name,
        vocab_size=meta.vocab_size,
        context_length=context,
        tokenizer_hash=meta.tokenizer_hash,
        chat_template_hash=meta.chat_template_hash,
        chat_template=meta.chat_template,
        policy_version=0,
        engine=engine,
        eos_token_ids=tuple(meta.eos_token_ids),
    )
    return StaticModel(info=info, reference_shapes=shapes)


@dataclasses.dataclass(slots=True)
class WeightState:
    """The weights serving now.

    Attributes:
        version: Policy version (0 = the initial weights).
        uri: Where they were loaded from.
        checksum: Their checksum as given to the update ("" if none was given).
    """

    version: int = 0
    uri: str = ""
    checksum: str = ""

    def is_noop(self, uri: str, version: int, checksum: str) -> bool:
        """Whether an update request repeats the serving weights (idempotent retry).

        Raises:
            CheckpointError: ``version`` is not greater than the serving one and is not a
                repeat of it.
        """
        if version == self.version and (
            (checksum and checksum.lower() == self.checksum.lower()) or (not checksum and uri == self.uri)
        ):
            return True
        if version <= self.version:
            raise CheckpointError("version", f"must be greater than the serving version {self.version}, got {version}")
        return False
