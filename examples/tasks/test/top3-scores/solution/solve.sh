#!/usr/bin/env bash
# Oracle solution of top3-scores.
set -euo pipefail
tail -n +2 /app/scores.csv | sort -t, -k2 -rn | head -3 | cut -d, -f1 > /app/top3.txt
