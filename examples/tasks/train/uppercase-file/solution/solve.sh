#!/usr/bin/env bash
# Oracle solution of uppercase-file.
set -euo pipefail
tr 'a-z' 'A-Z' < /app/shout.txt > /app/shout.upper && mv /app/shout.upper /app/shout.txt
