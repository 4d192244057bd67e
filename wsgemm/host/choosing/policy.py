"""The sm90 shape policy: a small, fixed menu of kernel configs, and which entry and which split-K
count run a given problem.

Why a menu: no one tile serves both ends of an LLM's GEMMs. At decode (1-64 tokens) the shipped
128x256 tile with a 2x1 cluster has one m-tile, so each cluster's second CTA computes a tile
that lies wholly outside the problem, and most SMs idle: 0.45-0.60x of cuBLAS, where 64-row
ping-pong tiles reach 0.83-1.08x (docs/perf.md, entry 11). At prefill the shipped tile is within
3% of cuBLAS. The menu stays small and fixed because ``warm`` compiles every entry in all 36
dtype x major variants (``menu_variants``).

How ``choose`` decides, in this order:

1. Rules no measurement overturns (``fits``, ``split_candidates``, ``_allowed``): a cluster of
   two CTAs along M (N) needs at least two m-tiles (n-tiles), or one of them computes nothing;
   split-K only on entries with a split variant, with an fp32 accumulator, outside
   batch-invariant mode, with a k-tile per split and at most two waves of split units. And
   decode is swap-AB's: when a swap-AB entry takes all of M in its token columns (M <= 16), only
   swap-AB entries are candidates. They were the fastest at every 1- and 16-token ``llm`` shape
   in the bench but one, where the tuner's pick (64x128 tiles in 40 clusters of two on 132
   SMs) runs at 0.91-1.08x from one process to the next (docs/perf.md entries 20 and 25).
2. The measured table (``data/sm90_*.json``, one per measured GPU; ``WSGEMM_POLICY_TABLE=path``
   replaces them): the nearest measured problem in the features ``(log2 ceil(M / M_QUANTUM),
   log2(N x L x table SMs / this GPU's SMs), log2 K)``, weighted 1, 1, 0.5, decides if it lies
   within ``MAX_TABLE_DISTANCE``: the best candidate measured there that rule 1 allows here.
   M counts blocks of ``M_QUANTUM`` rows (8: the gcd of the tiles' rows and the swap-AB
   tiles' token columns) because that, not M itself, sets the work: 1 and 16 tokens run the
   same tiles. N is scaled by the SM count so another sm_90 part (H100
   SXM 132 SMs, H100 PCIe 114, H20 78) reads the row measured at its tiles-per-SM.
3. Otherwise the heuristic (``_heuristic``): the narrowest swap-AB tile that takes the tokens
   (up to 16), then 64-row ping-pong tiles up to 64 tokens (64x256
   when they fill 80% of the SMs, else 64x128 in an N-pair cluster that shares A), 128x128
   cooperative tiles clustered along N up to 128 tokens, then the shipped 128x256 tile when it
   makes two waves and the shipped 128x128 ping-pong when it does not; a split only while the
   split units fit one wave and each keeps ``HEURISTIC_MIN_K_PER_SPLIT`` of K.

Split-K runs inside the kernel (``Sm90Config.split_k``; docs/architecture.md): no extra
kernels, a fixed cost per unit of one partial tile stored and, on the unit that finishes a
tile, the partials read back, rows inside C only. Only the entries marked ``splits`` (the
decode and 128-token ones) have a split variant, so ``warm`` compiles a bounded set: their
fp32-accumulator variants once more.

Batch invariance (``batch_invariant=True`` or ``WSGEMM_BATCH_INVARIANT=1``): the summation order
of every output element must not depend on M. Split-K changes it (partial sums over K ranges,
then their sum), so this mode never splits. Every entry accumulates in one order: the consumer
walks k-tiles in ascending order and each k-tile's 16-deep WGMMA k-steps in ascending order,
from zeroed accumulators, so every entry issues the same sequence of k16 steps whatever its
tile_k (a ragged tail only adds zero-filled steps); the entries differ in which CTA computes an
element, never in the order of its sum.
``tests/host/test_policy.py::test_gpu_every_menu_entry_gives_the_same_bits`` checks it on the GPU.

Pure Python on purpose: importing this module imports neither torch nor the DSL. An entry is a
backend name and a dict of its config's fields; ``MenuEntry.variant_config`` builds the kernel's
config through the registry only when asked.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...support import ELEMENT_BYTES, dtype_error
from ..registry import BACKENDS, Variant, every_variant

__all__ = [
    "DROPPED",
    "MENU",
    "M_QUANTUM",
    "m_block",
    "Choice",
    "MenuEntry",
    "Table",
    "batch_invariant_requested",
    "choose",
    "entry",
    "explain",
    "fits",
    "load_table",
    "menu_variants",
    "split_candidates",
]

SPLITS = (1, 2, 4, 8)
# Splits are candidates (tuned, and chosen from the table) while tiles x split units fit in
# this many waves: a problem with more tiles than that already fills the machine.
SPLIT_MAX_WAVES = 2
# Heuristic only: a split unit must keep this much K and the units fit one wave (module
# docstring). UNMEASURED for the in-kernel split: 16 k-tiles of 64, twice the ~8-stage ring
# of the 64-row tiles, so a unit's fixed costs (filling the ring, one partial tile stored and
# read back) stay a small part of it. The host split needed 6144 (its two extra kernels cost
# ~3-5 us, docs/perf.md entry 11); scripts/tune_menu.py measures what the table should say.
HEURISTIC_MIN_K_PER_SPLIT = 1024
# Heuristic only: 64x256 tiles at decode when they occupy this share of the SMs (the gate/up
# projections, 112-224 tiles on 132 SMs, at 1.00-1.02x; qkv/o with 24-40 tiles want 64x128).
WIDE_TILE_FILL = 0.8
# Heuristic only: the shipped 128x256 tile from this many waves on (1024 tokens: the shipped
# ping-pong 0.94-1.00x where the shipped 128x256 tile is 0.79-1.00x, issue #10).
LARGE_TILE_WAVES = 2
# Table lookup: feature weights (M blocks, N x L per SM, K) and the largest distance (log2
# units) at which a measured problem still speaks for this one.
FEATURE_WEIGHTS = (1.0, 1.0, 0.5)
MAX_TABLE_DISTANCE = 1.5
ENV_BATCH_INVARIANT = "WSGEMM_BATCH_INVARIANT"
ENV_TABLE = "WSGEMM_POLICY_TABLE"
TABLE_SCHEMA = 1


@dataclass(frozen=True)
class MenuEntry:
    """One compiled kernel config: the backend that runs it and its config's fields.

    ``shipped`` entries are the backend's own shipped config: they compile as
    ``Variant(backend, ..., config=None)``, the same variants (and cache keys) as before the menu.
    ``splits``: the entry has a split-K variant (``Sm90Config.split_k=0``) the policy may choose.
    """

    name: str
    backend: str
    fields: tuple[tuple[str, Any], ...]
    shipped: bool = False
    splits: bool = False

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.fields)

    @property
    def tile_m(self) -> int:
        return self.config["tile_m"]

    @property
    def tile_n(self) -> int:
        return self.config["tile_n"]

    @property
    def tile_k(self) -> int:
        return self.config["tile_k"]

    @property
    def cluster(self) -> tuple[int, int]:
        return self.config["cluster_m"], self.config["cluster_n"]

    @property
    def swap_ab(self) -> bool:
        """The entry runs the swapped problem C^T (N, M) = B^T A^T: N along its tile's M."""
        return bool(self.config.get("swap_ab", False))

    def kernel_mn(self, m: int, n: int) -> tuple[int, int]:
        """The (M, N) the kernel sees: the problem's, or swapped."""
        return (n, m) if self.swap_ab else (m, n)

    def tiles(self, m: int, n: int, batch: int) -> int:
        """The work units of a launch without split: output tiles, each side rounded up to
        whole clusters (a cluster that overhangs a ragged edge still runs all its CTAs)."""
        km, kn = self.kernel_mn(m, n)
        cm, cn = self.cluster
        # as kernels.common.scheduler.cluster_tile_counts, which this module cannot import
        # (it imports the DSL, and the policy runs in processes that never load it)
        tiles_m, tiles_n = -(-km // self.tile_m), -(-kn // self.tile_n)
        return -(-tiles_m // cm) * cm * (-(-tiles_n // cn) * cn) * max(batch, 1)

    def describe(self) -> str:
        cm, cn = self.cluster
        schedule = self.config["schedule"]
        swap = "swap-AB (C^T = B^T A^T), " if self.swap_ab else ""
        return f"{swap}{schedule} {self.tile_m}x{self.tile_n}x{self.tile_k} tile, cluster {cm}x{cn}"

    def variant_config(self, split: bool = False) -> Any:
        """What ``host.Variant(config=...)`` takes: None for a shipped entry, else the backend's
        config class with these fields (imports the kernel module). ``split``: the entry's
        split-K variant (the split count is a launch argument: ``split_k=0``)."""
        if split:
            if not self.splits:
                raise ValueError(f"menu entry {self.name!r} has no split-K variant")
            return dataclasses.replace(BACKENDS[self.backend].config(), **self.config, split_k=0)
        if self.shipped:
            return None
        config = dataclasses.replace(BACKENDS[self.backend].config(), **self.config)
        # a stream-K entry is the split kernel (compiled and cached as split_k=0)
        return config.compiled() if self.config.get("stream_k") else config


def _entry(
    name: str, backend: str, shipped: bool = False, splits: bool = False, **fields
) -> MenuEntry:
    fields.setdefault("swap_ab", False)  # a swap-AB entry says so; the others run A @ B as given
    fields.setdefault("stream_k", False)  # only dropped entries run stream-K (perf.md entry 28)
    return MenuEntry(name, backend, tuple(sorted(fields.items())), shipped, splits)


# The menu. Each entry earns its 36 compiled variants with a measured win (H200, fp16 TN, vs
# cuBLAS; the prototype's numbers in docs/perf.md entry 11, issue #10 for the shipped two).
MENU: tuple[MenuEntry, ...] = (
    # Prefill: 0.97-1.04x at 4096 and 16384 tokens.
    _entry("sm90", "sm90", True, tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1,
           schedule="cooperative"),
    # 1024 tokens: 0.94-1.00x where the 128x256 tile falls to 0.79x (qkv, o, down).
    _entry("sm90-pingpong", "sm90-pingpong", True, tile_m=128, tile_n=128, tile_k=64,
           cluster_m=2, cluster_n=1, schedule="pingpong"),
    # Decode with many n-tiles: gate/up at 1 and 16 tokens 1.00-1.02x; with split 2-4 the 70B
    # down projection 0.96x and o at 1 token 0.90x.
    _entry("pingpong-64x256-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=256,
           tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong"),
    # Decode with few n-tiles: qkv and o at 16 tokens 0.83-1.08x (shipped 0.50x); the 8B down
    # projection 0.86x with split 2; 0.80x on 8B qkv and o at 128 tokens.
    _entry("pingpong-64x128-c1x2", "sm90-pingpong", splits=True, tile_m=64, tile_n=128,
           tile_k=64, cluster_m=1, cluster_n=2, schedule="pingpong"),
    # 128 tokens: 8B gate/up 1.04x, 70B qkv 0.98x, o 0.88x, down 1.04x (split 2), 8B down 0.86x
    # (split 4).
    _entry("cooperative-128x128-c1x2", "sm90", splits=True, tile_m=128, tile_n=128, tile_k=64,
           cluster_m=1, cluster_n=2, schedule="cooperative"),
    # 128 tokens as cuBLAS tiles them (its kernel names: 64x64 and 64x128 tiles, one wave of
    # ~128 CTAs, no split), the two 64-row token tiles of a weight tile in one cluster so that
    # the weights' tile is multicast to both (c1x2 multicasts the small token tile instead):
    # against the old menu's best in the same run, 8B o 0.85 -> 1.01x, 8B down 0.95 -> 1.04x
    # (64x64); 70B o 0.90 -> 0.99x, 70B down 1.11 -> 1.12x, 8B qkv 0.86 -> 0.95x (64x128).
    # docs/perf.md entry 19.
    _entry("pingpong-64x64-c2x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=64,
           tile_k=64, cluster_m=2, cluster_n=1, schedule="pingpong"),
    _entry("pingpong-64x128-c2x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=128,
           tile_k=64, cluster_m=2, cluster_n=1, schedule="pingpong"),
    # Swap-AB for up to 16 tokens: the weights' N in 64-row WGMMAs, the tokens a 16-wide tile
    # (twice the 64x128 tiles' CTAs on a 4096-wide layer, no 64-row padding of the tokens).
    # 128-deep k-tiles: half as many ring stages of twice the bytes read decode faster than
    # 64-deep ones (the 64x8 tile at one token: 8B qkv 0.99 -> 1.06x, 70B qkv 0.94 -> 1.04x,
    # 8B down 0.93 -> 0.98x; docs/perf.md entry 25).
    _entry("swap-pingpong-64x16x128-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=16,
           tile_k=128, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Swap-AB at 1 token with an 8-wide token tile, as cuBLAS's 64x8: an eighth of the 64x16
    # tile's wasted MMA work (docs/perf.md entry 22).
    _entry("swap-pingpong-64x8x128-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=8,
           tile_k=128, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Wave-fitting widths (docs/perf.md entries 28, 29), as cuBLAS's odd tiles on the midsize
    # rows (192x176, 256x152 in our M x N): a width that makes the tile count a whole number of
    # waves, or a wave of wider tiles. Against the old menu's best in the same run (H200,
    # 2026-12-01): 128x192 on 4472x1928x680 TN 0.80 -> 0.92x, 2888x2072x1504 NT 0.82 -> 0.99x,
    # 1128x1968x4056 NT 0.82 -> 0.93x; 128x160 on the TT rows 943x2078x845 +24% and
    # 2345x778x1684 +36%; 128x224 on the NN/TT rows +2 to +11% (4527x3910x4047 TT).
    *(_entry(f"cooperative-128x{w}-c2x1", "sm90", tile_m=128, tile_n=w, tile_k=64,
             cluster_m=2, cluster_n=1, schedule="cooperative") for w in (160, 192, 224)),
    # 256 rows (each warpgroup two 64-row WGMMA bands), 160 wide: 5024x880x1112 NT 0.73 -> 0.94x
    # (120 tiles, one wave), 2712x3592x2920 TN 0.79 -> 0.93x (264 tiles, two waves exactly),
    # 935x4933x2295 TT +43%, 70B qkv at 1024 tokens 0.98 -> 1.02x.
    _entry("cooperative-256x160-c1x2", "sm90", tile_m=256, tile_n=160, tile_k=64,
           cluster_m=1, cluster_n=2, schedule="cooperative"),
    # The 70B qkv layer at 128 tokens (N = 10240 in 160-wide tiles: 2 x 64 = 128 CTAs, one
    # wave): 0.997 -> 1.035x; 808x5903x591 NN +2%.
    _entry("pingpong-64x160-c2x1", "sm90-pingpong", tile_m=64, tile_n=160, tile_k=64,
           cluster_m=2, cluster_n=1, schedule="pingpong"),
    # Gate/up at 128 tokens: 70B 1.002 -> 1.036x, 8B 1.006 -> 1.022x (the tokens' 128x256 tile
    # multicast to the cluster's two weight tiles).
    _entry("cooperative-128x256-c1x2", "sm90", tile_m=128, tile_n=256, tile_k=64,
           cluster_m=1, cluster_n=2, schedule="cooperative"),
)  # fmt: skip
# Measured by the prototype, left off the menu: no shape where they beat every entry above by
# more than the run-to-run noise (0.01-0.02x), and each would cost 36 more compiles.
# ``scripts/tune_menu.py --with-dropped`` times them again next to the menu.
DROPPED: tuple[MenuEntry, ...] = (
    # Gate/up at 16 tokens 0.97-1.02x, as pingpong-64x256-c1x1 (1.00-1.02x).
    _entry("pingpong-64x256-c1x2", "sm90-pingpong", tile_m=64, tile_n=256, tile_k=64,
           cluster_m=1, cluster_n=2, schedule="pingpong"),
    # The swap-AB tiles with 64-deep k-tiles (the menu's until entry 25): 24 stages of 9 KiB
    # (64x8) read the weights slower than 12 of 18 KiB at every decode shape measured.
    _entry("swap-pingpong-64x16-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=16,
           tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    _entry("swap-pingpong-64x8-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=8,
           tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Swap-AB up to 32 tokens: at 16 tokens 8B o 0.997x, down 0.985x, 70B o 0.974x against the
    # 64x16 tile's 0.993, 0.984, 0.966x in the same run (docs/perf.md entry 22): noise.
    _entry("swap-pingpong-64x32-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=32,
           tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Stream-K on the shipped tiles (docs/architecture.md; perf.md entries 26, 28): correct on
    # the H200; against the same tile unsplit it loses on every midsize row with short K (at most
    # 31 k-tiles a tile: 0.50-0.96x) and wins on half of those with long K (0.81-1.11x).
    _entry("sk-cooperative-128x256-c2x1", "sm90", tile_m=128, tile_n=256, tile_k=64,
           cluster_m=2, cluster_n=1, schedule="cooperative", stream_k=True),
    _entry("sk-pingpong-128x128-c2x1", "sm90-pingpong", tile_m=128, tile_n=128, tile_k=64,
           cluster_m=2, cluster_n=1, schedule="pingpong", stream_k=True),
    # The qkv layers at 128 tokens in 96-wide tiles (N = 6144: 2 x 64 = 128 CTAs, one wave):
    # 8B qkv 0.998x against the menu's 0.988x (64x128) in the same run, noise (perf.md 29).
    _entry("pingpong-64x96-c2x1", "sm90-pingpong", tile_m=64, tile_n=96, tile_k=64,
           cluster_m=2, cluster_n=1, schedule="pingpong"),
    # CUTLASS's usual large tile: 2144x1776x1960 TN 0.978x against sm90's 0.971x, noise; the
    # 256x160 tile (on the menu) wins the rows it was built for (perf.md 29).
    _entry("cooperative-256x128-c1x2", "sm90", tile_m=256, tile_n=128, tile_k=64,
           cluster_m=1, cluster_n=2, schedule="cooperative"),
)  # fmt: skip
_BY_NAME = {e.name: e for e in MENU + DROPPED}
# The smallest tile's rows: the unit in which the table measures M.
MIN_TILE_M = min(e.tile_m for e in MENU)
# The finest step in which M changes any rule: every tile count is ceil(M / t) for an entry's
# rows t (for a swap-AB entry its columns, where the tokens go, and its "M <= tile_n" fit), so
# M rounded up to their gcd chooses what M does. The table measures M in these blocks too.
M_QUANTUM = math.gcd(*(e.tile_n if e.swap_ab else e.tile_m for e in MENU))


def m_block(m: int) -> int:
    """M rounded up to whole ``M_QUANTUM`` blocks: all of M that any rule sees (``choose``
    memoizes on it, ``candidates`` and the tuned-choice buckets count it)."""
    return -(-m // M_QUANTUM) * M_QUANTUM


def entry(name: str) -> MenuEntry:
    """The menu (or dropped) entry called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"no menu entry {name!r}; the menu: {', '.join(e.name for e in MENU)}"
        ) from None


def menu_variants(arch: str = "sm_90a", entries: tuple[MenuEntry, ...] = MENU) -> list[Variant]:
    """Every variant ``warm`` compiles for the menu: each entry in every A/B, C and accumulator
    dtype and both majors of A and B (36 per entry), and each entry with ``splits`` once more
    as its split-K variant with an fp32 accumulator (24 more; fp16 accumulators never split).
    The shipped entries' variants are exactly the shipped backends' own."""
    out = [v for e in entries for v in every_variant(e.backend, arch, e.variant_config())]
    for e in entries:
        if e.splits:
            split = every_variant(e.backend, arch, e.variant_config(split=True))
            out += [v for v in split if v.acc_dtype == "float32"]
    return out


# ----------------------------------------------------------------------------- rules


def fits(e: MenuEntry, m: int, n: int) -> bool:
    """A cluster of two CTAs along M (N) needs two m-tiles (n-tiles): with one, the second CTA
    of every cluster computes a tile wholly outside the problem (the shipped 2x1 cluster at
    decode)."""
    cm, cn = e.cluster
    km, kn = e.kernel_mn(m, n)
    if e.swap_ab and m > e.tile_n:
        return False  # swap-AB is for a few tokens: all of them in one tile
    return -(-km // e.tile_m) >= cm and -(-kn // e.tile_n) >= cn


def split_candidates(
    e: MenuEntry,
    m: int,
    n: int,
    k: int,
    batch: int,
    sm_count: int,
    acc_dtype: str = "float32",
    batch_invariant: bool = False,
) -> tuple[int, ...]:
    """The split-K counts the tuner times and the policy may choose for entry ``e``.

    Only entries with a split variant (``splits``). Never with an fp16 accumulator:
    ``accumulate=torch.float16`` means one fp16 running sum per element over all of K; split
    partials would each round in fp16 and then add in fp32, a result that changes with the split
    (so with M) and matches neither promise. Never in batch-invariant mode (the split changes the
    summation order). Otherwise s in 2, 4, 8 while every split keeps a k-tile (no empty units)
    and the split units fit ``SPLIT_MAX_WAVES`` waves.
    """
    if not e.splits or acc_dtype != "float32" or batch_invariant:
        return (1,)
    tiles = e.tiles(m, n, batch)
    k_tiles = -(-k // e.tile_k)
    return (1,) + tuple(
        s for s in SPLITS[1:] if s <= k_tiles and tiles * s <= SPLIT_MAX_WAVES * sm_count
    )


def batch_invariant_requested(flag: bool | None = None) -> bool:
    """``flag`` when given, else ``WSGEMM_BATCH_INVARIANT=1`` in the environment (read once, at
    the first call: set it before the process multiplies)."""
    if flag is None:
        return _environment()[0]
    if not isinstance(flag, bool):
        raise TypeError(f"batch_invariant must be a bool or None, got {type(flag).__name__}")
    return flag


@functools.cache
def _environment() -> tuple[bool, str | None]:
    """(batch-invariant by default, table path override), read once per process: ``choose``
    runs for every new call signature, and reading the environment costs a microsecond a
    variable."""
    value = os.environ.get(ENV_BATCH_INVARIANT, "0")
    if value not in ("0", "1", ""):
        raise ValueError(f"{ENV_BATCH_INVARIANT}={value!r}; allowed: 0 or 1")
    return value == "1", os.environ.get(ENV_TABLE) or None


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class TablePoint:
    """One measured problem and what each candidate ran at: (entry, split, cuBLAS time / its
    time), menu entries only."""

    label: str
    m: int
    n: int
    k: int
    batch: int
    ratios: tuple[tuple[str, int, float], ...]


@dataclass(frozen=True)
class Table:
    name: str
    device: str
    sm_count: int
    cc: tuple[int, int]
    source: str
    points: tuple[TablePoint, ...]


def load_table(path: str | Path) -> Table:
    """Read and check a table written by ``scripts/tune_menu.py``. Candidates naming an entry
    not on the menu (a table older than the menu) are left out."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"policy table {path}: cannot read it as JSON ({exc})") from None
    try:
        if raw["schema"] != TABLE_SCHEMA:
            raise ValueError(f"schema {raw['schema']!r}, this wsgemm reads {TABLE_SCHEMA}")
        on_menu = {e.name for e in MENU}
        points = tuple(
            TablePoint(
                label=str(p["label"]),
                m=int(p["m"]),
                n=int(p["n"]),
                k=int(p["k"]),
                batch=int(p.get("batch", 1)),
                ratios=tuple(
                    (str(r["entry"]), int(r["split"]), float(r["ratio"]))
                    for r in p["ratios"]
                    if r["entry"] in on_menu and int(r["split"]) in SPLITS
                ),
            )
            for p in raw["points"]
        )
        cc = tuple(int(v) for v in raw["cc"])
        return Table(path.name, str(raw["device"]), int(raw["sm_count"]), cc, raw["source"], points)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"policy table {path}: malformed ({exc!r})") from None


@functools.cache
def _tables(override: str | None) -> tuple[Table, ...]:
    if override:
        return (load_table(override),)
    folder = resources.files(__package__) / "data"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    return tuple(load_table(Path(str(folder / name))) for name in names)


def _table_for(tables: tuple[Table, ...], sm_count: int, cc: tuple[int, int]) -> Table | None:
    """The table measured on this compute capability with the nearest SM count."""
    same = [t for t in tables if t.cc == cc]
    if not same:
        return None
    return min(same, key=lambda t: abs(math.log2(t.sm_count / sm_count)))


def _features(m: int, n: int, k: int, batch: int, sm_scale: float) -> tuple[float, float, float]:
    blocks = -(-max(m, 1) // M_QUANTUM)
    return math.log2(blocks), math.log2(max(n, 1) * max(batch, 1) * sm_scale), math.log2(max(k, 1))


def _distance(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    return math.sqrt(sum((w * (a - b)) ** 2 for w, a, b in zip(FEATURE_WEIGHTS, x, y, strict=True)))


# ----------------------------------------------------------------------------- choosing


@dataclass(frozen=True)
class Choice:
    """What runs a problem: a menu entry, a split-K count (1: none) and why."""

    menu_entry: MenuEntry
    split: int
    reason: str
    source: str  # "table", "heuristic", "tuned" (WSGEMM_AUTOTUNE, host.autotune) or "empty"


def choose(
    m: int,
    n: int,
    k: int,
    batch: int,
    ab_dtype: str,
    c_dtype: str,
    acc_dtype: str,
    sm_count: int,
    cc: tuple[int, int],
    *,
    batch_invariant: bool | None = None,
) -> Choice:
    """The menu entry and split for ``C (M, N, L) = A (M, K, L) B (K, N, L)`` on an sm_90 GPU
    with ``sm_count`` SMs. Dtypes are the host's names ("float16", ...). ``batch_invariant``
    None reads ``WSGEMM_BATCH_INVARIANT``. Memoized: a repeated problem (M counted in blocks of
    ``M_QUANTUM`` rows) costs a dict lookup; a new one a table search."""
    if not isinstance(m, int) or isinstance(m, bool):
        raise TypeError(f"m must be an int, got {type(m).__name__}")
    if m < 0:
        raise ValueError(f"m={m}; it must be >= 0")
    invariant = batch_invariant_requested(batch_invariant)
    # The choice depends on M only through its M_QUANTUM-row blocks (every tile count and rule
    # does): memoize on them, so a new token count in the same block is a hit.
    table = _environment()[1]
    return _choose(
        m_block(m), n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, tuple(cc), invariant, table
    )


def explain(*args: Any, batch_invariant: bool | None = None) -> str:
    """``choose``'s answer for the same arguments, as a few lines a person reads."""
    choice = choose(*args, batch_invariant=batch_invariant)  # checks the arguments first
    return describe(choice, *args, batch_invariant=batch_invariant)


def describe(choice: Choice, *args: Any, batch_invariant: bool | None = None) -> str:
    """``choice`` for ``choose``'s arguments ``args``, as ``explain`` words it."""
    m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc = args
    e = choice.menu_entry
    mode = ", batch-invariant" if batch_invariant_requested(batch_invariant) else ""
    split = f"{choice.split} (in the kernel, fp32 partials)" if choice.split > 1 else "1 (none)"
    return "\n".join(
        [
            f"problem: M={m} N={n} K={k} batch={batch}, {ab_dtype} inputs, {c_dtype} output, "
            f"{acc_dtype} accumulate; sm_{cc[0]}{cc[1]} with {sm_count} SMs{mode}",
            f"kernel: {e.name} (backend {e.backend}: {e.describe()})",
            f"split-K: {split}",
            f"grid: {_grid(choice, m, n, batch, sm_count)}",
            f"why ({choice.source}): {choice.reason}",
        ]
    )


def _grid(choice: Choice, m: int, n: int, batch: int, sm_count: int) -> str:
    """The work units against the SMs (one CTA each): how whole the waves are, which is what
    decides a mid-size problem's speed (docs/perf.md entry 28)."""
    tiles = choice.menu_entry.tiles(m, n, batch)
    if choice.source == "empty" or tiles == 0:
        return "none (an empty problem)"
    if choice.menu_entry.config.get("stream_k"):
        return f"{tiles} tiles for {sm_count} SMs, the last waves' k-tiles shared by all (stream-K)"
    units = tiles * choice.split
    what = f"{tiles} tiles" if choice.split == 1 else f"{tiles} tiles x {choice.split} splits"
    full, rest = divmod(units, sm_count)
    if units <= sm_count:
        fill = f"one wave, {units / sm_count:.0%} of the SMs busy"
    elif rest:
        fill = f"{units / sm_count:.2f} waves, the last {rest / sm_count:.0%} full"
    else:
        fill = f"{full} whole waves"
    return f"{what} for {sm_count} SMs: {fill}"


def _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc) -> None:
    for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch), ("sm_count", sm_count)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < (1 if name == "sm_count" else 0):
            raise ValueError(f"{name}={value}; it must be >= {1 if name == 'sm_count' else 0}")
    dtypes = (ab_dtype, c_dtype, acc_dtype)
    error = dtype_error(*dtypes)
    if error is None and not set(dtypes) <= ELEMENT_BYTES.keys():
        # the split rule compares acc_dtype with "float32": no aliases ("fp32", torch.float32)
        error = f"dtypes by the host's names only: {', '.join(ELEMENT_BYTES)}"
    if error:
        raise ValueError(f"(ab_dtype, c_dtype, acc_dtype)={dtypes}: {error}")
    if cc != (9, 0):
        raise ValueError(
            f"the sm90 menu runs on sm_90 (Hopper) only, got compute capability {cc}; "
            "other GPUs take an sm80 backend"
        )


def candidates(
    m: int,
    n: int,
    k: int,
    batch: int,
    ab_dtype: str,
    c_dtype: str,
    acc_dtype: str,
    sm_count: int,
    cc: tuple[int, int],
    *,
    batch_invariant: bool | None = None,
) -> tuple[tuple[MenuEntry, int], ...]:
    """Every (menu entry, split) ``choose`` may pick for this problem, in menu order: what the
    tuner times (``scripts/tune_menu.py``, ``WSGEMM_AUTOTUNE``). Empty for an empty problem."""
    _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, tuple(cc))
    if m == 0 or n == 0 or k == 0 or batch == 0:
        return ()
    invariant = batch_invariant_requested(batch_invariant)
    allowed = _allowed(m_block(m), n, k, batch, acc_dtype, sm_count, invariant)
    return tuple((entry(name), s) for name, splits in allowed.items() for s in splits)


def _allowed(m, n, k, batch, acc_dtype, sm_count, invariant) -> dict[str, tuple[int, ...]]:
    # Batch invariance needs no filter here: every entry sums in one order (the module's
    # docstring; the GPU test of the bits), so only the split is ruled out (split_candidates).
    entries = [e for e in MENU if fits(e, m, n)]
    if any(e.swap_ab for e in entries):
        entries = [e for e in entries if e.swap_ab]  # decode is swap-AB's (rule 1)
    return {
        e.name: split_candidates(e, m, n, k, batch, sm_count, acc_dtype, invariant) for e in entries
    }


@functools.lru_cache(maxsize=4096)
def _choose(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table_path):
    _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc)
    if m == 0 or n == 0 or k == 0 or batch == 0:
        return Choice(MENU[0], 1, "empty problem: no kernel runs", "empty")
    allowed = _allowed(m, n, k, batch, acc_dtype, sm_count, invariant)
    notes = _notes(acc_dtype, invariant)
    if allowed and all(entry(name).swap_ab for name in allowed):  # rule 1
        widest = max(entry(name).tile_n for name in allowed)
        notes = f"; up to {widest} tokens only the swap-AB entries are candidates{notes}"
    table = _table_for(_tables(table_path), sm_count, cc)
    if table is not None:
        found = _from_table(table, m, n, k, batch, sm_count, allowed)
        if found is not None:
            e, split, why = found
            return Choice(e, split, why + notes, "table")
    e, split, why = _heuristic(m, n, k, batch, sm_count, allowed)
    where = "no table for this GPU" if table is None else f"no {table.name} row within reach"
    return Choice(e, split, f"{where}; {why}{notes}", "heuristic")


def _notes(acc_dtype: str, invariant: bool) -> str:
    if invariant:
        return "; batch-invariant: no split-K, one accumulation order for every M"
    if acc_dtype != "float32":
        return "; no split-K with an fp16 accumulator"
    return ""


def _from_table(table: Table, m, n, k, batch, sm_count, allowed):
    """The best allowed candidate of the nearest measured cell within reach, or None.

    A cell: the measured problems at one distance (1 and 16 tokens of one layer are both one
    ``M_QUANTUM`` block, so they are one cell); a candidate scores its mean ratio over the cell's
    problems that measured it.
    """
    here = _features(m, n, k, batch, table.sm_count / sm_count)
    dist = sorted(
        (_distance(here, _features(p.m, p.n, p.k, p.batch, 1.0)), i)
        for i, p in enumerate(table.points)
    )
    for d, group in itertools.groupby(dist, key=lambda x: round(x[0], 9)):
        if d > MAX_TABLE_DISTANCE:
            return None
        cell = [table.points[i] for _, i in group]
        scores: dict[tuple[str, int], list[float]] = {}
        for p in cell:
            for name, s, r in p.ratios:
                if s in allowed.get(name, ()):
                    scores.setdefault((name, s), []).append(r)
        if not scores:
            continue
        (name, split), ratios = max(scores.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]))
        mean = sum(ratios) / len(ratios)
        labels = ", ".join(p.label for p in cell)
        why = (
            f"{table.name} ({table.device}, {table.sm_count} SMs): nearest measured problems with "
            f"an allowed candidate: {labels} (distance {d:.2f}); there {name} with split {split} "
            f"ran at {mean:.2f}x cuBLAS, the best of {len(scores)} allowed candidates"
        )
        return entry(name), split, why
    return None


def _first_fitting(allowed, *names) -> MenuEntry:
    for name in names:
        if name in allowed:
            return entry(name)
    return entry(next(iter(allowed)))


def _heuristic(m, n, k, batch, sm_count, allowed):
    """The documented fallback (module docstring, rule 3). ``allowed``: entry name -> splits."""
    swaps = [entry(name) for name in allowed if entry(name).swap_ab]
    if swaps:
        e = min(swaps, key=lambda e: e.tile_n)
        why = f"decode: {m} token(s) in a {e.tile_n}-wide swap-AB tile, the weights in its 64 rows"
    elif m <= MIN_TILE_M:
        wide = entry("pingpong-64x256-c1x1")
        tiles = wide.tiles(m, n, batch)
        if tiles >= WIDE_TILE_FILL * sm_count:
            e = _first_fitting(allowed, wide.name)
            why = f"decode: {tiles} 64x256 tiles fill {tiles / sm_count:.0%} of {sm_count} SMs"
        else:
            e = _first_fitting(allowed, "pingpong-64x128-c1x2", wide.name)
            why = f"decode: only {tiles} 64x256 tiles for {sm_count} SMs, so 64x128 tiles"
    elif m <= 128:
        e = _first_fitting(allowed, "cooperative-128x128-c1x2", "pingpong-64x256-c1x1")
        why = "one 128-row tile: 128x128 tiles, no cluster partner along M"
    else:
        large = entry("sm90")
        tiles = large.tiles(m, n, batch)
        if tiles >= LARGE_TILE_WAVES * sm_count:
            e = _first_fitting(allowed, "sm90", "sm90-pingpong")
            why = f"{tiles} 128x256 tiles make {tiles / sm_count:.1f} waves"
        else:
            e = _first_fitting(allowed, "sm90-pingpong", "sm90")
            why = f"only {tiles} 128x256 tiles ({tiles / sm_count:.1f} waves): 128x128 ping-pong"
    tiles = e.tiles(m, n, batch)
    splits = [
        s
        for s in allowed[e.name]
        if s > 1 and tiles * s <= sm_count and k // s >= HEURISTIC_MIN_K_PER_SPLIT
    ]
    split = max(splits, default=1)
    if split > 1:
        why += f"; {tiles} tiles leave SMs idle and K={k} splits {split} ways"
    return e, split, why
