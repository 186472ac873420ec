"""Verifier checks of hello-world (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    p = Path("hello.txt")
    require(p.is_file(), "hello.txt missing")
    require(p.read_text() == "hello world\n", f"content is {p.read_text()!r}")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
