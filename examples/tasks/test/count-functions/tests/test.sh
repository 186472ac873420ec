#!/usr/bin/env bash
# Verifier of count-functions: 1 when check.py passes, else 0, in /logs/verifier/reward.txt.
set -u
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
