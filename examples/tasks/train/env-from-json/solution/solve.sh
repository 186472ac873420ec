#!/usr/bin/env bash
# Oracle solution of env-from-json.
set -euo pipefail
python3 -c "import json;d=json.load(open('/app/settings.json'));open('/app/.env','w').write(''.join(f'{k.upper()}={v}\n' for k,v in sorted(d.items())))"
