#!/usr/bin/env bash
# Oracle solution of ini-set-port.
set -euo pipefail
sed -i '/^\[server\]/,/^\[/ s/^port = .*/port = 8080/' /app/app.ini
