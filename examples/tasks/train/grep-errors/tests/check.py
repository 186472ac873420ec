"""Verifier checks of grep-errors (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    want = "10:01 ERROR disk full\n10:03 ERROR timeout\n10:04 INFO ERRORS=0 summary\n"
    require(Path("errors.log").read_text() == want, "wrong lines")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
