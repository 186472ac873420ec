#!/usr/bin/env bash
# Oracle solution of find-largest-file.
set -euo pipefail
ls -S /app/data | head -1 > /app/largest.txt
