"""Checkpoints pushed over ``PushWeights``, staged in memory for the engine's weight update.

A ``PushWeights`` stream (a header naming the files and their sizes, then their bytes in chunks)
is written into a fresh folder under the staging root, a tmpfs (``/dev/shm``) by default, so the
bytes never touch a disk; the engine then loads that folder exactly as ``UpdateWeights`` loads a
checkpoint directory (same validation, checksum, versioning and restore on failure). The folder
of the weights serving now is kept (a failed update reloads it), every other one is removed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from openforge_core.errors import ResourceExhausted
from openforge_inference.engines.base import CheckpointError

#: A pushed file's name: a plain ``*.safetensors`` name, no directory part, no leading dot.
_FILE_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\.safetensors")
_SHM: Final = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class PushedFile:
    """One file a push declares: its name and size in bytes."""

    name: str
    size: int


def default_root() -> Path:
    """``/dev/shm`` where it exists and is writable (memory), else the system temp folder."""
    if _SHM.is_dir() and os.access(_SHM, os.W_OK):
        return _SHM
    return Path(tempfile.gettempdir())


def check_files(files: Sequence[PushedFile], max_bytes: int) -> int:
    """Checks a push's declared files; returns their total size in bytes.

    Raises:
        CheckpointError: No file, a name that is not a plain ``*.safetensors`` name, a name twice,
            files not sorted by name, or a negative size.
        ResourceExhausted: More than ``max_bytes`` in all (the client falls back to the file
            path).
    """
    if not files:
        raise CheckpointError("files", "a push declares at least one *.safetensors file")
    names = [f.name for f in files]
    for f in files:
        if not _FILE_NAME.fullmatch(f.name):
            raise CheckpointError("files", f"{f.name!r} is not a plain *.safetensors file name")
        if f.size < 0:
            raise CheckpointError("files", f"{f.name}: negative size {f.size}")
    if len(set(names)) != len(names):
        raise CheckpointError("files", "a file is declared twice")
    if names != sorted(names):
        raise CheckpointError("files", "files must be sorted by name (the checksum's order)")
    total = sum(f.size for f in files)
    if total > max_bytes:
        raise ResourceExhausted(
            f"{total} bytes declared, more than the limit of {max_bytes} (OPENFORGE_PUSH_MAX_GIB)",
            reason="PUSH_TOO_LARGE",
        )
    return total


class PushStaging:
    """Folders of pushed checkpoints under one root, one per push.

    Args:
        root: Where the folders go (None = :func:`default_root`); a folder of this process is
            made inside it on first use and removed by :meth:`close`.
        max_bytes: Largest push accepted, in bytes.
    """

    def __init__(self, root: Path | None, max_bytes: int) -> None:
        self._root = root
        self._max_bytes = max_bytes
        self._base: Path | None = None
        self._serving: Path | None = None
        self._lock = threading.Lock()

    def _new_folder(self) -> Path:
        with self._lock:  # two first pushes at once share one base folder
            return self._new_folder_locked()

    def _new_folder_locked(self) -> Path:
        if self._base is None:
            parent = self._root or default_root()
            parent.mkdir(parents=True, exist_ok=True)
            self._base = Path(tempfile.mkdtemp(prefix="openforge-pushed-", dir=parent))
        folder = self._base / uuid.uuid4().hex
        folder.mkdir()
        return folder

    async def receive(self, files: Sequence[PushedFile], chunks: AsyncIterator[bytes]) -> tuple[Path, int]:
        """Writes the declared files from ``chunks`` into a new folder.

        Args:
            files: The header's files, in the order of their bytes.
            chunks: The stream's bytes; consumed to its end.

        Returns:
            The folder and the bytes received.

        Raises:
            CheckpointError: Bad declared files (:func:`check_files`), or fewer or more bytes
                than declared. The folder is removed; the rest of ``chunks`` is not read.
            ResourceExhausted: The declared bytes do not fit in the staging folder's filesystem
                (a container's ``/dev/shm`` is 64 MiB unless sized: set ``OPENFORGE_PUSH_DIR``).
        """
        total = check_files(files, self._max_bytes)
        folder = await asyncio.to_thread(self._new_folder)
        received = 0
        try:
            free = (await asyncio.to_thread(shutil.disk_usage, folder)).free
            if total > free:
                raise ResourceExhausted(
                    f"a push of {total} bytes does not fit in {folder.parent} ({free} bytes free); "
                    "set OPENFORGE_PUSH_DIR to a larger filesystem",
                    reason="PUSH_DIR_FULL",
                )
            index, left = 0, files[0].size
            handle = await asyncio.to_thread((folder / files[0].name).open, "wb")
            try:
                async for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        while left == 0 and index + 1 < len(files):
                            await asyncio.to_thread(handle.close)
                            index += 1
                            left = files[index].size
                            handle = await asyncio.to_thread((folder / files[index].name).open, "wb")
                        if left == 0:
                            raise CheckpointError("chunk", f"more bytes than the {total} declared")
                        part = view[:left]
                        await asyncio.to_thread(handle.write, part)
                        left -= len(part)
                        received += len(part)
                        view = view[len(part) :]
            finally:
                await asyncio.to_thread(handle.close)
            # files declared after the last byte (empty ones included) still exist
            for f in files[index + 1 :]:
                await asyncio.to_thread((folder / f.name).touch)
            if received != total:
                raise CheckpointError("chunk", f"{received} bytes received, {total} declared")
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
        return folder, received

    def settle(self, folder: Path, *, serving: bool) -> None:
        """After the engine's update from ``folder``: when it serves now, the folder that served
        before is removed; otherwise (refused, failed, or a repeat of the serving weights)
        ``folder`` is."""
        if serving:
            previous, self._serving = self._serving, folder
            if previous is not None and previous != folder:
                shutil.rmtree(previous, ignore_errors=True)
        elif folder != self._serving:
            shutil.rmtree(folder, ignore_errors=True)

    def release_serving(self) -> None:
        """The engine serves weights from elsewhere now: the folder that served is removed."""
        previous, self._serving = self._serving, None
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        """Removes every folder of this process."""
        if self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None
