#!/usr/bin/env bash
# Oracle solution of rename-extensions.
set -euo pipefail
cd /app/images && for f in *.jpeg; do mv "$f" "${f%.jpeg}.jpg"; done
