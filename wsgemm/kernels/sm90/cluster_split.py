"""Cluster split-K: K split over the CTAs of a cluster, the partial sums met in the cluster's
shared memory (``Sm90Config.cluster_split``; docs/architecture.md, "Split-K inside the sm90
kernel").

Roles: CTA ``r`` of a cluster of ``ways`` runs split ``r`` of every tile the cluster takes
(``GroupedTileScheduler(split_rank=r)``); rank 0 finishes each tile, the other ranks send.

Pipelines: per consumer unit (both warpgroups of a cooperative tile, or each ping-pong
warpgroup) two mbarriers, and rank 0's receive buffers: one fp32 tile per other rank (its
slot), where that rank's whole partial tile lands at once:

* ``full`` (rank 0's, count 1): for each tile rank 0 arrives once with the bytes it expects
  (``ways - 1`` tiles of partial sums); the senders' ``st.async`` stores complete those bytes
  on it, so its phase ends when every partial has landed (and they are visible to whoever
  waited on it).
* ``free`` (each sender's, count 1): rank 0 arrives on it from afar once its unit has read the
  tile's partials; a sender waits on it before it writes its next tile's (its first tile
  passes: the barrier's phase before the first is complete).

Timeline of one tile: every rank runs its mainloop over its k-range; a sender waits ``free``,
issues its accumulators as 16-byte ``st.async`` stores into its slot of rank 0's buffers and
goes on to its next tile; rank 0 arrives on ``full`` with the bytes, waits for its phase, adds
the slots to its own accumulators in rank order (part 0 + part 1 + ..., the workspace split's
order, so the bits are those of ``split_k.fixup`` with the same ways), lets the senders reuse
their slots, and runs the epilogue. After its last tile a sender waits for rank 0's last
``free`` arrival, so no arrival targets the shared memory of a CTA that has exited. The
hardware runs the CTAs of a cluster together: no rank waits on one that is not resident,
whatever else runs on the GPU.

Every rank needs a k-tile (a rank with none would wait for a stage nobody loads): the
dispatcher refuses ``ways`` above K's k-tiles (``host.dispatch``), and anything that launches a
compiled cluster split kernel directly must do the same.
"""

import warnings
from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32

__all__ = ["ClusterSplitArgs", "barrier_count", "cluster_split_args", "init_barriers", "reduce",
           "sender_tail"]  # fmt: skip

# The loops over a thread's accumulator values are unrolled on purpose (each value a register);
# the DSL's note that a long static loop compiles slowly is expected here, not a problem.
warnings.filterwarnings("ignore", message="This static loop has", module=__name__)
VECTOR = 4  # fp32 words per st.async (v4.b32: 16 bytes)


def barrier_count(units: int) -> int:
    """mbarriers a cluster split keeps: ``full`` and ``free`` per consumer unit."""
    return 2 * units


@dataclass(frozen=True)
class ClusterSplitArgs:
    """What a consumer unit's reduction needs: the ways (static), this CTA's rank, the unit's
    receive buffers (rank 0's slots, every rank's address of them), its ``full`` and ``free``
    mbarriers, the unit's thread count and this thread's index among them, and the unit's
    barrier."""

    ways: int
    rank: Any
    recv: Any  # (ways - 1) x tile_m * tile_n fp32, this unit's, flat
    full: Any
    free: Any
    threads: int
    thread: Any
    barrier: Any


def init_barriers(barriers, units: int) -> None:
    """``full`` and ``free`` of each unit, count 1 each (one thread calls this; the kernel's
    cluster-wide init fence and barrier follow, before any peer stores or arrives)."""
    for i in range(barrier_count(units)):
        cute.arch.mbarrier_init(barriers + i, 1)


