"""The served model as the proxy needs it: template, tokenizer, family, stop ids.

Built once from inference's ``GetModelInfo`` and the model directory's
``tokenizer.json``; the tokenizer file's hash must equal the one inference
reports, so the proxy never renders with another tokenizer than the engine's.
What it serves with is reported to the orchestrator for the run manifest
(:class:`ServedModel`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge_core.errors import FailedPrecondition
from openforge_core.manifest import ServedModel, sha256_digest
from openforge_proxy.domain.engine import ModelInfo
from openforge_proxy.domain.families import Family, family_for
from openforge_proxy.domain.template import ChatTemplate
from openforge_proxy.domain.tokens import TokenizerCodec

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _special_tokens(model_dir: Path) -> dict[str, str]:
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    out: dict[str, str] = {}
    for key in _SPECIAL_KEYS:
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


@dataclass(frozen=True)
class ModelRuntime:
    """Everything model-specific the proxy uses.

    Attributes:
        info: What inference reported.
        template: The compiled chat template.
        family: Markers and parsers.
        codec: The tokenizer.
        generation_prompt: Text the template appends for the assistant's turn.
        eos_ids: Ids that end a turn (inference's EOS ids plus the family's end tokens that are
            tokens of the tokenizer).
        template_kwargs: Extra template variables used for every render.
        served: What it serves with, for the run manifest.
    """

    info: ModelInfo
    template: ChatTemplate
    family: Family
    codec: TokenizerCodec
    generation_prompt: str
    eos_ids: frozenset[int]
    template_kwargs: dict[str, Any]
    served: ServedModel

    @classmethod
    def load(
        cls,
        info: ModelInfo,
        *,
        model_dir: Path | None = None,
        family: str = "auto",
        template_kwargs: dict[str, Any] | None = None,
        check_hash: bool = True,
    ) -> ModelRuntime:
        """Builds the runtime for the served model.

        Args:
            info: ``GetModelInfo``.
            model_dir: Where this process reads the model directory (default:
                ``info.model_path``, i.e. a shared file system).
            family: Model family name, or ``auto`` to detect it from the template.
            template_kwargs: Extra template variables (``enable_thinking``...).
            check_hash: Refuse a ``tokenizer.json`` whose hash differs from inference's.

        Raises:
            FailedPrecondition: No template, unknown family, missing or different tokenizer.
        """
        if not info.chat_template:
            raise FailedPrecondition("the served model has no chat template", reason="NO_TEMPLATE")
        directory = model_dir or Path(info.model_path)
        fam = family_for(family, info.chat_template)
        codec = TokenizerCodec.from_dir(directory, fam.message_start)
        if check_hash and info.tokenizer_hash and codec.file_hash != info.tokenizer_hash:
            raise FailedPrecondition(
                f"tokenizer.json in {directory} differs from the one inference serves",
                reason="TOKENIZER_MISMATCH",
            )
        kwargs = dict(template_kwargs or {})
        template = ChatTemplate(info.chat_template, _special_tokens(directory))
        eos = set(info.eos_token_ids)
        for token in fam.end_tokens:
            eot = codec.token_id(token)
            if eot is not None:
                eos.add(eot)
        return cls(
            info=info,
            template=template,
            family=fam,
            codec=codec,
            generation_prompt=template.generation_prompt(**kwargs),
            eos_ids=frozenset(eos),
            template_kwargs=kwargs,
            served=ServedModel(
                tokenizer_hash=codec.file_hash,
                chat_template_hash=sha256_digest(info.chat_template.encode()),
                parsers=fam.parsers,
            ),
        )
