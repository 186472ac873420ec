#!/usr/bin/env bash
# Oracle solution of count-error-codes.
set -euo pipefail
python3 - <<'EOF'
import collections, json, re
c = collections.Counter(m.group(1) for line in open("/app/events.log") for m in [re.search(r"code=(\w+)", line)] if m)
json.dump(dict(c), open("/app/counts.json", "w"))
EOF
