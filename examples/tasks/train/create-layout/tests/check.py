"""Verifier checks of create-layout (run by tests/test.sh in the working folder /app)."""

import sys
from pathlib import Path


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    for d in ("project/src", "project/tests", "project/docs"):
        require(Path(d).is_dir(), d)
    init = Path("project/src/__init__.py")
    require(init.is_file() and init.stat().st_size == 0, "__init__.py")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
