#!/usr/bin/env bash
# oracle: one model call per line
set -eu
cd /app
bash check.sh
echo failed > answer.txt
