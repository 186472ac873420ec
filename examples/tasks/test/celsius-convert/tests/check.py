"""Verifier checks of celsius-convert (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("convert", "convert.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    require(abs(m.c_to_f(100) - 212) < 1e-9 and abs(m.c_to_f(-40) + 40) < 1e-9, "c_to_f")
    require(abs(m.f_to_c(32)) < 1e-9 and abs(m.f_to_c(98.6) - 37) < 1e-9, "f_to_c")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
