#!/usr/bin/env bash
# Oracle solution of csv-to-json.
set -euo pipefail
python3 - <<'EOF'
import csv, json
rows = [dict(r, age=int(r["age"])) for r in csv.DictReader(open("/app/people.csv"))]
json.dump(rows, open("/app/people.json", "w"))
EOF
