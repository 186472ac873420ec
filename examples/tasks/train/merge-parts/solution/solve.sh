#!/usr/bin/env bash
# Oracle solution of merge-parts.
set -euo pipefail
for i in $(seq 1 12); do cat /app/parts/part$i.txt; done > /app/full.txt
