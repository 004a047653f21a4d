#!/usr/bin/env bash
# Sets everything up and runs the whole test suite against the real local stack:
# lint and types, the C engine's own tests (plain, sanitized, fuzzed), then pytest.
# The stack is stopped at the end, also when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

started_stack=0
# MERIDIAN_KEEP_STACK=1 leaves the stack running afterwards (for a developer's loop).
cleanup() {
  if [ "$started_stack" = 1 ] && [ "${MERIDIAN_KEEP_STACK:-0}" != 1 ]; then
    meridian stack down >&2 || true
  fi
}
trap cleanup EXIT

status=0
step() { echo; echo "== $1" >&2; shift; "$@" || { echo "FAILED: $*" >&2; status=1; }; }

step "ruff" ruff check .
step "ruff format" ruff format --check .
step "mypy --strict" mypy
if [ -f native/Makefile ]; then
  step "native engine: C tests, sanitizers, bounded fuzzing" make -C native ci
fi

echo "== stack up" >&2
meridian stack up --postgres
started_stack=1
meridian stack status --output table

step "pytest" pytest -p no:cacheprovider "$@"
exit "$status"
