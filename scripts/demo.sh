#!/usr/bin/env bash
# Sets everything up and runs the demo (which starts the local stack of real engines
# when it is not up, and stops what it started)
# (arguments are passed on: e.g. `bash scripts/demo.sh --scale small --keep`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
exec meridian demo "$@"
