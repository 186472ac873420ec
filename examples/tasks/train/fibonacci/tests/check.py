"""Verifier checks of fibonacci (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fib", "fib.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    require([m.fib(i) for i in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34], "first ten")
    require(m.fib(200) == 280571172992510140037611932413038677189525, "fib(200)")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
