"""Hopper (sm_90a) warp-specialized persistent GEMM: TMA loads, WGMMA, TMA-store epilogue.

``Sm90Gemm``: the plan, the host entries, the device entry ``kernel`` (setup) and the roles
(``load``; ``mma_and_epilogue``, which runs ``mma`` and ``epilogue`` per tile). Beside it:
``split_k.py``, the split-K/stream-K fix-up the consumers call between the two;
``epilogue_loops.py``, the epilogue's subtile loops (``EpilogueLoops``, inherited); ``traced.py``,
the roles' loops as a kernel built with ``trace=True`` runs them (``TracedLoops``, inherited).
"""

from dataclasses import dataclass, replace
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from wsgemm.kernels.base import GemmKernel
from wsgemm.kernels.common import trace
from wsgemm.kernels.common.arrive import check_arrive_count
from wsgemm.kernels.common.grouped_scheduler import (
    RaggedKScheduler,
    RaggedMScheduler,
    unit_bound,
)
from wsgemm.kernels.common.scheduler import (
    GroupedTileScheduler,
    cluster_tile_counts,
    effective_splits,
    persistent_cluster_count,
    stream_k_layout,
)
from wsgemm.kernels.epilogue import PLAIN, Epilogue
from wsgemm.kernels.sm90 import cluster_split, dgated, ragged, ragged_k, residual, split_k
from wsgemm.kernels.sm90.config import (
    DEFAULT_RASTER_GROUP,
    DGATED_MAX_EPILOGUE_STAGES,
    LOADER_WARP,
    NUM_CONSUMER_WARPGROUPS,
    PRODUCER_REGISTERS,
    PRODUCER_WARP,
    SM90_SMEM_CAPACITY,
    SMEM_BUFFER_ALIGN,
    THREADS_PER_CTA,
    TRACED_PRODUCER_REGISTERS,
    WGMMA_K,
    WGMMA_M,
    Sm90Config,
    epilogue_stage_bytes,
    mainloop_stage_bytes,
    register_split,
    reserved_smem_bytes,
    stage_counts,
)
from wsgemm.kernels.sm90.epilogue_loops import (
    EpilogueLoops,
    _EpilogueArgs,
    epilogue_subtile_order,
)
from wsgemm.kernels.sm90.traced import TracedLoops
from wsgemm.support import (
    THREADS_PER_WARPGROUP,
    VECTOR_BYTES,
    WARP_SIZE,
    WARPS_PER_WARPGROUP,
    check_dtypes,
)
from wsgemm.support import BarrierId as _Barrier
from wsgemm.trace_format import Event, Role

__all__ = ["RECORDERS_PER_CTA", "Sm90Gemm", "epilogue_subtile_order", "mainloop_arrive_terms"]


#: Trace rows per CTA (``base.GemmKernel.traced``): row ``3 * cta + w`` is consumer warpgroup
#: w's (w = 0, 1), row ``3 * cta + 2`` the producer's; CTAs past the rows record nothing.
RECORDERS_PER_CTA = NUM_CONSUMER_WARPGROUPS + 1


def mainloop_arrive_terms(config: Sm90Config) -> dict[str, int]:
    """Why the mainloop's barriers expect the arrivals they do.

    full: the producer's one elected lane arrives once with the stage's byte count; every TMA
    that fills the stage (this CTA's and its multicast peers') then completes bytes on it.
    empty: every consumer warp that reads the stage arrives once (one elected lane) on the
    barrier of each CTA whose TMA writes into this CTA's stage, i.e. on itself and on each
    multicast peer along M and along N.
    """
    return {
        "consumer warpgroups reading each stage": 1 if config.pingpong else NUM_CONSUMER_WARPGROUPS,
        "warps per warpgroup": WARPS_PER_WARPGROUP,
        "arrivals per warp and CTA": 1,
        "CTAs writing each stage (self + M peers + N peers)": config.cluster_m
        + config.cluster_n
        - 1,
    }


#: A gated product loads the weights' gate and up halves of a tile as two TMA boxes into the
#: two halves of the operand's stage; each half is contiguous in shared memory only where a
#: tile's K is one 128-byte swizzle atom (64 16-bit values): with two atoms along K the
#: operand's layout interleaves the halves' atom columns, and a half-tile box's own layout
#: would not match where its atoms go.
GATED_TILE_K = 64
GATED_TILE_K_RULE = (
    f"a gated epilogue needs tile_k={GATED_TILE_K} (each weight half a contiguous half of the "
    "stage: one 128-byte swizzle atom along K)"
)


def gated_swap_refusal(config: Sm90Config, epilogue: Epilogue, trace: bool = False,
                       grouped: str | None = None) -> str | None:  # fmt: skip
    """Why a gated epilogue does not run on swap-AB ``config``, or None where it does.

    Under swap-AB the weights are the product's rows, so a gate row and its up row must sit in
    one thread's accumulators: a ping-pong warpgroup holding a 128-row tile runs two 64-row
    WGMMA bands, and each thread holds the same rows of both (row r of the first band, r + 64
    of the second). So the tile's first band is 64 gate rows and its second the same 64 rows of
    the up projection (two TMA boxes of A per stage), and the output tile is 64 rows. A
    cooperative tile splits its rows between two warpgroups, which hold no such pairs."""
    if not (config.pingpong and config.tile_m == 2 * WGMMA_M):
        return (
            "a gated swap-AB tile is a ping-pong 128-row tile (its two 64-row WGMMA bands the "
            f"gate's and the up projection's rows); got {config}"
        )
    if config.tile_k != GATED_TILE_K:
        return GATED_TILE_K_RULE + f"; got tile_k={config.tile_k}"
    unsupported = {
        "split-K or stream-K": config.splits_in_kernel,
        "tracing": trace,
        "groups": grouped is not None,
        # (its bias, ``[b_gate; b_up]``, runs along the tile's M: the weights' rows)
        "a column bias": epilogue.bias == "col",
        "a preact output": epilogue.preact,
        "alpha, beta or a residual": epilogue.scalars or epilogue.reads_c,
        "a row scale": epilogue.row_scale != "none",
    }
    used = [what for what, on in unsupported.items() if on]
    if used:
        return f"a gated swap-AB tile has no {', '.join(used)} yet; got {epilogue.name}"
    return None


