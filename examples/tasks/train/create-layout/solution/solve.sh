#!/usr/bin/env bash
# Oracle solution of create-layout.
set -euo pipefail
mkdir -p /app/project/src /app/project/tests /app/project/docs && : > /app/project/src/__init__.py
