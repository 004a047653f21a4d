#!/usr/bin/env bash
# replication_bench before (a base commit) and after (this tree), alternated in the same
# conditions on the same stack: the machine is shared, so one run of each is not a
# comparison.
#
#   BASE=d71c5cd ROUNDS=2 benchmarks/replication_ab.sh --only-lag [--rate 500]
#   BASE=d71c5cd ROUNDS=1 benchmarks/replication_ab.sh --objects 10000
#
# The base's code is exported with `git archive` into a temporary folder (no worktree,
# no checkout) and run with PYTHONPATH pointing there (the agents it starts inherit
# it); this tree's generated protobuf code, native engine and benchmark script are
# copied in, so both runs print the same rows (the base must have the same protos).
# Export the MERIDIAN_STACK_*_PORT variables of your stack first.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
base="${BASE:?set BASE to the commit to compare against}"
rounds="${ROUNDS:-2}"
python="$here/.venv/bin/python"
old="$(mktemp -d /tmp/replication-ab-XXXXXX)"
trap 'rm -rf "$old"' EXIT
git -C "$here" archive "$base" | tar -x -C "$old"
cp "$here"/meridian/v1/_generated.py "$here"/meridian/v1/*_pb2*.py* "$old/meridian/v1/"
cp "$here"/native/*.so "$old/native/" 2>/dev/null || true
cp "$here/benchmarks/replication_bench.py" "$old/benchmarks/"
run() {  # label, folder, PYTHONPATH, args...
    local label="$1" dir="$2" path="$3"
    shift 3
    echo "== $label: $*  ($(uptime | sed 's/.*load/load/'))"
    (cd "$dir" && PYTHONPATH="$path" timeout 1200 nice -n 10 "$python" \
        benchmarks/replication_bench.py "$@" 2>"$old/$label.err" | grep '^|' || true)
    grep 'lag run' "$old/$label.err" || true
}
for round in $(seq "$rounds"); do
    run "before-$base-$round" "$old" "$old" "$@"
    run "after-$round" "$here" "" "$@"
done
