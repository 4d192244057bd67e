"""What a grouped GEMM's ragged tile costs against a whole one, from a trace (docs/perf.md
entries 119, 121): the skewed moe rows lose ~23% where the groups' ends fall inside tiles, and
the host replay says a cost per ragged tile explains it only at ~2.3x a whole tile.

One moe projection's weights (``--model``/``--proj``), ``--groups`` groups of ``--tokens``
rows on average, under the patterns of ``moe_skew_probe.py`` (``patterns``: balanced, skewed,
sorted, aligned, shifted, ragged). Each pattern's call is recorded on the grouped kernel's
traced variant (``wsgemm.tracing.trace_grouped``) and its work units split into *whole*
tiles (all their rows in their group), *ragged* ones (a group's last tile, its rows running
past the group's end: the predicated copies of ``ragged.store_rows``) and *empty* ones (a
cluster's CTA past its group's rows: loads and computes, stores nothing). Per kind, the
medians over the consumer recorders' units of: the unit's time (its fetch to the recorder's
next fetch: ``summarize`` says what that holds on each schedule), its epilogue span and its
waits for a full stage. Also each call untraced (``untraced_us``, one timing: a few percent
of noise).

    python scripts/grouped_tile_costs.py [--model qwen3-235b-a22b] [--proj gate_up]
        [--groups 16] [--tokens 4096] [--dtype bf16] [--json FILE]

Needs a CUDA GPU; ``summarize(decoded)`` alone runs anywhere (a recording's ``raw.npz``).
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np

#: unit kinds, in the printed order
KINDS = ("whole", "ragged", "empty")


def unit_kinds(units: np.ndarray, ends: list[int], tile_m: int) -> np.ndarray:
    """Each unit's kind (an index into ``KINDS``): from its group's rows ``[start, end)``
    (``ends``: the groups' end rows) and its tile's first row ``start + tile_m * m``."""
    starts = [0, *ends[:-1]]
    g = units["tile_l"].astype(np.int64)
    lo = np.asarray(starts, dtype=np.int64)[g] + units["tile_m"].astype(np.int64) * tile_m
    hi = np.asarray(ends, dtype=np.int64)[g]
    left = hi - lo
    return np.where(left >= tile_m, 0, np.where(left > 0, 1, 2))


def summarize(decoded) -> dict:
    """Per unit kind: the consumer recorders' units and tiles of that kind, and the medians (us)
    of a unit's time, its epilogue span and its full-stage waits (``decoded``: a grouped
    recording's ``Decoded``).

    A unit's time is its fetch to the same recorder's next fetch: its mainloop and epilogue on
    a cooperative tile. Each recorder's last unit has no next fetch and is left out of the time
    (its end would add the call's final store drain). On a ping-pong tile a warpgroup fetches
    before its turn, so the time holds the other warpgroup's mainloop too (``schedule`` says
    which). A cooperative tile is fetched by both consumer warpgroups: ``units`` counts
    warpgroup-units, ``tiles`` tiles."""
    from wsgemm.tracing.decoding import CONSUMER_ROLES

    units = decoded.units()
    consumer = np.isin(decoded.recorders["role"][units["rec"]], CONSUMER_ROLES)
    kinds = unit_kinds(units, list(decoded.meta["groups"]), int(decoded.meta["tile"][0]))
    order = np.lexsort((units["t"], units["rec"]))
    nxt = np.full(len(units), np.nan)
    for i, j in itertools.pairwise(order):
        if units["rec"][i] == units["rec"][j]:
            nxt[i] = units["t"][j]
    took = (nxt - units["t"]) / 1e3  # NaN: a recorder's last unit
    per_unit = {}
    for name in ("epilogue", "wait full"):
        spans = decoded.unit_spans(name)
        total = np.zeros(len(units))
        np.add.at(total, spans["unit"], (spans["end"] - spans["begin"]) / 1e3)
        per_unit[name] = total
    per_tile = int(decoded.meta.get("consumers_per_tile") or 1)
    out = {}
    for index, kind in enumerate(KINDS):
        pick = consumer & (kinds == index)
        if not pick.any():
            continue
        timed = took[pick][~np.isnan(took[pick])]
        out[kind] = dict(
            units=int(pick.sum()),
            tiles=int(pick.sum()) // per_tile,
            unit_us=float(np.median(timed)) if len(timed) else None,
            epilogue_us=float(np.median(per_unit["epilogue"][pick])),
            wait_full_us=float(np.median(per_unit["wait full"][pick])),
            unit_us_sum=float(timed.sum()),
        )
    return out


def main() -> None:
    import torch
    from moe_skew_probe import patterns as size_patterns  # (scripts/ is this script's path)

    from wsgemm import tracing
    from wsgemm.bench import measure, moe

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-235b-a22b", choices=tuple(moe.MODELS))
    p.add_argument("--proj", default="gate_up")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--tokens", type=int, default=4096, help="average rows a group (>= 65)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--json")
    args = p.parse_args()
    if args.tokens < 65 or args.groups < 2:
        p.error("--tokens >= 65 and --groups >= 2 (the shifted and ragged patterns)")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    model = moe.MODELS[args.model]
    n, k = next((n, k) for proj, n, k in model.projections() if proj == args.proj)
    g, t = args.groups, args.tokens
    patterns = size_patterns(moe.skewed(g * t, g, f"tile-costs-{args.model}-{g}-{t}"), t)
    weights = torch.randn(g, n, k, dtype=dtype, device="cuda").transpose(1, 2)
    most = max(sum(s) for s in patterns.values())
    a_all = torch.randn(most, k, dtype=dtype, device="cuda")
    record = []
    print(f"{args.model} {args.proj} N={n} K={k}, {g} groups of {t} rows on average, "
          f"{args.dtype}; {torch.cuda.get_device_name()}")  # fmt: skip
    for name, sizes in patterns.items():
        rows = sum(sizes)
        offs = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device="cuda")
        timeline = tracing.trace_grouped(a_all[:rows], weights, offs)
        d = timeline.decoded
        kinds = summarize(d)
        untraced = d.meta.get("untraced_us")
        tflops = measure.tflops(2 * rows * n * k, untraced / 1e3) if untraced else None
        schedule = d.meta.get("schedule")
        shape = f"tile {d.meta['tile']} cluster {d.meta['cluster']} {schedule}"
        print(f"{name:9s} rows {rows:6d}  untraced {untraced or float('nan'):8.1f} us "
              f"({tflops or float('nan'):5.1f} TFLOP/s)  {shape}")  # fmt: skip
        if schedule == "pingpong":
            print("    (ping-pong: a unit's time holds the other warpgroup's turn too)")
        for kind, v in kinds.items():
            took = v["unit_us"] if v["unit_us"] is not None else float("nan")
            print(f"    {kind:6s} tiles {v['tiles']:5d}  unit {took:7.2f} us  epilogue "
                  f"{v['epilogue_us']:6.2f}  wait full {v['wait_full_us']:6.2f}")  # fmt: skip
        problems = timeline.check()
        if problems:
            print("    checks:", *problems[:3])
        record.append(dict(pattern=name, sizes=list(sizes), rows=rows, untraced_us=untraced,
                           tflops=tflops, kinds=kinds, checks=problems[:5],
                           tile=d.meta["tile"], cluster=d.meta["cluster"],
                           schedule=schedule))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, proj=args.proj, n=n, k=k, groups=g, tokens=t,
                           dtype=args.dtype, gpu=torch.cuda.get_device_name(),
                           rows=record), f)  # fmt: skip


if __name__ == "__main__":
    main()
