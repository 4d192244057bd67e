#!/usr/bin/env bash
# Per-SASS-instruction warp-stall samples of one wsgemm kernel (Nsight Compute source page):
#   OUT=/tmp/out bash scripts/ncu_source.sh NAME 'sm80{tile_m=192,tile_k=32,stages=4,mma_warps_m=4}' fp32 [M N K]
# writes $OUT/NAME.csv (one row per SASS instruction with its stall-reason sample counts).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$1; cand=$2; acc=$3; shift 3
rep=/tmp/$name
timeout 180 ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
  --import-source no -f -o "$rep" python3 scripts/profile_sm80.py "$cand" "$acc" ${*:-4096 4096 4096} \
  > "$OUT/$name.ncu.log" 2>&1
echo "ncu $name rc=$?"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.csv" 2>> "$OUT/$name.ncu.log"
echo "csv $name rc=$? $(wc -l < "$OUT/$name.csv") lines"
