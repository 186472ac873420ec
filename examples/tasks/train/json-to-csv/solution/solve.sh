#!/usr/bin/env bash
# Oracle solution of json-to-csv.
set -euo pipefail
python3 -c "import json;rows=json.load(open('/app/items.json'));open('/app/items.csv','w').write('sku,qty\n'+''.join(f'{r[\"sku\"]},{r[\"qty\"]}\n' for r in rows))"
