#!/usr/bin/env bash
# Oracle solution of crlf-to-lf.
set -euo pipefail
sed -i 's/\r$//' /app/windows.txt
