"""The gated unit's gradient in the sm90 epilogue (``Epilogue.dgated``).

A gated MLP's backward computes ``dh = d_out @ W_down`` (M, N), then the gradient of
``h = act(gate) * up`` with respect to its saved pre-activation ``[gate | up]`` (M, 2N):

    dgate = dh · up · act'(gate),    dup = dh · act(gate)

Fused, the GEMM that computes ``dh`` never stores it: each product subtile's epilogue reads the
pre-activation's two subtiles of the same rows and columns (the gate's, and the up
projection's N columns on) and stores the two gradient subtiles, ``[dgate | dup]`` (M, 2N).
The host gives the output and the pre-activation as (M, N, 1) views of their gate halves (the
address entry's operands share one L); ``halves`` reads each as (M, N, 2), the up half N
columns on, so a subtile's half is its L coordinate.

It rides the residual's machinery (``residual``): the same TMA load into the very epilogue
buffer the result is then written to and stored from, the same mbarriers, one per buffer.
Per product subtile ``e`` the tile takes two buffers in turn (output subtiles ``2e``: the
gate's, and ``2e + 1``: the up projection's; E is even):

1. the store warp has loaded both halves' C (the first E / 2 pairs before the epilogue,
   ``prefetch``; pair ``e + E/2 - 1`` at pair ``e``'s turn, into pair ``e - 1``'s buffers once
   both their stores have read them: ``cp.async.bulk.wait_group.read 0``);
2. every thread waits for both mbarriers and reads its elements of gate and up;
3. both results are written and stored, the gate half's first (``_store_subtile``, whose first
   barrier means every thread has read both buffers).

With four buffers one pair's loads are in flight while the pair before it computes; with two
each pair waits its own round trip. To make that round trip L2's, not DRAM's, the store warp
can ask L2 for all of the tile's pre-activation subtiles as its mainloop starts
(``prefetch_l2``: TMA prefetches, no buffer and no mbarrier; either schedule), so a tile's
pre-activation streams in beside its A and B rather than in a burst once its MMAs are done
(docs/perf.md entry 86 traced the epilogue at 15.7% of the consumers' time, all of it
exposed). Timed on an H100 (entry 97) with eight buffers it made the dh GEMM slower, not
faster: it is off (``config.DGATED_L2_PREFETCH``) until an A/B on one GPU says otherwise.

With ``Sm90Config.dgated_whole_tile`` (a ping-pong tile; ``registry.DGATED_WHOLE_TILE_FAMILIES``
switches calls to it) the tile takes a buffer for every output subtile (16 of 4 KB on the
128x128 tile, leaving its ring five stages of six) and loads them all at the start of its
epilogue, which runs under the other warpgroup's mainloop: no load leaves from the subtile
loop. There, the store warp's loads (a branch one warp of the warpgroup takes) make ptxas
serialize every WGMMA of a bf16 kernel, both warpgroups' mainloops included (warning C7520:
each HGMMA waited for before the next issues, ``sass.waited_wgmmas``), the likely cause of the
1.8x its plain GEMM the ping-pong dh GEMM ran (docs/perf.md entries 86 and 100). The
cooperative tile, whose buffers cannot hold a whole tile (128 KB of 8 KB subtiles), keeps the
loop's loads; with bf16 ptxas serializes it the same way, unless
``Sm90Config.dgated_loader_warp`` (``registry.DGATED_LOADER_WARP_FAMILIES``) moves them to a
warp of the producer warpgroup, which holds no accumulators (``Sm90Gemm.dgated_loader``): the
store warp then only frees each pair's buffers, an mbarrier arrival once its stores have read
them (``Sm90Gemm._free_pair``; docs/perf.md entry 101).
"""

from __future__ import annotations

import cutlass.cute as cute

from wsgemm.kernels.sm90 import residual
from wsgemm.support import VECTOR_BYTES

__all__ = ["halves", "issue", "later_pair", "prefetch", "prefetch_l2", "tile_views"]


def halves(t):
    """An (M, N, 1) gate half as given -> (M, N, 2): the up half is N columns on (each tensor
    is (M, 2N), ``[gate | up]``), the same 16-byte multiple the host checks (N % 8 == 0 for
    16-bit C; 4 for fp32)."""
    m, n = cute.size(t, mode=[0]), cute.size(t, mode=[1])
    vector = VECTOR_BYTES * 8 // t.element_type.width
    up = cute.assume(n, divby=vector)
    layout = cute.make_layout((m, n, 2), stride=(t.stride[0], t.stride[1], up))
    return cute.make_tensor(t.iterator, layout)


def tile_views(load: residual.ResidualLoad, tile, epi_tile):
    """``residual.tile_views`` of ``tile``'s gate half and of its up half (L 0 and 1)."""
    return tuple(residual.tile_views(load, tile, epi_tile, h) for h in (0, 1))


def issue(load: residual.ResidualLoad, views, order, s_out: int, s):
    """The store warp's: output subtile ``s_out`` of the tile (product subtile ``s_out // 2``,
    half ``s_out % 2``), the ``s``-th of this set, into buffer ``s % E``."""
    residual.issue(load, views[s_out % 2], order, s_out // 2, s)


def prefetch(load: residual.ResidualLoad, views, order, first, subtiles: int):
    """The store warp's: once every earlier store has read its buffer, the tile's first
    ``min(E, subtiles)`` output subtiles' loads (whole pairs: E is even)."""
    cute.arch.cp_async_bulk_wait_group(0, read=True)
    for s_out in range(min(load.stages, subtiles)):
        issue(load, views, order, s_out, first + s_out)


def prefetch_l2(load: residual.ResidualLoad, views, order, first: int, subtiles: int):
    """The store warp's: L2 prefetches of the tile's output subtiles ``first`` to
    ``subtiles - 1`` (their pre-activation halves; a hint: nothing waits for it, and data that
    has left L2 again is read from DRAM as before)."""
    with cute.arch.elect_one():  # one lane issues them (the coordinates are the warp's)
        for s_out in range(first, subtiles):
            gR = views[s_out % 2][1]
            cute.prefetch(load.tma, gR[(None, order.get_hier_coord(s_out // 2))])


def later_pair(stages: int, e: int, pairs: int) -> int | None:
    """The product subtile whose two loads pair ``e``'s turn issues (``E/2 - 1`` past it, into
    pair ``e - 1``'s buffers; the first E/2 pairs were prefetched), or None."""
    f = e + stages // 2 - 1
    return f if stages // 2 <= f < pairs else None
