"""Verifier checks of split-by-category: each check is worth an equal share of the reward.

Run by tests/test.sh in the working folder /app; writes /logs/verifier/reward.json.
"""

import json
from pathlib import Path

CHECKS = [
    ("fruit", lambda: Path("by_category/fruit.txt").read_text().split() == ["apple", "pear"]),
    ("veg", lambda: Path("by_category/veg.txt").read_text().split() == ["carrot", "leek"]),
    ("grain", lambda: Path("by_category/grain.txt").read_text().split() == ["rice"]),
]


def passed(check):
    try:
        return bool(check())
    except Exception as exc:  # a missing file counts as a failed check
        print(f"error: {exc}")
        return False


results = [(name, passed(fn)) for name, fn in CHECKS]
for name, ok in results:
    print(("PASS " if ok else "FAIL ") + name)
score = sum(ok for _, ok in results) / len(results)
Path("/logs/verifier/reward.json").write_text(
    json.dumps({"reward": score, "checks_passed": sum(ok for _, ok in results), "checks_total": len(results)})
)
