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
gate's, and ``2e + 1``: the up projection's); every thread waits for both mbarriers, reads its
elements of gate and up, and both results are written and stored, the gate half's first
(``_store_subtile``, whose first barrier means every thread has read both buffers). No load
leaves from the subtile loop: the consumers' store warp issuing them there (a branch one warp
of the warpgroup takes) made ptxas serialize every WGMMA of a bf16 kernel, both warpgroups'
mainloops included (warning C7520: each HGMMA waited for before the next issues,
``sass.waited_wgmmas``; docs/perf.md entries 86 and 100). Each schedule has its form:

* ping-pong: the tile takes a buffer for every output subtile (16 of 4 KB on the 128x128 tile,
  leaving its ring five stages of six), all loaded by the store warp at the start of its
  epilogue (``prefetch``), which runs under the other warpgroup's mainloop;
* cooperative, whose buffers cannot hold a whole tile (128 KB of 8 KB subtiles): two or four
  buffers (``config.DGATED_MAX_EPILOGUE_STAGES`` at most), loaded by a warp of the producer
  warpgroup, which holds no accumulators (``Sm90Gemm.dgated_loader``, walking the tile
  schedule up to E subtiles ahead of the epilogue); the store warp only frees each pair's
  buffers, an mbarrier arrival once its stores have read them (``Sm90Gemm._free_pair``;
  docs/perf.md entry 101).

Both timed faster on an H100 than the forms they replaced (docs/perf.md entry 104), whose
store warp loaded four buffers a pair ahead from the subtile loop; those, and an L2 prefetch
of each tile's pre-activation as its mainloop starts (entries 87 and 97: slower), are
deleted (git keeps them).
"""

from __future__ import annotations

import cutlass.cute as cute

from wsgemm.kernels.sm90 import residual
from wsgemm.support import VECTOR_BYTES

__all__ = ["halves", "issue", "prefetch", "tile_views"]


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
    """The store warp's (a ping-pong tile's) or the loader warp's (a cooperative one's): output
    subtile ``s_out`` of the tile (product subtile ``s_out // 2``, half ``s_out % 2``), the
    ``s``-th of this set, into buffer ``s % E``."""
    residual.issue(load, views[s_out % 2], order, s_out // 2, s)


def prefetch(load: residual.ResidualLoad, views, order, first, subtiles: int):
    """The store warp's, at a ping-pong tile's epilogue start: once every earlier store has
    read its buffer, the tile's first ``min(E, subtiles)`` output subtiles' loads (all of
    them: a ping-pong dgated tile has a buffer for each)."""
    cute.arch.cp_async_bulk_wait_group(0, read=True)
    for s_out in range(min(load.stages, subtiles)):
        issue(load, views, order, s_out, first + s_out)