def cluster_split_args(plan, launch, tiled_mma, mma_tidx, unit, barrier) -> ClusterSplitArgs:
    """A consumer unit's ``ClusterSplitArgs``: ``launch`` is the kernel's (mbarriers, receive
    buffers) pointers; ``unit`` 0 (cooperative) or the warpgroup (ping-pong); ``barrier`` the
    unit's epilogue barrier."""
    cfg = plan.config
    barriers, recv = launch
    words = (cfg.cluster_split - 1) * _tile_words(cfg)  # a unit's receive buffers
    return ClusterSplitArgs(
        ways=cfg.cluster_split,
        rank=cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()),
        recv=cute.make_tensor(
            recv + cute.assume(unit * words, divby=words), cute.make_layout(words)
        ),
        full=barriers + 2 * unit,
        free=barriers + 2 * unit + 1,
        threads=cute.size(tiled_mma),
        thread=mma_tidx,
        barrier=barrier,
    )


def _tile_words(cfg) -> int:
    """fp32 words of one tile: a slot."""
    return cfg.tile_m * cfg.tile_n


def _word(args: ClusterSplitArgs, v: int):
    """This thread's word of value ``v`` within a slot: vector ``v // 4`` (16 bytes) of every
    thread side by side, so a warp's vectors are consecutive (no bank conflict) and a thread
    reads back what the same thread of the sender wrote."""
    first = cute.assume((v // VECTOR * args.threads + args.thread) * VECTOR, divby=VECTOR)
    return first + v % VECTOR


@cute.jit
def reduce(plan: cutlass.Constexpr, args: ClusterSplitArgs, acc, tiles_done):
    """The tile's partial sums met on rank 0 (module docstring). ``tiles_done``: the tiles this
    unit has reduced before (its mbarriers' phase). Returns whether this CTA finishes the tile
    (rank 0: ``acc`` then holds the whole sum and the epilogue runs)."""
    cfg = plan.config
    values = cute.size(acc)
    # (a WGMMA's fp32 accumulators come in fours per thread: N/2 per 64-row band, N >= 8)
    assert values % VECTOR == 0, values
    words = _tile_words(cfg)
    finishes = args.rank == 0
    phase = tiles_done % 2
    if finishes:
        if args.thread == 0:
            tile_bytes = (args.ways - 1) * args.threads * values * 4
            cute.arch.mbarrier_arrive_and_expect_tx(args.full, tile_bytes)
        cute.arch.mbarrier_wait(args.full, phase)
        for peer in cutlass.range_constexpr(args.ways - 1):
            base = peer * words
            for v in cutlass.range_constexpr(values):
                acc[v] = acc[v] + args.recv[base + _word(args, v)]
        # Every thread of the unit has read the slots (each value is in a register: the adds
        # above used it), so the senders may write their next tile into them. A cluster-scoped
        # release would add a MEMBAR.GPU (waiting for this SM's outstanding stores) for no
        # gain: no read is left in flight to order.
        args.barrier.arrive_and_wait()
        if args.thread == 0:
            for peer in cutlass.range_constexpr(1, args.ways):
                cute.arch.mbarrier_arrive(args.free, peer)
    else:
        cute.arch.mbarrier_wait(args.free, phase ^ 1)
        bits = cute.recast_tensor(acc, Int32)
        base = cute.assume((args.rank - 1) * words, divby=words)
        for g in cutlass.range_constexpr(values // VECTOR):
            v = g * VECTOR
            cute.arch.store_async_dsmem(
                args.recv.iterator + cute.assume(base + _word(args, v), divby=VECTOR),
                (bits[v], bits[v + 1], bits[v + 2], bits[v + 3]), args.full, Int32(0),
            )  # fmt: skip
    return finishes


@cute.jit
def sender_tail(args: ClusterSplitArgs, tiles_done):
    """A sender's last wait: rank 0's ``free`` arrival for its last tile, so no arrival lands
    in the shared memory of an exited CTA (rank 0 has nothing to wait for: it waited for every
    partial before its epilogue)."""
    if args.rank != 0:
        cute.arch.mbarrier_wait(args.free, (tiles_done % 2) ^ 1)
