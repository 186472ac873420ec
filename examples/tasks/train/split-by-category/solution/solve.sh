#!/usr/bin/env bash
# Oracle solution of split-by-category.
set -euo pipefail
mkdir -p /app/by_category && tail -n +2 /app/products.csv | while IFS=, read -r name cat; do echo "$name" >> "/app/by_category/$cat.txt"; done
