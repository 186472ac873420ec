#!/usr/bin/env bash
# Oracle solution of count-functions.
set -euo pipefail
python3 -c "import ast;t=ast.parse(open('/app/module.py').read());print(sum(isinstance(n,(ast.FunctionDef,ast.AsyncFunctionDef)) for n in t.body))" > /app/answer.txt
