"""Checkpoint files: URI resolution, the checkpoint checksum, and validation before loading.

Both engines validate a new checkpoint completely (readable safetensors headers, the same tensor
names and shapes as the served model, the checksum) *before* touching the served weights, so a
refused update leaves the old weights serving untouched. Only the JSON headers are read for
validation (https://huggingface.co/docs/safetensors/index, "Format": 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, then the
data); the checksum reads every byte once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from openforge_inference.engines.base import CheckpointError, ChecksumMismatch

__all__ = [
    "TensorMeta",
    "checkpoint_checksum",
    "read_checkpoint_tensors",
    "resolve_checkpoint_uri",
    "safetensors_files",
    "validate_checkpoint",
]

_CHUNK: Final = 1 << 20
_MAX_HEADER: Final = 100 << 20  # the safetensors reference implementation's limit


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMeta:
    """One tensor of a checkpoint, from its safetensors header.

    Attributes:
        dtype: safetensors dtype name ("F32", "BF16", ...).
        shape: Tensor shape.
        file: File holding it.
    """

    dtype: str
    shape: tuple[int, ...]
    file: Path


def resolve_checkpoint_uri(uri: str) -> Path:
    """Turns a checkpoint reference into a local directory.

    Args:
        uri: A path, or a ``file://`` URI (``file:///abs/dir``).

    Returns:
        The directory.

    Raises:
        CheckpointError: Empty, another scheme, or not an existing directory.
    """
    if not uri:
        raise CheckpointError("uri", "must not be empty")
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise CheckpointError("uri", f"file URI with a remote host is not supported: {uri}")
        path = Path(urllib.parse.unquote(parsed.path))
    elif parsed.scheme == "":
        path = Path(uri)
    else:
        raise CheckpointError("uri", f"unsupported scheme {parsed.scheme!r} (use a path or file://)")
    if not path.is_dir():
        raise CheckpointError("uri", f"checkpoint directory {path} does not exist")
    return path


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's ``*.safetensors`` files (not recursive), sorted by name.

    Raises:
        CheckpointError: There are none.
    """
    files = sorted((p for p in directory.glob("*.safetensors") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise CheckpointError("uri", f"no *.safetensors files in {directory}")
    return files


def checkpoint_checksum(directory: Path) -> str:
    """``sha256:<hex>`` of the concatenated bytes of the directory's ``*.safetensors`` files,
    taken in file-name order (the checksum ``UpdateWeightsRequest.checksum`` carries).

    Args:
        directory: Checkpoint directory.

    Returns:
        The checksum string.

    Raises:
        CheckpointError: The directory holds no safetensors file.
    """
    digest = hashlib.sha256()
    for path in safetensors_files(directory):
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _read_header(path: Path) -> dict[str, TensorMeta]:
    size = path.stat().st_size
    with path.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise CheckpointError("uri", f"{path.name}: truncated safetensors header")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > _MAX_HEADER or 8 + header_len > size:
            raise CheckpointError("uri", f"{path.name}: invalid safetensors header length")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError("uri", f"{path.name}: header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError("uri", f"{path.name}: header is not a JSON object")
    data_len = size - 8 - header_len
    tensors: dict[str, TensorMeta] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(meta["dtype"])
            shape = tuple(int(d) for d in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError("uri", f"{path.name}: bad entry for {name}: {exc}") from exc
        if not 0 <= begin <= end <= data_len:
            raise CheckpointError("uri", f"{path.name}: data of {name} lies outside the file")
        tensors[name] = TensorMeta(dtype, shape, path)
    return tensors


def read_checkpoint_tensors(directory: Path) -> dict[str, TensorMeta]:
    """Tensor names, dtypes and shapes of a checkpoint, from its safetensors headers only.

    Args:
        directory: Checkpoint directory.

    Returns:
        ``{tensor name: TensorMeta}`` over all its ``*.safetensors`` files.

    Raises:
        CheckpointError: No safetensors file, an unreadable or truncated header, or a tensor
            stored in two files.
    """
    tensors: dict[str, TensorMeta] = {}
    for path in safetensors_files(directory):
        for name, meta in _read_header(path).items():
            if name in tensors:
                raise CheckpointError("uri", f"tensor {name} is stored twice")
            tensors[name] = meta
    return tensors


def validate_checkpoint(
    directory: Path, reference: Mapping[str, tuple[int, ...]], checksum: str
) -> dict[str, TensorMeta]:
    """Checks a checkpoint against the served model before any weight is touched.

    Args:
        directory: Checkpoint directory.
        reference: ``{tensor name: shape}`` of the served model's own checkpoint.
        checksum: Expected ``sha256:<hex>`` (see :func:`checkpoint_checksum`); "" skips it.

    Returns:
        The checkpoint's tensors.

    Raises:
        CheckpointError: Unreadable files, missing or unexpected tensors, shapes that differ
            from ``reference``, or a malformed checksum string.
        ChecksumMismatch: The files do not hash to ``checksum``.
    """
    if checksum and not (checksum.startswith("sha256:") and len(checksum) == 7 + 64):
        raise CheckpointError("checksum", "must be 'sha256:' followed by 64 hex digits")
    tensors = read_checkpoint_tensors(directory)
    missing = sorted(set(reference) - set(tensors))
    if missing:
        raise CheckpointError("uri", f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    unexpected = sorted(set(tensors) - set(reference))
    if unexpected:
        raise CheckpointError("uri", f"checkpoint has {len(unexpected)} unknown tensors, e.g. {unexpected[:3]}")
    for name, shape in reference.items():
        if tensors[name].shape != tuple(shape):
            raise CheckpointError("uri", f"tensor {name} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    if checksum:
        actual = checkpoint_checksum(directory)
        if actual != checksum.lower():
            raise ChecksumMismatch(
                f"checkpoint {directory} hashes to {actual}, expected {checksum}",
                metadata={"expected": checksum, "actual": actual},
            )
    return tensors
