"""Split-K and stream-K inside the sm90 kernel: the fix-up that combines the partial sums of a
tile's units (docs/architecture.md, "Split-K inside the sm90 kernel").

``Sm90Gemm.kernel`` hands its consumers the launch values (``SplitLaunch``);
``Sm90Gemm.mma_and_epilogue`` builds each consumer's ``SplitArgs`` once (``split_args``) and
calls ``fixup`` after every unit's mainloop, before its epilogue turn; the epilogue runs only on
the unit that finishes its tile. The schedule of units (k-ranges, splits, stream-K parts) is
``common.scheduler``'s.
"""

import warnings
from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from wsgemm.kernels.sm90.config import SEMAPHORES_PER_TILE
from wsgemm.support import THREADS_PER_WARPGROUP

__all__ = ["SplitArgs", "SplitLaunch", "fixup", "split_args"]

# The loops over a thread's accumulator values are unrolled on purpose (each value a register);
# the DSL's note that a long static loop compiles slowly is expected here, not a problem.
warnings.filterwarnings("ignore", message="This static loop has", module=__name__)


@dataclass(frozen=True)
class SplitLaunch:
    """Split-K's launch values as the kernel hands them to its consumer warpgroups: the split
    count (unused by stream-K, whose schedule chooses each tile's parts), the fp32 workspace,
    the per-tile semaphores, the tile counts that number the tiles, and the smem flags (one
    word per consumer warpgroup)."""

    splits: Any
    workspace: Any  # (units x tile_m * tile_n,) fp32, flat
    semaphores: Any  # (tiles,) int32, zero between launches
    num_m: Any
    num_n: Any
    flags: Any  # (consumer warpgroups,) int32 in smem


@dataclass(frozen=True)
class SplitArgs:
    """What the fix-up needs (``fixup``): the launch's split count, the fp32 workspace and the
    per-tile semaphores, the tile counts that number the tiles, C's rows, the fragment's tile
    coordinates, the unit's threads (thread 0 arrives for all), its barrier and its smem
    flag."""

    splits: Any
    workspace: Any  # (units x tile_m * tile_n,) fp32, flat
    semaphores: Any  # (tiles,) int32, zero between launches
    num_m: Any
    num_n: Any
    rows: Any  # M
    tCcC: Any  # the accumulator's (row, col) in the tile, fragment order
    threads: int  # threads holding one tile's accumulator (the unit)
    thread: Any  # this thread's index among them
    barrier: Any
    flag: Any  # (smem flags, this unit's index): the semaphore's value before its arrival


def split_args(
    plan, launch: SplitLaunch, tiled_mma, thr_mma, mma_tidx, mC_mnl, barrier
) -> SplitArgs:
    """A consumer warpgroup's ``SplitArgs``; ``barrier``: the epilogue barrier of its unit."""
    cfg = plan.config
    # Cooperative: both warpgroups hold one unit (flag 0); ping-pong: one unit each.
    flag_idx = 0
    if const_expr(cfg.pingpong):
        tidx, _, _ = cute.arch.thread_idx()
        flag_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
    return SplitArgs(
        splits=launch.splits,
        workspace=launch.workspace,
        semaphores=launch.semaphores,
        num_m=launch.num_m,
        num_n=launch.num_n,
        rows=Int32(cute.size(mC_mnl, mode=[0])),
        # (MMA, MMA_M, MMA_N) (row, col) in the tile, in the accumulator's order
        tCcC=thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n))),
        threads=cute.size(tiled_mma),
        thread=mma_tidx,
        barrier=barrier,
        flag=(launch.flags, flag_idx),
    )


def _partial(plan, args: SplitArgs, acc, slot):
    """This thread's view of workspace slot ``slot`` (an Int64; split-K: ``tile_idx * splits +
    split``): value ``v`` of the accumulator at word ``v * threads + thread`` of the slot, so
    the unit's threads write and read consecutive words (coalesced) for each ``v``."""
    cfg = plan.config
    base = slot * (cfg.tile_m * cfg.tile_n) + args.thread
    return cute.make_tensor(
        args.workspace.iterator + base, cute.make_layout(cute.size(acc), stride=args.threads)
    )


