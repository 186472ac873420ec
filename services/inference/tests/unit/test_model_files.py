"""Checkpoint URI resolution, checksum and validation on hand-written safetensors files."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from openforge_inference.engines.base import CheckpointError, ChecksumMismatch
from openforge_inference.model_files import (
    checkpoint_checksum,
    read_checkpoint_tensors,
    resolve_checkpoint_uri,
    validate_checkpoint,
)


def write_safetensors(path: Path, tensors: dict[str, tuple[int, ...]]) -> None:
    """Writes a valid F32 safetensors file of zeros (format: 8-byte LE header length, JSON
    header, data)."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


REFERENCE = {"a.weight": (4, 2), "b.weight": (3,)}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    write_safetensors(tmp_path / "model-00002.safetensors", {"b.weight": (3,)})
    write_safetensors(tmp_path / "model-00001.safetensors", {"a.weight": (4, 2)})
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_checksum_is_sha256_of_files_in_name_order(checkpoint: Path) -> None:
    digest = hashlib.sha256()
    for name in ("model-00001.safetensors", "model-00002.safetensors"):
        digest.update((checkpoint / name).read_bytes())
    assert checkpoint_checksum(checkpoint) == "sha256:" + digest.hexdigest()


def test_read_tensors_merges_files(checkpoint: Path) -> None:
    tensors = read_checkpoint_tensors(checkpoint)
    assert {n: t.shape for n, t in tensors.items()} == REFERENCE
    assert tensors["a.weight"].dtype == "F32"


def test_validate_accepts_matching_checkpoint(checkpoint: Path) -> None:
    validate_checkpoint(checkpoint, REFERENCE, checkpoint_checksum(checkpoint))
    validate_checkpoint(checkpoint, REFERENCE, "")


def test_validate_rejects_checksum_mismatch(checkpoint: Path) -> None:
    with pytest.raises(ChecksumMismatch):
        validate_checkpoint(checkpoint, REFERENCE, "sha256:" + "0" * 64)


def test_validate_rejects_malformed_checksum(checkpoint: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        validate_checkpoint(checkpoint, REFERENCE, "md5:abc")
    assert info.value.field_name == "checksum"


def test_validate_rejects_wrong_shape(checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match="shape"):
        validate_checkpoint(checkpoint, {**REFERENCE, "a.weight": (2, 4)}, "")


def test_validate_rejects_missing_and_unknown_tensors(checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match="lacks"):
        validate_checkpoint(checkpoint, {**REFERENCE, "c.weight": (1,)}, "")
    with pytest.raises(CheckpointError, match="unknown"):
        validate_checkpoint(checkpoint, {"a.weight": (4, 2)}, "")


def test_validate_rejects_missing_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        validate_checkpoint(tmp_path, REFERENCE, "")


def test_validate_rejects_truncated_file(checkpoint: Path) -> None:
    path = checkpoint / "model-00001.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="outside the file"):
        validate_checkpoint(checkpoint, REFERENCE, "")


def test_validate_rejects_garbage_header(checkpoint: Path) -> None:
    (checkpoint / "model-00001.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{nope")
    with pytest.raises(CheckpointError, match="not JSON"):
        validate_checkpoint(checkpoint, REFERENCE, "")


def test_resolve_uri(checkpoint: Path) -> None:
    assert resolve_checkpoint_uri(str(checkpoint)) == checkpoint
    assert resolve_checkpoint_uri(checkpoint.as_uri()) == checkpoint
    for bad in ("", "s3://bucket/ckpt", "file://remote-host/ckpt", str(checkpoint / "missing")):
        with pytest.raises(CheckpointError) as info:
            resolve_checkpoint_uri(bad)
        assert info.value.field_name == "uri"
