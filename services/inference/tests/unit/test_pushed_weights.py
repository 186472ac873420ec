"""Staging of pushed checkpoints: bytes land in their files whatever the chunking, bad streams are
refused with nothing left behind, and only the serving push is kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from openforge_core.errors import ResourceExhausted
from openforge_inference.engines.base import CheckpointError
from openforge_inference.pushed_weights import PushedFile, PushStaging, check_files


async def _stream(chunks: Sequence[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _receive(staging: PushStaging, files: Sequence[PushedFile], chunks: Sequence[bytes]) -> tuple[Path, int]:
    return asyncio.run(staging.receive(files, _stream(chunks)))


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1000])
def test_files_get_their_bytes_whatever_the_chunking(tmp_path: Path, chunk: int) -> None:
    contents = {
        "a.safetensors": b"A" * 10,
        "b.safetensors": b"",
        "c.safetensors": bytes(range(37)),
        "d.safetensors": b"",
    }
    files = [PushedFile(name, len(data)) for name, data in contents.items()]
    joined = b"".join(contents.values())
    staging = PushStaging(tmp_path, max_bytes=1 << 20)
    folder, received = _receive(staging, files, [joined[i : i + chunk] for i in range(0, len(joined), chunk)])
    assert received == len(joined)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == contents
    assert folder.parent.parent == tmp_path


@pytest.mark.parametrize(
    ("chunks", "words"),
    [([b"x" * 11], "more bytes than the 10 declared"), ([b"x" * 9], "9 bytes received, 10 declared"), ([], "0 bytes")],
)
def test_a_stream_that_does_not_match_its_header_leaves_nothing(
    tmp_path: Path, chunks: list[bytes], words: str
) -> None:
    staging = PushStaging(tmp_path, max_bytes=1 << 20)
    with pytest.raises(CheckpointError, match=words):
        _receive(staging, [PushedFile("m.safetensors", 10)], chunks)
    assert [list(base.iterdir()) for base in tmp_path.iterdir()] == [[]]


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ([], "at least one"),
        ([PushedFile("../m.safetensors", 1)], "plain"),
        ([PushedFile("sub/m.safetensors", 1)], "plain"),
        ([PushedFile(".m.safetensors", 1)], "plain"),
        ([PushedFile("m.bin", 1)], "plain"),
        ([PushedFile("m.safetensors", -1)], "negative"),
        ([PushedFile("m.safetensors", 1), PushedFile("m.safetensors", 1)], "twice"),
        ([PushedFile("b.safetensors", 1), PushedFile("a.safetensors", 1)], "sorted"),
    ],
)
def test_bad_declared_files_are_refused(files: list[PushedFile], words: str) -> None:
    with pytest.raises(CheckpointError, match=words):
        check_files(files, max_bytes=100)


def test_a_push_over_the_limit_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted, match="more than the limit of 100"):
        check_files([PushedFile("a.safetensors", 60), PushedFile("b.safetensors", 41)], max_bytes=100)


def test_a_push_larger_than_the_free_space_is_refused_before_any_byte(tmp_path: Path) -> None:
    staging = PushStaging(tmp_path, max_bytes=1 << 60)
    with pytest.raises(ResourceExhausted, match="OPENFORGE_PUSH_DIR"):
        _receive(staging, [PushedFile("m.safetensors", 1 << 55)], [b"x"])
    assert [list(base.iterdir()) for base in tmp_path.iterdir()] == [[]]


def test_only_the_serving_push_is_kept(tmp_path: Path) -> None:
    staging = PushStaging(tmp_path, max_bytes=1 << 20)
    files = [PushedFile("m.safetensors", 2)]
    first, _ = _receive(staging, files, [b"v1"])
    staging.settle(first, serving=True)
    refused, _ = _receive(staging, files, [b"no"])
    staging.settle(refused, serving=False)
    assert not refused.exists() and first.exists()
    second, _ = _receive(staging, files, [b"v2"])
    staging.settle(second, serving=True)
    assert not first.exists() and (second / "m.safetensors").read_bytes() == b"v2"
    staging.release_serving()  # the engine loaded a checkpoint from its path since
    assert not second.exists()
    base = second.parent
    staging.close()
    assert not base.exists()