@cute.jit
def fixup(plan: cutlass.Constexpr, args: SplitArgs, acc, tile):
    """Split-K and stream-K: combine the partial sums of ``tile``'s units (its parts). Returns
    whether this unit finishes the tile (then ``acc`` holds the whole sum and the epilogue
    runs).

    Each unit first takes a ticket: one thread adds 1 to the tile's arrival counter (relaxed,
    gpu scope) and the unit's barrier hands the old value to every thread. The unit that draws
    ``parts - 1`` is the last to arrive and finishes the tile; the others store their partial
    into their own workspace slot, meet on their barrier, and one thread adds 1 to the tile's
    stored counter with release semantics (a release of every thread's stores, which the
    barrier ordered before it). The finisher keeps its own partial in registers (it goes to
    memory only when it is the third part or later, ``_sum_in_part_order``): one thread waits
    with acquire loads until the stored counter shows the other ``parts - 1`` partials, the
    barrier passes that on, and every value is summed in part order
    0, 1, ..., ``parts - 1`` with its own part taken from its registers: the order, never the
    arrival, fixes the bits (an fp32 store and load would be exact: the same bits as reading
    its own part back). The finisher resets both counters to 0 for the next launch.

    The finisher waits only on units that drew a ticket before it: they are running (past
    their mainloop) and store without waiting for anyone, so the wait ends whatever else is
    resident on the GPU (no deadlock beside another persistent kernel).

    Only rows inside C are stored and read back (the TMA store drops the others), so a decode
    tile of a few tokens moves a few rows. Tiles wholly past a ragged cluster edge store
    nothing and skip it all.
    """
    cfg = plan.config
    finishes = cutlass.Boolean(True)
    # A split-K tile has `splits` parts in slots tile_idx * splits + part; a stream-K tile its
    # own count, from slot0 on (scheduler module docstring).
    parts = tile.parts if const_expr(cfg.stream_k) else args.splits
    if parts > 1 and tile.m < args.num_m and tile.n < args.num_n:
        tile_idx = (tile.l * args.num_m + tile.m) * args.num_n + tile.n
        if const_expr(cfg.stream_k):
            slot0 = cutlass.Int64(tile.slot0)
        else:
            slot0 = cutlass.Int64(tile_idx) * args.splits
        rows = args.rows - tile.m * cfg.tile_m
        values = cute.size(acc)
        arrived = args.semaphores.iterator + SEMAPHORES_PER_TILE * tile_idx
        stored = arrived + 1
        flags, flag_idx = args.flag
        if args.thread == 0:
            flags[flag_idx] = cute.arch.atomic_add(arrived, Int32(1), sem="relaxed", scope="gpu")
        args.barrier.arrive_and_wait()
        # (every thread reads the flag before the barrier either branch meets next, so this
        # unit's next tile rewrites it only after)
        finishes = flags[flag_idx] == parts - 1
        if finishes:
            if args.thread == 0:
                seen = cute.arch.load(stored, Int32, sem="acquire", scope="gpu")
                while seen < parts - 1:
                    seen = cute.arch.load(stored, Int32, sem="acquire", scope="gpu")
            args.barrier.arrive_and_wait()
            _sum_in_part_order(plan, args, acc, slot0, tile.split, parts, rows)
            if args.thread == 0:
                arrived.store(Int32(0))
                stored.store(Int32(0))
        else:
            own = _partial(plan, args, acc, slot0 + tile.split)
            for v in cutlass.range_constexpr(values):
                if args.tCcC[v][0] < rows:
                    own[v] = acc[v]
            args.barrier.arrive_and_wait()
            if args.thread == 0:
                cute.arch.atomic_add(stored, Int32(1), sem="release", scope="gpu")
    return finishes


@cute.jit
def _sum_in_part_order(plan: cutlass.Constexpr, args: SplitArgs, acc, slot0, own, parts, rows):
    """``acc`` := part 0 + part 1 + ... + part ``parts - 1`` (in that order), part ``own`` being
    ``acc`` itself and the others read from their workspace slots.

    Each pass is one unrolled loop over the thread's values whose loads do not depend on one
    another, so they are in flight together: one L2 round trip per pass, not per value (a loop
    over the parts inside the loop over the values waited one round trip per value, ~20 us
    per 64 values, docs/perf.md entry 45). Pass one adds the first two parts (fp32 addition is
    commutative: ``part 0 + own`` is ``acc`` plus part 0 whichever of the two ``own`` is);
    each further pass adds the next part. A finisher whose own part is third or later stores
    it to its slot first (an exact round trip, read back by this same thread)."""
    first = _partial(plan, args, acc, slot0)
    second = _partial(plan, args, acc, slot0 + 1)
    if own >= 2:
        mine = _partial(plan, args, acc, slot0 + own)
        for v in cutlass.range_constexpr(cute.size(acc)):
            if args.tCcC[v][0] < rows:
                mine[v] = acc[v]
    if own == 0:
        for v in cutlass.range_constexpr(cute.size(acc)):
            if args.tCcC[v][0] < rows:
                acc[v] = acc[v] + second[v]
    elif own == 1:
        for v in cutlass.range_constexpr(cute.size(acc)):
            if args.tCcC[v][0] < rows:
                acc[v] = first[v] + acc[v]
    else:
        for v in cutlass.range_constexpr(cute.size(acc)):
            if args.tCcC[v][0] < rows:
                acc[v] = first[v] + second[v]
    for p in cutlass.range(2, parts, unroll=1):
        part = _partial(plan, args, acc, slot0 + p)
        for v in cutlass.range_constexpr(cute.size(acc)):
            if args.tCcC[v][0] < rows:
                acc[v] = acc[v] + part[v]