@dataclass(frozen=True)
class Sm90Plan:
    """Static facts fixed when the kernel is traced (tensor majors decide the smem layouts)."""

    config: Sm90Config
    ab_dtype: Any
    c_dtype: Any
    acc_dtype: Any
    ab_stages: int
    epi_stages: int
    producer_regs: int
    consumer_regs: int
    tma_bytes_per_stage: int
    storage: Any
    c_major: Any  # LayoutEnum of C: ROW_MAJOR (N-major) or COL_MAJOR (M-major)
    epilogue: Epilogue = PLAIN  # the fused epilogue (``wsgemm.kernels.epilogue``)

    @property
    def gated_rows(self) -> bool:
        """A gated epilogue on a swap-AB tile: the gate and up projections are the product's
        rows (the weights fill the tile's M), its two 64-row WGMMA bands (``gated_swap``)."""
        return bool(self.epilogue.gated) and self.config.swap_ab

    @property
    def out_tile_n(self) -> int:
        """The output tile's width: the product's, or half of it under a gated epilogue (its
        first half the gate's columns, its second the up projection's)."""
        if self.epilogue.gated and not self.gated_rows:
            return self.config.tile_n // 2
        return self.config.tile_n

    @property
    def out_tile_m(self) -> int:
        """The output tile's height: the product's, or half of it under a gated swap-AB tile
        (its first band the gate's rows, its second the up projection's)."""
        return self.config.tile_m // 2 if self.gated_rows else self.config.tile_m

    @property
    def product_subtiles(self) -> int:
        """Epilogue subtiles of the output tile (``out_tile_m`` x ``out_tile_n``)."""
        epi_m, epi_n = self.config.epi_tile
        return (self.out_tile_m // epi_m) * (self.out_tile_n // epi_n)

    @property
    def out_subtiles(self) -> int:
        """Epilogue subtiles stored per output tile: a dgated epilogue stores two per product
        subtile (its gate half's, then its up half's: ``dgated``)."""
        return self.product_subtiles * (2 if self.epilogue.dgated else 1)

    @property
    def preact_outputs(self) -> int:
        """Subtiles ``preact`` stores beside each output subtile: a gated product's gate and up
        halves (two), a plain one's pre-activation (one); none without ``preact``."""
        if not self.epilogue.preact:
            return 0
        return 2 if self.epilogue.gated else 1

    @property
    def stores_per_tile(self) -> int:
        """TMA stores a tile issues (turns of the epilogue buffers' ring): the output's
        subtiles, and with ``preact`` the pre-activation's subtiles of each as well."""
        return self.out_subtiles * (1 + self.preact_outputs)


@dataclass(frozen=True)
class _LoadArgs:
    """What the producer warp needs: TMA atoms, partitioned tensors and multicast masks."""

    tma_a: Any
    tAgA: Any  # (TMA, tiles_m, k_tiles, L)
    tAsA: Any  # (TMA, stages)
    mask_a: Any
    tma_b: Any
    tBgB: Any  # (TMA, tiles_n, k_tiles, L)
    tBsB: Any  # (TMA, stages)
    mask_b: Any
    k_tiles: Any
    # a grouped kernel's (A's TMA coordinates, this CTA's multicast slice, sA): its tiles'
    # A rows start at their group's first row (``ragged.a_tile``); None for a dense kernel
    ragged_a: Any = None
    # a gated epilogue's second half of B (the up projection's rows, N rows past the gate's):
    # (TMA, tiles_n, k_tiles, L) and (TMA, stages), loaded into the second half of sB
    tBgB_up: Any = None
    tBsB_up: Any = None
    # a ragged-K grouped kernel's (``ragged_k.Descriptors``, A's and B's TMA coordinates, the
    # CTA's cluster coordinates, sA, sB): each unit's views start at its group's first k, its
    # loads go through this CTA's descriptors; None for others
    ragged_k: Any = None
    # a gated swap-AB tile's second half of A (the up projection's rows, M rows past the
    # gate's): (TMA, tiles_m, k_tiles, L) and (TMA, stages), loaded into the second half of sA
    tAgA_up: Any = None
    tAsA_up: Any = None


@dataclass(frozen=True)
class _ConsumerArgs:
    """What the consumer warpgroups take from the kernel's setup."""

    tiled_mma: Any
    sA: Any  # (tile_m, tile_k, stages)
    sB: Any  # (tile_n, tile_k, stages)
    sC: Any  # (epi_m, epi_n, epi_stages)
    tma_c: Any
    mC_mnl: Any  # (M, N, L), TMA's view of C
    k_tiles: Any
    # split_k.SplitLaunch; a cluster split's (mbarriers, receive buffers); None without a split
    split: Any
    bias: Any  # the fused epilogue's bias vector (``plan.epilogue.bias``), or None
    # a grouped kernel's C (rows, N), for its predicated stores
    mC_gmem: Any = None
    scalars: Any = None  # the fused epilogue's (alpha, beta) fp32 values, or None
    # a residual's (TMA load atom, C's TMA coordinates (M, N, L), its first mbarrier), or None
    residual_load: Any = None
    row_scale: Any = None  # the fused epilogue's row scale vector, or None
    # a preact output's (TMA store atom, its coordinates: (M, N, 2) of a gated product's halves,
    # ``dgated.halves``; (M, N, L) of a plain product's), or None
    preact: Any = None


@dataclass(frozen=True)
class _MmaArgs:
    tiled_mma: Any
    tCrA: Any  # (MMA, MMA_M, MMA_K, stages) smem descriptors
    tCrB: Any  # (MMA, MMA_N, MMA_K, stages) smem descriptors
    warpgroup: Any


class Sm90Gemm(TracedLoops, EpilogueLoops, GemmKernel):
    """Persistent warp-specialized GEMM for Hopper: TMA -> smem ring -> WGMMA -> TMA store.

    Roles (384 threads, three warpgroups):
      * producer, warpgroup 2: after ``setmaxnreg`` down to 40 registers, its first warp walks
        the tile schedule and issues the TMA loads of A and B into an S-stage smem ring
        (multicasting the operand its cluster peers share); its other three warps exit, but
        for a cooperative dgated tile's loader warp: its second warp walks the same schedule
        and loads the saved pre-activation into the epilogue's buffers (``dgated_loader``).
      * consumers, warpgroups 0 and 1: ``setmaxnreg`` up, issue WGMMAs from the ring into fp32
        (or fp16) register accumulators, then run the epilogue: convert, store to smem
        subtiles, TMA-store to global. Cooperative: both work on one tile, 64 rows each of
        every 128-row band (a 256-row tile has two).
        Ping-pong: each owns every other tile; ordered barriers let one warpgroup's epilogue
        run while the other issues its mainloop. Under split-K (``config.split_k != 1``) a
        consumer's unit of work is one tile's K range, and ``split_k.fixup`` combines the
        partial sums of a tile's units before the epilogue (docs/architecture.md, "Split-K
        inside the sm90 kernel").
      * traced (``trace=True``): the same roles, recording into a trace buffer; their k-loops
        and the epilogue's subtile loop are ``traced.TracedLoops``' (times staged in lanes),
        the tile-level events are recorded by the roles here.

    Pipelines:
      * mainloop (``PipelineTmaAsync``, S stages), producer -> consumers. full: 1 arrival (the
        producer's elected lane, with the stage's byte count) + the TMA bytes of this CTA and
        its multicast peers. empty: 1 arrival per consumer warp reading the stage (8
        cooperative, 4 ping-pong) from each CTA that writes into the stage
        (``mainloop_arrive_terms``).
      * epilogue store (``PipelineTmaStore``, E buffers), consumers -> TMA unit: bulk-group
        commit per subtile; a buffer is rewritten only after at most E-1 stores are pending.
      * dgated loader warp -> consumers (``dgated_loader``, ``_free_pair``): per epilogue
        buffer a full mbarrier (1 arrival: the loader's expect-tx, + the subtile's bytes) and
        a free one (1 arrival: the store warp's, once its stores have read the buffer).
      * ping-pong order: named barriers MMA_ORDER+wg and EPI_ORDER+wg (256 threads: one
        warpgroup syncs, the other arrives) hand the mainloop and the epilogue back and forth.
      * split-K fix-up (``split_k.py``), unit -> the unit that finishes its tile, through
        global memory: each unit draws a ticket (one thread adds 1 to the tile's arrival
        counter); the one that draws ``parts - 1`` finishes, keeping its partial in registers;
        the others store their fp32 partial into their workspace slot, meet on their epilogue
        barrier, and one thread adds 1 to the tile's stored counter (release, gpu scope). The
        finisher waits (acquire) until the stored counter shows the others: units that drew a
        ticket before it, past their mainloop, so no deadlock whatever is resident. It resets
        both counters to 0.

    Per-role timeline (steady state):
      * producer: per unit, per k-tile of its range: wait empty[s] -> arm full[s] with bytes
        -> TMA A, B. At the end: wait every stage empty (peers may still be reading what it
        multicast).
      * consumer: per unit: [ping-pong: wait MMA turn] -> per k-tile: wait full[s] -> WGMMA ->
        release stage s-1 once its WGMMAs retired -> [ping-pong: pass MMA turn] -> [split-K:
        ticket -> barrier -> last? wait for the stored count, sum the parts in order (its own
        from registers), reset the counters : store partial, barrier, count it, next unit] ->
        [ping-pong: wait epilogue turn] -> per subtile:
        convert -> wait buffer free -> st.shared -> fence -> TMA store -> [ping-pong: drain
        stores, pass epilogue turn; skip the other warpgroup's unit's stages].
    """

    name = "sm90"
    arch = "sm_90a"
    needs_vector_extent = False
    #: None: a dense (batched) GEMM. "m": the ragged-M grouped GEMM (``grouped.py``: its rows
    #: cut into groups by an offsets launch argument, ``ragged.py`` the pieces that differ);
    #: "k": the ragged-K one (its K cut into groups, each group a batch of C; ``ragged_k.py``).
    grouped = None
    # split-K's count and buffers (``_call`` says what they hold); unsplit kernels ignore them
    # and the fused epilogue's bias vector, alpha, beta and C (``epilogue``; kernels without a
    # bias, without ``scale`` and ``residual``, or without ``c_tensor``, ignore them). A row
    # scale is the grouped kernel's only (``grouped.Sm90GroupedGemm``: its launch arguments
    # follow these).
    LAUNCH_EXTRAS = (
        ("split_count", 1), ("workspace", None), ("semaphores", None), ("bias", None),
        ("alpha", None), ("beta", None), ("residual", None),
    )  # fmt: skip

    def __init__(
        self,
        config: Sm90Config,
        ab_dtype,
        c_dtype,
        acc_dtype,
        gpu_arch: str = "sm_90a",
        trace: bool = False,
        epilogue: Epilogue = PLAIN,
    ):
        """``trace``: build the traced variant (launched through ``traced``; the recorder is
        ``wsgemm.kernels.common.trace``, the roles' traced loops are ``traced.TracedLoops``).
        ``epilogue``: the fused epilogue (``wsgemm.kernels.epilogue.Epilogue``, or its name),
        computed in fp32 on the accumulators before the conversion to C's dtype."""
        if isinstance(epilogue, str):
            epilogue = Epilogue.parse(epilogue)
        if not isinstance(epilogue, Epilogue):
            raise ValueError(f"epilogue must be an Epilogue, got {type(epilogue).__name__}")
        self.fused_epilogue = epilogue
        if not isinstance(config, Sm90Config):
            raise ValueError(f"config must be an Sm90Config, got {type(config).__name__}")
        if gpu_arch != self.arch:
            raise ValueError(f"Sm90Gemm runs on sm_90a only (WGMMA, setmaxnreg), got {gpu_arch!r}")
        self.gpu_arch = gpu_arch
        check_dtypes(ab_dtype, c_dtype, acc_dtype)
        if (config.splits_in_kernel or config.cluster_split > 1) and acc_dtype != cutlass.Float32:
            what = "stream-K" if config.stream_k else f"split-K (split_k={config.split_k})"
            if config.cluster_split > 1:
                what = f"a cluster split (cluster_split={config.cluster_split})"
            raise ValueError(
                f"{what} needs an fp32 accumulator, got {acc_dtype}: the partial sums are "
                "added in fp32, not one fp16 running sum over K"
            )
        if config.cluster_split > 1:
            refused = {
                "tracing": trace,
                "groups": self.grouped is not None,
                "a residual, preact, gated, dgated or dact epilogue": (
                    not epilogue.rides_cluster_split
                ),
            }  # fmt: skip
            used = [what for what, on in refused.items() if on]
            if used:
                raise ValueError(f"a cluster split kernel has no {', '.join(used)} yet; got "
                                 f"{config}, epilogue {epilogue.name}")  # fmt: skip
            if not config.cluster_split_fits(ab_dtype.width // 8, c_dtype.width // 8):
                raise ValueError(
                    f"cluster_split={config.cluster_split} on a {config.tile_m}x{config.tile_n} "
                    f"tile: rank 0's receive buffers ({config.cluster_split_bytes()} bytes) leave "
                    "the ring fewer than two stages of shared memory; take fewer ways or a "
                    "smaller tile"
                )
        if epilogue.row_scale != "none" and self.grouped != "m":
            raise ValueError(
                "a row scale is the ragged-M grouped kernel's (its launch argument: "
                "grouped_mm(row_scale=))"
            )
        if epilogue.reads_c_per_subtile and trace:
            raise ValueError("a traced kernel with a residual or a dact epilogue is not built: "
                             "trace it without")  # fmt: skip
        if epilogue.gated and config.swap_ab:
            why = gated_swap_refusal(config, epilogue, trace, self.grouped)
            if why is not None:
                raise ValueError(why)
        elif epilogue.gated:
            half = config.tile_n // 2
            if epilogue.bias == "row":
                raise ValueError(
                    "a gated row tile's bias ([b_gate; b_up]) runs along its columns: a column "
                    "bias (a row bias is the swap-AB tile's, whose rows are the weights')"
                )
            if config.tile_k != GATED_TILE_K:
                raise ValueError(GATED_TILE_K_RULE + f"; got tile_k={config.tile_k}")
            if trace or half % config.epi_tile[1] or half < config.epi_tile[1]:
                raise ValueError(
                    "a gated epilogue needs tile_n a multiple of "
                    f"{2 * config.epi_tile[1]} (each half whole epilogue subtiles) and no "
                    f"tracing; got tile_n={config.tile_n}, trace={trace}"
                )
        if epilogue.preact and (
            config.splits_in_kernel or self.grouped is not None or trace
            or (not epilogue.gated and (config.swap_ab or config.pingpong))
        ):  # fmt: skip
            raise ValueError(
                "a preact output runs on a dense, unsplit kernel: no split-K, stream-K, groups "
                "or tracing (a plain product's on a cooperative row tile: a ping-pong tile's "
                f"second output spilled); got {config}"
            )
        if epilogue.dgated and (
            config.swap_ab or config.splits_in_kernel or self.grouped is not None
        ):
            raise ValueError(
                "a dgated epilogue (the gated unit's gradient) runs on a dense, unsplit kernel: "
                f"no swap-AB, split-K, stream-K or groups; got {config}"
            )
        if epilogue.dact and (config.splits_in_kernel or self.grouped is not None):
            raise ValueError(
                "a dact epilogue (an activation's gradient) runs on a dense, unsplit kernel "
                f"(swap-AB or not): no split-K, stream-K or groups; got {config}"
            )
        if self.grouped is not None:
            unsupported = {
                "split-K or stream-K": config.splits_in_kernel,
                "swap-AB": config.swap_ab,
                "tracing with a ragged K": trace and self.grouped == "k",
                "a fused bias": epilogue.bias != "none",
            }
            unsupported["alpha or a residual"] = epilogue.scalars
            for what, used in unsupported.items():
                if used:
                    raise ValueError(f"the grouped sm90 kernel has no {what} yet")
        self.config = config
        self.ab_dtype, self.c_dtype, self.acc_dtype = ab_dtype, c_dtype, acc_dtype
        self.name = "sm90-pingpong" if config.pingpong else "sm90"  # the backend's name
        self.ab_stages, self.epi_stages = self.stage_counts()
        self.trace = bool(trace)
        self.producer_regs, self.consumer_regs = register_split(
            NUM_CONSUMER_WARPGROUPS,
            producer=TRACED_PRODUCER_REGISTERS if self.trace else PRODUCER_REGISTERS,
        )

    def _stage_bytes(self) -> tuple[int, int]:
        """(bytes of one mainloop stage, bytes of one epilogue buffer)."""
        cfg = self.config
        ab = mainloop_stage_bytes(cfg.tile_m, cfg.tile_n, cfg.tile_k, self.ab_dtype.width // 8)
        return ab, epilogue_stage_bytes(*cfg.epi_tile, self.c_dtype.width // 8)

    @property
    def _dgated_loader(self) -> bool:
        """Whether a warp of the producer warpgroup loads a dgated tile's pre-activation: a
        cooperative one's (a ping-pong one's store warp loads its whole tile's: ``dgated``)."""
        return self.fused_epilogue.dgated and not self.config.pingpong

    def stage_counts(self) -> tuple[int, int]:
        """(mainloop stages, epilogue buffers) from the smem budget for this config's dtypes."""
        ab_bytes, epi_bytes = self._stage_bytes()
        if not self.fused_epilogue.dgated:
            # a cluster split's receive buffers come off the top (``cluster_split``)
            return self.config.plain_stage_counts(self.ab_dtype.width // 8,
                                                  self.c_dtype.width // 8)  # fmt: skip
        # a dgated tile stores two subtiles per product subtile, into a pair of buffers
        subtiles = 2 * self.config.num_epi_subtiles
        if self.config.pingpong:
            # a buffer for each of them: the epilogue loads the whole tile's pre-activation at
            # its start (``dgated.prefetch``), under the other warpgroup's mainloop, and none
            # from its subtile loop (see ``dgated``)
            ab_stages, _ = stage_counts(ab_bytes, subtiles * epi_bytes, 1, max_epi=1)
            return ab_stages, subtiles
        ab_stages, epi_stages = stage_counts(ab_bytes, epi_bytes, subtiles,
                                             max_epi=DGATED_MAX_EPILOGUE_STAGES)  # fmt: skip
        return ab_stages, epi_stages - epi_stages % 2

    def shared_memory_bytes(self) -> int:
        """Dynamic shared memory: barriers (one aligned unit), the ring, the epilogue buffers, a
        cluster split's receive buffers."""
        ab_bytes, epi_bytes = self._stage_bytes()
        return (
            reserved_smem_bytes() + self.ab_stages * ab_bytes + self.epi_stages * epi_bytes
            + self.config.cluster_split_bytes()
        )  # fmt: skip

    def fake_launch_extras(self) -> tuple:
        """Compile-time stand-ins for split-K's launch arguments (count, workspace, semaphores):
        fake buffers for a split kernel; for an unsplit one the count and two None buffers,
        which its compiled function takes and ignores."""
        from cutlass.cute.runtime import make_fake_tensor

        bias = None
        if self.fused_epilogue.bias != "none":
            width = self.ab_dtype.width // 8
            bias = make_fake_tensor(self.ab_dtype, (cute.sym_int64(),), (1,), assumed_align=width)
        scalars = (None, None)
        if self.fused_epilogue.scalars:
            scalars = (cutlass.Float32(1.0), cutlass.Float32(0.0))
        c_in = self._fake_c() if self.fused_epilogue.own_c else None
        if not self.config.splits_in_kernel:
            return Int32(1), None, None, bias, *scalars, c_in
        workspace = make_fake_tensor(cutlass.Float32, (cute.sym_int64(),), (1,), assumed_align=16)
        semaphores = make_fake_tensor(Int32, (cute.sym_int64(),), (1,), assumed_align=4)
        return Int32(1), workspace, semaphores, bias, *scalars, c_in

    def _row_scale_dtype(self):
        """A row scale's element type (``Epilogue.row_scale``): fp32, or the inputs' dtype."""
        return cutlass.Float32 if self.fused_epilogue.row_scale == "fp32" else self.ab_dtype

    def _fake_c(self):
        """A residual's own C (M, N, L): the output's major (M-major under swap-AB), its
        non-unit strides 16-byte multiples (``c_tensor``'s launch argument)."""
        from cutlass.cute.runtime import make_fake_tensor

        vector = VECTOR_BYTES * 8 // self.c_dtype.width
        rows, cols, batches = (cute.sym_int64() for _ in range(3))
        ld, batch = (cute.sym_int64(divisibility=vector) for _ in range(2))
        stride = (1, ld, batch) if self.config.swap_ab else (ld, 1, batch)
        return make_fake_tensor(
            self.c_dtype, (rows, cols, batches), stride, assumed_align=VECTOR_BYTES
        )

    def mainloop_consumer_arrivals(self, mma_threads: int) -> int:
        """The empty barrier's count, from the traced WGMMA (its thread count) and the cluster,
        checked against ``mainloop_arrive_terms``."""
        cfg = self.config
        actual = (mma_threads // WARP_SIZE) * (cfg.cluster_m + cfg.cluster_n - 1)
        return check_arrive_count("sm90 mainloop empty", actual, mainloop_arrive_terms(cfg))

    # -------------------------------------------------------------------------- host side: _call

    @cute.jit
    def _call(self, mA, mB, mC, max_active_clusters, stream, raster_group, launch, trace_buffer):
        """C[m, n, l] = sum_k A[m, k, l] * B[n, k, l] (the entries of ``base.GemmKernel``).
        Launch arguments: ``max_active_clusters`` bounds the persistent grid; ``raster_group``
        (0: the schedule's default, else a positive multiple of ``cluster_m``;
        ``check_raster_group``) orders its tiles. Split-K's (``launch``; a kernel built with
        ``config.split_k != 1``, else all three are ignored): ``split_count`` splits K (clamped
        by ``effective_splits``), ``workspace`` is a flat fp32 tensor of at least
        ``config.split_workspace_elements`` words (contents irrelevant) and ``semaphores`` a
        flat int32 tensor of ``config.split_semaphores`` zeros (two per output tile), which the
        kernel leaves zero again. A fused epilogue's: ``bias`` (a flat vector of the inputs'
        dtype), ``alpha`` and ``beta`` (fp32 scalars; ``Epilogue.scale`` and ``residual``), ``c``
        (a residual's C when it is not the output: ``Epilogue.c_tensor``; (M, N, L) of C's
        dtype and major). A grouped kernel's after them: ``row_scale`` (a flat vector of every
        group's rows, ``Epilogue.row_scale``'s dtype; None without) and ``offs``."""
        split_count, workspace, semaphores, bias, alpha, beta, c_in = launch[:7]
        offs = mC_gmem = k_operands = row_scale = None
        num_l = Int32(cute.size(mB, mode=[2]))  # batches, or a grouped kernel's groups
        if const_expr(self.grouped is not None):
            row_scale, offs = launch[7], launch[8]
            if const_expr(offs is None or offs.element_type != Int32):
                raise ValueError("a grouped kernel takes its groups' end offsets as int32")
        if const_expr(self.grouped == "m"):
            # A and C hold every group's rows (their L is B's with batch stride 0)
            mA, mC = ragged.first_batch(mA), ragged.first_batch(mC)
            mC_gmem = mC[(None, None, 0)]
        elif const_expr(self.grouped == "k"):
            # A and B hold every group's K (their L is C's with batch stride 0); the workspace
            # holds each CTA's copies of their descriptors (``ragged_k``)
            if const_expr(workspace is None or workspace.element_type != cutlass.Float32):
                raise ValueError("a ragged-K grouped kernel takes an fp32 descriptor workspace")
            num_l = Int32(cute.size(mC, mode=[2]))
            mA, mB = ragged.first_batch(mA), ragged.first_batch(mB)
            k_operands = (mA, mB)
        trace.check_entry(self.trace, trace_buffer)
        cfg = self.config
        if const_expr(self.fused_epilogue.bias == "none"):
            bias = None
        else:
            if const_expr(bias is None):
                raise ValueError(f"epilogue {self.fused_epilogue.name} takes a bias vector")
            if const_expr(bias.element_type != self.ab_dtype):
                raise ValueError(f"the bias is {bias.element_type}, it must be {self.ab_dtype}")
        if const_expr(self.fused_epilogue.row_scale == "none"):
            row_scale = None
        else:
            if const_expr(row_scale is None):
                raise ValueError(f"epilogue {self.fused_epilogue.name} takes a row scale vector")
            if const_expr(row_scale.element_type != self._row_scale_dtype()):
                raise ValueError(
                    f"the row scale is {row_scale.element_type}, it must be "
                    f"{self._row_scale_dtype()}"
                )
        scalars = None
        if const_expr(self.fused_epilogue.scalars):
            if const_expr(alpha is None or beta is None):
                raise ValueError(f"epilogue {self.fused_epilogue.name} takes alpha and beta")
            scalars = (cutlass.Float32(alpha), cutlass.Float32(beta))
        if const_expr(cfg.splits_in_kernel):
            if const_expr(workspace is None or semaphores is None):
                raise ValueError("a split-K kernel takes a workspace and semaphores")
            if const_expr(workspace.element_type != cutlass.Float32):
                raise ValueError(f"the workspace is {workspace.element_type}, it must be fp32")
            if const_expr(semaphores.element_type != Int32):
                raise ValueError(f"the semaphores are {semaphores.element_type}, not int32")
        for t, want, what in (
            (mA, self.ab_dtype, "A"),
            (mB, self.ab_dtype, "B"),
            (mC, self.c_dtype, "C"),
        ):
            if const_expr(t.element_type != want):
                raise ValueError(f"{what} is {t.element_type}, the kernel was built for {want}")
        a_major = LayoutEnum.from_tensor(mA)
        b_major = LayoutEnum.from_tensor(mB)
        if const_expr(self.grouped == "k"):
            ragged_k.check_operands(a_major, b_major, LayoutEnum.ROW_MAJOR)
        if const_expr(self.grouped == "m" and a_major != LayoutEnum.ROW_MAJOR):
            # a group starts at any row: a TMA box starting at any element of A's contiguous
            # dimension is an illegal instruction on the GPU (docs/perf.md entry 39)
            raise ValueError("the grouped kernel reads a K-major A (the host copies others)")
        # C is N-major (row-major per batch), or M-major for a swap-AB config: the host passes
        # the caller's row-major C transposed (C^T = B^T A^T); the epilogue follows it.
        c_major = LayoutEnum.from_tensor(mC)
        want_c = LayoutEnum.COL_MAJOR if const_expr(cfg.swap_ab) else LayoutEnum.ROW_MAJOR
        if const_expr(c_major != want_c):
            raise ValueError(
                "C must be M-major (column-major per batch) for a swap_ab config"
                if cfg.swap_ab
                else "C must be N-major (row-major per batch)"
            )

        if const_expr(self.fused_epilogue.dgated):
            # the output's two halves: (M, N, 1) given, the up half N columns on
            mC = dgated.halves(mC)
        tile_mnk = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        # a gated product loads the weights in two halves of a tile each (gate rows, then up
        # rows N on): B's, or under swap-AB A's (the weights fill the tile's M: ``gated_rows``)
        gated_rows = self.fused_epilogue.gated and cfg.swap_ab
        gated = self.fused_epilogue.gated and not cfg.swap_ab
        a_box = cfg.tile_m // 2 if const_expr(gated_rows) else cfg.tile_m
        b_box = cfg.tile_n // 2 if const_expr(gated) else cfg.tile_n
        if const_expr(gated_rows):
            if const_expr(a_major != LayoutEnum.ROW_MAJOR):
                raise ValueError("a gated swap-AB tile reads a K-major A (nn.Linear's weights)")
            # A's view holds the gate's M rows; the up projection's are the M rows after them
            m, k, batches = (cute.size(mA, mode=[i]) for i in range(3))
            mA = cute.make_tensor(
                mA.iterator, cute.make_layout((2 * m, k, batches), stride=mA.stride)
            )
        if const_expr(gated):
            if const_expr(b_major != LayoutEnum.ROW_MAJOR):
                raise ValueError("a gated epilogue reads a K-major B (nn.Linear's weights)")
            # B's view holds the gate's N rows; the up projection's are the N rows after them
            n, k, batches = (cute.size(mB, mode=[i]) for i in range(3))
            mB = cute.make_tensor(
                mB.iterator, cute.make_layout((2 * n, k, batches), stride=mB.stride)
            )
        tiled_mma = self.make_tiled_mma(a_major, b_major)
        a_layout = sm90_utils.make_smem_layout_a(a_major, tile_mnk, self.ab_dtype, self.ab_stages)
        b_layout = sm90_utils.make_smem_layout_b(b_major, tile_mnk, self.ab_dtype, self.ab_stages)
        a_box_layout, b_box_layout = a_layout, b_layout
        if const_expr(gated_rows):
            a_box_layout = sm90_utils.make_smem_layout_a(
                a_major, (a_box, cfg.tile_n, cfg.tile_k), self.ab_dtype, self.ab_stages
            )
        if const_expr(gated):
            b_box_layout = sm90_utils.make_smem_layout_b(
                b_major, (cfg.tile_m, b_box, cfg.tile_k), self.ab_dtype, self.ab_stages
            )
        c_layout = sm90_utils.make_smem_layout_epi(
            self.c_dtype, c_major, cfg.epi_tile, self.epi_stages
        )

        # A is shared by the CTAs of a cluster row (same m), B by a cluster column (same n).
        tma_a, tma_mA = cpasync.make_tiled_tma_atom(
            self._load_op(cfg.cluster_n),
            mA,
            cute.slice_(a_box_layout, (None, None, 0)),
            (a_box, cfg.tile_k),
            num_multicast=cfg.cluster_n,
        )
        tma_b, tma_mB = cpasync.make_tiled_tma_atom(
            self._load_op(cfg.cluster_m),
            mB,
            cute.slice_(b_box_layout, (None, None, 0)),
            (b_box, cfg.tile_k),
            num_multicast=cfg.cluster_m,
        )
        tma_c, tma_mC = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(),
            mC,
            cute.slice_(c_layout, (None, None, 0)),
            cfg.epi_tile,
        )

        residual_load = None
        if const_expr(self.fused_epilogue.preact):
            # the pre-activation stored too (``preact``; a gated product's two halves): where,
            # and its TMA store
            if const_expr(c_in is None or c_in.element_type != self.c_dtype):
                raise ValueError(f"a preact output is a tensor of {self.c_dtype}")
            if const_expr(LayoutEnum.from_tensor(c_in) != c_major):
                raise ValueError("the preact output must have the output's major")
            residual_load = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(),
                dgated.halves(c_in) if const_expr(self.fused_epilogue.gated) else c_in,
                cute.slice_(c_layout, (None, None, 0)),
                cfg.epi_tile,
            )
        if const_expr(self.fused_epilogue.reads_c):
            # C's subtiles read by TMA into the epilogue buffers (``residual``)
            source = mC
            if const_expr(self.fused_epilogue.own_c):
                if const_expr(c_in is None or c_in.element_type != self.c_dtype):
                    name = self.fused_epilogue.name
                    raise ValueError(f"epilogue {name} takes a C of {self.c_dtype}")
                if const_expr(LayoutEnum.from_tensor(c_in) != c_major):
                    raise ValueError("the residual's C must have the output's major")
                source = c_in
                if const_expr(self.fused_epilogue.dgated):
                    source = dgated.halves(c_in)
            residual_load = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(),
                source,
                cute.slice_(c_layout, (None, None, 0)),
                cfg.epi_tile,
            )

        tma_bytes = cute.size_in_bytes(
            self.ab_dtype, cute.slice_(a_layout, (None, None, 0))
        ) + cute.size_in_bytes(self.ab_dtype, cute.slice_(b_layout, (None, None, 0)))
        check_arrive_count(
            "sm90 mainloop full (transaction bytes)",
            tma_bytes,
            {
                "rows of A and B per stage": cfg.tile_m + cfg.tile_n,
                "k per stage": cfg.tile_k,
                "bytes per element": self.ab_dtype.width // 8,
            },
        )
        plan = Sm90Plan(
            config=cfg,
            ab_dtype=self.ab_dtype,
            c_dtype=self.c_dtype,
            acc_dtype=self.acc_dtype,
            ab_stages=self.ab_stages,
            epi_stages=self.epi_stages,
            producer_regs=self.producer_regs,
            consumer_regs=self.consumer_regs,
            tma_bytes_per_stage=tma_bytes,
            storage=self._shared_storage(a_layout, b_layout, c_layout),
            c_major=c_major,
            epilogue=self.fused_epilogue,
        )

        # Tile counts (M, N, K are dynamic): a ragged edge is one more tile, zero-filled by TMA.
        num_m = Int32(cute.ceil_div(cute.size(mC, mode=[0]), plan.out_tile_m))
        num_n = Int32(cute.ceil_div(cute.size(mC, mode=[1]), plan.out_tile_n))
        k_tiles = Int32(cute.ceil_div(cute.size(mA, mode=[1]), cfg.tile_k))
        clusters_m, clusters_n = cluster_tile_counts(num_m, num_n, cfg.cluster_m, cfg.cluster_n)
        units = clusters_m * clusters_n * num_l
        splits = None
        if const_expr(self.grouped == "k"):
            semaphores = None  # the workspace holds descriptors
            num_clusters = persistent_cluster_count(units, max_active_clusters)
        elif const_expr(self.grouped == "m"):
            # the groups' sizes are on the GPU: launch for the most units they can hold
            rows = Int32(cute.size(mC, mode=[0]))
            units = unit_bound(rows, num_l, cfg.tile_m, cfg.cluster_m, clusters_n)
            workspace = semaphores = None
            num_clusters = persistent_cluster_count(units, max_active_clusters)
        elif const_expr(cfg.stream_k):
            splits = Int32(1)  # unused: the stream-K schedule chooses each tile's parts
            num_clusters = stream_k_layout(units, k_tiles, max_active_clusters)[0]
        elif const_expr(cfg.cluster_split > 1):
            # a cluster per tile (its CTAs its splits); no workspace
            workspace = semaphores = None
            num_clusters = persistent_cluster_count(units, max_active_clusters)
        else:
            if const_expr(cfg.splits_in_kernel):
                splits = Int32(effective_splits(split_count, k_tiles))
                units = units * splits
            else:
                workspace = semaphores = None
            num_clusters = persistent_cluster_count(units, max_active_clusters)

        self.kernel(
            plan,
            tiled_mma,
            tma_a,
            tma_mA,
            tma_b,
            tma_mB,
            tma_c,
            tma_mC,
            a_layout,
            b_layout,
            c_layout,
            num_m,
            num_n,
            num_l,
            k_tiles,
            raster_group,
            splits,
            workspace,
            semaphores,
            bias,
            row_scale,
            scalars,
            offs,
            mC_gmem,
            k_operands,
            residual_load,
            trace_buffer,
        ).launch(
            grid=(cfg.cluster_m * cfg.cluster_split, cfg.cluster_n, num_clusters),
            block=[THREADS_PER_CTA, 1, 1],
            # a cluster split's CTAs along x (its cluster_m and cluster_n are 1)
            cluster=(cfg.cluster_m * cfg.cluster_split, cfg.cluster_n, 1),
            # One persistent CTA per SM: ptxas then budgets 64K / 384 registers per thread at
            # launch and keeps the setmaxnreg hand-over (without it, a kernel that fits in fewer
            # registers loses its USETMAXREG and launches with its bare count).
            min_blocks_per_mp=1,
            stream=stream,
        )

    def make_tiled_mma(self, a_major: LayoutEnum, b_major: LayoutEnum) -> cute.TiledMma:
        """64 x tile_n WGMMA atoms: two warpgroups stacked along M, repeating over a 256-row
        tile (cooperative), or one warpgroup repeating the atom over its whole tile
        (ping-pong)."""
        cfg = self.config
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype,
            self.ab_dtype,
            a_major.sm90_mma_major_mode(),
            b_major.sm90_mma_major_mode(),
            self.acc_dtype,
            (1, 1, 1) if cfg.pingpong else (NUM_CONSUMER_WARPGROUPS, 1, 1),
            tiler_mn=(WGMMA_M, cfg.tile_n),
        )
        if cute.size(tiled_mma.shape_mnk, mode=[2]) != WGMMA_K:
            raise ValueError("expected a k=16 WGMMA for 16-bit inputs")
        return tiled_mma

    def make_epilogue_copy(self, tiled_mma: cute.TiledMma, c_major: LayoutEnum) -> cute.TiledCopy:
        """Registers -> smem subtile: st.matrix (transposed for an M-major C) for 16-bit
        outputs, plain st.shared for fp32. The C-atom tiling (16-bit st.matrix shape) only fixes
        which accumulator values each thread owns per subtile."""
        # st.matrix x4 covers 16 columns of a warp's accumulators; an 8-wide tile takes x2
        matrices = 2 if self.config.tile_n == 8 else 4
        transpose = c_major.is_m_major_c()
        if const_expr(matrices == 4 or self.c_dtype.width != 16):
            store_atom = sm90_utils.get_smem_store_op(c_major, self.c_dtype, self.acc_dtype)
        else:
            store_atom = cute.make_copy_atom(
                warp.StMatrix8x8x16bOp(transpose=transpose, num_matrices=matrices), self.c_dtype
            )
        layout_atom = cute.make_copy_atom(
            warp.StMatrix8x8x16bOp(transpose=transpose, num_matrices=matrices), cutlass.Float16
        )
        return cute.make_tiled_copy_S(
            store_atom, cute.make_tiled_copy_C_atom(layout_atom, tiled_mma)
        )

    @staticmethod
    def _load_op(num_multicast: int):
        if num_multicast == 1:
            return cpasync.CopyBulkTensorTileG2SOp()
        return cpasync.CopyBulkTensorTileG2SMulticastOp()

    def _shared_storage(self, a_layout, b_layout, c_layout):
        """Barriers first (and a residual's, under split-K one flag word per consumer
        warpgroup, a cluster split's mbarriers, all within the same 1 KiB unit), then the
        swizzled A, B and C buffers and a cluster split's receive buffers on 1 KiB
        boundaries."""
        split = self.config.splits_in_kernel
        ways = self.config.cluster_split
        recv_words = self.config.cluster_split_bytes() // 4
        residual_count = 0  # the residual's mbarriers
        if self.fused_epilogue.reads_c:
            residual_count = residual.barrier_count(
                self.epi_stages, self.config.pingpong, self._dgated_loader
            )

        @cute.struct
        class SharedStorage:
            mainloop_barriers: cute.struct.MemRange[cutlass.Int64, 2 * self.ab_stages]
            if residual_count:
                # In the barriers' alignment unit too.
                residual_barriers: cute.struct.MemRange[cutlass.Int64, residual_count]
            if self.trace:
                # In the barriers' alignment unit: the budget below does not change.
                trace_slots: cute.struct.Align[
                    cute.struct.MemRange[Int32, trace.slot_words(RECORDERS_PER_CTA)], 16
                ]
            if split:
                split_flags: cute.struct.MemRange[Int32, NUM_CONSUMER_WARPGROUPS]
            if ways > 1:
                cluster_split_barriers: cute.struct.MemRange[
                    cutlass.Int64,
                    cluster_split.barrier_count(self.config.split_units),
                ]
            sA: cute.struct.Align[
                cute.struct.MemRange[self.ab_dtype, cute.cosize(a_layout)], SMEM_BUFFER_ALIGN
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.ab_dtype, cute.cosize(b_layout)], SMEM_BUFFER_ALIGN
            ]
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(c_layout)], SMEM_BUFFER_ALIGN
            ]
            if ways > 1:
                cluster_split_recv: cute.struct.Align[
                    cute.struct.MemRange[cutlass.Float32, recv_words], SMEM_BUFFER_ALIGN
                ]

        # The layouts' footprint must be what the stage budget assumed.
        if SharedStorage.size_in_bytes() != self.shared_memory_bytes():
            raise ValueError(
                f"shared storage is {SharedStorage.size_in_bytes()} bytes, the budget planned "
                f"{self.shared_memory_bytes()} (capacity {SM90_SMEM_CAPACITY})"
            )
        return SharedStorage

    # -------------------------------------------------------------------------- device side: kernel

    @cute.kernel
    def kernel(
        self,
        plan: cutlass.Constexpr,
        tiled_mma: cute.TiledMma,
        tma_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        c_layout: cute.ComposedLayout,
        num_m: Int32,
        num_n: Int32,
        num_l: Int32,
        k_tiles: Int32,
        raster_group: Int32,
        splits,
        workspace,
        semaphores,
        bias,
        row_scale,
        scalars,
        offs,
        mC_gmem,
        k_operands,
        residual_load,
        trace_buffer,
    ):
        """Set up smem, pipelines and the schedule, then hand each warpgroup its role.
        ``splits``, ``workspace``, ``semaphores``: split-K's launch values (None without);
        ``bias``, ``row_scale``: the fused epilogue's vectors (None without); ``scalars``: its
        (alpha, beta)
        (None without); ``offs``, ``mC_gmem``: a grouped
        kernel's group ends and its C (rows, N) (None for a dense kernel); ``k_operands``: a
        ragged-K grouped kernel's A and B as passed (the descriptors it rewrites; None for
        others); ``residual_load``: a residual's TMA load of C and its coordinates, or a
        preact output's TMA store and its coordinates (None without either)."""
        cfg = plan.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == PRODUCER_WARP:
            for atom in (tma_a, tma_b, tma_c):
                cpasync.prefetch_descriptor(atom)
            if const_expr(residual_load is not None):
                cpasync.prefetch_descriptor(residual_load[0])

        storage = SmemAllocator().allocate(plan.storage)
        if const_expr(plan.epilogue.reads_c):
            if warp_idx == 0:
                residual.init_barriers(
                    storage.residual_barriers.data_ptr(),
                    residual.barrier_count(
                        plan.epi_stages, cfg.pingpong, self._dgated_loader
                    ),  # fmt: skip
                )
        if const_expr(cfg.cluster_split > 1):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cluster_split.init_barriers(
                        storage.cluster_split_barriers.data_ptr(), cfg.split_units
                    )
        cluster_layout = cute.make_layout((cfg.cluster_m, cfg.cluster_n, 1))
        ab_pipeline = self._make_mainloop_pipeline(
            plan, storage.mainloop_barriers.data_ptr(), tiled_mma, cluster_layout
        )
        # Barrier inits must be visible cluster-wide before any peer multicasts or arrives (a
        # cluster split's peers store into rank 0 and arrive on each other's mbarriers).
        hw_cluster = (cfg.cluster_m * cfg.cluster_split, cfg.cluster_n)
        pipeline_init_arrive(cluster_shape_mn=hw_cluster, is_relaxed=True)

        sA = storage.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = storage.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        sC = storage.sC.get_tensor(c_layout.outer, swizzle=c_layout.inner)
        slots = trace.struct_slots(trace_buffer, storage, RECORDERS_PER_CTA)

        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        split_rank = None
        if const_expr(cfg.cluster_split > 1):
            # the rank is the CTA's split; its place in the (1 x 1) multicast cluster is (0, 0)
            split_rank, rank = rank, Int32(0)
        cluster_coord = cluster_layout.get_flat_coord(rank)
        _, _, cluster_idx = cute.arch.block_idx()
        _, _, num_clusters = cute.arch.grid_dim()
        # Cluster rows per raster group: a bad launch value (none passes the host's check)
        # still yields a group of at least one row, so every tile is visited and nothing hangs.
        default_group = DEFAULT_RASTER_GROUP[cfg.schedule] // cfg.cluster_m
        group_rows = cutlass.max(
            cutlass.select_(raster_group > 0, raster_group // cfg.cluster_m, default_group), 1
        )
        # where this CTA stands: every scheduler's last arguments
        place = (
            (cfg.cluster_m, cfg.cluster_n),
            Int32(group_rows),
            Int32(num_clusters),
            Int32(cluster_idx),
            (Int32(cluster_coord[0]), Int32(cluster_coord[1])),
        )
        if const_expr(self.grouped == "k"):
            k_total = Int32(cute.size(mA_mkl, mode=[1]))
            scheduler = RaggedKScheduler(offs, k_total, cfg.tile_k, (num_m, num_n, num_l), *place)
        elif const_expr(self.grouped == "m"):
            scheduler = RaggedMScheduler(
                offs,
                num_l,
                Int32(cute.size(mC_gmem, mode=[0])),
                cluster_tile_counts(num_m, num_n, cfg.cluster_m, cfg.cluster_n)[1],
                cfg.tile_m,
                *place,
            )
        elif const_expr(cfg.cluster_split > 1):
            scheduler = GroupedTileScheduler(
                (num_m, num_n, num_l), *place, (k_tiles, Int32(cfg.cluster_split)),
                split_rank=split_rank,
            )  # fmt: skip
        else:
            scheduler = GroupedTileScheduler(
                (num_m, num_n, num_l),
                *place,
                (k_tiles, splits) if const_expr(cfg.splits_in_kernel) else None,
                stream_k=cfg.stream_k,
                stream_k_teams=cfg.stream_k_teams,
            )

        pipeline_init_wait(cluster_shape_mn=hw_cluster)

        if warp_idx >= PRODUCER_WARP:
            cute.arch.setmaxregister_decrease(plan.producer_regs)
            if warp_idx == PRODUCER_WARP:
                rec = trace.open_recorder(
                    trace_buffer, slots, Role.PRODUCER, self.gpu_arch, THREADS_PER_WARPGROUP
                )
                descriptors = None  # a ragged-K kernel's, this CTA's copies
                if const_expr(k_operands is not None):
                    descriptors = ragged_k.Descriptors.of_cta(tma_a, tma_b, *k_operands, workspace)
                load_args = self._load_args(
                    plan,
                    tma_a,
                    mA_mkl,
                    sA,
                    tma_b,
                    mB_nkl,
                    sB,
                    cluster_layout,
                    cluster_coord,
                    k_tiles,
                    (cute.size(mC_mnl, mode=[0]), cute.size(mC_mnl, mode=[1])),
                    descriptors,
                )
                self.load(plan, load_args, scheduler, ab_pipeline, rec)
            if const_expr(self._dgated_loader):
                if warp_idx == LOADER_WARP:
                    barriers = storage.residual_barriers.data_ptr()
                    load = self._residual_load(plan, *residual_load, sC, barriers)
                    self.dgated_loader(plan, load, scheduler)
        else:
            cute.arch.setmaxregister_increase(plan.consumer_regs)
            rec = trace.open_recorder(
                trace_buffer, slots, Role.CONSUMER, self.gpu_arch, THREADS_PER_WARPGROUP
            )
            split = None
            if const_expr(cfg.splits_in_kernel):
                flags = storage.split_flags.get_tensor(cute.make_layout(NUM_CONSUMER_WARPGROUPS))
                split = split_k.SplitLaunch(splits, workspace, semaphores, num_m, num_n, flags)
            elif const_expr(cfg.cluster_split > 1):
                # the cluster split's mbarriers and receive buffers
                split = (storage.cluster_split_barriers.data_ptr(),
                         storage.cluster_split_recv.data_ptr())  # fmt: skip
            res_load = None  # the residual's load, coordinates and mbarriers
            if const_expr(plan.epilogue.reads_c):
                tma_r, mR = residual_load
                res_load = (tma_r, mR, storage.residual_barriers.data_ptr())
            preact_store = residual_load if const_expr(plan.epilogue.preact) else None
            consumer_args = _ConsumerArgs(
                tiled_mma, sA, sB, sC, tma_c, mC_mnl, k_tiles, split, bias, mC_gmem, scalars,
                res_load, row_scale, preact_store,
            )  # fmt: skip
            self.mma_and_epilogue(plan, consumer_args, scheduler, ab_pipeline, rec)

    def _make_mainloop_pipeline(self, plan, barrier_ptr, tiled_mma, cluster_layout):
        producer_arrivals = check_arrive_count(
            "sm90 mainloop full",
            1,
            {"TMA-issuing warps": 1, "elected arrive.expect_tx per warp": 1},
        )
        consumer_arrivals = self.mainloop_consumer_arrivals(cute.size(tiled_mma))
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=barrier_ptr,
            num_stages=plan.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, producer_arrivals),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrivals),
            tx_count=plan.tma_bytes_per_stage,
            cta_layout_vmnk=cute.make_layout((1, *cluster_layout.shape)),
            defer_sync=True,
        )
        if const_expr(plan.config.cluster_split > 1):
            # Each CTA of a cluster split loads its own stages (no multicast): lane 0 of each
            # consumer warp releases a stage locally. The pipeline derives its signalling lane
            # from the CTA's rank in the hardware cluster, which here is the split, not a place
            # in the (1 x 1) layout it was given: set it as for a CTA of its own.
            tidx, _, _ = cute.arch.thread_idx()
            ring = replace(ring, is_signaling_thread=tidx % WARP_SIZE == 0)
        return ring

    # ------------------------------------------------------------------------- load (producer warp)

    def _load_args(
        self, plan, tma_a, mA_mkl, sA, tma_b, mB_nkl, sB, cluster_layout, cluster_coord, k_tiles,
        mn_out, descriptors=None,
    ) -> _LoadArgs:  # fmt: skip
        """``mn_out``: C's rows and columns (a gated product's up rows of A or B start there);
        ``descriptors``: a ragged-K grouped kernel's ``ragged_k.Descriptors``."""
        cfg = plan.config
        m_out, n_out = mn_out
        # (tile_m, tile_k, tiles_m, k_tiles, L); gated swap-AB: the gate's half tile
        gA = cute.local_tile(mA_mkl, (plan.out_tile_m, cfg.tile_k), (None, None, None))
        tAgA_up = tAsA_up = None
        if const_expr(plan.gated_rows):
            sA, tAsA_up, tAgA_up = self._up_half(
                tma_a, sA, mA_mkl, plan.out_tile_m, m_out, cfg.tile_k, cluster_coord[1],
                cfg.cluster_n,
            )  # fmt: skip
        # (tile_n, tile_k, tiles_n, k_tiles, L); gated: the gate's half tile (out_tile_n rows)
        gB = cute.local_tile(mB_nkl, (plan.out_tile_n, cfg.tile_k), (None, None, None))
        tBgB_up = tBsB_up = None
        if const_expr(plan.epilogue.gated and not plan.gated_rows):
            sB, tBsB_up, tBgB_up = self._up_half(
                tma_b, sB, mB_nkl, plan.out_tile_n, n_out, cfg.tile_k, cluster_coord[0],
                cfg.cluster_m,
            )  # fmt: skip
        # Each CTA of a multicast group loads its slice of the shared tile for all of them.
        tAsA, tAgA = cpasync.tma_partition(
            tma_a,
            cluster_coord[1],
            cute.make_layout(cfg.cluster_n),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b,
            cluster_coord[0],
            cute.make_layout(cfg.cluster_m),
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )
        mask_a = mask_b = None
        if const_expr(cfg.cluster_n > 1):
            mask_a = cute.make_layout_image_mask(cluster_layout, cluster_coord, mode=1)
        if const_expr(cfg.cluster_m > 1):
            mask_b = cute.make_layout_image_mask(cluster_layout, cluster_coord, mode=0)
        ragged_a = ragged_k_args = None
        if const_expr(self.grouped == "m"):
            ragged_a = (mA_mkl, cluster_coord[1], sA)
        if const_expr(descriptors is not None):
            ragged_k_args = (descriptors, mA_mkl, mB_nkl, cluster_coord, sA, sB)
        return _LoadArgs(
            tma_a, tAgA, tAsA, mask_a, tma_b, tBgB, tBsB, mask_b, k_tiles, ragged_a, tBgB_up,
            tBsB_up, ragged_k_args, tAgA_up, tAsA_up,
        )  # fmt: skip

    @staticmethod
    def _up_half(tma, s_x, m_x, rows: int, up_row, tile_k: int, cta, ctas: int) -> tuple:
        """A gated product's weight operand loaded in two halves a stage (B's, or A's on a
        swap-AB tile): (the stage's first half, ``rows`` gate rows: the operand's own loads'
        destination; the second half's TMA partition, (TMA, stages); the up rows' from
        ``up_row`` on, (TMA, tiles, k_tiles, L)). ``cta``/``ctas``: this CTA's slice of a
        multicast tile, among how many."""
        # s_x's halves: ((rows, 2), tile_k, stages), gate rows then up rows
        halves = cute.logical_divide(s_x, (rows,))
        g_up = cute.local_tile(
            cute.domain_offset((up_row, 0, 0), m_x), (rows, tile_k), (None, None, None)
        )
        s_up, g_up = cpasync.tma_partition(
            tma, cta, cute.make_layout(ctas),
            cute.group_modes(halves[((None, 1), None, None)], 0, 2), cute.group_modes(g_up, 0, 2),
        )  # fmt: skip
        return halves[((None, 0), None, None)], s_up, g_up

    @cute.jit
    def load(self, plan: cutlass.Constexpr, args: _LoadArgs, scheduler, ab_pipeline, rec=None):
        """Producer warp: fill the ring, tile after tile, k-tile after k-tile. ``rec``: its
        trace recorder (None: untraced; traced, the k-loop is ``_load_lanes``, traced.py)."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, plan.ab_stages)
        descriptor_group = Int32(-1)  # a ragged-K kernel's: the group its descriptors are for
        if const_expr(args.ragged_k is not None):
            args.ragged_k[0].init()
        tile = scheduler.initial_work_tile()
        while tile.is_valid:
            trace.fetch(rec, tile)
            if const_expr(args.ragged_k is not None):
                if tile.l != descriptor_group and descriptor_group >= 0:
                    self._drain(plan, ab_pipeline, state)
                tAgA, tBgB = self._ragged_k_views(plan, args, tile, descriptor_group)
                descriptor_group = tile.l
            elif const_expr(args.ragged_a is None):
                tAgA = args.tAgA[(None, tile.m, None, tile.l)]  # (TMA, k_tiles)
            else:
                mA_tma, a_cta, sA = args.ragged_a
                tAgA = ragged.a_tile(
                    args.tma_a, mA_tma, sA, a_cta, plan.config.cluster_n, tile,
                    (plan.config.tile_m, plan.config.tile_k),
                )  # fmt: skip
            if const_expr(args.ragged_k is None):
                tBgB = args.tBgB[(None, tile.n, None, tile.l)]  # (TMA, k_tiles)
            up = None  # a gated product's up half of B (or of A under swap-AB): (TMA, k_tiles)
            if const_expr(args.tBgB_up is not None):
                up = args.tBgB_up[(None, tile.n, None, tile.l)]
            if const_expr(args.tAgA_up is not None):
                up = args.tAgA_up[(None, tile.m, None, tile.l)]
            k_begin, k_end = self._k_range(tile, args.k_tiles)
            if const_expr(rec is not None):
                state = self._load_lanes(
                    plan, args, ab_pipeline, state, tAgA, tBgB, k_begin, k_end, rec
                )
            else:
                for k in cutlass.range(k_begin, k_end, unroll=1):
                    # Waits until every consumer of this stage, here and in the peers this CTA
                    # multicasts to, released it; then arms full[s] with the stage's bytes.
                    ab_pipeline.producer_acquire(state)
                    self._load_k_tile(args, ab_pipeline, state, tAgA, tBgB, k, up)
                    state.advance()
            tile = scheduler.next_work_tile(tile)
        # Peers may still be reading stages this CTA multicast into, and will arrive on its
        # empty barriers: wait for all of them before the CTA may exit.
        trace.record(rec, Event.WAIT_EMPTY_BEGIN)
        ab_pipeline.producer_tail(state)
        trace.record(rec, Event.WAIT_EMPTY_END)
        trace.close(rec)

    @cute.jit
    def dgated_loader(self, plan: cutlass.Constexpr, load: residual.ResidualLoad, scheduler):
        """Loader warp (a cooperative dgated tile's: ``dgated``): every output subtile's
        pre-activation of every tile the CTA runs, in the epilogue's order, each into its
        buffer once the store that last read the buffer has read it (the store warp's arrival
        on the buffer's second mbarrier: ``_free_pair``). It walks the schedule as the
        producer warp does, up to the buffers ahead of the epilogue: a tile's last pair is
        freed under the next tile's mainloop, so its first E subtiles load there; the first
        use of each buffer waits for nothing."""
        cfg = plan.config
        order = epilogue_subtile_order(cfg, plan.out_tile_n, plan.out_tile_m)
        free = load.barriers + plan.epi_stages
        s = Int32(0)
        tile = scheduler.initial_work_tile()
        while tile.is_valid:
            views = dgated.tile_views(load, tile, cfg.epi_tile)
            for s_out in cutlass.range_constexpr(plan.out_subtiles):
                # the buffer's previous store has read it (parity 1 of a fresh barrier: free)
                cute.arch.mbarrier_wait(free + s % plan.epi_stages,
                                        ((s // plan.epi_stages) % 2) ^ 1)  # fmt: skip
                dgated.issue(load, views, order, s_out, s)
                s += 1
            tile = scheduler.next_work_tile(tile)

    @cute.jit
    def _drain(self, plan: cutlass.Constexpr, ab_pipeline, state):
        """Wait until the consumers (here and in the multicast peers) have released the stage
        filled last, so every load issued so far has landed: a ragged-K kernel then rewrites
        the descriptors those loads read (without this wait an empty group's k-tile read real
        values on an H100: docs/perf.md entry 58). ``state`` is the next fill's; the wait is
        the one that fill of the last stage would make, without arming it."""
        last = state.clone()
        for _ in cutlass.range_constexpr(plan.ab_stages - 1):
            last.advance()
        ab_pipeline.sync_object_empty.wait(last.index, last.phase)

    @cute.jit
    def _ragged_k_views(self, plan: cutlass.Constexpr, args: _LoadArgs, tile, descriptor_group):
        """A ragged-K unit's (A, B) TMA views from its group's first k on, this CTA's
        descriptors first retargeted to its group's K extent when the group changed."""
        cfg = plan.config
        descriptors, mA_tma, mB_tma, cluster_coord, sA, sB = args.ragged_k
        if tile.l != descriptor_group:
            descriptors.retarget(tile.k_extent)
        tAgA = ragged_k.k_slice(args.tma_a, mA_tma, sA, cluster_coord[1], cfg.cluster_n, tile.m,
                                tile.k_start, (cfg.tile_m, cfg.tile_k))  # fmt: skip
        tBgB = ragged_k.k_slice(args.tma_b, mB_tma, sB, cluster_coord[0], cfg.cluster_m, tile.n,
                                tile.k_start, (cfg.tile_n, cfg.tile_k))  # fmt: skip
        return tAgA, tBgB

    @cute.jit
    def _load_k_tile(self, args: _LoadArgs, ab_pipeline, state, tAgA, tBgB, k, up=None):
        """The TMA loads of k-tile ``k`` into ``state``'s stage (acquired), then the commit
        (``up``: a gated product's up half of B, or of A on a gated swap-AB tile, into the
        second half of the operand's stage; a ragged-K kernel loads through its CTA's
        descriptors)."""
        full = ab_pipeline.producer_get_barrier(state)
        desc_a = desc_b = None
        if const_expr(args.ragged_k is not None):
            desc_a, desc_b = args.ragged_k[0].a(), args.ragged_k[0].b()
        self._tma_load(
            args.tma_a, tAgA[(None, k)], args.tAsA[(None, state.index)], full, args.mask_a,
            desc_a,
        )  # fmt: skip
        self._tma_load(
            args.tma_b, tBgB[(None, k)], args.tBsB[(None, state.index)], full, args.mask_b,
            desc_b,
        )  # fmt: skip
        if const_expr(up is not None and args.tAgA_up is not None):
            self._tma_load(
                args.tma_a, up[(None, k)], args.tAsA_up[(None, state.index)], full, args.mask_a
            )
        elif const_expr(up is not None):
            self._tma_load(
                args.tma_b, up[(None, k)], args.tBsB_up[(None, state.index)], full, args.mask_b
            )
        ab_pipeline.producer_commit(state)

    @cute.jit
    def _tma_load(self, atom, src, dst, full_barrier, mask, desc=None):
        """One TMA load (``mask``: its multicast peers; ``desc``: a descriptor in global memory
        instead of the atom's)."""
        extra = {} if const_expr(mask is None) else {"mcast_mask": mask}
        if const_expr(desc is not None):
            extra["tma_desc_ptr"] = desc
        cute.copy(atom, src, dst, tma_bar_ptr=full_barrier, **extra)

    # -------------------------------------------------------------------- mma (consumer warpgroups)

    @cute.jit
    def mma_and_epilogue(
        self, plan: cutlass.Constexpr, args: _ConsumerArgs, scheduler, ab_pipeline, rec=None
    ):
        """Consumer warpgroup: for each of its tiles, the mainloop then the epilogue (under
        split-K: the mainloop over the unit's k-range, the fix-up (``split_k.fixup``), and the
        epilogue only on the unit that finishes the tile). ``rec``: its trace recorder (None:
        untraced)."""
        cfg = plan.config
        tiled_mma, k_tiles = args.tiled_mma, args.k_tiles
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        # Cooperative: one 256-thread MMA over both warpgroups; ping-pong: one per warpgroup.
        mma_tidx = tidx % THREADS_PER_WARPGROUP if const_expr(cfg.pingpong) else tidx
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(args.sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(args.sB))
        # (out_tile_m, out_tile_n, tiles_m, tiles_n, L)
        out_tile = (plan.out_tile_m, plan.out_tile_n)
        gC_mnl = cute.local_tile(args.mC_mnl, out_tile, (None, None, None))
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((cfg.tile_m, cfg.tile_n)), plan.acc_dtype
        )
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        mma_args = _MmaArgs(tiled_mma, tCrA, tCrB, wg)
        epi_args = self._epilogue_args(
            plan, tiled_mma, acc, mma_tidx, args.sC, args.tma_c, gC_mnl, wg, args
        )
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=plan.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, cute.size(tiled_mma)),
        )

        split_args = cluster_args = None
        if const_expr(cfg.cluster_split > 1):
            cluster_args = cluster_split.cluster_split_args(
                plan, args.split, tiled_mma, mma_tidx, wg if const_expr(cfg.pingpong) else 0,
                epi_args.barrier,
            )  # fmt: skip
        elif const_expr(args.split is not None):
            split_args = split_k.split_args(
                plan, args.split, tiled_mma, thr_mma, mma_tidx, args.mC_mnl, epi_args.barrier
            )
        read_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, plan.ab_stages
        )
        steps = 1
        first = 0
        # Ping-pong drains its stores after every tile and restarts at buffer 0; a residual's
        # count goes on (its mbarriers' phases, ``residual``).
        subtiles_per_tile = plan.stores_per_tile
        if const_expr(cfg.pingpong and not plan.epilogue.reads_c):
            subtiles_per_tile = 0
        if const_expr(cfg.pingpong):
            # Warpgroup w takes the CTA's units w, w + 2, ...; the ring holds every unit's
            # stages in order, so warpgroup 1 starts past the first unit's k-tiles.
            steps = NUM_CONSUMER_WARPGROUPS
            first = wg
            read_state.advance(self._k_count(scheduler.initial_work_tile(), k_tiles) * wg)
            if wg == 0:
                # Warpgroup 0 goes first in both orders.
                self._order_arrive(_Barrier.MMA_ORDER, 0)
                self._order_arrive(_Barrier.EPI_ORDER, 0)
        tile = scheduler.initial_work_tile(first)
        subtiles_done = Int32(0)
        tiles_done = None  # a cluster split's tiles reduced (its mbarriers' phase)
        if const_expr(cfg.cluster_split > 1):
            tiles_done = Int32(0)
        while tile.is_valid:
            trace.fetch(rec, tile)
            if const_expr(cfg.pingpong):
                trace.record(rec, Event.ORDER_WAIT_BEGIN, stage=0)
                self._order_wait(_Barrier.MMA_ORDER, wg)
                trace.record(rec, Event.ORDER_WAIT_END, stage=0)
            # the bias of the first subtiles, in flight under the mainloop
            bias_ahead = self._bias_ahead(plan, epi_args, tile)
            # a row scale's factors of the whole tile, in flight under the mainloop too
            scales = self._row_scale_tile(plan, epi_args, tile)
            k_begin, k_end = self._k_range(tile, k_tiles)
            prefetch = None
            if const_expr(self._residual_under_mainloop(plan)):
                prefetch = (epi_args, tile, subtiles_done)
            read_state = self.mma(
                plan, mma_args, ab_pipeline, read_state, acc, k_begin, k_end - k_begin, rec,
                prefetch,
            )  # fmt: skip
            if const_expr(split_args is not None):
                # Before the epilogue turn: it touches no epilogue buffer, so it overlaps the
                # other warpgroup's epilogue.
                trace.record(rec, Event.FIXUP_BEGIN)
                finishes = split_k.fixup(plan, split_args, acc, tile)
                trace.record(rec, Event.FIXUP_END)
            if const_expr(cluster_args is not None):
                # the same place: its own receive buffers, no epilogue buffer
                finishes = cluster_split.reduce(plan, cluster_args, acc, tiles_done)
                tiles_done += 1
            if const_expr(cfg.pingpong):
                trace.record(rec, Event.ORDER_WAIT_BEGIN, stage=1)
                self._order_wait(_Barrier.EPI_ORDER, wg)
                trace.record(rec, Event.ORDER_WAIT_END, stage=1)
            if const_expr(split_args is None and cluster_args is None):
                trace.record(rec, Event.EPILOGUE_BEGIN)
                self.epilogue(
                    plan, epi_args, store_pipeline, tile, subtiles_done, rec, bias_ahead, scales
                )
                trace.record(rec, Event.EPILOGUE_END)
                subtiles_done += subtiles_per_tile
            else:
                if finishes:
                    trace.record(rec, Event.EPILOGUE_BEGIN)
                    self.epilogue(
                        plan, epi_args, store_pipeline, tile, subtiles_done, rec, bias_ahead,
                        scales,
                    )  # fmt: skip
                    trace.record(rec, Event.EPILOGUE_END)
                    subtiles_done += subtiles_per_tile
            if const_expr(cfg.pingpong):
                # The other warpgroup reuses the epilogue buffers: they must be drained.
                if epi_args.is_store_warp:
                    trace.record(rec, Event.STORE_WAIT_BEGIN)
                    store_pipeline.producer_tail()
                    trace.record(rec, Event.STORE_WAIT_END)
                self._order_arrive(_Barrier.EPI_ORDER, 1 - wg)
                # Skip the other warpgroup's unit: its own k-tile count.
                read_state.advance(self._k_count(scheduler.next_work_tile(tile), k_tiles))
            tile = scheduler.next_work_tile(tile, steps)
        if const_expr(cluster_args is not None):
            cluster_split.sender_tail(cluster_args, tiles_done)
        if const_expr(not cfg.pingpong):
            # Outstanding TMA stores still read the epilogue buffers.
            if epi_args.is_store_warp:
                trace.record(rec, Event.STORE_WAIT_BEGIN)
                store_pipeline.producer_tail()
                trace.record(rec, Event.STORE_WAIT_END)
        trace.close(rec)

    @staticmethod
    def _k_range(tile, k_tiles):
        """The k-tiles [begin, end) of a unit: all of K unless the unit names its own."""
        if const_expr(tile.has_k_range):
            return tile.k_begin, tile.k_end
        return 0, k_tiles

    @staticmethod
    def _k_count(tile, k_tiles):
        """How many k-tiles (ring stages) a unit takes: all of K unless it names its own."""
        if const_expr(tile.has_k_range):
            return tile.k_end - tile.k_begin
        return k_tiles

    @cute.jit
    def mma(
        self,
        plan: cutlass.Constexpr,
        args: _MmaArgs,
        ab_pipeline,
        read_state,
        acc,
        k_begin,
        k_count,
        rec=None,
        prefetch=None,
    ):
        """One unit's mainloop over ``k_count`` (>= 1) k-tiles from ``k_begin`` (the trace's
        k-tile numbers; traced, the loop is ``_mma_lanes``, traced.py). One k-tile of WGMMAs
        stays in flight; a stage is released as soon as the WGMMAs reading it have retired.
        ``prefetch``: a residual's (epilogue args, tile, subtiles done), whose first C loads
        leave once the first k-tile's WGMMAs are issued (``residual_prefetch``)."""
        if const_expr(rec is not None):
            return self._mma_lanes(plan, args, ab_pipeline, read_state, acc, k_begin, k_count,
                                   rec, prefetch)  # fmt: skip
        release_state = read_state.clone()
        acc.fill(0.0)
        warpgroup.fence()  # the zeroed accumulators are WGMMA inputs
        # K >= 1, so there is always a first k-tile.
        ab_pipeline.consumer_wait(read_state)
        self._mma_k_tile(args, acc, read_state.index)
        warpgroup.commit_group()
        read_state.advance()
        if const_expr(prefetch is not None):
            self.residual_prefetch(plan, *prefetch)
        for _ in cutlass.range(1, k_count, unroll=1):
            ab_pipeline.consumer_wait(read_state)
            self._mma_k_tile(args, acc, read_state.index)
            warpgroup.commit_group()
            warpgroup.wait_group(1)  # the previous k-tile's WGMMAs are done reading smem
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
        if const_expr(plan.config.pingpong):
            # All WGMMAs of this tile are issued: the other warpgroup may issue its own.
            self._order_arrive(_Barrier.MMA_ORDER, 1 - args.warpgroup)
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(release_state)
        return read_state

    @cute.jit
    def _mma_k_tile(self, args: _MmaArgs, acc, stage):
        for kb in cutlass.range_constexpr(cute.size(args.tCrA, mode=[2])):
            cute.gemm(
                args.tiled_mma,
                acc,
                args.tCrA[(None, None, kb, stage)],
                args.tCrB[(None, None, kb, stage)],
                acc,
            )

    # --------------------------------------------------------------- epilogue (consumer warpgroups)

    def _epilogue_args(self, plan, tiled_mma, acc, mma_tidx, sC, tma_c, gC_mnl, wg, consumer):
        cfg = plan.config
        tiled_copy_r2s = self.make_epilogue_copy(tiled_mma, plan.c_major)
        thr_copy_r2s = tiled_copy_r2s.get_slice(mma_tidx)
        # Every thread of the MMA writes into each subtile, so all of them meet per subtile.
        epilogue_threads = check_arrive_count(
            "sm90 epilogue barrier",
            cute.size(tiled_mma),
            {
                "warpgroups writing each subtile": 1 if cfg.pingpong else NUM_CONSUMER_WARPGROUPS,
                "threads per warpgroup": THREADS_PER_WARPGROUP,
            },
        )
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if const_expr(cfg.pingpong):
            # Each warpgroup has its own barrier and its own store warp (its first warp).
            barrier_id = int(_Barrier.EPILOGUE) + wg
            is_store_warp = warp_idx % WARPS_PER_WARPGROUP == 0
        else:
            barrier_id = int(_Barrier.EPILOGUE)
            is_store_warp = warp_idx == 0
        barrier = pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=epilogue_threads)
        tRS_cAcc = bias_extent = residual_load = row_scale_extent = None
        epi = plan.epilogue
        if const_expr(epi.bias != "none" or epi.reads_c or epi.row_scale != "none"):
            # the accumulators' tile coordinates, laid out as the accumulators are
            tile_coords = cute.make_identity_tensor((cfg.tile_m, cfg.tile_n))
            tRS_cAcc = tiled_copy_r2s.retile(tiled_mma.get_slice(mma_tidx).partition_C(tile_coords))
        if const_expr(plan.epilogue.bias != "none"):
            mode = 0 if const_expr(plan.epilogue.bias == "row") else 1
            bias_extent = Int32(cute.size(consumer.mC_mnl, mode=[mode]))
        if const_expr(epi.row_scale != "none"):
            row_scale_extent = Int32(cute.size(consumer.row_scale))
        if const_expr(plan.epilogue.reads_c):
            tma_r, mR, barriers = consumer.residual_load
            if const_expr(cfg.pingpong):
                barriers = barriers + wg * plan.epi_stages  # each warpgroup's own phases
            residual_load = self._residual_load(plan, tma_r, mR, sC, barriers)
        preact = None
        if const_expr(epi.preact):
            tma_p, mP = consumer.preact
            out_tile = (plan.out_tile_m, plan.out_tile_n)
            preact = (tma_p, cute.local_tile(mP, out_tile, (None, None, None)))
        ragged_store = None
        if const_expr(self.grouped == "m"):
            ragged_store = ragged.RaggedStore(
                consumer.mC_mnl, consumer.mC_gmem, mma_tidx, epilogue_threads
            )
        return _EpilogueArgs(
            tiled_copy_r2s=tiled_copy_r2s,
            tRS_rAcc=tiled_copy_r2s.retile(acc),
            tRS_sC=thr_copy_r2s.partition_D(sC),
            # st.matrix exchanges values inside the warp: the register side has its own shape.
            rD_shape=thr_copy_r2s.partition_S(sC).shape[:3],
            tma_c=tma_c,
            sC=sC,
            gC_mnl=gC_mnl,
            barrier=barrier,
            is_store_warp=is_store_warp,
            tRS_cAcc=tRS_cAcc,
            bias=consumer.bias,
            bias_extent=bias_extent,
            ragged=ragged_store,
            scalars=consumer.scalars,
            residual=residual_load,
            row_scale=consumer.row_scale,
            row_scale_extent=row_scale_extent,
            preact=preact,
        )

    @staticmethod
    def _order_wait(base: _Barrier, wg):
        """Wait for warpgroup ``wg``'s turn (the other warpgroup arrives, ``wg`` syncs)."""
        cute.arch.barrier(barrier_id=int(base) + wg, number_of_threads=2 * THREADS_PER_WARPGROUP)

    @staticmethod
    def _order_arrive(base: _Barrier, wg):
        """Give warpgroup ``wg`` its turn."""
        cute.arch.barrier_arrive(
            barrier_id=int(base) + wg, number_of_threads=2 * THREADS_PER_WARPGROUP
        )
