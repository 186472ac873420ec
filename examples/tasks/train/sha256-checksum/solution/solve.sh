#!/usr/bin/env bash
# Oracle solution of sha256-checksum.
set -euo pipefail
sha256sum /app/blob.bin | cut -d' ' -f1 > /app/checksum.txt
