"""The cluster split against the workspace split-K on the decode and small-M products where the
policy splits (issue #23 item 1: the fix-up's cost per shared tile, before and after).

For each LLM layer shape at 1-64 tokens, one tile (the menu's for that token count) runs K
unsplit, split 2 and 4 ways through the workspace (``Sm90Config.split_k``, today's fix-up:
global partials, a ticket and a flag per tile) and 2 and 4 ways over a cluster
(``Sm90Config.cluster_split``: the partials met in rank 0's shared memory), beside cuBLAS
(``torch.mm``) and ``auto`` (the policy's pick today). Every call is checked once against the
fp32 product of its inputs (twice cuBLAS's error), then all of a shape's calls are timed in
interleaved rounds (``wsgemm.bench.measure.interleaved``: cold L2, the order rotated each round);
ratios are formed within a round and their median reported. The calls go through
``wsgemm.api.matmul(config=)`` (the GPU is held while the host queues them, so host time is
not in the numbers).

    python scripts/bench_cluster_split.py --json OUT.json [--rounds 7] [--reps 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

#: (label, N, K) of the 8B and 70B (tp=8) layers whose decode products the policy splits
LAYERS = (
    ("8b qkv", 6144, 4096),
    ("8b o", 4096, 4096),
    ("8b down", 4096, 14336),
    ("70b tp8 down", 8192, 3584),
    ("70b tp8 qkv", 1280, 8192),
    ("70b o", 8192, 8192),
)
TOKENS = (1, 8, 16, 32, 64)
WAYS = (2, 4)


def tile_for(tokens: int):
    """(name, backend, config) of the tile the menu runs at ``tokens`` (its decode swap-AB
    tiles up to 32 rows, the 64-row ping-pong tile above)."""
    from wsgemm.kernels.sm90.config import Sm90Config

    if tokens <= 8:
        return "swap-pingpong-64x8x128", "sm90-pingpong", Sm90Config(
            tile_m=64, tile_n=8, tile_k=128, schedule="pingpong", swap_ab=True)  # fmt: skip
    if tokens <= 16:
        return "swap-pingpong-64x16x128", "sm90-pingpong", Sm90Config(
            tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True)  # fmt: skip
    if tokens <= 32:
        return "swap-pingpong-64x32", "sm90-pingpong", Sm90Config(
            tile_m=64, tile_n=32, schedule="pingpong", swap_ab=True)  # fmt: skip
    return "pingpong-64x128", "sm90-pingpong", Sm90Config(
        tile_m=64, tile_n=128, schedule="pingpong")  # fmt: skip


def named_tile(name: str):
    """(name, backend, config) of a row tile named on the command line (``--tile``): a large
    cooperative tile (its cluster splits are refused where rank 0's receive buffers leave the
    ring too little shared memory)."""
    from wsgemm.kernels.sm90.config import Sm90Config

    width = int(name.rsplit("x", 1)[1])
    return name, "sm90", Sm90Config(tile_m=128, tile_n=width)


def contenders(config) -> dict:
    """name -> config: unsplit, the workspace split and the cluster split of ``config``."""
    out = {"unsplit": config}
    for ways in WAYS:
        out[f"split{ways}"] = dataclasses.replace(config, split_k=ways)
        out[f"cluster{ways}"] = dataclasses.replace(config, cluster_split=ways)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument(
        "--shapes",
        metavar="MxNxK,...",
        help="these problems (x @ W.T, M tokens) instead of LAYERS x --tokens, each on the tile "
        "the menu runs at its M",
    )
    parser.add_argument(
        "--tile",
        choices=("menu", "cooperative-128x256", "cooperative-128x128"),
        default="menu",
        help="the tile every problem runs on: the menu's for its M, or one named",
    )
    args = parser.parse_args(argv)
    if args.shapes:
        problems = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s]
        problems = [(m, f"{m}x{n}x{k}", n, k) for m, n, k in problems]
    else:
        problems = [(t, label, n, k) for t in map(int, args.tokens.split(","))
                    for label, n, k in LAYERS]  # fmt: skip

    import torch

    from wsgemm import api
    from wsgemm.bench import check, env
    from wsgemm.bench.measure import CudaTimer, interleaved
    from wsgemm.bench.nvml import Nvml

    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    timer = CudaTimer(device, Nvml.open(device.index), getattr(props, "L2_cache_size", None))
    gen = torch.Generator(device=device).manual_seed(0)
    record = {"device": props.name, "source_digest": env.source_digest(),
              "rounds": args.rounds, "reps": args.reps, "tile": args.tile,
              "rows": []}  # fmt: skip
    start = time.perf_counter()
    for tokens, label, n, k in problems:
        tile, backend, base = tile_for(tokens) if args.tile == "menu" else named_tile(args.tile)
        x = torch.randn(tokens, k, device=device, generator=gen).half()
        w = torch.randn(n, k, device=device, generator=gen).half()
        ref = check.reference(x, w.t())
        theirs = check.errors(torch.mm(x, w.t()), ref)
        tol = check.tolerance(check.model_tolerance("fp16", "fp32", k), theirs)
        out = torch.empty(tokens, n, device=device, dtype=torch.float16)
        calls = {"cublas": lambda x=x, w=w: torch.mm(x, w.t())}
        named = {"auto": None, **contenders(base)}
        for name, config in named.items():

            def run(config=config, x=x, w=w, out=out, backend=backend):
                if config is None:  # what users call: the policy's pick
                    return api.matmul(x, w.t(), out=out)
                return api.matmul(x, w.t(), out=out, backend=backend, config=config)

            check.poison(out)
            try:
                run()
            except ValueError as e:  # e.g. fewer k-tiles than ways
                print(f"  {name}: refused ({e})")
                continue
            torch.cuda.synchronize(device)
            wrong = tol.verdict(check.errors(out, ref))
            if wrong:
                print(f"WRONG {tile} {name} t={tokens} {label}: {wrong}")
                return 1
            calls[name] = run
        samples = interleaved(timer, calls, args.rounds, args.reps)
        row = {"label": f"{label} t={tokens}", "m": tokens, "n": n, "k": k, "tile": tile,
               "us": {c: round(statistics.median(s.ms for s in v) * 1e3, 2)
                      for c, v in samples.items()},
               "over_cublas": {}, "cluster_over_split": {}}  # fmt: skip
        for c, v in samples.items():
            ratios = [b.ms / s.ms for s, b in zip(v, samples["cublas"], strict=True)]
            row["over_cublas"][c] = round(statistics.median(ratios), 3)
        for ways in WAYS:
            if f"cluster{ways}" in samples and f"split{ways}" in samples:
                ratios = [
                    s.ms / c.ms
                    for s, c in zip(samples[f"split{ways}"], samples[f"cluster{ways}"], strict=True)
                ]
                row["cluster_over_split"][ways] = round(statistics.median(ratios), 3)
        best = max((c for c in row["over_cublas"] if c not in ("cublas", "auto")),
                   key=row["over_cublas"].get)  # fmt: skip
        print(f"{row['label']:22s} {tile:24s} "
              + " ".join(f"{c}={r:.3f}" for c, r in row["over_cublas"].items())
              + f" | best {best}; cluster/split {row['cluster_over_split']}")  # fmt: skip
        record["rows"].append(row)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    rows = record["rows"]
    for c in ("auto", "unsplit", "split2", "split4", "cluster2", "cluster4"):
        have = [r["over_cublas"][c] for r in rows if c in r["over_cublas"]]
        if have:
            geo = statistics.geometric_mean(have)
            print(f"== {c}: {geo:.3f}x cuBLAS geomean over {len(have)} rows")
    best = [max(v for c, v in r["over_cublas"].items() if c not in ("cublas", "auto"))
            for r in rows]  # fmt: skip
    before = [max(v for c, v in r["over_cublas"].items() if c in ("unsplit", "split2", "split4"))
              for r in rows]  # fmt: skip
    auto = [r["over_cublas"]["auto"] for r in rows if "auto" in r["over_cublas"]]
    if auto:
        print(f"== auto (the policy's pick) {statistics.geometric_mean(auto):.3f}x cuBLAS")
    print(
        f"== best of unsplit/workspace split {statistics.geometric_mean(before):.3f}x, "
        f"with the cluster split {statistics.geometric_mean(best):.3f}x cuBLAS "
        f"({len(rows)} rows, {time.perf_counter() - start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
