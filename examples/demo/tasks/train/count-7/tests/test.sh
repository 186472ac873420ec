#!/usr/bin/env bash
# Verifier of a `lines` task: gated partial credit, written by check.py to /logs/verifier/reward.json.
set -u
mkdir -p /logs/verifier
cd /app || { echo '{"reward": 0}' > /logs/verifier/reward.json; exit 0; }
python3 /tests/check.py
