#!/usr/bin/env bash
# One batched GPU session on the lent H200 (see ../shared/gpu/README.md; `bash
# scripts/make_gpu_bundle.sh` makes the three parts once per machine): needs `.gpu/p1/stash.sh`
# and `.gpu/pw/stash.sh` (the small wheels, moved out of p2 so that p2 and the tree fit one
# transfer) run earlier on this host, each in its own call, and `.gpu/p2` carried now. Logs go
# to $OUT.
#   usage: [SANITIZE='sm80 sm80{tile_m=96}'] bash scripts/gpu_session.sh [tests|sanitize|checks|verify|epilogue|residual|raggedk|raggedkbench|routed|epibench|gatedbench|gatedheldout|gatedfit|gatedbias|dgated|gatedswap|gatedsmall|gatedsanitize|skteams|dgatedtiles|dgatedheld|dact|dactbench|dactsanitize|groupedtrace|dgatedtrace|suiteall|routechoice|docsllm|suite1|suite2|suite3|suite4|gatedtiles|bandtrace|mlptrain|rpr|hostbench|fixup|grouped|grouped3d2d|groupedtune|skewprobe|tilecosts|oracle|lowrows|bandoracle|heldout|heldoutbi|clustersplit|clustersanitize|streamk|wavefit|wavetune|layouttune|initcheck|bench|all]...
set -uo pipefail
source .gpu/p2/install.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
# One sanitizer run of scripts/sanitize_auto.py's MODE cases (or SCRIPT's: sanitize_grouped.py
# takes the same --initcheck; log sanitize_NAME_TOOL.log), its cases compiled outside the
# sanitizer first by the caller (an in-process compile makes
# cuda-python probe driver symbols, cuGetProcAddress: API errors, not memory ones, left out of
# the report, perf.md 119). initcheck reads nothing back (it does not see TMA stores:
# sanitize_auto.py) and leaves out torch's elementwise kernels, which read what a TMA store
# wrote (the copy of a misaligned C, the activation of an unfused product; perf.md 117, 119).
sanitize_run() {
  local tool=$1 mode=$2 name=$3 script=${4:-scripts/sanitize_auto.py} flag= exclude=
  if [[ $tool == initcheck ]]; then
    flag=--initcheck; exclude="--kernel-name-exclude kns=elementwise_kernel"
  fi
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 --report-api-errors no \
    $exclude python3 $script $mode $flag 2>&1 \
    | tee "$OUT/sanitize_${name}_$tool.log" | tail -3
  echo "$tool $name rc=${PIPESTATUS[0]}"
}
# sanitize_auto.py MODE's cases compiled, then under memcheck, racecheck and initcheck
sanitize_mode() {
  local mode=$1 name=$2
  python3 scripts/sanitize_auto.py $mode 2>&1 | tail -3
  for tool in memcheck racecheck initcheck; do sanitize_run $tool "$mode" $name; done
}
start=$SECONDS
if has warm || has tests || has checks; then
  python3 -m wsgemm warm --arch sm_90a --jobs 15 > "$OUT/warm.log" 2>&1; tail -2 "$OUT/warm.log"
  echo "warm done in $((SECONDS - start)) s"
fi
if has smoke || has tests; then
  for b in ${BACKENDS:-sm90 sm90-pingpong sm80 sm80-multistage}; do
    timeout 90 python3 scripts/sanitize_cases.py $b 2>&1 | tail -4; echo "smoke $b rc=${PIPESTATUS[0]}"
  done
fi
if has tests; then
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --maxfail=${MAXFAIL:-40} --no-header \
    -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" ${TESTS:-tests/} 2>&1 \
    | tee "$OUT/gpu_tests.log" | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -45
  echo "tests done at $((SECONDS - start)) s"
fi
if has sanitize; then
  # Compile (and check) the cases outside the sanitizer first: an in-process compile makes
  # cuda-python probe driver symbols (cuGetProcAddress), which memcheck counts as API errors.
  python3 scripts/sanitize_cases.py ${SANITIZE:-} 2>&1 | tail -3
  echo "plain rc=${PIPESTATUS[0]}"
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py ${SANITIZE:-} 2>&1 \
      | tee "$OUT/sanitize_$tool.log" | tail -12
    echo "$tool rc=${PIPESTATUS[0]}"
  done
  sanitize_mode "" auto
  echo "sanitize done at $((SECONDS - start)) s"
fi
if has oracle; then
  # issue #23's oracle: every menu and dropped entry x split on a models draw (DRAW=SEED:FAMILIES:COUNT)
  # (WITH_CS=1: the cluster split candidates too, tune_menu.CLUSTER_SPLIT; ENTRIES='cs*,...':
  # only the entries of those name patterns; MRANGE=LO:HI: only those token counts)
  timeout ${ORACLE_TIMEOUT:-560} python3 scripts/tune_menu.py --out "$OUT/oracle" --draw ${DRAW:-1:fit:250} \
    --with-dropped ${WITH_CS:+--with-cluster-split} ${ENTRIES:+--entries "$ENTRIES"} \
    ${MRANGE:+--m-range $MRANGE} --jobs 15 --rounds ${ROUNDS:-3} --budget-s ${BUDGET:-480} > "$OUT/oracle.log" 2>&1
  echo "oracle rc=$?"; grep -E "shapes:|budget|done in|WRONG|FAILED" "$OUT/oracle.log" | tail -20
  echo "oracle done at $((SECONDS - start)) s"
