"""Verifier checks of config-checklist: each check is worth an equal share of the reward.

Run by tests/test.sh in the working folder /app; writes /logs/verifier/reward.json.
"""

import json
from pathlib import Path

CHECKS = [
    ("logs/ exists", lambda: Path("logs").is_dir()),
    (
        "mode=production",
        lambda: (
            "mode=production" in Path("app.conf").read_text().splitlines()
            and "mode=development" not in Path("app.conf").read_text()
        ),
    ),
    ("tmp.lock removed", lambda: not Path("tmp.lock").exists()),
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
