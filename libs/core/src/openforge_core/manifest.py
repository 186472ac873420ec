"""What the run manifest (``openforge.common.v1.RunManifest``) records, shared by its producers:
content digests (``sha256:<hex>``, the form inference's ``GetModelInfo`` and the dashboard use for
a tokenizer) and what the proxy serves a run with (:class:`ServedModel`, which the proxy reports
and the orchestrator records)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "sha256:"


@dataclass(frozen=True)
class ServedModel:
    """What the proxy renders, tokenizes and parses with (``openforge.proxy.v1.ServedModel``).

    Attributes:
        tokenizer_hash: :func:`sha256_digest` of the ``tokenizer.json`` bytes the proxy loaded.
        chat_template_hash: :func:`sha256_digest` of the chat template's UTF-8 text.
        parsers: The proxy's model family and parsers, ``<role>:<name>``: ``family:<name>``,
            ``tool_call:<name>``, ``reasoning:<name>``.
    """

    tokenizer_hash: str
    chat_template_hash: str
    parsers: tuple[str, ...]


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return PREFIX + hashlib.sha256(data).hexdigest()


def files_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """``sha256:<hex>`` over named files, in the order given: per file its name (UTF-8) and its
    bytes, each preceded by its length (8 bytes, big-endian), so no two different listings hash
    alike.

    Args:
        files: (name, content) pairs; the caller fixes the order (e.g. sorted names).
    """
    h = hashlib.sha256()
    for name, content in files:
        encoded = name.encode()
        h.update(len(encoded).to_bytes(8, "big"))
        h.update(encoded)
        h.update(len(content).to_bytes(8, "big"))
        h.update(content)
    return PREFIX + h.hexdigest()
