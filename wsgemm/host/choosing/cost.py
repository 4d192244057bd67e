"""The cost model: a predicted time for every (menu entry, split-K count) on a problem, from
which ``choose`` takes the fastest.

Why a model and not a lookup: a table of measured problems speaks only for the problems it
measured; a layer of another model at another token count lies between its points, and the
nearest one chose a kernel 0.5x as fast as the best on real layers (docs/perf.md entry 33). The
model reasons from what sets a persistent GEMM's time instead, with a handful of constants per
entry fitted from measurements (``scripts/fit_cost_model.py``; the constants and the fit's
record are ``data/cost/<gpu>.json``, and docs/policy.md lists them).

For entry ``e`` (tile ``tm x tn x tk``, cluster ``cm x cn``) and split ``s`` on the problem the
kernel sees (``kernel_mn``: swap-AB exchanges M and N):

* **work units**: output tiles, each side rounded up to whole clusters, times the batch, times
  ``s``; **waves**: units over the CTAs that run at once (the SMs in whole clusters, fewer for
  clusters of 4: ``CLUSTERS_AT_ONCE``), rounded up,
  because a persistent CTA runs its units one after another and the call ends with the last;
* **compute** = waves x (k-tiles per unit x ``per_k_tile`` x the tile's volume over a
  128x256x64 tile's + ``per_unit`` + with a split ``per_split_unit`` + ``per_extra_split`` x
  (s - 1)): a k-tile's MMAs, a unit's fixed costs (filling the ring, the epilogue), a split
  unit's partial tile stored and read back by the unit that finishes the tile;
* **DRAM** = the bytes each operand and C need at least once (plus the split partials'
  workspace traffic) over the entry's fitted ``dram_tb_s``;
* **L2** = the bytes every CTA's TMA loads read from L2, the A tile shared by a cluster's ``cn``
  CTAs and the B tile by its ``cm`` (multicast), over one machine-wide ``l2_tb_s``;
* a **cluster split** (the split's parts on the CTAs of one cluster, the partials met in rank
  0's shared memory: ``Sm90Config.cluster_split``) has no workspace bytes, clusters ``s``
  times as large, and instead of the two split terms ``per_cluster_split`` x (s - 1) x the
  KB of one fp32 partial tile a unit: the other ranks' partials received and added, in
  proportion to their bytes (fitted on cluster-split timings anchored to the rest of the
  model: ``scripts/fit_cost_model.py --cluster-split``);
* **time** = ``launch_us`` + the three combined as a ``q``-norm (``q`` = 1 adds them, a large
  ``q`` takes the largest): compute, DRAM and L2 overlap, but not perfectly.

A fused epilogue with an activation (issue #25) adds, per unit, the time its special-function
instructions take where nothing hides them (``epilogue_us``): ``mufu`` MUFU instructions per
accumulator element (``EPILOGUE_MUFU``, read from the SASS: docs/perf.md entry 43) at 16 a
cycle per SM, against the tensor cores' 4096 flops a cycle, is ``2 x mufu`` 64-deep k-tiles of
the tile's own MMA time. A cooperative tile's two warpgroups run the epilogue together, so all
of it adds; a ping-pong warpgroup's epilogue runs under the other's mainloop, so only what
passes that mainloop adds, and once per call the last unit's whole (nothing follows it). Not
fitted: derived from the per-k-tile constant (measured +5.5% for gelu_tanh on the cooperative
128x256 tile at K = 4096, predicted +6%: entry 43).

A gated call (``gated_linear``: ``act(gate) * up`` of a (M, 2I) product) has two roads, priced
by ``gated_roads``: the gated kernel (on the tile it runs, ``gated_kernel_entry``, with
constants of its own, ``GATED_KERNEL_COSTS``; writing the half-width result, with the
activation's MUFU work: half an instruction set per product value) or the unfused road, the
product on ``auto``'s choice in fp32 and then a gating pass of two torch kernels whose cost is
``GATING_PASS_US`` plus its bytes at ``GATING_PASS_TB_S``. Both fitted on an H100
(``scripts/fit_gated_cost.py``, docs/perf.md entry 76) and used on any sm90 GPU.

A prediction carries its terms so that ``explain`` can say why the winner won. Pure Python, as
the rest of the room: no torch, no DSL; a prediction is a few dozen float operations.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from .menu import MenuEntry, entry

__all__ = ["COST_SCHEMA", "EPILOGUE_MUFU", "CostModel", "EntryCost", "Prediction", "cost_model_for",
           "GatedRoads", "clusters_at_once", "epilogue_us", "features", "gated_kernel_entry",
           "gated_roads", "gating_pass_us", "load_cost_model"]  # fmt: skip

COST_SCHEMA = 1
#: MUFU (special-function unit) instructions per accumulator element of each fused activation
#: (docs/perf.md entry 43: the logistic ones take one ``ex2.approx`` and one ``rcp.approx``;
#: ``tests/kernels/test_compile_sass.py`` checks which use the unit).
EPILOGUE_MUFU = {"none": 0, "relu": 0, "relu2": 0, "gelu": 2, "gelu_tanh": 2, "silu": 2}
#: 64-deep k-tiles of a tile's MMA time per MUFU instruction per element: 16 MUFU results a
#: cycle per SM against 4096 MMA flops (2 per element per k step: 64 x 2 / 4096 = 1/32 cycle
#: per element a k-tile, 1/16 per MUFU instruction).
K_TILES_PER_MUFU = 2
# The tile the per-k-tile constant is stated for: a k-tile of another tile costs its volume's
# share of it, so the constant stays comparable across entries.
REFERENCE_TILE_VOLUME = 128 * 256 * 64


@dataclass(frozen=True)
class EntryCost:
    """One entry's fitted constants (microseconds and TB/s)."""

    per_k_tile: float
    per_unit: float
    per_split_unit: float
    dram_tb_s: float


