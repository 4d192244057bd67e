#!/usr/bin/env bash
# The benchmark runs behind docs/perf.md and docs/benchmarking.md, on the H200. Records to $OUT.
#   usage: OUT=/tmp/out bash scripts/report_bench.sh [sm90] [sm80] [llm]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${*:-sm90 sm80 llm}
bench() { python3 -m wsgemm bench --no-progress "$@"; }
if [[ " $what " == *" sm90 "* ]]; then
  # issue #2: the five shapes of the floor, fp16 in/out, fp32 accumulation
  bench --rounds 5 --backends cublas,wsgemm:sm90,wsgemm:sm90-pingpong,quack \
    --shapes "4096,4096,4096;8192,8192,8192;8192,28672,4096;8192,4096,14336;16384,16384,4096" \
    --json "$OUT/sm90.json" --markdown "$OUT/sm90.md" > "$OUT/sm90.log" 2>&1
  echo "sm90 rc=$?"; tail -8 "$OUT/sm90.md"
fi
if [[ " $what " == *" sm80 "* ]]; then
  # issue #3: the ablation, both accumulations, square and two LLM shapes
  for acc in fp32 fp16; do
    bench --rounds 5 --accumulate $acc --backends cublas,wsgemm:sm80,wsgemm:sm80-multistage \
      --shapes "4096,4096,4096;8192,8192,8192;4096,28672,4096;4096,4096,14336" \
      --json "$OUT/sm80_$acc.json" --markdown "$OUT/sm80_$acc.md" > "$OUT/sm80_$acc.log" 2>&1
    echo "sm80 $acc rc=$?"; tail -6 "$OUT/sm80_$acc.md"
  done
fi
if [[ " $what " == *" llm "* ]]; then
  bench --rounds 3 --suite llm --tokens 128,4096,16384 --models 8b \
    --json "$OUT/llm.json" --markdown "$OUT/llm.md" --plot "$OUT/llm.png" > "$OUT/llm.log" 2>&1
  echo "llm rc=$?"; tail -10 "$OUT/llm.md"
fi
