"""Why the grouped kernel lost on skewed routing at large batch (docs/perf.md entries 119,
121): the same total rows of one moe problem under several group-size patterns, each timed
through ``wsgemm.grouped_mm`` (auto), ``torch._grouped_mm`` and a per-group ``torch.mm`` loop,
and the busiest group alone as a dense product (``wsgemm.matmul`` against ``torch.mm``).

Patterns: ``balanced``; ``skewed`` (the moe suite's Zipf draw); ``sorted`` (the same sizes,
largest group first); ``aligned`` (the skewed sizes rounded up to whole 256-row cluster rows:
every group starts on a multiple of 256 rows and fills its tiles; the total grows by ~3%, and
time is compared per row); ``shifted`` (balanced, but the first group 64 rows longer and the
last 64 shorter: every group between starts 64 rows off the 128-row grid of A and C, and,
its tiles counted from its own first row, fills them); ``ragged`` (every group but the last
64 rows short of whole cluster rows, the last taking the rest: every group's last tile holds
64 rows, and half the groups start off the grid). ``aligned`` against ``skewed`` says whether
the loss follows where groups start and end rather than their sizes or order (``sorted``);
``shifted`` against ``balanced`` what a start off the grid costs alone, ``ragged`` what the
ragged last tiles add.

    python scripts/moe_skew_probe.py [--model qwen3-235b-a22b] [--tokens 4096] [--proj gate_up]
        [--dtype bf16] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch

import wsgemm
from wsgemm.bench import measure, moe
from wsgemm.bench.nvml import Nvml


def patterns(skewed: tuple[int, ...], tokens: int) -> dict[str, tuple[int, ...]]:
    """The module docstring's group-size patterns of ``len(skewed)`` groups of ``tokens`` rows
    on average, ``skewed`` the skewed draw (``grouped_tile_costs.py`` traces the same)."""
    groups = len(skewed)
    return {
        "balanced": (tokens,) * groups,
        "skewed": skewed,
        "sorted": tuple(sorted(skewed, reverse=True)),
        "aligned": tuple(-(-s // 256) * 256 for s in skewed),
        "shifted": (tokens + 64, *[tokens] * (groups - 2), tokens - 64),
        "ragged": (*[tokens - 64] * (groups - 1), tokens + 64 * (groups - 1)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-235b-a22b", choices=tuple(moe.MODELS))
    p.add_argument("--tokens", type=int, default=4096, help="average rows a group (>= 65)")
    p.add_argument("--proj", default="gate_up")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="cold-L2 calls a round's sample")
    p.add_argument("--json")
    args = p.parse_args()
    if args.tokens < 65:
        p.error(f"--tokens {args.tokens}: the shifted and ragged patterns need at least 65")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    model = moe.MODELS[args.model]
    n, k = next((n, k) for proj, n, k in model.projections() if proj == args.proj)
    weights = torch.randn(model.experts, n, k, dtype=dtype, device="cuda").transpose(1, 2)
    sizes_of = patterns(moe.group_sizes(model, args.tokens, "skewed"), args.tokens)
    most = max(sum(s) for s in sizes_of.values())
    a_all = torch.randn(most, k, dtype=dtype, device="cuda")
    out_all = torch.empty(most, n, dtype=dtype, device="cuda")  # the loop's, shared
    calls = {}
    for name, sizes in sizes_of.items():
        rows = sum(sizes)
        a, out = a_all[:rows], out_all[:rows]
        offs = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device="cuda")
        ends = itertools.accumulate(sizes)
        spans = [(a[e - z : e], weights[g], out[e - z : e])
                 for g, (z, e) in enumerate(zip(sizes, ends, strict=True)) if z]  # fmt: skip

        def run_loop(spans=spans):
            for x, w, y in spans:
                torch.mm(x, w, out=y)

        calls[(name, "wsgemm:auto", rows)] = lambda a=a, offs=offs: wsgemm.grouped_mm(
            a, weights, offs
        )
        calls[(name, "torch", rows)] = lambda a=a, offs=offs: torch._grouped_mm(a, weights, offs)
        calls[(name, "loop", rows)] = run_loop
    big = max(sizes_of["skewed"])
    g = sizes_of["skewed"].index(big)
    x = a_all[:big]
    calls[("busiest group dense", "wsgemm:auto", big)] = lambda: wsgemm.matmul(x, weights[g])
    calls[("busiest group dense", "torch", big)] = lambda: torch.mm(x, weights[g])
    props = torch.cuda.get_device_properties(0)
    timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0), props.L2_cache_size)
    # (each call estimated, so compiled and warmed, first; rounds interleaved and rotated)
    samples = measure.interleaved(timer, calls, args.rounds, args.reps)
    clocks = [x.sm_clock_mhz for v in samples.values() for x in v if x.sm_clock_mhz]
    print(f"{args.model} {args.proj} N={n} K={k} t/e={args.tokens} {args.dtype}, "
          f"{args.rounds} rounds, L2 flushed; {props.name}, SM clock "
          f"{min(clocks, default=0):.0f}-{max(clocks, default=0):.0f} MHz")  # fmt: skip
    record = []
    for (name, backend, rows), taken in samples.items():
        ts = [x.ms for x in taken]
        ms = statistics.median(ts)
        tflops = measure.tflops(2 * rows * n * k, ms)
        record.append(dict(pattern=name, backend=backend, rows=rows, ms=ms, tflops=tflops,
                           rounds=ts, sm_clock_mhz=[x.sm_clock_mhz for x in taken]))  # fmt: skip
        print(f"  {name:22s} {backend:12s} rows {rows:7d}  {ms:8.3f} ms  {tflops:6.1f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            sizes = {name: list(v) for name, v in sizes_of.items()}
            json.dump(dict(model=args.model, proj=args.proj, n=n, k=k, tokens=args.tokens,
                           dtype=args.dtype, gpu=torch.cuda.get_device_name(), sizes=sizes,
                           rows=record), f)  # fmt: skip


if __name__ == "__main__":
    main()
