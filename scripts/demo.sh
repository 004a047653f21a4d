#!/usr/bin/env bash
# Sets everything up, starts the local stack of real engines and runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
meridian stack up --postgres
meridian stack status --output table
if meridian demo --help >/dev/null 2>&1; then
  meridian demo
else
  echo "(meridian demo is not built yet: the stack above is up; stop it with 'meridian stack down')"
fi
