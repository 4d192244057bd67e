"""Fit the gated road's constants (``wsgemm/host/choosing/cost.py``: ``GATED_KERNEL_COSTS``,
``GATING_PASS_US``, ``GATING_PASS_TB_S``) to measured gated calls, and say how well the road
choice does with them.

    python scripts/fit_gated_cost.py [FIT.json ... --kernel-only FILE:ROWS ...] \
        [--judge other.json ...]

With no files, the shipped fit's (``SHIPPED_FIT``, ``SHIPPED_KERNEL_ONLY``), from the repository
root; ``tests/host/test_cost.py`` checks that it gives the shipped constants.

Reads ``scripts/bench_epilogue.py`` JSON records of gated epilogues that timed both roads:
``kernel`` (the gated kernel forced) and ``road`` (``auto``'s product in fp32, then the gating
pass). A record whose ``kernel_tile`` is "swap" (``kernel`` ran the swap-AB decode tile, priced
by ``cost.GATED_SWAP_PROXY`` and ``GATED_SWAP_SCALE``: ``scripts/fit_gated_swap.py``) is judged on
that tile and left out of the row tiles' fit. The gated kernel's constants are fitted per row
tile (``cost.gated_kernel_entry``: the
ping-pong 128x128 tile for a few rows, the cooperative 128x256 for many), three each, with the
cost model's own form and machine constants (``cost.predict``); the gating pass's two constants
on the road's time less the model's prediction of its product. Least squares on log time with
a soft-L1 loss, as ``scripts/fit_cost_model.py``. Prints the constants as ``cost.py`` writes
them, then for the fit file and each ``--judge`` file: the choice's time against the forced
kernel and against the faster road (geomeans), and the rows where the slower road was chosen.

Needs numpy and scipy (a development tool: the model itself is pure Python).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

from wsgemm.host import choosing, registry
from wsgemm.host.choosing import cost
from wsgemm.host.choosing.menu import MENU, entry

SM_COUNT, CC = 132, (9, 0)
#: what the shipped constants were fitted on: ``main()``'s default (docs/perf.md entry 76;
#: at 242b11b, the gated-bench run's ``fused`` ran the gated kernel from 32 rows up: entry 73)
SHIPPED_FIT = ["docs/data/gpu-2026-12-06g/gated-fit.json"]
SHIPPED_KERNEL_ONLY = ["docs/data/gpu-2026-12-06f/gated-bench.json:32"]
#: what ``cost.GATED_SMALL_TILE``'s constants were fitted on (``fit_small_tile``; docs/perf.md
#: entry 88): session 25's forced-tile record, an H100
SHIPPED_SMALL_TILE_FIT = ["docs/data/gpu-2026-12-06i/gated-tiles.json"]
#: a bound on the fitted DRAM rates, just above the highest of the shipped model's entries
#: (cooperative-128x224-c2x1's 8.21 TB/s)
DRAM_TB_S_MAX = 8.5
MENU_NAMES = {e.name for e in MENU}


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    activation: str
    m: int
    n: int
    k: int
    kernel_us: float
    road_us: float
    tile: str | None = None  # a forced tile's menu entry (None: the rule's, gated_kernel_entry)
    swap: bool = False  # ``kernel`` ran the swap-AB decode tile (a record's kernel_tile "swap")
    small: bool = False  # ``kernel`` ran with the small row tile allowed (kernel_tile "small")

    @property
    def entry(self) -> str:
        return self.tile or cost.gated_kernel_entry(self.m, self.small)


def read_rows(paths, kernel_only: dict[str, int] | None = None) -> list[Row]:
    """The records of ``paths`` that timed both roads; with ``kernel_only`` (path -> rows),
    also those files' records from ``rows`` rows up, whose ``fused`` contender ran the gated
    kernel (a run before the ``kernel`` contender), with no road time (NaN); and each forced
    tile's time (``scripts/bench_gated_tiles.py``: a menu entry's name) as a row of that tile
    for the kernel's constants alone."""
    rows = []
    files = [(p, None) for p in paths] + list((kernel_only or {}).items())
    for path, min_rows in files:
        with open(path) as f:
            raw = json.load(f)
        for r in raw["records"]:
            med = r["median_ms"]
            act = {"swiglu": "silu", "geglu": "gelu_tanh"}.get(r["epilogue"], r["epilogue"])
            if min_rows is not None:
                if r["m"] >= min_rows:
                    rows.append(Row(r["label"], act, r["m"], r["n"], r["k"],
                                    med["fused"] * 1e3, math.nan))  # fmt: skip
                continue
            if "kernel" in med and "road" in med:
                swap, small = (r.get("kernel_tile") == t for t in ("swap", "small"))
                rows.append(Row(r["label"], act, r["m"], r["n"], r["k"], med["kernel"] * 1e3,
                                med["road"] * 1e3, swap=swap, small=small))  # fmt: skip
            for tile in sorted(set(med) & MENU_NAMES):  # scripts/bench_gated_tiles.py's
                rows.append(Row(r["label"], act, r["m"], r["n"], r["k"], med[tile] * 1e3,
                                math.nan, tile))  # fmt: skip
    return rows


