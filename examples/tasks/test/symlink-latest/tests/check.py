"""Verifier checks of symlink-latest (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import os

    require(Path("latest").is_symlink(), "not a symlink")
    require(os.readlink("latest") == "releases/v3", f"points to {os.readlink('latest')}")
    require(Path("latest/VERSION").read_text() == "3\n", "broken")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
