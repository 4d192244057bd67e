"""The Hopper (sm_90a) kernel's static configuration and its budgets.

``Sm90Config`` (CTA tile, cluster, schedule; validated eagerly), the shipped configs, and the
shared-memory and register budgets (plain Python on static tile facts, so the numbers can be
tested without a GPU; each function says where its number comes from).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from wsgemm.kernels.common.budget import barrier_bytes, register_budget
from wsgemm.support import (
    REGISTERS_PER_SM,
    SETMAXNREG_MAX,
    SETMAXNREG_MIN,
    SETMAXNREG_STEP,
    SWIZZLE_ATOM_BYTES,
    THREADS_PER_WARPGROUP,
    WARPS_PER_WARPGROUP,
    smem_per_block,
)

__all__ = [
    "CLUSTER_SPLITS",
    "EPI_TILE_N",
    "NUM_CONSUMER_WARPGROUPS",
    "LOADER_WARP",
    "PRODUCER_WARP",
    "DEFAULT_RASTER_GROUP",
    "SCHEDULES",
    "SHIPPED_CONFIGS",
    "SM90_REGISTERS_PER_SM",
    "SM90_SMEM_CAPACITY",
    "SMEM_BUFFER_ALIGN",
    "STATIC_SMEM_BYTES",
    "THREADS_PER_CTA",
    "SWAP_TILE_N_CHOICES",
    "TILE_N_CHOICES",
    "TRACED_PRODUCER_REGISTERS",
    "WGMMA_K",
    "WGMMA_M",
    "Sm90Config",
    "check_raster_group",
    "epilogue_stage_bytes",
    "mainloop_stage_bytes",
    "register_split",
    "reserved_smem_bytes",
    "shipped_config",
    "stage_counts",
]

SCHEDULES = ("cooperative", "pingpong")
# Two consumer warpgroups (0 and 1) and one producer warpgroup (2).
NUM_CONSUMER_WARPGROUPS = 2
PRODUCER_WARPGROUP = NUM_CONSUMER_WARPGROUPS
PRODUCER_WARP = PRODUCER_WARPGROUP * WARPS_PER_WARPGROUP
# A cooperative dgated tile's loader warp (``Sm90Gemm.dgated_loader``): the producer warpgroup's
# second.
LOADER_WARP = PRODUCER_WARP + 1
THREADS_PER_CTA = (NUM_CONSUMER_WARPGROUPS + 1) * THREADS_PER_WARPGROUP
# One WGMMA atom covers 64 rows of M and k = 16 for 16-bit inputs.
WGMMA_M = 64
WGMMA_K = 16
# Output subtile width: a 32-column strip keeps the epilogue's smem buffers small enough that
# the mainloop ring keeps its stages (a narrower tile is one subtile wide).
EPI_TILE_N = 32
# WGMMA takes N = 8..256 in steps of 8; the epilogue's st.matrix x4 covers 16 columns of a warp's
# accumulators (x2 for the 8-wide tile). The narrow ones (8, 16, 32) are for swap-AB, where the
# tile's N is a few tokens (C^T = B^T A^T: the weights fill the 64-row M slot); 8 only there.
# The odd multiples of 32 (96, 160, 224) size a tile count to whole waves (docs/perf.md entry
# 28); an N-major B takes 64-byte swizzle atoms there (the 128-byte atom is 64 columns wide).
TILE_N_CHOICES = (8, 16, 32, 64, 96, 128, 160, 192, 224, 256)
# Swap-AB's token tiles also come in steps of 16 from 96 (a token count's tiles sized to it:
# 266 tokens are 2 x 144 rows, not 2 x 160; docs/perf.md entry 64); their epilogue subtiles are
# 16 columns wide where 32 does not divide the tile.
SWAP_TILE_N_CHOICES = tuple(sorted({*TILE_N_CHOICES, *range(96, 257, 16)}))


#: A cluster split's ways (``Sm90Config.cluster_split``; 1: off): at most 8 CTAs in a portable
#: cluster, and rank 0's receive buffers, (ways - 1) fp32 tiles, must leave the ring its stages.
CLUSTER_SPLITS = (1, 2, 4)


#: Semaphores per split tile: its units' arrivals, then its stored partials (``split_k.fixup``).
SEMAPHORES_PER_TILE = 2
#: A TMA descriptor's size (and alignment) in global memory, and the fp32 workspace words each
#: CTA of a ragged-K grouped kernel keeps its A and B descriptors in (``ragged_k.py``).
TMA_DESCRIPTOR_BYTES = 128
RAGGED_K_WORDS_PER_CTA = 2 * TMA_DESCRIPTOR_BYTES // 4


@dataclass(frozen=True)
class Sm90Config:
    """Static shape of the kernel.

    ``tile_m x tile_n x tile_k``: CTA tile; ``cluster_m x cluster_n``: CTAs per cluster (a
    cluster along M multicasts B, along N multicasts A); ``schedule``: "cooperative" (both
    consumer warpgroups on one tile, half its rows each: one 64-row WGMMA band of a 128-row
    tile, two of a 256-row one) or "pingpong" (each warpgroup owns whole tiles, alternating).
    Every field changes the compiled code; the raster group, which does not, is a launch
    argument (``Sm90Gemm._call``; :data:`DEFAULT_RASTER_GROUP`).

    ``split_k``: split-K inside the kernel. 1 (the default, every shipped config): the kernel
    has no split path, and compiles to the code it had before split-K existed. Any other value
    compiles the split path, whose split count is a launch argument (``split_count``), so every
    count shares one compiled kernel: 0 is that kernel's own name (what the host compiles and
    caches, :meth:`compiled`), and a count n >= 2 is what a caller passes as
    ``wsgemm.matmul(..., config=...)`` to run K split n ways.
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    cluster_m: int = 1
    cluster_n: int = 1
    schedule: str = "cooperative"
    # Swap-AB: the host runs this config on the swapped problem C^T (N, M) = B^T A^T, so the
    # weights' N fills the tile's M (64- or 128-row WGMMAs) and a few tokens its N; the kernel
    # then writes an M-major C (the caller's row-major C, transposed; no copy).
    swap_ab: bool = False
    split_k: int = 1
    # Stream-K (``scheduler`` module docstring): the split kernel with the stream-K schedule,
    # whole waves of tiles and then the last partial wave's k-tiles shared evenly by every
    # cluster. Compiled as ``split_k=0``; the launch's split count is not used.
    stream_k: bool = False
    # Stream-K in teams (``scheduler.stream_k_team``): the clusters that share a B column block
    # (the cluster rows, where one raster group holds them) take one range over the shared
    # columns together, member r in row r, so they read each B slice at the same step; the
    # plain layout starts their ranges at different k, and B comes from DRAM once per cluster
    # row (docs/perf.md entry 105). Needs ``stream_k``.
    stream_k_teams: bool = False
    # Cluster split-K (``cluster_split.py``): K split ``cluster_split`` ways over the CTAs of a
    # cluster (2 or 4; 1: off), CTA r of a cluster taking split r of every tile the cluster
    # runs; the partial sums go to rank 0 through distributed shared memory (no workspace, no
    # flags in global memory), which sums them in split order and runs the epilogue. The CTAs
    # of a cluster run together, so no unit waits on one that is not resident. Needs no other
    # cluster (``cluster_m = cluster_n = 1``: no multicast) and no other split.
    cluster_split: int = 1

    def __post_init__(self):
        if not isinstance(self.split_k, int) or isinstance(self.split_k, bool) or self.split_k < 0:
            raise ValueError(
                "split_k must be an int: 1 (no split), n >= 2 (K split n ways) or 0 (the "
                f"split kernel, count given at launch), got {self.split_k!r}"
            )
        if not isinstance(self.stream_k, bool):
            raise ValueError(f"stream_k must be a bool, got {self.stream_k!r}")
        if not isinstance(self.stream_k_teams, bool):
            raise ValueError(f"stream_k_teams must be a bool, got {self.stream_k_teams!r}")
        if self.stream_k_teams and not self.stream_k:
            raise ValueError("stream_k_teams lays out stream-K's shared work: it needs stream_k")
        if self.stream_k and self.split_k not in (0, 1):
            raise ValueError(
                f"stream_k=True chooses its own splits: leave split_k at 1 (or 0), got "
                f"{self.split_k}"
            )
        if self.cluster_split not in CLUSTER_SPLITS or isinstance(self.cluster_split, bool):
            raise ValueError(
                f"cluster_split must be one of {CLUSTER_SPLITS} (1: off), got "
                f"{self.cluster_split!r}"
            )
        if self.cluster_split > 1 and (
            self.split_k != 1 or self.stream_k or self.cluster_m != 1 or self.cluster_n != 1
        ):
            raise ValueError(
                "cluster_split splits K over the CTAs of a cluster of its own: it takes "
                "cluster_m = cluster_n = 1 (no multicast) and no split_k or stream_k; got "
                f"cluster {self.cluster_m}x{self.cluster_n}, split_k={self.split_k}, "
                f"stream_k={self.stream_k}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        allowed_m = (128, 256) if self.schedule == "cooperative" else (64, 128)
        if self.tile_m not in allowed_m:
            raise ValueError(
                f"{self.schedule} tile_m must be one of {allowed_m}, got {self.tile_m}"
            )
        choices = SWAP_TILE_N_CHOICES if self.swap_ab else TILE_N_CHOICES
        if self.tile_n not in choices:
            raise ValueError(
                f"tile_n must be one of {', '.join(map(str, choices))}"
                f"{' (swap-AB)' if self.swap_ab else ''}, got {self.tile_n}"
            )
        if self.tile_n == 8 and not self.swap_ab:
            raise ValueError(
                "tile_n=8 is the swap-AB decode tile (its M-major store, st.matrix x2): set "
                "swap_ab=True, or take tile_n >= 16"
            )
        if self.tile_k not in (32, 64, 128):
            raise ValueError(f"tile_k must be one of 32, 64, 128, got {self.tile_k}")
        if self.schedule == "pingpong" and self.tile_m * self.tile_n > 128 * 128:
            # One warpgroup holds the whole tile: 128 fp32 accumulators per thread at most,
            # or the 232-register budget spills.
            raise ValueError(
                f"pingpong tile {self.tile_m}x{self.tile_n} is too large: one warpgroup holds it, "
                "so tile_m * tile_n must be <= 16384"
            )
        if not self.pingpong and self.tile_m * self.tile_n > 256 * 160:
            # Two warpgroups hold the tile: 160 fp32 accumulators per thread at most (256x160
            # compiles spill-free in every variant, tests/host/test_policy.py's sweep).
            raise ValueError(
                f"cooperative tile {self.tile_m}x{self.tile_n} is too large: two warpgroups "
                "hold it, so tile_m * tile_n must be <= 40960"
            )
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
            raise ValueError(
                "cluster_m and cluster_n must each be 1 or 2, "
                f"got {self.cluster_m}x{self.cluster_n}"
            )

    def __repr__(self) -> str:
        # The compile cache keys a variant by this repr: a config at the defaults of the fields
        # added later keeps the key it had before they existed.
        later = {"cluster_split": 1, "stream_k_teams": False}
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name not in later or getattr(self, f.name) != later[f.name]
        ]
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def pingpong(self) -> bool:
        return self.schedule == "pingpong"

    @property
    def splits_in_kernel(self) -> bool:
        """Whether the kernel has the split-K path (the count comes with each launch, or the
        stream-K schedule chooses the splits)."""
        return self.split_k != 1 or self.stream_k

    def compiled(self) -> Sm90Config:
        """The config the kernel is compiled from: a split count is a launch argument, so every
        ``split_k`` other than 1 compiles (and is cached) as ``split_k=0``."""
        return replace(self, split_k=0) if self.splits_in_kernel else self

    def split_workspace_elements(self, m: int, n: int, batch: int, splits: int) -> int:
        """fp32 words of the split-K workspace of an (M, N, L) problem split ``splits`` ways
        (the count the kernel runs, ``scheduler.effective_splits``): one tile of partial sums
        per work unit of a tile inside C (the unit that finishes a tile keeps its own in
        registers and leaves its slot unused unless it is a tile's third part or later, which
        it stores and reads back: which unit finishes is known only at run time)."""
        return self.split_tiles(m, n, batch) * splits * self.tile_m * self.tile_n

    def stream_k_workspace_elements(
        self, m: int, n: int, k: int, batch: int, max_active_clusters: int
    ) -> int:
        """fp32 words of a stream-K launch's workspace: ``scheduler.stream_k_slots`` partial
        tiles per stream-K tile and CTA (each unit of a tile shared by several clusters stores
        its partial; whole tiles store none)."""
        from wsgemm.kernels.common.scheduler import stream_k_slots

        work, k_tiles, team = self.stream_k_problem(m, n, k, batch, max_active_clusters)
        tiles, per_tile = stream_k_slots(work, k_tiles, max_active_clusters, team)
        return tiles * self.cluster_size * per_tile * self.tile_m * self.tile_n

    def stream_k_problem(
        self, m: int, n: int, k: int, batch: int, max_active_clusters: int
    ) -> tuple[int, int, int]:
        """(cluster tiles, k-tiles, team) a stream-K launch of this config lays out
        (``scheduler.stream_k_layout``) on (M, N, K, batch): the team 1 without
        ``stream_k_teams``, else the one the kernel forms (``scheduler.stream_k_team``) under
        the default raster group, which every split launch passes
        (``host.workspace.split_launcher``)."""
        from wsgemm.kernels.common.scheduler import (
            cluster_tile_counts,
            group_rows,
            stream_k_layout,
            stream_k_team,
        )

        clusters_m, clusters_n = cluster_tile_counts(
            -(-m // self.tile_m), -(-n // self.tile_n), self.cluster_m, self.cluster_n
        )
        work, k_tiles = clusters_m * clusters_n * batch, -(-k // self.tile_k)
        if not self.stream_k_teams:
            return work, k_tiles, 1
        launched = stream_k_layout(work, k_tiles, max_active_clusters)[0]
        rows = group_rows(DEFAULT_RASTER_GROUP[self.schedule], self.cluster_m)
        return work, k_tiles, stream_k_team(clusters_m, rows, launched)

    def split_tiles(self, m: int, n: int, batch: int) -> int:
        """Output tiles inside C."""
        return -(-m // self.tile_m) * -(-n // self.tile_n) * batch

    def split_semaphores(self, m: int, n: int, batch: int) -> int:
        """int32 semaphores of a split-K or stream-K launch: two per output tile inside C (the
        units that arrived, the partials stored: ``split_k.fixup``)."""
        return SEMAPHORES_PER_TILE * self.split_tiles(m, n, batch)

    @property
    def cluster_size(self) -> int:
        """CTAs per cluster: the multicast cluster's, or a cluster split's."""
        return self.cluster_m * self.cluster_n * self.cluster_split

    @property
    def split_units(self) -> int:
        """Consumer units holding one tile's accumulators each: both warpgroups together
        (cooperative), or each warpgroup alone (ping-pong)."""
        return NUM_CONSUMER_WARPGROUPS if self.pingpong else 1

    def cluster_split_bytes(self) -> int:
        """Shared memory a cluster split takes beside the ring: rank 0's receive buffers, one
        fp32 tile of partial sums per other rank and consumer unit (every rank holds the same
        layout; only rank 0's is written)."""
        if self.cluster_split == 1:
            return 0
        tile_bytes = self.tile_m * self.tile_n * 4
        return (self.cluster_split - 1) * self.split_units * tile_bytes

    def k_tiles_for_every_rank(self, k: int) -> bool:
        """Whether K gives every rank of a cluster split a k-tile (a rank without one would wait
        for a stage nobody loads: ``cluster_split.py``); True without a cluster split."""
        return self.cluster_split <= max(-(-k // self.tile_k), 1)

    def cluster_split_fits(self, ab_bytes: int = 2, c_bytes: int = 2) -> bool:
        """Whether rank 0's receive buffers leave the ring two stages (``stage_counts``, as the
        kernel budgets it) with operands and C of these sizes: else the kernel is refused when
        built."""
        try:
            self.plain_stage_counts(ab_bytes, c_bytes)
        except ValueError:
            return False
        return True

    def plain_stage_counts(self, ab_bytes: int = 2, c_bytes: int = 2) -> tuple[int, int]:
        """(mainloop stages, epilogue buffers) of a kernel whose epilogue reads no C, with
        operands and C of these sizes: a cluster split's receive buffers come off the top, then
        the ring's stages beside at least two buffers (``stage_counts``). ValueError where fewer
        than two stages fit."""
        capacity = SM90_SMEM_CAPACITY - self.cluster_split_bytes()
        ab = mainloop_stage_bytes(self.tile_m, self.tile_n, self.tile_k, ab_bytes)
        epi = epilogue_stage_bytes(*self.epi_tile, c_bytes)
        return stage_counts(ab, epi, self.num_epi_subtiles, capacity)

    @property
    def epi_tile(self) -> tuple[int, int]:
        """Output subtile: the rows of one WGMMA step of every consumer warpgroup, in the order
        the accumulators hold them (kernel.epilogue_subtile_order): 128 for cooperative (both
        warpgroups' 64-row bands write one buffer; a 256-row tile has two such steps), one
        64-row band for ping-pong (one warpgroup writes it)."""
        rows = WGMMA_M if self.pingpong else NUM_CONSUMER_WARPGROUPS * WGMMA_M
        width = min(EPI_TILE_N, self.tile_n)
        return (rows, width if self.tile_n % width == 0 else EPI_TILE_N // 2)

    @property
    def num_epi_subtiles(self) -> int:
        return (self.tile_m // self.epi_tile[0]) * (self.tile_n // self.epi_tile[1])


SHIPPED_CONFIGS = {
    "sm90": Sm90Config(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, schedule="cooperative"),
    "sm90-pingpong": Sm90Config(
        tile_m=128, tile_n=128, tile_k=64, cluster_m=2, schedule="pingpong"
    ),
}

#: The raster group a launch uses when it passes none (``raster_group=0``), per schedule:
#: m-tiles walked down a column before the next column. Cooperative 16: its ~132 tiles in
#: flight cover a square footprint of A rows and B columns (docs/perf.md, entry 2).
DEFAULT_RASTER_GROUP = {"cooperative": 16, "pingpong": 8}


def check_raster_group(raster_group: int, config: Sm90Config) -> int:
    """A launch's raster group: 0 (the schedule's default) or a positive multiple of
    ``cluster_m`` (a group holds whole clusters). Returns the group the kernel will use."""
    if raster_group == 0:
        return DEFAULT_RASTER_GROUP[config.schedule]
    if (
        not isinstance(raster_group, int)
        or raster_group < 1
        or raster_group % config.cluster_m != 0
    ):
        raise ValueError(
            f"raster_group must be 0 (the default) or a positive multiple of cluster_m "
            f"({config.cluster_m}), got {raster_group!r}"
        )
    return raster_group


def shipped_config(name: str, acc_dtype=None) -> Sm90Config:
    """The shipped config of kernel ``name`` (the same for both accumulator dtypes)."""
    if name not in SHIPPED_CONFIGS:
        raise ValueError(f"no sm90 kernel named {name!r}; known: {sorted(SHIPPED_CONFIGS)}")
    return SHIPPED_CONFIGS[name]


# ----------------------------------------------------------------------------------------------
# Budgets

# The largest dynamic shared memory one block may opt into on sm_90 (227 KiB).
SM90_SMEM_CAPACITY = smem_per_block("sm_90a")
SM90_REGISTERS_PER_SM = REGISTERS_PER_SM
# ptxas gives a kernel whose dynamic smem is 1 KiB-aligned a 1 KiB static smem section (seen in
# the cubin); it counts against the same per-block limit, so the budget keeps it free.
STATIC_SMEM_BYTES = 1024
# Swizzled TMA/WGMMA buffers start on 1 KiB boundaries (the 128B swizzle pattern repeats
# every 1024 bytes, and the descriptors assume the pattern starts at the buffer).
SMEM_BUFFER_ALIGN = SWIZZLE_ATOM_BYTES
# The epilogue keeps at least this many smem buffers so one TMA store can drain while the next
# subtile is written; more are added only from smem the mainloop ring cannot use.
MIN_EPILOGUE_STAGES = 2
MAX_EPILOGUE_STAGES = 4
# The most epilogue buffers a cooperative dgated tile takes, in pairs: its loader warp loads
# each pair's pre-activation into the two its stores then use (a ping-pong dgated tile takes
# one for every output subtile, all loaded at its epilogue's start: ``Sm90Gemm.stage_counts``).
# Eight, and an L2 prefetch of each tile's pre-activation as its mainloop starts (entries 87
# and 89), timed slower on an H100 than four without it, the store warp then loading (entry
# 97); the prefetch is deleted (git keeps it).
DGATED_MAX_EPILOGUE_STAGES = 4
# The producer warpgroup only issues TMA and walks the schedule (a few divisions per tile);
# 40 registers hold that without spilling, the rest goes to the accumulators.
PRODUCER_REGISTERS = 40
# A traced producer also keeps its recorder (row pointer, capacity, shared slot) and builds one
# event of eight words: 8 more. The consumers then get 224 of the CTA's pool (register_split).
TRACED_PRODUCER_REGISTERS = 48


def mainloop_stage_bytes(tile_m: int, tile_n: int, tile_k: int, ab_bytes: int) -> int:
    """One ring stage holds an A tile (tile_m x tile_k) and a B tile (tile_n x tile_k)."""
    return (tile_m + tile_n) * tile_k * ab_bytes


def epilogue_stage_bytes(epi_m: int, epi_n: int, c_bytes: int) -> int:
    """One epilogue buffer holds one output subtile in the output dtype."""
    return epi_m * epi_n * c_bytes


def reserved_smem_bytes(ab_stages_upper_bound: int = 64) -> int:
    """The mbarrier pairs (full + empty, 8 bytes each, per stage) sit before the first swizzled
    buffer, which starts at the next 1 KiB boundary: one alignment unit covers them."""
    return -(-barrier_bytes(ab_stages_upper_bound) // SMEM_BUFFER_ALIGN) * SMEM_BUFFER_ALIGN


def stage_counts(
    ab_stage_bytes: int,
    epi_stage_bytes: int,
    num_epi_subtiles: int,
    capacity: int = SM90_SMEM_CAPACITY,
    max_epi: int = MAX_EPILOGUE_STAGES,
) -> tuple[int, int]:
    """(mainloop stages, epilogue stages) that fit in ``capacity`` bytes of shared memory
    (less the static section).

    The mainloop ring gets every stage that fits beside the barriers and the minimum epilogue
    buffers (deeper rings hide more TMA latency); epilogue buffers then take what is left, up to
    ``max_epi`` (``MAX_EPILOGUE_STAGES``) and never more than there are subtiles in a tile.
    """
    min_epi = min(MIN_EPILOGUE_STAGES, num_epi_subtiles)
    capacity -= STATIC_SMEM_BYTES
    free = capacity - reserved_smem_bytes() - min_epi * epi_stage_bytes
    ab_stages = free // ab_stage_bytes
    if ab_stages < 2:
        raise ValueError(
            f"a {ab_stage_bytes}-byte mainloop stage leaves room for {ab_stages} stage(s) in "
            f"{capacity} bytes of shared memory; at least 2 are needed to overlap load and MMA"
        )
    left = capacity - reserved_smem_bytes() - ab_stages * ab_stage_bytes
    epi_stages = min(max_epi, num_epi_subtiles, left // epi_stage_bytes)
    return ab_stages, epi_stages


def register_split(
    num_consumer_warpgroups: int,
    threads_per_warpgroup: int = THREADS_PER_WARPGROUP,
    producer: int = PRODUCER_REGISTERS,
) -> tuple[int, int]:
    """(producer, consumer) registers per thread after ``setmaxnreg``.

    setmaxnreg moves registers within the CTA's pool (``CTAPOOL`` in the SASS): what the CTA
    was launched with, ``budget.register_budget`` for each of its threads, not the SM's
    64K. The producer warpgroup drops to ``producer`` (``PRODUCER_REGISTERS``; a traced
    kernel's ``TRACED_PRODUCER_REGISTERS``); the consumer warpgroups share what is left of the
    pool equally, rounded down to the step of 8 that setmaxnreg needs. A split that asked for
    more than the pool would leave the consumers' allocation retrying forever (a hang).
    """
    warpgroups = num_consumer_warpgroups + 1
    threads = warpgroups * threads_per_warpgroup
    pool = threads * register_budget(threads)
    consumer = (pool // threads_per_warpgroup - producer) // num_consumer_warpgroups
    consumer = min(SETMAXNREG_MAX, consumer // SETMAXNREG_STEP * SETMAXNREG_STEP)
    if consumer < SETMAXNREG_MIN:
        raise ValueError(f"{num_consumer_warpgroups} consumer warpgroups leave too few registers")
    total = threads_per_warpgroup * (producer + num_consumer_warpgroups * consumer)
    assert total <= pool, (total, pool)
    return producer, consumer
