"""Verifier checks of fix-syntax-error (run by tests/test.sh in the working folder /app)."""

import subprocess
import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    out = subprocess.run([sys.executable, "app.py"], capture_output=True, text=True, timeout=30)
    require(out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-300:])


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
