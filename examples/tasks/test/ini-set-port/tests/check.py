"""Verifier checks of ini-set-port (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import configparser

    c = configparser.ConfigParser()
    c.read("app.ini")
    require(c["server"]["port"] == "8080", "server port")
    require(c["client"]["port"] == "9000" and c["server"]["host"] == "127.0.0.1", "other keys changed")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
