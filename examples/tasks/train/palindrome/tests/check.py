"""Verifier checks of palindrome (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("palindrome", "palindrome.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    cases = {
        "A man, a plan, a canal: Panama": True,
        "race a car": False,
        "": True,
        "No 'x' in Nixon": True,
        "ab": False,
    }
    for s, want in cases.items():
        require(bool(m.is_palindrome(s)) is want, repr(s))


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