fi
if has lowrows; then
  # issue #23: where a shape's loss lies, in the kernels or in the choice: what cuBLAS runs
  # there (its kernel names), then every menu and dropped entry x split on those shapes
  # (LOW_FP16 / LOW_BF16: M,N,K;M,N,K... TN; diagnosis only, never fitted on)
  for dt in float16 bfloat16; do
    shapes=$([[ $dt == float16 ]] && echo "${LOW_FP16:-}" || echo "${LOW_BF16:-}")
    [[ -n $shapes ]] || continue
    short=$([[ $dt == float16 ]] && echo fp16 || echo bf16)
    timeout 90 python3 scripts/cublas_kernels.py --shapes "$shapes" --dtype $short \
      > "$OUT/lowrows-cublas-$short.log" 2>&1; echo "cublas kernels $short rc=$?"
    timeout ${LOW_TIMEOUT:-300} python3 scripts/tune_menu.py --out "$OUT/lowrows-$short" \
      --shapes "$shapes" --dtype $dt --with-dropped --jobs 15 --rounds ${ROUNDS:-5} \
      --budget-s ${BUDGET:-240} > "$OUT/lowrows-$short.log" 2>&1
    echo "lowrows $short rc=$?"; grep -E "shapes:|budget|done in|WRONG|FAILED" "$OUT/lowrows-$short.log" | tail -5
  done
  echo "lowrows done at $((SECONDS - start)) s"
fi
if has bandoracle; then
  # perf.md entry 48: the oracle (menu + dropped x split) on the fit draw's 129-1024-token
  # shapes, where the kernels lose most (entry 33), with the wide swap-AB candidates (its warm
  # compiles them in parallel; each candidate checked against float64 before it is timed), then
  # their GPU fuzz on the compiled variants
  timeout ${ORACLE_TIMEOUT:-380} python3 scripts/tune_menu.py --out "$OUT/bandoracle" \
    --draw ${DRAW:-1:fit:250} --m-range 129:1024 --with-dropped --jobs 15 --rounds ${ROUNDS:-3} \
    --budget-s ${BUDGET:-330} > "$OUT/bandoracle.log" 2>&1
  echo "bandoracle rc=$?"; grep -E "shapes:|budget|done in|WRONG|FAILED|oracle" "$OUT/bandoracle.log" | tail -20
  timeout ${SWAPWIDE_TIMEOUT:-180} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_swap_ab.py -k wide > "$OUT/swapwide-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/swapwide-tests.log" | cut -c1-300 | tail -10
  echo "bandoracle done at $((SECONDS - start)) s"
fi
if has heldout; then
  # issue #24's acceptance run: auto against cuBLAS on a held-out models draw (SEED recorded
  # before it is measured), both dtypes, no tuned store, no autotune
  for dt in ${DTYPES:-fp16 bf16}; do  # (DTYPES=fp16: one dtype a call)
    # (SWITCH_ON=NAME,...: host.registry switches on for this run alone, scripts/switched.py)
    WSGEMM_AUTOTUNE=0 timeout ${BENCH_TIMEOUT:-200} python3 scripts/switched.py "${SWITCH_ON:-}" \
      bench --suite models --seed ${SEED:?} --count ${COUNT:-160} --dtype $dt --families ${FAMILIES:-gemma2,phi,deepseek,falcon3,olmo2,olmoe,yi} \
      --backends cublas,wsgemm:auto --rounds ${ROUNDS:-7} --json "$OUT/heldout-$dt.json" > "$OUT/heldout-$dt.log" 2>&1
    echo "heldout $dt rc=$?"; grep -iE "geomean|auto" "$OUT/heldout-$dt.log" | tail -4
    # the cost model's prediction error on the same rows (issue #24)
    python3 scripts/prediction_error.py "$OUT/heldout-$dt.json" \
      --json "$OUT/heldout-$dt-prediction-error.json" | head -3
    # a shape below the floor is re-run in a fresh process, both records kept (issue #24)
    [[ -s "$OUT/heldout-$dt.json" ]] || echo "heldout $dt: no record, so no re-run"
    python3 scripts/rerun_below.py "$OUT/heldout-$dt.json" --floor ${FLOOR:-0.92} \
      | while read -r layout dtype acc shapes; do
        WSGEMM_AUTOTUNE=0 timeout ${RERUN_TIMEOUT:-150} python3 scripts/switched.py \
          "${SWITCH_ON:-}" bench --shapes "$shapes" --layout $layout --dtype $dtype \
          --accumulate $acc --backends cublas,wsgemm:auto --rounds ${ROUNDS:-7} \
          --json "$OUT/heldout-$dt-rerun-$layout.json" < /dev/null > "$OUT/heldout-$dt-rerun-$layout.log" 2>&1
        rc=$?
        echo "heldout $dt re-run of $(tr ';' '\n' <<< "$shapes" | wc -l) shapes below" \
          "${FLOOR:-0.92}x rc=$rc"; grep -iE "geomean" "$OUT/heldout-$dt-rerun-$layout.log" | tail -2
      done
  done
  echo "heldout done at $((SECONDS - start)) s"
fi
if has clustersplit; then
  # issue #23: the cluster split-K (off until these pass: Sm90Config.cluster_split), its GPU
  # cases, then against the workspace split and cuBLAS on decode products (perf.md entry 94)
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_cluster_split.py 2>&1 | tee "$OUT/cluster-split-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  # how many clusters of 2 and 4 CTAs the GPU holds at once (the host launches sm_count // ways)
  python3 -c "import torch; torch.zeros(1, device='cuda'); from wsgemm.host.dispatch import \
    CudaDevices as D; d = D(); print('max active clusters', {w: d.clusters(0, w) for w in (1, 2, 4)})" \
    2>&1 | tail -1
  WSGEMM_AUTOTUNE=0 timeout ${CS_BENCH_TIMEOUT:-240} python3 scripts/bench_cluster_split.py \
    --rounds ${ROUNDS:-7} --json "$OUT/cluster-split.json" > "$OUT/cluster-split.log" 2>&1
  echo "cluster split bench rc=$?"; grep -E "==|WRONG|Error" "$OUT/cluster-split.log"
