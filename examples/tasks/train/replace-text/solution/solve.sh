#!/usr/bin/env bash
# Oracle solution of replace-text.
set -euo pipefail
find /app/docs -name '*.txt' -exec sed -i 's/foo/bar/g' {} +
