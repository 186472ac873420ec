"""Verifier of a `lines` task (run by tests/test.sh in /app; writes /logs/verifier/reward.json).

0.2 when answer.txt exists, 1.0 when its lines are the expected ones (blanks around them ignored).
"""

import json
from pathlib import Path

EXPECTED = ["root"]
path = Path("answer.txt")
exists = path.is_file()
lines = [x.strip() for x in path.read_text(errors="replace").strip().splitlines()] if exists else []
right = exists and lines == EXPECTED
reward = 1.0 if right else 0.2 if exists else 0.0
print(f"answer.txt exists: {exists}; lines: {lines[:8]}; expected: {EXPECTED}")
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": reward, "exists": int(exists)}))