fi
if has heldoutbi; then
  # issue #24: the held-out geomean reported with batch invariance on (fp16; the same draw)
  WSGEMM_AUTOTUNE=0 WSGEMM_BATCH_INVARIANT=1 timeout ${BENCH_TIMEOUT:-200} python3 -m wsgemm bench \
    --suite models --seed ${SEED:?} --count ${COUNT:-160} --dtype fp16 \
    --families ${FAMILIES:-gemma2,phi,deepseek,falcon3,olmo2,olmoe,yi} --backends cublas,wsgemm:auto \
    --rounds ${ROUNDS:-7} --json "$OUT/heldout-bi-fp16.json" > "$OUT/heldout-bi-fp16.log" 2>&1
  echo "heldout batch-invariant fp16 rc=$?"; grep -iE "geomean|auto" "$OUT/heldout-bi-fp16.log" | tail -4
fi
if has epilogue; then
  # issue #25: the fused epilogue's GPU tests (351 cases with -k fused: ~450 s on an H100,
  # 2026-12-05, so alone in a call)
  timeout ${EPI_TEST_TIMEOUT:-560} python3 -m pytest -v -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_epilogue.py -k "${EPI_TESTS:-fused}" > "$OUT/epilogue-tests.log" 2>&1
  grep -cE " PASSED" "$OUT/epilogue-tests.log"; grep -E "FAILED|ERROR|passed|failed" "$OUT/epilogue-tests.log" | cut -c1-300 | tail -20
  echo "epilogue tests done at $((SECONDS - start)) s"
fi
if has verify; then
  # session 17's launch-path changes, first GPU run (one call): the fused bias launch now takes
  # (bias, alpha, beta), the grouped one (bias, alpha, beta, offs); the traced split-K call;
  # the wide swap-AB tiles now on the menu (their fuzz and the same-bits check of every entry)
  timeout ${VERIFY_TIMEOUT:-520} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_epilogue.py tests/gpu/test_gpu_grouped.py tests/gpu/test_gpu_trace.py \
    tests/gpu/test_gpu_swap_ab.py tests/host/test_policy.py \
    -k "(test_fused_epilogue and auto) or grouped or split_k or wide or same_bits" \
    > "$OUT/verify-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/verify-tests.log" | cut -c1-300 | tail -20
  echo "verify done at $((SECONDS - start)) s"
