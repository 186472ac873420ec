"""Verifier checks of merge-parts (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    require(Path("full.txt").read_text() == "".join(f"chunk {i}\n" for i in range(1, 13)), "wrong order or content")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
