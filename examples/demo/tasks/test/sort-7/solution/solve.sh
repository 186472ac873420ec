#!/usr/bin/env bash
# oracle: one model call per line
set -eu
cd /app
sort data.txt > answer.txt
