#!/usr/bin/env bash
# Oracle solution of count-lines.
set -euo pipefail
wc -l < /app/data/input.txt | tr -d " " > /app/answer.txt