def _model() -> cost.CostModel:
    model = cost.cost_model_for(SM_COUNT, CC)
    if model is None:
        raise SystemExit(f"no shipped cost model for {SM_COUNT} SMs, sm_{CC[0]}{CC[1]}")
    return model


def product_choice(r: Row) -> choosing.Choice:
    """``auto``'s pick for the unfused road's product (fp32 out), as it ran when the records
    were timed: before the cluster split (docs/perf.md entry 97)."""
    with registry.switches(CLUSTER_SPLIT_FAMILIES=frozenset()):
        return choosing.choose(r.m, r.n, r.k, 1, "float16", "float32", "float32", SM_COUNT, CC,
                               batch_invariant=False)  # fmt: skip


def product_us(model, r: Row) -> float:
    """The model's time for the unfused road's product (``product_choice``)."""
    choice = product_choice(r)
    f = cost.features(choice.menu_entry, choice.split, r.m, r.n, r.k, 1, SM_COUNT, 2, 4)
    return cost.predict(model, choice.menu_entry, f).us


def kernel_us(model, costs: dict, r: Row) -> float:
    name = r.entry
    e = entry(name)
    local = dataclasses.replace(model, entries={name: costs[name]})
    f = cost.features(e, 1, r.m, r.n, r.k, 1, SM_COUNT, 2, 1)
    return cost.predict(local, e, f, cost.EPILOGUE_MUFU.get(r.activation, 0) // 2).us


def fit(rows: list[Row]):
    import numpy as np
    from scipy.optimize import least_squares

    model = _model()
    road_rows = [r for r in rows if r.tile is None and not math.isnan(r.road_us)]
    costs = fit_kernel(rows)

    def road_residuals(x):
        us, tb_s = np.exp(x)
        pairs = zip(products, road_rows, strict=True)
        return [math.log((p + cost.gating_pass_us(r.m, r.n // 2, r.activation, us, tb_s))
                         / r.road_us) for p, r in pairs]  # fmt: skip

    products = [product_us(model, r) for r in road_rows]
    us, tb_s = np.exp(least_squares(road_residuals, np.log([5.0, 1.5]), loss="soft_l1",
                                    f_scale=0.05).x)  # fmt: skip
    return costs, float(us), float(tb_s)


def fit_kernel(rows: list[Row]) -> dict:
    """The gated kernel's three constants per row tile, fitted on each tile's own rows (the
    swap tile's left out: ``fit_gated_swap.py``)."""
    import numpy as np
    from scipy.optimize import least_squares

    model = _model()
    rows = [r for r in rows if not r.swap]  # the row tiles' constants: their own times only
    names = sorted({r.entry for r in rows})
    start = np.log([0.5, 1.0, 3.5] * len(names))

    def unpack(x):
        v = np.exp(x)
        return {name: cost.EntryCost(v[3 * i], v[3 * i + 1], 0.0, v[3 * i + 2])
                for i, name in enumerate(names)}  # fmt: skip

    def kernel_residuals(x):
        costs = unpack(x)
        return [math.log(kernel_us(model, costs, r) / r.kernel_us) for r in rows]

    # DRAM rates kept within what any entry of the model was fitted to (a tile whose rows are
    # all compute-bound would otherwise take an unbounded rate)
    low = np.log([1e-3, 1e-4, 1.0] * len(names))
    high = np.log([5.0, 50.0, DRAM_TB_S_MAX] * len(names))
    fitted = least_squares(kernel_residuals, start, loss="soft_l1", f_scale=0.05,
                           bounds=(low, high))  # fmt: skip
    return unpack(fitted.x)


def fit_small_tile(paths=None) -> dict:
    """``cost.GATED_SMALL_TILE``'s constants alone, on its forced rows of
    ``scripts/bench_gated_tiles.py`` records (default ``SHIPPED_SMALL_TILE_FIT``); the other
    tiles' and the gating pass's constants are the shipped fit's, untouched."""
    rows = read_rows(paths or SHIPPED_SMALL_TILE_FIT)
    return fit_kernel([r for r in rows if r.tile == cost.GATED_SMALL_TILE])


def judge(rows: list[Row], costs=None, us=None, tb_s=None) -> dict:
    """The road choice on ``rows`` with these constants (default: the shipped ones)."""
    model = _model()
    if costs is not None:  # a fit without rows of a tile keeps the shipped constants for it
        costs = {**(cost.GATED_KERNEL_COSTS or {}), **costs}
    chosen, kernel, best, predicted, missed = [], [], [], [], []
    rows = [r for r in rows if r.tile is None and not math.isnan(r.road_us)]
    for r in rows:
        choice = product_choice(r)
        swap_tile_n = cost.gated_swap_tile_n(r.m) if r.swap else None
        roads = cost.gated_roads(model, choice.menu_entry, choice.split, r.m, r.n, r.k, SM_COUNT,
                                 r.activation, costs, us, tb_s, swap_tile_n,
                                 small=r.small)  # fmt: skip
        took = r.road_us if roads.unfused_wins else r.kernel_us
        predicted.append(min(roads.fused_us, roads.unfused_us) / roads.fused_us)
        chosen.append(took)
        kernel.append(took / r.kernel_us)
        best.append(took / min(r.kernel_us, r.road_us))
        if best[-1] > 1.05:
            missed.append(f"{r.label} ({r.m}x{r.n}x{r.k}): {best[-1]:.2f}x the faster road")
    return dict(rows=len(rows), over_kernel_geomean=_geomean(kernel),
                predicted_over_kernel_geomean=_geomean(predicted),
                over_best_geomean=_geomean(best), over_best_max=max(best),
                misses_over_5pct=missed)  # fmt: skip


def _geomean(v) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in v))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "fit",
        nargs="*",
        default=SHIPPED_FIT,
        help="bench_epilogue.py JSON files to fit on (default: the shipped fit's)",
    )
    p.add_argument("--judge", nargs="*", default=[], help="JSON files to judge the fit on")
    p.add_argument("--kernel-only", nargs="*", default=None, metavar="FILE:ROWS",
                   help="also fit the kernel's constants on FILE's fused times from ROWS rows up "
                   "(a run before the kernel contender; entry 73's: 32)")  # fmt: skip
    args = p.parse_args(argv)
    if args.kernel_only is None:  # the shipped fit's own extra rows only with its own files
        shipped = {str(Path(p).resolve()) for p in SHIPPED_FIT}
        given = {str(Path(p).resolve()) for p in args.fit}
        args.kernel_only = SHIPPED_KERNEL_ONLY if given == shipped else []
    kernel_only = {}
    for spec in args.kernel_only:
        path, _, min_rows = spec.rpartition(":")
        kernel_only[path] = int(min_rows)
    rows = read_rows(args.fit, kernel_only)
    if not rows:
        raise SystemExit("no record timed both roads (kernel and road)")
    costs, us, tb_s = fit(rows)
    print(f"fitted on {len(rows)} rows of {', '.join(args.fit + args.kernel_only)}")
    print("GATED_KERNEL_COSTS = {")
    for name, c in costs.items():
        print(f'    "{name}": EntryCost({c.per_k_tile:.4f}, {c.per_unit:.4f}, 0.0, '
              f"{c.dram_tb_s:.4f}),")  # fmt: skip
    print("}")
    print(f"GATING_PASS_US = {us:.2f}\nGATING_PASS_TB_S = {tb_s:.3f}")
    for name, paths in [("fit", args.fit)] + [(j, [j]) for j in args.judge]:
        judged = read_rows(paths)
        print(f"{name}: shipped {json.dumps(judge(judged))}")
        print(f"{name}: fitted  {json.dumps(judge(judged, costs, us, tb_s))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
