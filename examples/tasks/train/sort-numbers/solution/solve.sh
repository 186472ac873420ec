#!/usr/bin/env bash
# Oracle solution of sort-numbers.
set -euo pipefail
sort -n /app/numbers.txt > /app/sorted.txt
