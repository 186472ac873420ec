#!/usr/bin/env bash
# Graded verifier: the reward is the fraction of the answer's non-blank characters that are the
# letter "e" (either case), in [0, 1]; no answer or an empty one earns 0.
set -u
mkdir -p /logs/verifier
python3 - <<'PY' > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
from pathlib import Path

path = Path("/app/answer.txt")
text = "".join(path.read_text(errors="replace").split()) if path.is_file() else ""
print(round(sum(c in "eE" for c in text) / len(text), 6) if text else 0)
PY
echo "reward: $(cat /logs/verifier/reward.txt)"