fi
if has residual; then
  # issue #25: the fused residual and alpha (kernels/sm90/residual.py: C by TMA into the
  # epilogue buffers since perf.md entry 56). Its speed:
  # EPILOGUES=residual bash scripts/gpu_session.sh epibench
  timeout ${RES_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_residual.py > "$OUT/residual-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/residual-tests.log" | cut -c1-300 | tail -20
  echo "residual tests done at $((SECONDS - start)) s"
fi
if has epibench; then
  # issue #25: fused against plain wsgemm and torch's best unfused path (llm suite rows, fp16)
  timeout ${EPI_BENCH_TIMEOUT:-300} python3 scripts/bench_epilogue.py --rounds ${ROUNDS:-5} \
    --models ${EPI_MODELS:-8b,70b} \
    --tokens ${EPI_TOKENS:-16,1024,4096} --epilogues ${EPILOGUES:-bias,bias_gelu_tanh,bias_silu} \
    --json "$OUT/epilogue-bench.json" > "$OUT/epilogue-bench.log" 2>&1
  echo "epilogue bench rc=$?"; grep "==" "$OUT/epilogue-bench.log"
  echo "epilogue bench done at $((SECONDS - start)) s"
fi
if has gatedbench; then
  # issue #25: gated_linear (fused) against the plain 2I-wide product, that product then
  # torch's unit, and torch's unfused SwiGLU/GeGLU, on the llm suite's gate/up rows
  WSGEMM_AUTOTUNE=0 timeout ${GATED_BENCH_TIMEOUT:-400} python3 scripts/bench_epilogue.py \
    --rounds ${ROUNDS:-5} --models ${EPI_MODELS:-8b,70b} --tokens ${GATED_TOKENS:-1,4,16,32,64,256,1024,4096,16384} \
    --epilogues ${GATED:-swiglu,geglu} --json "$OUT/gated-bench.json" > "$OUT/gated-bench.log" 2>&1
  echo "gated bench rc=$?"; grep -E "==|Error" "$OUT/gated-bench.log"
  echo "gated bench done at $((SECONDS - start)) s"
fi
if has gatedsmall; then
  # the gated kernel's small row tile (off in calls until these pass: GATED_SMALL_FAMILIES,
  # docs/perf.md entry 88), then its held-out judgment with it on for that run alone:
  # SWITCH_ON=GATED_SMALL_FAMILIES SEED=379700 bash scripts/gpu_session.sh gatedsmall gatedheldout
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "gated_small" 2>&1 | tee "$OUT/gated-small-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
fi
if has gatedheldout && [[ -z ${SEED:-} ]]; then
  echo "gatedheldout: skipped, no SEED (draw one, record it, then SEED=... this step)"
elif has gatedheldout; then
  # perf.md entry 73's road choice judged off its fit rows: the gate_up rows of a models draw
  # (SEED recorded before it is measured; families the road's constants never saw)
  # (no online tuning: its first timings of a shape ran inside the timed rounds)
  WSGEMM_AUTOTUNE=0 timeout ${GATED_BENCH_TIMEOUT:-400} python3 scripts/bench_epilogue.py --suite models \
    --seed ${SEED:?} --count ${COUNT:-200} --families ${FAMILIES:-gemma2,phi,deepseek,falcon3,olmo2,olmoe,yi} \
    --rounds ${ROUNDS:-5} --epilogues swiglu --switch-on "${SWITCH_ON:-}" \
    --json "$OUT/gated-heldout.json" > "$OUT/gated-heldout.log" 2>&1
  echo "gated heldout rc=$?"; grep -E "==|Error" "$OUT/gated-heldout.log"
  echo "gated heldout done at $((SECONDS - start)) s"
fi
if has gatedfit; then
  # what the gated road's constants are fitted on (scripts/fit_gated_cost.py): the gate_up rows
  # of a models draw of the fit families (seed 1, as the menu's fit draws)
  WSGEMM_AUTOTUNE=0 timeout ${GATED_BENCH_TIMEOUT:-400} python3 scripts/bench_epilogue.py --suite models \
    --seed ${FIT_SEED:-1} --count ${FIT_COUNT:-250} --families ${FIT_FAMILIES:-llama3,qwen2.5,qwen3,qwen3-moe,mistral,mixtral} \
    --rounds ${ROUNDS:-5} --epilogues swiglu --json "$OUT/gated-fit.json" > "$OUT/gated-fit.log" 2>&1
  echo "gated fit rc=$?"; grep -E "==|Error" "$OUT/gated-fit.log"
  echo "gated fit done at $((SECONDS - start)) s"
fi
if has gatedbias; then
  # the biased gated kernel (off in calls until these pass: host.registry.GATED_BIAS_FAMILIES)
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "gated_bias or biases" 2>&1 | tee "$OUT/gated-bias-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
fi
if has dgated; then
  # the gated unit's gradient fused into the dh GEMM (off in calls until these pass:
  # host.registry.DGATED_FAMILIES), then GatedMLP trained with it against float64
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "(dgated or preact or gated_mlp) and not linear_preact" \
    2>&1 | tee "$OUT/dgated-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
fi
if has dact; then
  # a plain MLP's training kernels (off in calls until these pass: host.registry.DACT_FAMILIES,
  # docs/perf.md entry 92): the activation's gradient fused into the dh GEMM, the up
  # projection storing its pre-activation, then MLP trained with both
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "dact or linear_preact" 2>&1 | tee "$OUT/dact-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
fi
if has dactbench; then
  # docs/perf.md entry 92's prediction: the dact GEMM against its plain GEMM, a plain MLP's step
  timeout ${MLP_BENCH_TIMEOUT:-240} python3 scripts/bench_mlp_dact.py --rounds ${ROUNDS:-5} \
    --tokens ${MLP_TOKENS:-1024,4096} --json "$OUT/mlp-dact.json" > "$OUT/mlp-dact.log" 2>&1
  echo "mlp dact rc=$?"; tail -8 "$OUT/mlp-dact.log"
fi
if has suiteall; then
  # the whole GPU suite in one call: JOBS pytest runs side by side (scripts/gpu_suite.py);
  # shards of equal time from an earlier run's $OUT/suite/durations.json, kept as
  # tests/gpu/durations.json (SUITE_PLAN= another file; SUITE_PLAN=none: equal counts).
  # 12 jobs: that file's measured times put the suite at ~3600 s of shard time on an H100
  # host, 445 s at 12 jobs (perf.md entry 115)
  plan=${SUITE_PLAN:-tests/gpu/durations.json}
  [[ -f $plan ]] || plan=
  WSGEMM_AUTOTUNE=0 python3 scripts/gpu_suite.py --out "$OUT/suite" --jobs ${JOBS:-12} \
    --timeout ${SUITE_TIMEOUT:-540} ${plan:+--plan "$plan"} ${TESTS:-tests/} 2>&1 \
    | tee "$OUT/gpu-suite.log" | tail -40
  echo "suiteall done at $((SECONDS - start)) s"
fi
# The whole GPU suite in four calls of under 600 s each (one run was cut at 560 s after 41%,
# docs/perf.md entry 80): named steps only, not part of "all"
suite() { [[ " $steps " == *" $1 "* ]]; }
for part in 1 2 3 4; do
  suite suite$part || continue
  case $part in
    1) files="test_bench_gpu test_gpu_autograd test_gpu_autotune test_gpu_cache test_gpu_correctness test_gpu_dispatch" ;;
    2) files="test_gpu_epilogue test_gpu_grouped test_gpu_residual test_gpu_route_choice" ;;
    3) files="test_gpu_splitk" ;;
    4) files="test_gpu_stream_k test_gpu_swap_ab test_gpu_trace" ;;
  esac
  WSGEMM_AUTOTUNE=0 timeout ${SUITE_TIMEOUT:-560} python3 -m pytest -q -m gpu --no-header \
    -p no:cacheprovider -rf $(for f in $files; do echo tests/gpu/$f.py; done) 2>&1 \
    | tee "$OUT/gpu-suite$part.log" | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  echo "suite$part done at $((SECONDS - start)) s"
done
if has gatedswap; then
  # the gated swap-AB decode tile (on since these passed: docs/perf.md entry 85), then
  # timed at 1-32 rows against the rule's tile, the road, torch's unfused SwiGLU and plain
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "gated_swap" 2>&1 | tee "$OUT/gated-swap-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  WSGEMM_AUTOTUNE=0 timeout ${GATED_TILES_TIMEOUT:-300} python3 scripts/bench_gated_tiles.py \
    --rows ${SWAP_ROWS:-1,4,8,16,32} --tiles sm90-pingpong --rounds ${ROUNDS:-5} \
    --json "$OUT/gated-swap.json" > "$OUT/gated-swap.log" 2>&1
  echo "gated swap bench rc=$?"; cat "$OUT/gated-swap.log" | cut -c1-250 | tail -40
fi
if has groupedtrace; then
  # issue #26: a grouped call traced (which tile ran which group), then drawn from the CLI
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_trace.py -k grouped 2>&1 | tee "$OUT/grouped-trace-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  timeout 300 python3 -m wsgemm trace --shape 4096,2048,7168 --groups 1200,0,300,2596 \
    --out "$OUT/grouped-trace" 2>&1 | tail -12
