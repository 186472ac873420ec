#!/usr/bin/env bash
# Oracle solution of make-tarball.
set -euo pipefail
cd /app && tar czf backup.tar.gz data
