#!/usr/bin/env bash
# Oracle solution of hello-world.
set -euo pipefail
printf "hello world\n" > /app/hello.txt
