"""Verifier checks of replace-text (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    require(Path("docs/a.txt").read_text() == "bar and barbar\n", "a.txt")
    require(Path("docs/sub/b.txt").read_text() == "no match\nbar\n", "b.txt")
    require(Path("docs/c.md").read_text() == "foo stays\n", "c.md changed")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
