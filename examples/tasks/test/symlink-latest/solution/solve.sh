#!/usr/bin/env bash
# Oracle solution of symlink-latest.
set -euo pipefail
cd /app && ln -s releases/v3 latest
