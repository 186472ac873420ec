#!/usr/bin/env bash
# oracle: one model call per line
set -eu
cd /app
wc -l < data.txt > answer.txt
