"""The dgated GEMM on each row tile beside its plain GEMM, shape by shape (docs/perf.md entry 107).

``bench_mlp_train.py --dgated-tiles`` times the forced tiles inside a training step's rotation,
where each call follows a different neighbour (a whole step, a forward GEMM twice the size):
on an H100 its dh GEMM medians ran up to 17% slower than the same call timed among calls of its
own size, and the same kernel timed 0-15% apart in two places of the rotation. Here each shape
times only the dh GEMM's three forms, of one size, rotated over the rounds: ``plain``
(``wsgemm.matmul(dy, w_down)``), ``auto`` (``gated_grad`` on ``api.gated.dgated_tile``'s pick)
and the dgated GEMM forced onto each entry of ``--tiles`` (``dgated_tile`` replaced). Cold
L2, CUDA events (``wsgemm.bench.measure.CudaTimer``), bf16, random operands; each forced
tile's result is checked against ``auto``'s first.

    python scripts/bench_dgated_tiles.py --models 8b,qwen3-4b --tokens 1024,4096 \\
        [--tiles sm90-pingpong,sm90] [--rounds 5] [--reps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from bench_mlp_train import forced_dgated, mlp_dims

import wsgemm
from wsgemm.api import gated as gated_core
from wsgemm.bench import env, measure
from wsgemm.bench.nvml import Nvml
from wsgemm.host.choosing import choose, dgated_entry, dgated_kernel_entry


def forms(tokens: int, hidden: int, ffn: int, tiles, gen) -> dict:
    """The calls timed on one shape: plain, auto and each forced tile."""
    dt = torch.bfloat16
    dy = torch.randn(tokens, hidden, device="cuda", dtype=dt, generator=gen)
    w_down = torch.randn(hidden, ffn, device="cuda", dtype=dt, generator=gen) / ffn**0.5
    preact = torch.randn(tokens, 2 * ffn, device="cuda", dtype=dt, generator=gen)

    def auto():
        with torch.no_grad():
            return gated_core.gated_grad(dy, w_down, preact, "silu")

    calls = {"plain": lambda: wsgemm.matmul(dy, w_down), "auto": auto}
    want = calls["auto"]()
    for name in tiles:
        calls[name] = forced_dgated(name, dy, w_down, preact, "silu")
        got = calls[name]()
        if not torch.equal(got, want):
            err = (got.float() - want.float()).abs().max().item()
            if err > 0.05 * want.float().abs().max().item():
                raise SystemExit(f"{name} differs from auto's tile by {err} at {tokens} tokens")
    return calls


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--tokens", default="1024,4096")
    p.add_argument("--tiles", default="sm90-pingpong,sm90")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tiles = tuple(t for t in args.tiles.split(",") if t)
    timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    records = []
    dims = {name: mlp_dims(name) for name in args.models.split(",")}  # bad names before any run
    for name, (hidden, ffn) in dims.items():
        for tokens in (int(t) for t in args.tokens.split(",")):
            calls = forms(tokens, hidden, ffn, tiles, gen)
            samples = measure.interleaved(timer, calls, args.rounds, args.reps)
            times = {n: [s.ms for s in v] for n, v in samples.items()}
            clocks = [s.sm_clock_mhz for v in samples.values() for s in v if s.sm_clock_mhz]
            med = {n: statistics.median(v) for n, v in times.items()}
            cc = torch.cuda.get_device_capability()
            pick = dgated_entry(tokens, ffn, hidden, "bfloat16", sms, cc)
            rule = dgated_kernel_entry(tokens, ffn, sms)  # the wave-fill rule alone (entry 107)
            plain = choose(tokens, ffn, hidden, 1, "bfloat16", "bfloat16", "float32", sms, cc,
                           batch_invariant=False)  # fmt: skip
            plain_pick = f"{plain.menu_entry.name}/{plain.split}"
            over = {n: med[n] / med["plain"] for n in calls if n != "plain"}
            print(f"{name:16s} t={tokens:<6d} I={ffn:<6d} plain {med['plain'] * 1e3:8.1f} us  "
                  + "  ".join(f"{n} {v:.3f}" for n, v in over.items())
                  + f"  (auto: {pick}; plain: {plain_pick})",
                  flush=True)  # fmt: skip
            records.append(dict(model=name, tokens=tokens, hidden=hidden, ffn=ffn,
                                times_ms=times, median_ms=med, over_plain=over,
                                auto_pingpong=pick == "sm90-pingpong", auto_entry=pick,
                                rule_entry=rule,
                                plain_entry=plain_pick,
                                sm_clock_mhz=clocks))  # fmt: skip
            del calls
    if args.json:
        env.write_script_record(args.json, args, records, sms=sms)


if __name__ == "__main__":
    sys.exit(main())
