"""Verifier checks of make-tarball (run by tests/test.sh in the working folder /app)."""

import sys


class Failed(Exception):
    pass


def require(condition, why):
    if not condition:
        raise Failed(why)


def check():
    import tarfile

    with tarfile.open("backup.tar.gz", "r:gz") as tf:
        names = set(tf.getnames())
        require({"data/a.txt", "data/b/c.txt"} <= names, f"entries {sorted(names)}")
        require(tf.extractfile("data/b/c.txt").read() == b"gamma\n", "content")


try:
    check()
except Exception as exc:  # a failed requirement, or a missing or malformed file
    print(f"FAIL: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("PASS")
