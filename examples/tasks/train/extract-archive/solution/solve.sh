#!/usr/bin/env bash
# Oracle solution of extract-archive.
set -euo pipefail
mkdir -p /app/out && tar xzf /app/bundle.tar.gz -C /app/out && cat "$(find /app/out -name secret.txt)" > /app/answer.txt