@dataclass(frozen=True)
class CostModel:
    """The constants of one GPU: per entry, and the machine-wide ones."""

    name: str
    device: str
    sm_count: int
    cc: tuple[int, int]
    source: str
    launch_us: float
    l2_tb_s: float
    q: float
    per_extra_split: float
    entries: dict[str, EntryCost]
    #: a cluster split's price per unit, per part beyond the first and per KB of its fp32
    #: partial tile (rank 0 receives the other ranks' partials in its shared memory, then adds
    #: them); None: not fitted, and a cluster split is priced as the workspace split
    per_cluster_split: float | None = None


class Features(NamedTuple):
    """What the model reads of a (problem, entry, split): the grid and the bytes. (A named
    tuple: ``choose`` builds one for every candidate of every new problem, and a frozen
    dataclass costs twice the time to build; docs/perf.md entry 114.)"""

    units: int
    waves: int
    k_tiles: int  # per unit
    volume: float  # the tile's volume over REFERENCE_TILE_VOLUME
    split: int
    dram_bytes: float
    l2_bytes: float
    cluster_split: bool = False  # the split's parts meet in a cluster's shared memory
    slots: int = 0  # CTAs a wave runs (whole clusters at once; 0: unknown)


class Prediction(NamedTuple):
    """A candidate's predicted time (us) and its three terms (a named tuple, as ``Features``)."""

    us: float
    compute_us: float
    dram_us: float
    l2_us: float
    features: Features

    @property
    def bound(self) -> str:
        """The term that weighs most: what limits this candidate."""
        terms = {"compute": self.compute_us, "DRAM": self.dram_us, "L2": self.l2_us}
        return max(terms, key=terms.get)


