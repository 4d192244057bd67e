"""The sm90 menu: a small, fixed set of kernel configs ``auto`` chooses from on Hopper.

Why a menu: no one tile serves both ends of an LLM's GEMMs. At decode (1-64 tokens) the shipped
128x256 tile with a 2x1 cluster has one m-tile, so each cluster's second CTA computes a tile that
lies wholly outside the problem and most SMs idle; 64-row and swap-AB tiles do not. At prefill
the shipped tile is as fast as cuBLAS. The menu stays small and fixed because ``warm`` compiles
every entry in all 36 dtype x major variants (``menu_variants``), so an entry joins only with a
measured win: docs/policy.md has each entry's, with its docs/perf.md entry.

Pure Python on purpose: importing this module imports neither torch nor the DSL. An entry is a
backend name and a dict of its config's fields; ``MenuEntry.variant_config`` builds the kernel's
config through the registry only when asked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from ..registry import BACKENDS, Variant, every_variant

__all__ = [
    "MENU",
    "MIN_TILE_M",
    "M_QUANTUM",
    "SPLITS",
    "SWAP_DECODE_MAX_N",
    "MenuEntry",
    "entry",
    "m_block",
    "menu_variants",
]

# The split-K counts a split variant may launch (a launch argument, not a compile).
SPLITS = (1, 2, 4, 8)
#: The widest decode swap-AB tile (tokens in its N): such a tile takes all of a call's tokens in
#: one tile or does not fit. Wider swap-AB tiles (64 and up, ``scripts/tune_menu.py``'s
#: candidates for 129-1024 tokens, docs/perf.md entry 48) tile the tokens as any N: their
#: token tile can be sized to M more closely than a 64- or 128-row tile.
SWAP_DECODE_MAX_N = 32


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

    @classmethod
    def of(
        cls, name: str, backend: str, shipped: bool = False, splits: bool = False, **fields
    ) -> MenuEntry:
        """An entry with these config fields (the menu's, and the tuner's dropped ones)."""
        fields.setdefault("swap_ab", False)  # a swap-AB entry says so; the others run A @ B
        fields.setdefault("stream_k", False)  # only dropped entries run stream-K (perf.md 28)
        return cls(name, backend, tuple(sorted(fields.items())), shipped, splits)

    def __hash__(self) -> int:
        # by name alone (equal entries share it): the policy's caches key on entries, and the
        # generated hash would walk every field each time
        return hash(self.name)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.fields)

    # The fields the policy reads for every candidate of every new problem, read once (an entry
    # is frozen; functools.cached_property writes the instance's __dict__ directly).
    @functools.cached_property
    def tile_m(self) -> int:
        return self.config["tile_m"]

    @functools.cached_property
    def tile_n(self) -> int:
        return self.config["tile_n"]

    @functools.cached_property
    def tile_k(self) -> int:
        return self.config["tile_k"]

    @functools.cached_property
    def cluster(self) -> tuple[int, int]:
        return self.config["cluster_m"], self.config["cluster_n"]

    @functools.cached_property
    def swap_ab(self) -> bool:
        """The entry runs the swapped problem C^T (N, M) = B^T A^T: N along its tile's M."""
        return bool(self.config.get("swap_ab", False))

    @functools.cached_property
    def wide_swap(self) -> bool:
        """A swap-AB tile wider than the decode ones (``SWAP_DECODE_MAX_N``): measured, and
        run, only with fp32 accumulators and the inputs' dtype out (``runs_dtypes``)."""
        return self.swap_ab and self.tile_n > SWAP_DECODE_MAX_N

    def runs_dtypes(self, ab_dtype: str, c_dtype: str, acc_dtype: str) -> bool:
        """Whether ``auto`` runs this entry in these dtypes (so ``warm`` compiles them): a wide
        swap-AB tile only with fp32 accumulators and C in the inputs' dtype, where it was
        measured (docs/perf.md entry 51; its other dtype variants also spill registers: the
        ``-m sweep`` run); every other entry in all of them."""
        return not self.wide_swap or (acc_dtype == "float32" and c_dtype == ab_dtype)

    def kernel_mn(self, m: int, n: int) -> tuple[int, int]:
        """The (M, N) the kernel sees: the problem's, or swapped."""
        return (n, m) if self.swap_ab else (m, n)

    def tile_counts(self, m: int, n: int) -> tuple[int, int]:
        """The output tiles along the kernel's M and N that hold part of an (M, N) product."""
        km, kn = self.kernel_mn(m, n)
        return -(-km // self.tile_m), -(-kn // self.tile_n)

    def tiles(self, m: int, n: int, batch: int) -> int:
        """The work units of a launch without split: output tiles, each side rounded up to
        whole clusters (a cluster that overhangs a ragged edge still runs all its CTAs)."""
        cm, cn = self.cluster
        # as kernels.common.scheduler.cluster_tile_counts, which this module cannot import
        # (it imports the DSL, and the policy runs in processes that never load it)
        tiles_m, tiles_n = self.tile_counts(m, n)
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


_of = MenuEntry.of

# The menu: one line each on what an entry is for; its measured win (H200, fp16 TN, against
# cuBLAS) and its docs/perf.md entry are its row in docs/policy.md.
MENU: tuple[MenuEntry, ...] = (
    # Prefill: the shipped large tile.
    _of("sm90", "sm90", True, tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1,
        schedule="cooperative"),
    # 1024 tokens, where the large tile makes less than two waves (qkv, o, down).
    _of("sm90-pingpong", "sm90-pingpong", True, tile_m=128, tile_n=128, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="pingpong"),
    # 17-64 tokens with many n-tiles (gate/up).
    _of("pingpong-64x256-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=256,
        tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong"),
    # 17-64 tokens with few n-tiles (qkv, o, down; split on the K-heavy ones).
    _of("pingpong-64x128-c1x2", "sm90-pingpong", splits=True, tile_m=64, tile_n=128,
        tile_k=64, cluster_m=1, cluster_n=2, schedule="pingpong"),
    # One 128-row tile of tokens, no cluster partner along M (split on the down projections).
    _of("cooperative-128x128-c1x2", "sm90", splits=True, tile_m=128, tile_n=128, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="cooperative"),
    # 128 tokens as cuBLAS tiles them: two 64-row token tiles of one weight tile in a cluster,
    # so the weights' tile (most of the bytes) is multicast to both CTAs.
    _of("pingpong-64x64-c2x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=64,
        tile_k=64, cluster_m=2, cluster_n=1, schedule="pingpong"),
    _of("pingpong-64x128-c2x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=128,
        tile_k=64, cluster_m=2, cluster_n=1, schedule="pingpong"),
    # Swap-AB up to 16 tokens: the weights' N in 64-row WGMMAs, the tokens a 16-wide tile;
    # 128-deep k-tiles (half the ring stages, twice the bytes each) read the weights faster.
    _of("swap-pingpong-64x16x128-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=16,
        tile_k=128, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Swap-AB at 17-32 tokens, where a 64-row token tile is half empty (perf.md entry 33).
    _of("swap-pingpong-64x32-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=32,
        tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Swap-AB up to 8 tokens, as cuBLAS's 64x8: an eighth of the 16-wide tile's wasted MMAs.
    _of("swap-pingpong-64x8x128-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=8,
        tile_k=128, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Wave-fitting widths, as cuBLAS's odd tiles on mid-size problems: a width that makes the
    # tile count a whole number of waves, or one wave of wider tiles.
    *(_of(f"cooperative-128x{w}-c2x1", "sm90", tile_m=128, tile_n=w, tile_k=64,
          cluster_m=2, cluster_n=1, schedule="cooperative") for w in (160, 192, 224)),
    # 256 rows (each warpgroup two 64-row WGMMA bands), 160 wide: one or two whole waves on
    # mid-size problems and on 70B qkv at 1024 tokens.
    _of("cooperative-256x160-c1x2", "sm90", tile_m=256, tile_n=160, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="cooperative"),
    # 70B qkv at 128 tokens: N = 10240 in 160-wide tiles is 128 CTAs, one wave.
    _of("pingpong-64x160-c2x1", "sm90-pingpong", tile_m=64, tile_n=160, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="pingpong"),
    # Gate/up at 128 tokens: the tokens' 128x256 tile multicast to the cluster's two weight tiles.
    _of("cooperative-128x256-c1x2", "sm90", tile_m=128, tile_n=256, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="cooperative"),
    # 129-1024 tokens: swap-AB with the tokens in one or two wide N tiles (266 tokens: 320 rows
    # of 160-wide tiles where 128-row ones take 384), the weights' N giving the CTAs; widths in
    # steps of 16 where 32 leaves a tile mostly empty (144 for 266-288 tokens).
    *(_of(f"swap-cooperative-128x{w}-c2x1", "sm90", tile_m=128, tile_n=w, tile_k=64,
          cluster_m=2, cluster_n=1, schedule="cooperative", swap_ab=True)
      for w in (96, 144, 160, 192, 208, 224)),
)  # fmt: skip
_BY_NAME = {e.name: e for e in MENU}
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
    """The menu entry called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"no menu entry {name!r}; the menu: {', '.join(e.name for e in MENU)}"
        ) from None


def menu_variants(arch: str = "sm_90a", entries: tuple[MenuEntry, ...] = MENU) -> list[Variant]:
    """Every variant ``warm`` compiles for the menu: each entry in every A/B, C and accumulator
    dtype and both majors of A and B (36 per entry; a wide swap-AB entry only in the dtypes
    ``auto`` runs it in, 8: ``MenuEntry.runs_dtypes``), and each entry with ``splits`` once more
    as its split-K variant with an fp32 accumulator (24 more; fp16 accumulators never split).
    The shipped entries' variants are exactly the shipped backends' own."""
    out = []
    for e in entries:
        variants = every_variant(e.backend, arch, e.variant_config())
        if e.splits:
            split = every_variant(e.backend, arch, e.variant_config(split=True))
            variants += [v for v in split if v.acc_dtype == "float32"]
        out += [v for v in variants if e.runs_dtypes(v.ab_dtype, v.c_dtype, v.acc_dtype)]
    return out
