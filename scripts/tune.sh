#!/usr/bin/env bash
# Tuning sweep on the H200: shipped configs against candidates, interleaved with cuBLAS in one
# process per suite (python -m wsgemm bench, docs/benchmarking.md). Logs and records go to $OUT.
#   usage: OUT=/tmp/out bash scripts/tune.sh [sm90] [sm80]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${*:-sm90 sm80}
bench() { python3 -m wsgemm bench --no-progress --rounds "${ROUNDS:-3}" "$@"; }
if [[ " $what " == *" sm90 "* ]]; then
  bench --shapes "4096,4096,4096;8192,8192,8192;8192,28672,4096;8192,4096,14336;16384,16384,4096" \
    --backends "cublas,quack,wsgemm:sm90,\
wsgemm:sm90{cluster_m=1},wsgemm:sm90{cluster_m=1,cluster_n=2},wsgemm:sm90-pingpong,\
wsgemm:sm90-pingpong{tile_m=64,tile_n=256}" \
    --json "$OUT/tune_sm90.json" --markdown "$OUT/tune_sm90.md" > "$OUT/tune_sm90.log" 2>&1
  echo "sm90 sweep rc=$?"; tail -14 "$OUT/tune_sm90.md"
fi
if [[ " $what " == *" sm80 "* ]]; then
  # both kernels always with the same config: the ablation compares like with like
  cands="cublas"
  for k in sm80 sm80-multistage; do
    cands+=",wsgemm:$k,wsgemm:$k{mma_warps_n=2},wsgemm:$k{tile_k=32,stages=4}"
    cands+=",wsgemm:$k{tile_n=128,mma_warps_n=2}"
  done
  for acc in fp32 fp16; do
    bench --shapes "4096,4096,4096;8192,8192,8192;4096,28672,4096;4096,4096,14336" \
      --accumulate $acc --backends "$cands" \
      --json "$OUT/tune_sm80_$acc.json" --markdown "$OUT/tune_sm80_$acc.md" > "$OUT/tune_sm80_$acc.log" 2>&1
    echo "sm80 $acc sweep rc=$?"; tail -11 "$OUT/tune_sm80_$acc.md"
  done
fi
