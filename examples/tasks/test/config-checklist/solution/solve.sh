#!/usr/bin/env bash
# Oracle solution of config-checklist.
set -euo pipefail
mkdir -p /app/logs && sed -i 's/^mode=development$/mode=production/' /app/app.conf && rm -f /app/tmp.lock
