#!/usr/bin/env bash
# Oracle solution of json-extract.
set -euo pipefail
python3 -c "import json;print(json.load(open('/app/config.json'))['release']['version'])" > /app/version.txt
