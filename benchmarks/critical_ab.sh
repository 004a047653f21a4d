#!/usr/bin/env bash
# Before/after runs of critical_bench.py, alternated in the same conditions (issue 13):
#
#   bash benchmarks/critical_ab.sh BASE_COMMIT [ROUNDS] [SECONDS] [RATE]
#
# "before" is BASE_COMMIT checked out (detached) in a temporary worktree and run with
# this tree's venv, its code first on PYTHONPATH (the generated protobuf code is made
# there, the native engine's built module copied: native/ must be the same at both);
# "after" is this tree. Each round runs the throughput run (32 writers, CPU per acked
# write; SECONDS long, default 5: the costs that grow with the objects held show in
# longer runs) and the 1 KiB latency run of --quick, before then after. With RATE, the
# throughput run offers that many writes a second (critical_bench.py --rate), and both
# sides run this tree's critical_bench.py (the harness the same, the agents' code not):
# on a noisy machine the CPU per acked write at a fixed load compares two builds better
# than their saturated rates do. Needs the stack
# (MERIDIAN_STACK_* ports exported) and this tree's .venv.
set -euo pipefail
base=${1:?usage: critical_ab.sh BASE_COMMIT [ROUNDS] [SECONDS] [RATE]}
rounds=${2:-2}
seconds=${3:-5}
rate=${4:-}
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
tree=$(mktemp -d /tmp/critical-ab.XXXXXX)
cleanup() { git -C "$here" worktree remove --force "$tree" >/dev/null 2>&1 || true; }
trap cleanup EXIT
git -C "$here" worktree add -q --detach "$tree" "$base"
(cd "$tree" && "$py" scripts/protogen.py >/dev/null)
cp "$here"/native/_delta.*.so "$tree/native/"
for round in $(seq "$rounds"); do
  for side in before after; do
    if [ "$side" = before ]; then dir=$tree; path=$tree; else dir=$here; path=; fi
    for what in throughput small; do
      echo "=== round $round $side $what $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
      bench=benchmarks/critical_bench.py
      paced=()
      if [ -n "$rate" ]; then bench=$here/benchmarks/critical_bench.py; paced=(--rate "$rate"); fi
      (cd "$dir" && PYTHONPATH=$path timeout 300 "$py" "$bench" --quick --only "$what" \
        --seconds "$seconds" "${paced[@]}" 2>&1 | grep -E "ack quorum, p|writers  |CPU per acked") || true
    done
  done
done
