"""Verifier checks of csv-to-json (run by tests/test.sh in the working folder /app)."""

import json
import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    want = [
        {"name": "Ada", "age": 36, "city": "London"},
        {"name": "Lin", "age": 29, "city": "Taipei"},
        {"name": "Ola", "age": 41, "city": "Oslo"},
    ]
    require(json.loads(Path("people.json").read_text()) == want, "wrong json")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
