#!/usr/bin/env bash
# Oracle solution of celsius-convert.
set -euo pipefail
cat > /app/convert.py <<'EOF'
def c_to_f(c):
    return c * 9 / 5 + 32


def f_to_c(f):
    return (f - 32) * 5 / 9
EOF
