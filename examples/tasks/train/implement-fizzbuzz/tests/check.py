"""Verifier checks of implement-fizzbuzz (run by tests/test.sh in the working folder /app)."""

import subprocess
import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    out = subprocess.run([sys.executable, "fizzbuzz.py"], capture_output=True, text=True, timeout=30).stdout.split()

    def word(i):
        return "FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)

    want = [word(i) for i in range(1, 31)]
    require(out == want, "wrong output")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
