"""Verifier of a `words` task (run by tests/test.sh in /app; writes /logs/verifier/reward.json).

0.5 for exactly one new entry of the asked type, 1.0 when it also has the asked name.
"""

import json
from pathlib import Path

EXPECTED = {"name": "city", "type": "file", "before": ["code.txt"]}
new = sorted(p for p in Path(".").iterdir() if p.name not in EXPECTED["before"])
kind_ok = len(new) == 1 and (new[0].is_dir() if EXPECTED["type"] == "dir" else new[0].is_file())
name_ok = kind_ok and new[0].name == EXPECTED["name"]
reward = 1.0 if name_ok else 0.5 if kind_ok else 0.0
print(f"new entries: {[p.name for p in new]}; type ok: {kind_ok}; name ok: {name_ok}")
result = {"reward": reward, "type_ok": int(kind_ok), "name_ok": int(name_ok)}
Path("/logs/verifier/reward.json").write_text(json.dumps(result))
