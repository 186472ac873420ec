#!/usr/bin/env bash
# Oracle solution of reverse-words.
set -euo pipefail
cat > /app/text_utils.py <<'EOF'
def reverse_words(s):
    return " ".join(reversed(s.split(" ")))
EOF
