"""Reading a model directory's metadata without loading weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from openforge_core.errors import FailedPrecondition
from openforge_inference.domain.model_dir import read_model_dir


def _model_dir(tmp_path: Path, *, template_file: bool) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 512, "max_position_embeddings": 2048, "eos_token_id": 2}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    (d / "tokenizer.json").write_text('{"model": {}}')
    tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}"
    if template_file:
        (d / "chat_template.jinja").write_text(tmpl)
    else:
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": tmpl}]}))
    return d


@pytest.mark.parametrize("template_file", [True, False])
def test_reads_sizes_hashes_template_and_eos(tmp_path: Path, template_file: bool) -> None:
    info = read_model_dir(_model_dir(tmp_path, template_file=template_file))
    assert info.vocab_size == 512 and info.context_length == 2048
    assert info.eos_token_ids == (2, 5)
    assert info.tokenizer_hash == "sha256:" + hashlib.sha256(b'{"model": {}}').hexdigest()
    assert info.chat_template.startswith("{% for m")
    assert info.chat_template_hash == "sha256:" + hashlib.sha256(info.chat_template.encode()).hexdigest()


def test_missing_or_broken_dirs_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="does not exist"):
        read_model_dir(tmp_path / "none")
    d = _model_dir(tmp_path, template_file=True)
    (d / "config.json").write_text("{not json")
    with pytest.raises(FailedPrecondition, match="not valid JSON"):
        read_model_dir(d)
    (d / "tokenizer.json").unlink()
    with pytest.raises(FailedPrecondition, match=r"tokenizer\.json missing"):
        read_model_dir(d)
