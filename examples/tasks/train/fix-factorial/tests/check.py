"""Verifier checks of fix-factorial (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mathutils", "mathutils.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    require([m.factorial(i) for i in range(7)] == [1, 1, 2, 6, 24, 120, 720], "factorial still wrong")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