fi
if has dgatedtrace; then
  # where the fused dh GEMM's time goes (8B at DT_ROWS tokens, default 4096; perf.md entries
  # 81, 107), then its test: the dgated GEMM on the rule's tile and forced onto the ping-pong
  # one (its whole pre-activation in shared memory, the epilogue under the other warpgroup's
  # mainloop), and the plain product on auto's pick and on the ping-pong tile. Entry 112's
  # question (DT_ROWS=1024): if the plain ping-pong trace's "wait full" is near the dgated
  # one's (~44% of a mainloop), the tile starves its feed; near the cooperative plain one's
  # (~28%), the epilogue's traffic does
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_trace.py -k dgated 2>&1 | tee "$OUT/dgated-trace-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  timeout 300 python3 - "$OUT/dgated-trace" ${DT_ROWS:-4096} <<'PY' 2>&1 | tail -20
import contextlib, os, sys, torch
from unittest import mock
from wsgemm import tracing
from wsgemm.api import gated as gated_core
from wsgemm.host.choosing.menu import entry
out, rows = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
dy = torch.randn(rows, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, 14336, dtype=torch.bfloat16, device="cuda") / 64
pre = torch.randn(rows, 2 * 14336, dtype=torch.bfloat16, device="cuda")
def show(name, t):
    t.write_summary(f"{out}/summary-{name}.json")
    s = t.summary()
    print(name, s["call"]["backend"], t.check() or "consistent", round(s["duration_us"], 1),
          "us", s["roles"]["consumer"]["fractions"])
    return t
e = entry("sm90-pingpong")
for name, forced in (("dgated", None), ("dgated-pingpong", (e.backend, e.variant_config()))):
    patch = mock.patch.object(gated_core, "dgated_tile", lambda *_: forced)
    with patch if forced else contextlib.nullcontext():
        t = show(name, tracing.trace_gated_grad(dy, w, pre, "silu"))
    t.save(f"{out}/raw-{name}.npz")
    t.plot(f"{out}/timeline-{name}.png")
show("plain", tracing.trace(dy, w))
show("plain-pingpong", tracing.trace(dy, w, backend="sm90-pingpong"))
PY
fi
if has bandtrace; then
  # issues #23/#24: where auto's pick spends its time on the held-out draw's worst shapes at
  # 65-1022 tokens (docs/data/gpu-2026-12-06e/heldout-fp16.json: 0.81-0.89x cuBLAS), traced
  # as auto runs them (a split pick traced with its fix-up), each beside explain's prediction
  for shape in 913,2048,1024 266,5120,17920 483,3072,1536 562,17920,5120 501,2560,4096 \
      199,3072,1152 199,7168,4608 1022,2048,7168 75,4096,2752 350,2752,4096; do
    python3 -m wsgemm explain --shape $shape 2>&1 | grep -E "^(kernel|split-K|grid|why)" | head -4
    timeout 120 python3 -m wsgemm trace --shape $shape --split-k --out "$OUT/bandtrace/$shape" \
      2>&1 | grep -E "role|producer|consumer|call|tiles per SM|tail|overhead" | head -9
  done
fi
if has gatedtiles; then
  # the gated kernel's row tiles at few rows (scripts/bench_gated_tiles.py; each checked first)
  WSGEMM_AUTOTUNE=0 timeout ${GATED_TILES_TIMEOUT:-300} python3 scripts/bench_gated_tiles.py \
    --rounds ${ROUNDS:-5} --json "$OUT/gated-tiles.json" > "$OUT/gated-tiles.log" 2>&1
  echo "gated tiles rc=$?"; cat "$OUT/gated-tiles.log" | cut -c1-250 | tail -40
fi
if has skteams; then
  # docs/perf.md entry 105: stream-K in teams (Sm90Config.stream_k_teams): its GPU cases, the
  # traced 615x8192x4096 call in both layouts beside the unsplit tile (entry 104's shape), then
  # the band's A/B: both layouts, the menu's best band tiles, on the fit draw's 129-1024 rows
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_stream_k.py -k "teams or 615" 2>&1 | tee "$OUT/skteams-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  timeout 240 python3 - "$OUT" <<'PY' 2>&1 | tail -12
import json, sys, torch, wsgemm
from wsgemm.kernels.sm90.config import Sm90Config
a = torch.randn(615, 4096, dtype=torch.float16, device="cuda")
b = torch.randn(8192, 4096, dtype=torch.float16, device="cuda").t()
out = {}
for name, config in [("unsplit", None), ("ranges", Sm90Config(stream_k=True)),
                     ("teams", Sm90Config(stream_k=True, stream_k_teams=True))]:
    t = wsgemm.trace(a, b, backend="sm90", config=config, split_k=config is not None)
    s = t.summary()
    out[name] = s
    consumer = s["roles"].get("consumer", s["roles"])
    print(name, "problems:", t.check() or "none", "| us:", s["duration_us"], "| overhead:",
          s["overhead"], "| consumer:", consumer, "| fixup:", s["fixup"], "| tail:", s["finish"])
open(sys.argv[1] + "/skteams-trace.json", "w").write(json.dumps(out, default=str, indent=1))
PY
  timeout ${SK_TIMEOUT:-300} python3 scripts/tune_menu.py --out "$OUT/skteams" --draw ${DRAW:-1:fit:250} \
    --m-range ${MRANGE:-129:1024} --with-dropped --entries "${ENTRIES:-sm90,cooperative-128x256-c1x2,swap-cooperative-128x1[46]0-c2x1,sk-*,skt-*}" \
    --jobs 15 --rounds ${ROUNDS:-5} --budget-s ${BUDGET:-250} > "$OUT/skteams.log" 2>&1
  echo "skteams rc=$?"; grep -E "shapes:|budget|done in|WRONG|FAILED" "$OUT/skteams.log" | tail -5
  python3 scripts/compare_forms.py "$OUT/skteams/tune_menu.csv" --prefix skt- --base-prefix sk- \
    2>&1 | tail -8
fi
if has dgatedtiles; then
  # docs/perf.md entry 107: the dgated GEMM's row tiles (ping-pong: the whole tile buffered;
  # cooperative: the loader warp) forced, beside auto's and the plain GEMM, timed alone, on
  # seven fit-family MLPs (hidden = the dh GEMM's K, 2048-8192): the fit of the tile rule
  # (DT_TILES: the tiles forced, e.g. every row tile of the menu, entry 110)
  timeout ${MLP_BENCH_TIMEOUT:-300} python3 scripts/bench_dgated_tiles.py --rounds ${ROUNDS:-4} \
    --tiles ${DT_TILES:-sm90-pingpong,sm90} --models ${DT_MODELS:-8b,70b,qwen2.5-7b,qwen3-4b,mistral-nemo-12b,qwen2.5-32b/4,llama-3.2-3b} \
    --tokens ${MLP_TOKENS:-1024,4096} --json "$OUT/dgated-tiles-fit.json" \
    2>&1 | tee "$OUT/dgated-tiles.log" | tail -16
