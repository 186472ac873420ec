"""Verifier checks of make-executable (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import os

    require(os.access("run.sh", os.X_OK), "run.sh is not executable")
    require(Path("out.txt").read_text().strip() == "ran with 0 args", "wrong output")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
