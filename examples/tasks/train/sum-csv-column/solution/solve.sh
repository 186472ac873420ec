#!/usr/bin/env bash
# Oracle solution of sum-csv-column.
set -euo pipefail
python3 -c "import csv;print(f'{sum(float(r[\"amount\"]) for r in csv.DictReader(open(\"/app/sales.csv\"))):.2f}')" > /app/total.txt
