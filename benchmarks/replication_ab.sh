#!/usr/bin/env bash
# replication_bench before (a base commit) and after (this tree), alternated in the same
# conditions on the same stack: the machine is shared, so one run of each is not a
# comparison.
#
#   BASE=d71c5cd ROUNDS=2 benchmarks/replication_ab.sh --only-lag [--rate 500]
#   BASE=d71c5cd ROUNDS=1 benchmarks/replication_ab.sh --objects 10000
#   BASE=d71c5cd NEW=HEAD benchmarks/replication_ab.sh ...   # "after" = a commit, not the tree
#
# The base's code is exported with `git archive` into a temporary folder (no worktree,
# no checkout) and run with PYTHONPATH pointing there (the agents it starts inherit
# it); this tree's generated protobuf code, native engine and benchmark script are
# copied in, so both runs print the same rows (the base must have the same protos).
# With NEW set, the "after" runs are that commit exported the same way, so editing the
# tree meanwhile changes neither side.
# Export the MERIDIAN_STACK_*_PORT variables of your stack first.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
base="${BASE:?set BASE to the commit to compare against}"
rounds="${ROUNDS:-2}"
python="$here/.venv/bin/python"
old="$(mktemp -d /tmp/replication-ab-XXXXXX)"
trap 'rm -rf "$old"' EXIT
export_to() {  # commit, folder
    git -C "$here" archive "$1" | tar -x -C "$2"
    cp "$here"/meridian/v1/_generated.py "$here"/meridian/v1/*_pb2*.py* "$2/meridian/v1/"
    cp "$here"/native/*.so "$2/native/" 2>/dev/null || true
    cp "$here/benchmarks/replication_bench.py" "$2/benchmarks/"
}
export_to "$base" "$old"
new_dir="$here" new_path=""
if [ -n "${NEW:-}" ]; then
    new_dir="$old/new"
    mkdir "$new_dir"
    export_to "$NEW" "$new_dir"
    new_path="$new_dir"
fi
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
    run "after-$round" "$new_dir" "$new_path" "$@"
done
