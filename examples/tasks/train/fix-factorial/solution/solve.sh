#!/usr/bin/env bash
# Oracle solution of fix-factorial.
set -euo pipefail
sed -i 's/range(1, n)/range(1, n + 1)/' /app/mathutils.py