fi
if has dgatedheld; then
  # docs/perf.md entry 107: the dgated row tile by wave fill (cost.dgated_kernel_entry), fitted
  # on seven fit-family MLPs at 1024/4096 tokens, judged on seven held-out-family MLPs at
  # 512/2048/8192: the dgated GPU cases, then auto's tile beside both forced
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu --no-header -p no:cacheprovider -rf \
    tests/gpu/test_gpu_epilogue.py -k "dgated" 2>&1 | tee "$OUT/dgated-tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  # (timed alone: bench_mlp_train's rotation biased these ratios by position, entry 107)
  timeout ${MLP_BENCH_TIMEOUT:-300} python3 scripts/bench_dgated_tiles.py --rounds ${ROUNDS:-4} \
    --tiles ${DT_TILES:-sm90-pingpong,sm90} --models ${DH_MODELS:-gemma-2-9b,gemma-2-2b,phi-3-medium,falcon3-10b,olmo-2-13b,yi-1.5-34b/2,falcon3-3b} \
    --tokens ${MLP_TOKENS:-512,2048,8192} --json "$OUT/dgated-tiles-heldout.json" \
    2>&1 | tee "$OUT/dgated-heldout.log" | tail -24
fi
if has mlptrain; then
  # issue #25 / perf.md entry 74: a SwiGLU MLP's forward+backward, wsgemm vs torch vs its GEMMs
  timeout ${MLP_BENCH_TIMEOUT:-240} python3 scripts/bench_mlp_train.py --rounds ${ROUNDS:-5} \
    --models ${EPI_MODELS:-8b,70b} --tokens ${MLP_TOKENS:-1024,4096} \
    --dgated-tiles ${DGATED_TILES:-sm90-pingpong} \
    --json "$OUT/mlp-train.json" > "$OUT/mlp-train.log" 2>&1
  echo "mlp train rc=$?"; cat "$OUT/mlp-train.log" | tail -16
fi
if has rpr; then
  # issue #27: does the baseline's setting (cuBLAS's reduced-precision split-K reduction off)
  # change any ratio? cublas-rpr is torch.matmul with torch's default (allowed)
  for dt in fp16 bf16; do
    WSGEMM_AUTOTUNE=0 timeout ${BENCH_TIMEOUT:-200} python3 -m wsgemm bench --suite ${RPR_SUITE:-llm} \
      --dtype $dt --backends cublas,cublas-rpr,wsgemm:auto --rounds ${ROUNDS:-5} \
      --json "$OUT/rpr-$dt.json" > "$OUT/rpr-$dt.log" 2>&1
    echo "rpr $dt rc=$?"; grep -iE "geomean|rpr|wrong" "$OUT/rpr-$dt.log" | tail -8
  done
fi
if has docsllm; then
  # issue #27's docs: the llm suite for docs/benchmarking.md (auto first, the peers and torch's
  # default reduced-precision cuBLAS in the same process), acceptance settings: no tuned store,
  # WSGEMM_AUTOTUNE=0, no table override
  root=$(python3 -c 'from wsgemm.host.choosing.autotune import location; print(location().root or "")')
  [[ -n $root ]] && rm -rf "$root/autotune"
  WSGEMM_AUTOTUNE=0 timeout ${BENCH_TIMEOUT:-560} python3 -m wsgemm bench --suite llm \
    --backends ${DOCS_BACKENDS:-wsgemm:auto,cublas-rpr,triton,quack} --rounds ${ROUNDS:-5} \
    --json "$OUT/llm-docs.json" --plot "$OUT/llm-docs.png" --markdown "$OUT/llm-docs.md" \
    > "$OUT/llm-docs.log" 2>&1
  echo "docs llm rc=$?"; grep -iE "geomean|wrong|error" "$OUT/llm-docs.log" | tail -10
  tail -8 "$OUT/llm-docs.md"
fi
if has routechoice; then
  # issue #27: the on-line chooser races auto's kernel against torch.matmul (on sm_90 the
  # study mode, against_torch=True), stores the faster and reuses it: the medians it printed
  WSGEMM_AUTOTUNE=0 timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -s -m gpu --no-header \
    -p no:cacheprovider -rfE tests/gpu/test_gpu_route_choice.py > "$OUT/route-choice.log" 2>&1
  grep -E "^M=|^nothing set|passed|failed" "$OUT/route-choice.log" | cut -c1-300
fi
if has hostbench; then
  # host time per call, torch.mm vs wsgemm.matmul (and the grouped / gated ops), 64x64 fp16
  timeout 120 python3 scripts/bench_host_overhead.py --rounds 7 > "$OUT/host-overhead.log" 2>&1
  echo "host bench rc=$?"; tail -12 "$OUT/host-overhead.log"
fi
if has fixup; then
  # issue #23 item 1: the split-K/stream-K fix-up's exposed cost per shared tile, and the
  # stream-K tile against the same tile unsplit on entry 28's rows (docs/perf.md entry 45)
  timeout ${FIXUP_TIMEOUT:-300} python3 scripts/bench_fixup.py --out "$OUT/fixup" --jobs 15 \
    --rounds ${ROUNDS:-7} > "$OUT/fixup.log" 2>&1
  echo "fixup rc=$?"; grep -E "fix-up|stream-K|WRONG|FAILED|done in" "$OUT/fixup.log" | tail -30
fi
if has grouped3d2d; then
  # issue #26: 3D x 2D on the grouped kernel (transposed), built on the CPU (perf.md entry 42)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_grouped.py -k 3d2d > "$OUT/grouped-3d2d.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/grouped-3d2d.log" | cut -c1-300 | tail -10
  echo "grouped 3d2d done at $((SECONDS - start)) s"
