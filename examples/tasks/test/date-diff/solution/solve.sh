#!/usr/bin/env bash
# Oracle solution of date-diff.
set -euo pipefail
python3 -c "import datetime as d;a,b=[d.date.fromisoformat(l.strip()) for l in open('/app/dates.txt') if l.strip()];print((b-a).days)" > /app/days.txt
