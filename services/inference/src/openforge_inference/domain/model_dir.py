"""What a model directory says about itself, read without loading weights.

Reads the files ``save_pretrained`` writes for an HF causal LM: ``config.json``
(``vocab_size``, ``max_position_embeddings``, ``eos_token_id``),
``generation_config.json`` (``eos_token_id``), ``tokenizer.json`` and the chat
template, which transformers stores either as ``chat_template.jinja`` (recent
versions) or under ``chat_template`` in ``tokenizer_config.json`` (older ones;
a string, or a list of ``{"name", "template"}`` where ``default`` is used).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge_core.errors import FailedPrecondition


@dataclass(frozen=True)
class ModelDirInfo:
    """Metadata of a model directory.

    Attributes:
        path: The directory.
        vocab_size: Rows of the embedding matrix.
        context_length: Maximum positions (prompt + completion tokens).
        tokenizer_hash: ``sha256:<hex>`` of ``tokenizer.json``.
        chat_template: The Jinja chat template text ("" if none).
        chat_template_hash: ``sha256:<hex>`` of the template text ("" if none).
        eos_token_ids: Token ids that end a turn.
    """

    path: Path
    vocab_size: int
    context_length: int
    tokenizer_hash: str
    chat_template: str
    chat_template_hash: str
    eos_token_ids: tuple[int, ...]


def sha256_hex(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FailedPrecondition(f"{path.name} is not valid JSON: {exc}", reason="BAD_MODEL_DIR") from exc
    if not isinstance(data, dict):
        raise FailedPrecondition(f"{path.name} is not a JSON object", reason="BAD_MODEL_DIR")
    return data


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg_path = model_dir / "tokenizer_config.json"
    if not cfg_path.is_file():
        return ""
    tmpl = _load_json(cfg_path).get("chat_template", "")
    if isinstance(tmpl, list):
        named = {t.get("name"): t.get("template", "") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default", "")
    return tmpl if isinstance(tmpl, str) else ""


def read_model_dir(model_dir: Path) -> ModelDirInfo:
    """Reads a model directory's metadata.

    Args:
        model_dir: An HF-format model directory.

    Returns:
        Its metadata.

    Raises:
        FailedPrecondition: Missing directory, ``config.json`` or ``tokenizer.json``,
            or a config without ``vocab_size``.
    """
    if not model_dir.is_dir():
        raise FailedPrecondition(f"model directory {model_dir} does not exist", reason="BAD_MODEL_DIR")
    for required in ("config.json", "tokenizer.json"):
        if not (model_dir / required).is_file():
            raise FailedPrecondition(f"{required} missing in {model_dir}", reason="BAD_MODEL_DIR")
    config = _load_json(model_dir / "config.json")
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise FailedPrecondition("config.json has no positive vocab_size", reason="BAD_MODEL_DIR")
    context = config.get("max_position_embeddings", 0)
    eos = _ids(config.get("eos_token_id"))
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        eos += [i for i in _ids(_load_json(gen_path).get("eos_token_id")) if i not in eos]
    template = _chat_template(model_dir)
    return ModelDirInfo(
        path=model_dir,
        vocab_size=vocab,
        context_length=context if isinstance(context, int) else 0,
        tokenizer_hash=sha256_hex((model_dir / "tokenizer.json").read_bytes()),
        chat_template=template,
        chat_template_hash=sha256_hex(template.encode()) if template else "",
        eos_token_ids=tuple(eos),
    )