fi
if has raggedk; then
  # issue #26's 2D x 2D form: the ragged-K kernel's variants, its GPU tests, the sanitizer
  timeout 200 python3 -c "from wsgemm import host
o = host.warm(host.ragged_k_variants(), jobs=15); bad = [x for x in o if x.status == 'failed']
print(len(o) - len(bad), 'ragged-K variants ready;', *(f'{x.key}: {x.error}' for x in bad[:3]))"
  timeout ${RAGGEDK_TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    -k "ragged_k or 2d2d" tests/gpu/test_gpu_grouped.py > "$OUT/raggedk-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/raggedk-tests.log" | cut -c1-300 | tail -20
  timeout 120 python3 scripts/sanitize_grouped.py 2>&1 | tail -2
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_grouped.py \
    2>&1 | tee "$OUT/sanitize_raggedk_memcheck.log" | tail -3
  echo "raggedk done at $((SECONDS - start)) s"
fi
if has raggedkbench; then
  # issue #26's weight-gradient form: the moe suite's wgrad pass, the ragged-K kernel (auto and
  # sm90 named) against torch._grouped_mm (bf16) and the per-expert loop (fp16)
  for dt in ${RKB_DTYPES:-bf16 fp16}; do
    timeout ${RKB_TIMEOUT:-200} python3 -m wsgemm bench --suite moe --pass wgrad --dtype $dt \
      --models ${RKB_MODELS:-qwen3-30b-a3b,qwen3-235b-a22b,mixtral-8x7b} --tokens ${RKB_TOKENS:-64,512} \
      --backends all,wsgemm:sm90 --rounds ${ROUNDS:-3} --no-progress --json "$OUT/moe-wgrad-$dt.json" \
      > "$OUT/moe-wgrad-$dt.log" 2>&1
    echo "moe wgrad $dt rc=$?"; grep -iE "geomean|wrong|error" "$OUT/moe-wgrad-$dt.log" | head -8 | cut -c1-300
  done
fi
if has routed; then
  # issue #26's row scale: grouped_mm(row_scale=) (the router weights on the down projection)
  # against torch._grouped_mm then the scale (bf16) and the loop then the scale (fp16); its GPU
  # tests first (docs/perf.md entry 63)
  timeout ${ROUTED_TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_grouped.py -k row_scale > "$OUT/rowscale-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/rowscale-tests.log" | tail -8
  for dt in ${ROUTED_DTYPES:-bf16 fp16}; do
    timeout ${ROUTED_TIMEOUT:-120} python3 -m wsgemm bench --suite moe --pass routed --dtype $dt \
      --models ${ROUTED_MODELS:-qwen3-30b-a3b,qwen3-235b-a22b,mixtral-8x7b,deepseek-v3} \
      --tokens ${ROUTED_TOKENS:-64,512} --backends all --rounds ${ROUNDS:-3} --no-progress \
      --json "$OUT/moe-routed-$dt.json" > "$OUT/moe-routed-$dt.log" 2>&1
    echo "moe routed $dt rc=$?"; grep -iE "geomean|wrong|error" "$OUT/moe-routed-$dt.log" | head -8 | cut -c1-300
  done
fi
if has grouped; then
  # issue #26 step 1: the grouped kernel's variants compiled in parallel, its GPU tests, the
  # sanitizer on its ragged cases, then the moe bench (bf16 against torch._grouped_mm)
  timeout 300 python3 -c "from wsgemm import host; from wsgemm.host.grouped import grouped_variants
o = host.warm(grouped_variants(), jobs=15); bad = [x for x in o if x.status == 'failed']
print(len(o) - len(bad), 'grouped variants ready;', *(f'{x.key}: {x.error}' for x in bad[:3]))"
  timeout ${GROUPED_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_grouped.py > "$OUT/grouped-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/grouped-tests.log" | cut -c1-300 | tail -20
  timeout 120 python3 scripts/sanitize_grouped.py 2>&1 | tail -2
  for tool in memcheck racecheck initcheck; do
    sanitize_run $tool "" grouped scripts/sanitize_grouped.py
  done
  for dt in ${MOE_DTYPES:-bf16 fp16}; do
    WSGEMM_AUTOTUNE=0 timeout ${MOE_BENCH_TIMEOUT:-240} python3 -m wsgemm bench --suite moe --dtype $dt \
      --rounds ${ROUNDS:-5} ${MOE_ARGS:-} --json "$OUT/moe-$dt.json" > "$OUT/moe-$dt.log" 2>&1
    echo "moe $dt rc=$?"; grep -iE "geomean|wsgemm" "$OUT/moe-$dt.log" | tail -6
  done
  echo "grouped done at $((SECONDS - start)) s"
fi
if has skewprobe; then
  # perf.md entry 119: the grouped kernel on skewed routing at large batch, by group-size
  # pattern (balanced, skewed, sorted, aligned) beside torch and the loop
  for spec in ${SKEW_SPECS:-qwen3-235b-a22b:gate_up qwen3-30b-a3b:gate_up}; do
    timeout 200 python3 scripts/moe_skew_probe.py --model ${spec%%:*} --proj ${spec##*:} \
      --tokens ${SKEW_TOKENS:-4096} --json "$OUT/skewprobe-${spec%%:*}-${spec##*:}.json" 2>&1 | tail -25
  done
fi
if has tilecosts; then
  # perf.md entry 121: a ragged tile's cost against a whole one, from traces of one moe
  # projection under moe_skew_probe's patterns (scripts/grouped_tile_costs.py)
  timeout ${TC_TIMEOUT:-240} python3 scripts/grouped_tile_costs.py ${TC_ARGS:-} \
    --json "$OUT/tile-costs.json" > "$OUT/tile-costs.log" 2>&1
  echo "tile costs rc=$?"; tail -30 "$OUT/tile-costs.log"
fi
if has groupedtune; then
  # issue #26: every grouped tile on the moe problems (bf16 against torch._grouped_mm), the
  # choice fitted on two models and judged on the other two (docs/perf.md entry 41)
  timeout ${GTUNE_TIMEOUT:-560} python3 scripts/tune_grouped.py --out "$OUT/tune_grouped" \
    --dtype ${GTUNE_DTYPE:-bf16} --tokens ${GTUNE_TOKENS:-8,64,512,4096} --jobs 15 \
    --rounds ${ROUNDS:-3} --budget-s ${BUDGET:-480} > "$OUT/tune_grouped.log" 2>&1
  echo "groupedtune rc=$?"; grep -E "t/e=|WRONG|FAILED|done in" "$OUT/tune_grouped.log" | tail -20
fi
if has checks; then
  # docs/perf.md entry 21: what was built without a GPU, checked in one go
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_autotune.py tests/gpu/test_gpu_trace.py tests/gpu/test_gpu_swap_ab.py 2>&1 \
    | tee "$OUT/checks.log" | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  for b in sm90 sm90-pingpong; do
    timeout 120 python3 -m wsgemm trace --shape 4096,4096,4096 --backend $b --out /tmp/tr_$b \
      2>&1 | grep -E "overhead|problem" | head -3
  done
  timeout 200 python3 scripts/tune_menu.py --out "$OUT/tune_decode" --suites llm --tokens 1,16 \
    --with-dropped --jobs 15 2>&1 | grep -E "best|geomean" | tail -20
  echo "checks done at $((SECONDS - start)) s"
fi
# the gated kernels (row tiles, swap-AB decode tile, preact, dgated)
if has gatedsanitize; then sanitize_mode --gated gated; fi
# a plain MLP's training kernels (dact, the plain preact)
if has dactsanitize; then sanitize_mode --plain-mlp plain_mlp; fi
# the cluster split (docs/perf.md entries 94-95): its st.async stores into rank 0's shared
# memory and its two mbarriers, before CLUSTER_SPLIT_FAMILIES is switched on
if has clustersanitize; then sanitize_mode --cluster-split cluster_split; fi
if has streamk; then
  # docs/perf.md entry 26: stream-K, built without a GPU, checked in one go
  python3 -m wsgemm warm --arch sm_90a --jobs 15 > "$OUT/warm.log" 2>&1; tail -1 "$OUT/warm.log"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_stream_k.py 2>&1 | tee "$OUT/stream_k.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  python3 scripts/sanitize_auto.py --stream-k 2>&1 | tail -2  # compiles outside the sanitizer
  for tool in memcheck racecheck; do sanitize_run $tool --stream-k stream_k; done  # initcheck: its step
  timeout 300 python3 scripts/tune_menu.py --out "$OUT/tune_midsize" --suites midsize \
    --with-dropped --jobs 15 2>&1 | grep -E "best|geomean" | tail -30
  echo "stream-K done at $((SECONDS - start)) s"
fi
if has wavefit; then
  # docs/perf.md entry 28: the dropped entries built without a GPU (128x{160,192,224} and
  # 256x{128,160} cooperative, 64x{96,160} ping-pong), their GPU fuzz; within one call's 600 s
  timeout 120 python3 -m wsgemm warm --arch sm_90a --jobs 15 > "$OUT/warm.log" 2>&1
  tail -1 "$OUT/warm.log"
  # warm compiles the menu; the GPU fuzz also runs the dropped tiles (all 36 variants each)
  timeout 100 python3 -c "import sys; sys.path.insert(0, 'scripts'); import tune_menu
from wsgemm import host; from wsgemm.host import choosing; host.warm(
    choosing.menu_variants(entries=tuple(e for e in tune_menu.DROPPED if not e.swap_ab
    and not e.config.get('stream_k'))), jobs=15)" > "$OUT/warm_dropped.log" 2>&1 \
    || { echo "warm of the dropped tiles failed:"; tail -3 "$OUT/warm_dropped.log"; }
  timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider --no-header -rf \
    tests/gpu/test_gpu_correctness.py -k menu_entry 2>&1 | tee "$OUT/wavefit.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -20
  echo "wavefit done at $((SECONDS - start)) s"
fi
if has wavetune; then
  # the same entries timed (after wavefit, on the same warm host: its compile cache): the
  # midsize rows, and the llm rows at 128 tokens (the qkv misfits) and at 1024
  timeout 400 python3 scripts/tune_menu.py --out "$OUT/tune_wavefit" --suites midsize,llm \
    --tokens 128,1024 --with-dropped --jobs 15 --budget-s 360 2>&1 | grep -E "best|geomean" | tail -40
  echo "wavetune done at $((SECONDS - start)) s"
fi
if has layouttune; then
  # docs/perf.md entry 30: the midsize shapes timed in their own layouts (NT: M-major A, N-major
  # B), to tell a slow kernel variant from a choice tuned on TN operands
  timeout 400 python3 scripts/tune_menu.py --out "$OUT/tune_layouts" --suites midsize \
    --layouts own --jobs 15 --budget-s 300 2>&1 | grep -E "best|geomean" | tail -30
  python3 -m wsgemm explain --shape 608,3263,4259 --layout TT 2>&1 | sed -n '1p;$p'  # its GPU branch
  echo "layouttune done at $((SECONDS - start)) s"
fi
if has initcheck; then
  # initcheck alone, outputs left unread (scripts/sanitize_auto.py --initcheck): auto's
  # choices, forced split-K and swap-AB, then stream-K
  python3 scripts/sanitize_auto.py > /dev/null 2>&1; python3 scripts/sanitize_auto.py --stream-k > /dev/null 2>&1
  sanitize_run initcheck "" auto
  sanitize_run initcheck --stream-k stream_k
fi
if has bench; then
  python3 -m wsgemm bench --quick 2>&1 | tee "$OUT/bench_quick.log" | tail -30
fi
echo "session done in $((SECONDS - start)) s"
