#!/usr/bin/env bash
# Alternating rounds of two engine builds on the checkpoint series, one thread,
# in-library CPU time (md_floor --whole, best of REPS each), so that a load change
# hits both alike; prints each pair's best diff / patch GB/s per build and the
# delta sizes.
#   native/tests/floor_rounds.sh OLD_BUILD NEW_BUILD SERIES_DIR [ROUNDS [REPS]]
# SERIES_DIR holds weights.{a,b10,b100,b10g} and optim.{a,b10,b100} (the files
# benchmarks/delta_bench.py's train_series writes); a build is a native BUILD dir.
set -euo pipefail
old=$1 new=$2 dir=$3 rounds=${4:-3} reps=${5:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pairs=("weights.a weights.b10 bf16, 10 steps" "weights.a weights.b100 bf16, 100 steps"
       "optim.a optim.b10 fp32, 10 steps" "optim.a optim.b100 fp32, 100 steps"
       "weights.a weights.b10g bf16, gained a tensor")
for r in $(seq "$rounds"); do
  for b in "$old" "$new"; do
    for p in "${pairs[@]}"; do
      set -- $p
      line=$(nice -n 10 "$b/md_floor" --whole "$dir/$1" "$dir/$2" "$tmp" "$reps")
      echo "$b|${p#* * }|$line" >> "$tmp/all"
    done
  done
done
printf '| pair | before diff / patch GB/s | after diff / patch GB/s | delta bytes before -> after |\n| --- | --- | --- | --- |\n'
for p in "${pairs[@]}"; do
  name=${p#* * }
  row=$(awk -F'|' -v n="$name" -v o="$old" -v w="$new" '
    $2 == n { split($3, f, " +"); d = f[2]; q = f[5]; sz = f[12]
      if ($1 == o) { if (d > od) od = d; if (q > op) op = q; os = sz }
      else if ($1 == w) { if (d > nd) nd = d; if (q > np) np = q; ns = sz } }
    END { printf "%.2f / %.2f | %.2f / %.2f | %s -> %s", od, op, nd, np, os, ns }' "$tmp/all")
  echo "| $name | $row |"
done