def features(
    e: MenuEntry,
    split: int,
    m: int,
    n: int,
    k: int,
    batch: int,
    sm_count: int,
    ab_bytes: int = 2,
    c_bytes: int = 2,
    cluster_split: bool = False,
) -> Features:
    """The grid (units, waves, k-tiles per unit) and bytes (DRAM, L2) of entry ``e`` with
    ``split`` on ``C (M, N, L) = A (M, K, L) B (K, N, L)`` over ``sm_count`` SMs; with
    ``cluster_split`` the split's parts run on the CTAs of one cluster and meet in its shared
    memory (no workspace bytes; the clusters are ``split`` times the entry's)."""
    km, kn = e.kernel_mn(m, n)
    cm, cn = e.cluster
    cluster_split = cluster_split and split > 1
    tiles = e.tiles(m, n, batch)  # whole clusters, times the batch
    units = tiles * split
    size = cm * cn * (split if cluster_split else 1)
    slots = clusters_at_once(sm_count, size) * size
    waves = -(-units // slots)
    k_tiles = -(-math.ceil(k / e.tile_k) // split)
    volume = e.tile_m * e.tile_n * e.tile_k / REFERENCE_TILE_VOLUME
    batch = max(batch, 1)
    dram = ((km + kn) * k * ab_bytes + km * kn * c_bytes) * batch
    if split > 1 and not cluster_split:  # each unit's fp32 partial tile, stored and read back
        dram += tiles * e.tile_m * e.tile_n * 4 * 2 * split
    l2 = units * k_tiles * (e.tile_m * e.tile_k / cn + e.tile_n * e.tile_k / cm) * ab_bytes
    return Features(units, waves, k_tiles, volume, split, float(dram), float(l2), cluster_split,
                    slots)  # fmt: skip


#: Clusters of a size the hardware runs at once where that is fewer than the SMs over the size
#: (a cluster's CTAs share a GPC, and GPCs of 16 or 18 SMs leave some over): on a 132-SM
#: GH100 (H100 SXM; the H200 is the same die) the driver's occupancy query answered 66 clusters
#: of 2 and **30 of 4** (`gpu_session.sh clustersplit`, 2026-12-07, docs/perf.md entry 97).
CLUSTERS_AT_ONCE = {(132, 4): 30}


def clusters_at_once(sm_count: int, size: int) -> int:
    """How many clusters of ``size`` CTAs (one per SM) run at once on ``sm_count`` SMs."""
    return max(CLUSTERS_AT_ONCE.get((sm_count, size), sm_count // size), 1)


def epilogue_us(model: CostModel, e: MenuEntry, f: Features, mufu: int) -> float:
    """The time per unit that a fused activation of ``mufu`` MUFU instructions per element adds
    to ``e`` (module docstring): all of it on a cooperative tile, what passes the other
    warpgroup's mainloop on a ping-pong one; 0 for an entry the model does not know."""
    return _epilogue(model, e, f, mufu)[0]


def _epilogue(model: CostModel, e: MenuEntry, f: Features, mufu: int) -> tuple[float, float]:
    """(``epilogue_us``, what it adds once per call): the call's last epilogue has no
    mainloop after it to hide under (ping-pong) nor other units to share it with (split), so
    the call's end waits for all of it."""
    c = model.entries.get(e.name)
    if c is None or mufu <= 0:
        return 0.0, 0.0
    k_tile = c.per_k_tile * f.volume * 64 / e.tile_k  # one 64-deep k-tile of this tile
    whole = K_TILES_PER_MUFU * mufu * k_tile
    share = whole / f.split  # only the unit that finishes a split tile runs its epilogue
    if e.config.get("schedule") == "pingpong":
        share = max(0.0, share - f.k_tiles * c.per_k_tile * f.volume)
    # the call's last epilogue, whole, after every mainloop: what the shares left out of it
    return share, whole - share


def predict(model: CostModel, e: MenuEntry, f: Features, mufu: int = 0) -> Prediction | None:
    """The predicted time of ``e`` on the problem of ``f``, with a fused activation of ``mufu``
    MUFU instructions per element (``epilogue_us``); None for an entry the model has no
    constants for."""
    c = model.entries.get(e.name)
    if c is None:
        return None
    per_unit_epilogue, last_epilogue = _epilogue(model, e, f, mufu)
    per_unit = f.k_tiles * c.per_k_tile * f.volume + c.per_unit + per_unit_epilogue
    if f.cluster_split and model.per_cluster_split is not None:  # (only a split is one)
        partial_kb = e.tile_m * e.tile_n * 4 / 1024  # one rank's fp32 partial tile
        per_unit += model.per_cluster_split * partial_kb * (f.split - 1)
    elif f.split > 1:
        per_unit += c.per_split_unit + model.per_extra_split * (f.split - 1)
    compute = f.waves * per_unit + last_epilogue
    dram = f.dram_bytes / (c.dram_tb_s * 1e6)
    l2 = f.l2_bytes / (model.l2_tb_s * 1e6)
    q = model.q
    combined = (compute**q + dram**q + l2**q) ** (1 / q)
    return Prediction(model.launch_us + combined, compute, dram, l2, f)


#: The unfused gated road's pass after its (M, 2I) fp32 product: ``act(gate)``, then ``act *
#: up`` into the 16-bit result, two torch kernels (three for relu2: ``relu``, then ``square``).
#: A fixed cost (two launches and the gaps between them and the product: host time where the
#: host is slow) and its bytes at an elementwise rate: fitted (``scripts/fit_gated_cost.py``)
#: on the road's time less the model's time for its product, on the fit families' gate_up rows
#: at 1-14445 tokens timed on an H100 (docs/perf.md entry 76; entry 73's first estimate, 5 us
#: and 1.5 TB/s from the inputs'-dtype road on 8B/70B, was low for the fp32 road).
GATING_PASS_US = 9.34
GATING_PASS_TB_S = 1.77
#: bytes per result value: the gate read and act(gate) written in fp32, both halves read for
#: the product, the 16-bit result written
GATING_PASS_BYTES = 4 + 4 + 4 + 4 + 2
#: The gated kernel's small row tile (``host.runs_gated_small``): up to this many rows the
#: ping-pong 64x128 tile in 2x1 clusters (64 result columns a CTA, 128 rows a cluster) rather
#: than the 128x128 one. On session 25's forced-tile record (docs/perf.md entry 88, an H100) it
#: took 0.93-1.29x the plain product at 1-128 rows on five gate_up shapes where the 128x128
#: tile took 1.18-1.89x, and lost to it at 256 rows on four of the five.
GATED_SMALL_MAX_ROWS = 128
GATED_SMALL_TILE = "pingpong-64x128-c2x1"
#: the gated kernel's row tiles (``api.gated.gated_config``): the ping-pong 128x128 tile
#: (64 result columns) up to this many rows, the cooperative 128x256 (128) above
GATED_PINGPONG_MAX_ROWS = 256
#: the gated kernel's own constants per row tile (its menu entry's name; ``per_split_unit``
#: unused: it never splits), fitted with the pass's above (``scripts/fit_gated_cost.py``, the
#: same rows; the cooperative tile's rows are compute-bound, so its DRAM rate sits at the fit's
#: bound). The plain entries' constants misprice it: the cooperative entry's put the 128x128
#: tile's narrow calls at 26 us where they take 16, and its wide few-row calls low by 25-40%.
GATED_KERNEL_COSTS: dict[str, EntryCost] | None = {
    "sm90": EntryCost(0.6166, 0.0001, 0.0, 8.5000),
    "sm90-pingpong": EntryCost(0.5406, 0.5186, 0.0, 3.0070),
    # fitted on its own forced rows alone (``fit_gated_cost.fit_small_tile``, entry 88)
    GATED_SMALL_TILE: EntryCost(0.2823, 2.3260, 0.0, 2.9873),
}


def gated_kernel_entry(rows: int, small: bool = False) -> str:
    """The menu entry whose tile the gated kernel runs for a call of ``rows`` rows (``small``:
    the small row tile may run it, ``GATED_SMALL_TILE``)."""
    if small and rows <= GATED_SMALL_MAX_ROWS:
        return GATED_SMALL_TILE
    return "sm90-pingpong" if rows <= GATED_PINGPONG_MAX_ROWS else "sm90"


#: The dgated GEMM's row tile above ``GATED_PINGPONG_MAX_ROWS`` (``dgated_kernel_entry``): the
#: ping-pong 128x128 tile (its whole tile's pre-activation buffered) where the share of its
#: waves' slots it fills is more than this factor the cooperative 128x256 tile's, else the
#: cooperative tile (its loader warp). Both forced on seven fit-family MLPs at 1024 and 4096
#: tokens (an H100, docs/perf.md entry 107): where both tiles fill their waves alike the
#: ping-pong tile took 1.04-1.13x the cooperative one's time in the training-step benchmark
#: (9 rows, geomean 1.085: this factor), 1.05-1.15x timed alone (geomean 1.088); where the
#: cooperative tile left a partial wave (fill 0.77-0.90 against 0.92-1.00) it took 0.88-0.98x.
DGATED_PINGPONG_WAVE_MARGIN = 1.085
#: ``choosing.dgated_entry``: the dgated GEMM takes the plain product's unsplit cooperative
#: row tile (``choose``'s) where that fills its waves more than this factor the tile above's.
#: The 13 row tiles forced on the 14 fit rows (an H100, docs/perf.md entry 110): the one row
#: where it filled them 1.148x as well ran 0.946x the time; of the seven within 1.023x, five
#: ran 3-11% slower. Any factor between separates them; entry 107's 1.085 was taken.
DGATED_PLAIN_TILE_MARGIN = 1.085


def wave_fill(e: MenuEntry, m: int, n: int, sm_count: int) -> float:
    """The share of its waves' slots (``Features.slots``) that entry ``e`` unsplit fills with
    tiles of an (M, N) product over ``sm_count`` SMs: 1.0 where the last wave is full. A
    cluster that overhangs the problem's edge runs all its CTAs, but the ones past the edge
    fill their slot with nothing (docs/perf.md entry 110: the dgated GEMM on a 2x1 cluster
    tile over 3 or 5 row tiles ran ~1.5x the time of a 1x2 cluster's)."""
    f = features(e, 1, m, n, 1, 1, sm_count)
    tiles_m, tiles_n = e.tile_counts(m, n)
    return tiles_m * tiles_n / (f.waves * f.slots) if f.slots and f.waves else 1.0  # (empty)


def dgated_kernel_entry(rows: int, half: int, sm_count: int) -> str:
    """The menu entry whose tile the dgated GEMM (``api.gated.gated_grad``: ``dh`` is (rows,
    half)) runs over ``sm_count`` SMs: the gated kernel's (``gated_kernel_entry``) up to
    ``GATED_PINGPONG_MAX_ROWS`` rows; above, the ping-pong tile where it fills its waves more
    than ``DGATED_PINGPONG_WAVE_MARGIN`` times as well as the cooperative one does."""
    tile = gated_kernel_entry(rows)
    if tile != "sm90":
        return tile
    # (not cached: ``choosing.dgated_entry``, its one caller on a call's path, caches its answer)
    pingpong = wave_fill(entry("sm90-pingpong"), rows, half, sm_count)
    cooperative = wave_fill(entry("sm90"), rows, half, sm_count)
    return "sm90-pingpong" if pingpong > DGATED_PINGPONG_WAVE_MARGIN * cooperative else "sm90"


#: The gated swap-AB decode tile (``host.runs_gated_swap``): calls of up to this many rows, the
#: tokens in the tile's N (the narrowest of these widths that holds them), 64 result rows a
#: tile. The model prices it as the plain swap-AB decode entry of the same width
#: (``GATED_SWAP_PROXY``) on (rows, I, 2K), unsplit: a 64-row tile over twice the K is the
#: 128-row tile's weight bytes and MMA work a CTA, with as many CTAs (I / 64), writing the
#: half-width result. Timed (an H100, docs/perf.md entry 85) the tile ran 1.02-1.14x the
#: plain product at 1-16 rows and 0.90-1.09x at 32, where the proxy said ~1.0x and ~1.1x: the
#: proxy's price is scaled per width (``GATED_SWAP_SCALE``, the geomean of measured over
#: predicted swap-over-road ratio, ``scripts/fit_gated_swap.py`` on ``SHIPPED_SWAP_FIT``).
GATED_SWAP_TILE_N = (8, 16, 32)
GATED_SWAP_SCALE = {8: 1.090, 16: 1.084, 32: 0.940}
GATED_SWAP_MAX_ROWS = GATED_SWAP_TILE_N[-1]
GATED_SWAP_PROXY = {
    8: "swap-pingpong-64x8x128-c1x1",
    16: "swap-pingpong-64x16x128-c1x1",
    32: "swap-pingpong-64x32-c1x1",
}


def gated_swap_tile_n(rows: int) -> int | None:
    """The gated swap-AB tile's width for a call of ``rows`` rows, or None past
    ``GATED_SWAP_MAX_ROWS``."""
    return next((n for n in GATED_SWAP_TILE_N if rows <= n), None)


def gating_pass_us(
    m: int, half: int, activation: str = "silu", us: float | None = None, tb_s: float | None = None
) -> float:
    """The unfused gated road's gating pass over an (m, 2 * half) fp32 product (above; ``us``
    and ``tb_s`` in place of ``GATING_PASS_US`` and ``GATING_PASS_TB_S``, for a fit); relu2's
    activation is two kernels (``relu``, then ``square``: one more fp32 write and read)."""
    us = GATING_PASS_US if us is None else us
    tb_s = GATING_PASS_TB_S if tb_s is None else tb_s
    launches, extra = (3, 8) if activation == "relu2" else (2, 0)
    value_bytes = GATING_PASS_BYTES + extra
    return us * launches / 2 + m * half * value_bytes / (tb_s * 1e6)


@dataclass(frozen=True)
class GatedRoads:
    """The predicted microseconds of a gated call's two roads (``gated_roads``)."""

    fused_us: float
    unfused_us: float
    product_us: float  # of which the unfused road's (M, 2I) product
    gating_us: float  # and its gating pass

    @property
    def unfused_wins(self) -> bool:
        return self.unfused_us < self.fused_us


def gated_roads(
    model: CostModel,
    product: MenuEntry,
    split: int,
    m: int,
    n: int,
    k: int,
    sm_count: int,
    activation: str,
    kernel_costs: dict[str, EntryCost] | None = None,
    pass_us: float | None = None,
    pass_tb_s: float | None = None,
    swap_tile_n: int | None = None,
    swap_scale: float | None = None,
    small: bool = False,
    cluster_split: bool = False,
) -> GatedRoads | None:
    """The two roads of ``gated_linear`` on an (m, n = 2I, k) product: the gated kernel (its
    row tile, ``gated_kernel_entry``, with ``GATED_KERNEL_COSTS``' constants for it, unsplit,
    writing m x I 16-bit values, with the activation's MUFU work: ``EPILOGUE_MUFU`` per result
    value, half of it per product value) against the product on ``product`` with ``split``
    writing fp32, plus ``gating_pass_us``. The last three arguments stand in for the shipped
    constants (a fit). ``swap_tile_n``: the gated kernel is the swap-AB decode tile of that
    width (``gated_swap_tile_n``), priced as ``GATED_SWAP_PROXY``'s entry times
    ``GATED_SWAP_SCALE``'s (``swap_scale`` in its place, for a fit). ``small``: the row tile is
    ``gated_kernel_entry``'s with the small tile allowed. ``cluster_split``: the product's
    split runs over a cluster (``rules.split_in_cluster``), priced in that form; a fit that
    replays records timed before the cluster split ran keeps it off (``scripts/fit_gated_*``).
    None where the model lacks an entry."""
    costs = GATED_KERNEL_COSTS if kernel_costs is None else kernel_costs
    plain = predict(model, product, features(product, split, m, n, k, 1, sm_count, 2, 4,
                                             cluster_split))  # fmt: skip
    gating = gating_pass_us(m, n // 2, activation, pass_us, pass_tb_s)
    if swap_tile_n is not None:
        # a 128-row tile over K is a 64-row tile over 2K (the same weight bytes and MMA work
        # a CTA, as many CTAs): the proxy on (m, I, 2K), writing I 16-bit values a row
        proxy = entry(GATED_SWAP_PROXY[swap_tile_n])
        mufu = EPILOGUE_MUFU.get(activation, 0)
        fused = predict(model, proxy, features(proxy, 1, m, n // 2, 2 * k, 1, sm_count, 2, 2),
                        mufu)  # fmt: skip
        if fused is None or plain is None:
            return None
        scale = GATED_SWAP_SCALE[swap_tile_n] if swap_scale is None else swap_scale
        return GatedRoads(fused.us * scale, plain.us + gating, plain.us, gating)
    if costs is None:
        gated, local = entry("sm90"), model
    else:
        name = gated_kernel_entry(m, small)
        gated, local = entry(name), dataclasses.replace(model, entries={name: costs[name]})
    mufu = EPILOGUE_MUFU.get(activation, 0) // 2
    fused = predict(local, gated, features(gated, 1, m, n, k, 1, sm_count, 2, 1), mufu)
    if fused is None or plain is None:
        return None
    return GatedRoads(fused.us, plain.us + gating, plain.us, gating)


def load_cost_model(path: str | Path) -> CostModel:
    """Read and check a cost model written by ``scripts/fit_cost_model.py``."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cost model {path}: cannot read it as JSON ({exc})") from None
    try:
        if raw["schema"] != COST_SCHEMA:
            raise ValueError(f"schema {raw['schema']!r}, this wsgemm reads {COST_SCHEMA}")
        entries = {
            str(name): EntryCost(*(float(v[key]) for key in EntryCost.__dataclass_fields__))
            for name, v in raw["entries"].items()
        }
        machine = {key: float(raw[key]) for key in ("launch_us", "l2_tb_s", "q", "per_extra_split")}
        if raw.get("per_cluster_split") is not None:  # fitted later than the rest: optional
            machine["per_cluster_split"] = float(raw["per_cluster_split"])
        model = CostModel(
            path.name, str(raw["device"]), int(raw["sm_count"]), tuple(int(v) for v in raw["cc"]),
            str(raw["source"]), entries=entries, **machine,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cost model {path}: malformed ({exc!r})") from None
    values = [v for c in entries.values() for v in vars(c).values()] + [model.launch_us]
    if model.per_cluster_split is not None:
        values.append(model.per_cluster_split)
    if (
        not all(math.isfinite(v) and v >= 0 for v in values)
        or min([model.l2_tb_s, model.q] + [c.dram_tb_s for c in entries.values()]) <= 0
    ):
        raise ValueError(f"cost model {path}: constants must be finite, rates and q positive")
    return model


@functools.cache
def cost_models() -> tuple[CostModel, ...]:
    """The shipped cost models (``data/cost/*.json``), one per measured GPU."""
    folder = resources.files(__package__) / "data" / "cost"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    return tuple(load_cost_model(Path(str(folder / name))) for name in names)


def cost_model_for(sm_count: int, cc: tuple[int, int]) -> CostModel | None:
    """The model fitted on this compute capability with the nearest SM count."""
    same = [c for c in cost_models() if c.cc == tuple(cc)]
    if not same:
        return None
    return min(same, key=lambda c: abs(math.log2(c.sm_count / sm_count)))
