"""Fit the gated swap-AB decode tile's price scale (``wsgemm/host/choosing/cost.py``:
``GATED_SWAP_SCALE``) to timed calls, and say how well the road choice does with it.

    python scripts/fit_gated_swap.py [FIT.json ...] [--judge other.json ...]

With no files, the shipped fit's (``SHIPPED_SWAP_FIT``), from the repository root;
``tests/host/test_cost.py`` checks that it gives the shipped constants.

Reads ``scripts/bench_gated_tiles.py`` JSON records (``gpu_session.sh gatedswap``) that timed the
swap tile (``swap``) and the unfused road (``road``: ``auto``'s product in fp32, then the gating) at
up to ``cost.GATED_SWAP_MAX_ROWS`` rows, or ``scripts/bench_epilogue.py`` records whose ``kernel``
ran that tile (``kernel_tile`` "swap"). The model prices the tile as a plain swap-AB entry
(``cost.GATED_SWAP_PROXY``); per tile width the scale is the geomean over the rows of the measured
swap-over-road ratio divided by the predicted one (unscaled), so the model's own error on the road's
product stays in it, as it does when the choice is made. Prints the scales, then for each file the
rows where the chosen road was more than 5% slower than the other.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from wsgemm.host import choosing, registry
from wsgemm.host.choosing import cost

SM_COUNT, CC = 132, (9, 0)
#: what the shipped scale was fitted on (docs/perf.md entry 85; an H100)
SHIPPED_SWAP_FIT = ["docs/data/gpu-2026-12-06j/gated-swap.json"]


def read_rows(paths) -> list[dict]:
    """The records of ``paths`` that timed both the swap tile and the road."""
    rows = []
    for path in paths:
        for r in json.loads(Path(path).read_text())["records"]:
            med = r["median_ms"]
            swap = med.get("swap", med.get("kernel") if r.get("kernel_tile") == "swap" else None)
            if swap is not None and "road" in med and r["m"] <= cost.GATED_SWAP_MAX_ROWS:
                rows.append(dict(label=r["label"], m=r["m"], n=r["n"], k=r["k"],
                                 swap_us=swap * 1e3, road_us=med["road"] * 1e3))  # fmt: skip
    return rows


#: The records predate the cluster split (2026-12-06): their products' choices are replayed as
#: they ran then (docs/perf.md entry 97).
AS_RECORDED = dict(CLUSTER_SPLIT_FAMILIES=frozenset())


def _roads(r: dict, scale: float | None):
    model = choosing.cost_model_for(SM_COUNT, CC)
    with registry.switches(**AS_RECORDED):
        choice = choosing.choose(r["m"], r["n"], r["k"], 1, "float16", "float32", "float32",
                                 SM_COUNT, CC, batch_invariant=False)  # fmt: skip
    return cost.gated_roads(model, choice.menu_entry, choice.split, r["m"], r["n"], r["k"],
                            SM_COUNT, "silu", swap_tile_n=cost.gated_swap_tile_n(r["m"]),
                            swap_scale=scale)  # fmt: skip


def fit(rows: list[dict]) -> dict[int, float]:
    """Per tile width, the geomean of measured over (unscaled) predicted swap-over-road."""
    logs: dict[int, list[float]] = {}
    for r in rows:
        roads = _roads(r, 1.0)
        predicted, measured = roads.fused_us / roads.unfused_us, r["swap_us"] / r["road_us"]
        logs.setdefault(cost.gated_swap_tile_n(r["m"]), []).append(math.log(measured / predicted))
    return {n: round(math.exp(sum(v) / len(v)), 3) for n, v in sorted(logs.items())}


def judge(rows: list[dict], scales: dict[int, float] | None = None) -> dict:
    """The road choice on ``rows`` with ``scales`` (default: the shipped ones)."""
    scales = cost.GATED_SWAP_SCALE if scales is None else scales
    if not rows:
        return dict(rows=0, over_best_geomean=math.nan, over_best_max=math.nan, missed=[])
    best, missed = [], []
    for r in rows:
        roads = _roads(r, scales[cost.gated_swap_tile_n(r["m"])])
        took = r["road_us"] if roads.unfused_wins else r["swap_us"]
        best.append(took / min(r["swap_us"], r["road_us"]))
        if best[-1] > 1.05:
            missed.append(f"{r['label']}: {best[-1]:.3f}x the faster road")
    geomean = math.exp(sum(map(math.log, best)) / len(best))
    return dict(rows=len(rows), over_best_geomean=geomean, over_best_max=max(best), missed=missed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help=f"records to fit on (default {SHIPPED_SWAP_FIT})")
    ap.add_argument("--judge", nargs="*", default=[], help="records to judge the fit on")
    args = ap.parse_args(argv)
    files = args.files or SHIPPED_SWAP_FIT
    rows = read_rows(files)
    if not rows:
        raise SystemExit(f"{files}: no record timed both the swap tile and the road")
    scales = fit(rows)
    print("GATED_SWAP_SCALE = {" + ", ".join(f"{n}: {s:.3f}" for n, s in scales.items()) + "}")
    for name, paths in [("fit", files)] + [(p, [p]) for p in args.judge]:
        q = judge(read_rows(paths), scales)
        print(f"{name}: {q['rows']} rows, chosen over the faster road geomean "
              f"{q['over_best_geomean']:.3f}, max {q['over_best_max']:.3f}")  # fmt: skip
        for line in q["missed"]:
            print("  missed", line)


if __name__ == "__main__":
    main()
