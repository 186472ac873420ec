"""Verifier checks of sha256-checksum (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import hashlib

    digest = hashlib.sha256(Path("blob.bin").read_bytes()).hexdigest()
    require(Path("checksum.txt").read_text().strip() == digest, "wrong checksum")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
