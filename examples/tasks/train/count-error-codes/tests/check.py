"""Verifier checks of count-error-codes (run by tests/test.sh in the working folder /app)."""

import json
import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    require(json.loads(Path("counts.json").read_text()) == {"E1": 3, "E2": 1, "E3": 1}, "wrong counts")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
