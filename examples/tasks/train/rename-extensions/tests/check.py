"""Verifier checks of rename-extensions (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    names = sorted(p.name for p in Path("images").iterdir())
    require(names == ["a.jpg", "b.jpg", "c.png", "d.jpg"], f"files are {names}")
    require(Path("images/a.jpg").read_text() == "a\n", "content changed")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
