#!/usr/bin/env bash
# The sm80 ablation on the H200: Nsight Compute warp-state profiles of both kernels, then
# interleaved sweeps against cuBLAS (python -m wsgemm bench). Logs and records go to $OUT.
#   usage: OUT=/tmp/out bash scripts/sm80_study.sh [ncu] [sweep]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${*:-ncu sweep}
if [[ " $what " == *" ncu "* ]]; then
  for spec in ${PROFILE:-"sm80 fp32" "sm80-multistage fp32" "sm80 fp16" "sm80-multistage fp16"}; do
    set -- $spec
    name=$(echo "$1_$2" | tr -c 'A-Za-z0-9_\n' '_')
    timeout 120 ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis python3 scripts/profile_sm80.py "$1" "$2" 4096 4096 4096 \
      > "$OUT/ncu_$name.log" 2>&1
    echo "ncu $1 $2 rc=$?"; grep -E "Throughput|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Pipe" "$OUT/ncu_$name.log" | head -12
  done
fi
if [[ " $what " == *" sweep "* ]]; then
  shapes="4096,4096,4096;8192,8192,8192;4096,28672,4096;4096,4096,14336"
  # both kernels with the same configs: the ablation compares like with like
  for acc in ${ACCS:-fp32 fp16}; do
    # Defaults: the candidates of docs/perf.md's headline table (records docs/data/sm80_study_*).
    if [[ $acc == fp32 ]]; then
      cands=${FP32:-"cublas,wsgemm:sm80,wsgemm:sm80-multistage,wsgemm:sm80-multistage{fast_interior=0},\
wsgemm:sm80{tile_m=192,tile_k=32,stages=4,mma_warps_m=4},\
wsgemm:sm80-multistage{tile_m=192,tile_k=32,stages=4,mma_warps_m=4},\
wsgemm:sm80{tile_k=32,stages=4},wsgemm:sm80-multistage{tile_k=32,stages=4}"}
    else
      cands=${FP16:-"cublas,wsgemm:sm80,wsgemm:sm80-multistage,wsgemm:sm80-multistage{fast_interior=1},\
wsgemm:sm80{tile_n=128,mma_warps_n=2,ctas_per_sm=2},\
wsgemm:sm80-multistage{tile_n=128,mma_warps_n=2,ctas_per_sm=2}"}
    fi
    python3 -m wsgemm bench --no-progress --rounds "${ROUNDS:-5}" --shapes "$shapes" \
      --accumulate $acc --backends "$cands" --json "$OUT/study_$acc.json" \
      --markdown "$OUT/study_$acc.md" > "$OUT/study_$acc.log" 2>&1
    echo "sweep $acc rc=$?"; tail -12 "$OUT/study_$acc.md"
  done
fi
