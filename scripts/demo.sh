#!/usr/bin/env bash
# Sets everything up, starts the local stack of real engines and runs the demo
# (arguments are passed on: e.g. `bash scripts/demo.sh --scale small --keep`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
meridian stack up
meridian stack status --output table
exec meridian demo "$@"
