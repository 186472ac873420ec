"""Verifier checks of reverse-words (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("text_utils", "text_utils.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    require(m.reverse_words("a b c") == "c b a", "a b c")
    require(m.reverse_words("hello") == "hello", "one word")
    require(m.reverse_words("the sky is blue") == "blue is sky the", "sentence")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
