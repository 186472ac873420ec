#!/usr/bin/env bash
# Oracle solution of grep-errors.
set -euo pipefail
grep ERROR /app/app.log > /app/errors.log
