#!/usr/bin/env bash
# Oracle solution of matrix-transpose.
set -euo pipefail
python3 -c "rows=[l.split() for l in open('/app/matrix.txt') if l.strip()];open('/app/transposed.txt','w').write(''.join(' '.join(c)+'\n' for c in zip(*rows)))"
