#!/usr/bin/env bash
# Oracle solution of make-executable.
set -euo pipefail
chmod +x /app/run.sh && /app/run.sh > /app/out.txt
