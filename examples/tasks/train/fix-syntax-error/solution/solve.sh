#!/usr/bin/env bash
# Oracle solution of fix-syntax-error.
set -euo pipefail
sed -i 's/^def main()$/def main():/' /app/app.py
