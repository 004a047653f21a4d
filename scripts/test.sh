#!/usr/bin/env bash
# Sets everything up and runs the whole test suite against the real local stack:
# lint and types, the C engine's own tests (plain, sanitized, fuzzed), then pytest.
# The stack is stopped at the end, also when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

started_stack=0
tools_pid="" tools_group=""
# MERIDIAN_KEEP_STACK=1 leaves the stack running afterwards (for a developer's loop).
cleanup() {
  # its own session and process group (setsid), so its Go builds stop with it
  # (only while that job still runs: a finished group's id may belong to another by now)
  if [ -n "$tools_pid" ] && jobs -rp | grep -qx "$tools_pid" && [ -s "$tools_group" ]; then
    kill -- -"$(cat "$tools_group")" 2>/dev/null || true
  fi
  rm -f "$tools_group"
  if [ "$started_stack" = 1 ] && [ "${MERIDIAN_KEEP_STACK:-0}" != 1 ]; then
    meridian stack down >&2 || true
  fi
}
trap cleanup EXIT

status=0
began=$SECONDS
step() {
  local name=$1 t0=$SECONDS
  shift
  echo; echo "== $name" >&2
  "$@" || { echo "FAILED: $*" >&2; status=1; }
  echo "== $name: $((SECONDS - t0)) s (at $((SECONDS - began)) s)" >&2
}

# The deployment tests' tools (OpenTofu, its providers, helm: Go builds; checkov: a
# virtualenv) take about two minutes to build on a fresh machine. They build in the
# background, niced, while the engine's tests and the stack start: one core is free
# then. The tests' fixture takes the same file locks, so it waits for a build under way
# (or builds what failed here, and then fails with the installer's sentence).
tools_log="${TMPDIR:-/tmp}/meridian-tools.$$.log"
tools_group="${TMPDIR:-/tmp}/meridian-tools.$$.pgid"
# The child writes its own id: setsid forks when it starts as a group leader (job
# control on), and then `$!` is not the new group's id; -w keeps `$!` alive as long.
setsid -w sh -c 'echo $$ >"$1"; exec nice -n 10 python -m controlplane.stack.tools' sh "$tools_group" \
  >"$tools_log" 2>&1 &
tools_pid=$!
echo "deployment tools building in the background (log: $tools_log)" >&2

step "ruff" ruff check .
step "ruff format" ruff format --check .
step "mypy --strict" mypy
if [ -f native/Makefile ]; then
  step "native engine: C tests, sanitizers, bounded fuzzing" make -C native -j2 ci
fi

echo "== stack up" >&2
meridian stack up --postgres
started_stack=1
meridian stack status --output table
echo "== stack up: done (at $((SECONDS - began)) s)" >&2

step "pytest" pytest -p no:cacheprovider "$@"
exit "$status"
