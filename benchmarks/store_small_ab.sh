#!/usr/bin/env bash
# Before/after runs of store_small_bench.py, alternated in the same conditions:
#
#   bash benchmarks/store_small_ab.sh BASE_COMMIT [ROUNDS]
#
# "before" is BASE_COMMIT exported (git archive) into a temporary folder and run with
# this tree's venv and benchmark script, its code first on PYTHONPATH; "after" is this
# tree.
set -euo pipefail
base=${1:?usage: store_small_ab.sh BASE_COMMIT [ROUNDS]}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
old=$(mktemp -d /tmp/store-small-ab.XXXXXX)
trap 'rm -rf "$old"' EXIT
git -C "$here" archive "$base" | tar -x -C "$old"
cp "$here"/meridian/v1/_generated.py "$here"/meridian/v1/*_pb2*.py* "$old/meridian/v1/" 2>/dev/null || true
cp "$here/benchmarks/store_small_bench.py" "$old/benchmarks/"
for round in $(seq "$rounds"); do
  for side in before after; do
    if [ "$side" = before ]; then dir=$old; path=$old; else dir=$here; path=; fi
    echo "=== round $round $side $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH=$path timeout 300 "$py" benchmarks/store_small_bench.py) || true
  done
done
