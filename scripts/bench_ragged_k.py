"""grouped_mm's 2D x 2D form (a mixture-of-experts layer's weight gradient) on the ragged-K
kernel against torch, interleaved (issue #26; until the moe suite has a weight-gradient pass).

For each (model, projection, tokens per expert, routing) of ``wsgemm.bench.moe`` the weight
gradient ``dW[g] = dY[rows of g]^T @ X[rows of g]`` (``a`` = dY^T, M-major; ``b`` = X; offs on
the tokens): ``torch._grouped_mm`` (bf16 only), a per-expert ``torch.mm`` loop over the
host-known sizes (``loop``) and ``wsgemm.grouped_mm`` on each named backend, round-robin with
the order rotated each round, cold L2 (``wsgemm.bench.measure.CudaTimer``); every contender is
checked against float32 per group first. Prints per problem the median time of each and the
ratios to the baseline (torch in bf16, loop in fp16), and the geomeans.

    python scripts/bench_ragged_k.py [--models qwen3-30b-a3b,mixtral-8x7b] [--tokens 64,512]
        [--dtype bf16|fp16] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

import wsgemm
from wsgemm.bench import measure, moe
from wsgemm.bench.nvml import Nvml


def contenders(a, b, offs, sizes, out, dtype):
    calls = {}
    if dtype == torch.bfloat16:
        calls["torch"] = lambda: torch._grouped_mm(a, b, offs)
    spans, lo = [], 0
    for g, size in enumerate(sizes):
        spans.append((a[:, lo : lo + size], b[lo : lo + size], out[g]))
        lo += size

    def loop():
        for x, y, dest in spans:
            torch.mm(x, y, out=dest)  # an empty slice writes zeros, as the kernel does
        return out

    calls["loop"] = loop
    for backend in ("sm90", "sm90-pingpong"):
        calls[f"wsgemm:{backend}"] = lambda backend=backend: wsgemm.grouped_mm(
            a, b, offs, out=out, backend=backend
        )
    return calls


def check(calls, a, b, sizes) -> None:
    ref, lo = [], 0
    for size in sizes:
        ref.append(a[:, lo : lo + size].float() @ b[lo : lo + size].float())
        lo += size
    ref = torch.stack(ref)
    scale = ref.abs().max().item() + 1.0
    for name, call in calls.items():
        got = call().float()
        err = (got - ref).abs().max().item()
        if not err <= 2e-2 * scale:
            raise AssertionError(f"{name}: off by {err:.3g} (scale {scale:.3g})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3-30b-a3b,qwen3-235b-a22b,mixtral-8x7b")
    p.add_argument("--tokens", default="64,512")
    p.add_argument("--routings", default="balanced,skewed")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    baseline = "torch" if dtype == torch.bfloat16 else "loop"
    shapes = moe.problems(models=tuple(args.models.split(",")),
                          tokens=tuple(int(t) for t in args.tokens.split(",")),
                          routings=tuple(args.routings.split(",")))  # fmt: skip
    timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    records, ratios = [], {}
    for s in shapes:
        tokens = s.m
        # the forward's (N, K): dW is (N, K) per group; dY (tokens, N), X (tokens, K)
        dy = torch.randn(tokens, s.n, device="cuda", dtype=dtype, generator=gen)
        x = torch.randn(tokens, s.k, device="cuda", dtype=dtype, generator=gen)
        a, b = dy.t(), x
        offs = torch.tensor(s.offs, dtype=torch.int32, device="cuda")
        out = torch.empty(len(s.sizes), s.n, s.k, device="cuda", dtype=dtype)
        calls = contenders(a, b, offs, s.sizes, out, dtype)
        check(calls, a, b, s.sizes)
        names = list(calls)
        estimates = {n: timer.estimate(calls[n]) for n in names}
        times = {n: [] for n in names}
        clocks = []
        for r in range(args.rounds):
            for n in measure.rotated(names, r):
                sample = timer.measure(calls[n], args.reps, estimates[n])
                times[n].append(sample.ms)
                clocks.append(sample.sm_clock_mhz)
        med = {n: statistics.median(v) for n, v in times.items()}
        line = [f"{s.label:40s}"]
        for n in names:
            ratio = statistics.median(t / q for t, q in zip(times[baseline], times[n],
                                                            strict=True))  # fmt: skip
            ratios.setdefault(n, []).append(ratio)
            line.append(f"{n} {med[n] * 1e3:9.1f} us ({ratio:5.2f}x)")
        print("  ".join(line), flush=True)
        records.append(dict(label=s.label, sizes=list(s.sizes), n=s.n, k=s.k, times_ms=times,
                            sm_clock_mhz=clocks))  # fmt: skip
    summary = {n: math.exp(statistics.fmean(math.log(r) for r in v)) for n, v in ratios.items()}
    print(f"== geomean speed over {baseline} ({args.dtype}): " + ", ".join(
        f"{n} {v:.3f}x" for n, v in summary.items()))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(dtype=args.dtype, baseline=baseline, summary=summary,
                           torch=torch.__version__, records=records), f)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
