#!/usr/bin/env bash
# Oracle solution of dedupe-lines.
set -euo pipefail
awk '!seen[$0]++' /app/list.txt > /app/unique.txt
