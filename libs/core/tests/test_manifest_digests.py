"""The manifest's digests: ``sha256:<hex>`` of bytes, and of named files unambiguously."""

from __future__ import annotations

import hashlib

from openforge_core.manifest import files_digest, sha256_digest


def test_sha256_digest_is_the_prefixed_hex_digest() -> None:
    assert sha256_digest(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


def test_files_digest_depends_on_names_contents_and_order_only() -> None:
    base = files_digest([("a/test.sh", b"echo 1\n"), ("b/test.sh", b"echo 2\n")])
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    assert files_digest([("a/test.sh", b"echo 1\n"), ("b/test.sh", b"echo 2\n")]) == base
    assert files_digest([("a/test.sh", b"echo 1\n"), ("b/test.sh", b"echo 3\n")]) != base  # content
    assert files_digest([("a/test.sh", b"echo 1\n"), ("c/test.sh", b"echo 2\n")]) != base  # name
    assert files_digest([("b/test.sh", b"echo 2\n"), ("a/test.sh", b"echo 1\n")]) != base  # order
    # the length prefixes keep a name/content boundary from moving unnoticed
    assert files_digest([("ab", b"c")]) != files_digest([("a", b"bc")])
    assert files_digest([]) == sha256_digest(b"")
