"""The residual of the sm90 epilogue: ``beta · C``, C the output's own values before the call.

A residual epilogue (``Epilogue.residual``) reads each output subtile before it stores it, by
TMA into the very epilogue buffer the subtile's result is then written to and stored from
(the buffer is C's, then D's):

1. the store warp issues subtile ``s``'s load (``issue``: the tile's subtile by TMA into
   buffer ``s % E`` of the E epilogue buffers, completing on that buffer's mbarrier) once the
   store that last read the buffer has finished reading it;
2. every epilogue thread waits for the buffer's mbarrier (``wait``: its phase flips with each
   load, so the phase of subtile ``s`` is ``(s // E) & 1``) and reads its accumulators'
   elements of C from it (``value``) before the subtile's store writes the buffer (the
   store's first barrier: every thread has read C).

Timeline of one tile of S subtiles: the first E loads (``prefetch``) leave before the
epilogue: under the tile's mainloop (cooperative, unsplit: right after its first k-tile's
MMAs are issued, once the previous tile's stores have read their buffers), or at the start
of the epilogue (ping-pong, whose buffers the other warpgroup's epilogue holds during this
one's mainloop; split-K and stream-K, where only the unit that finishes the tile stores it).
Then subtile e's turn issues the load of subtile e + E - 2 (into the buffer of subtile e - 2,
whose store is then at most one behind the newest: ``cp.async.bulk.wait_group.read 1``), so
each later load has E - 2 subtiles' work to arrive: two with four buffers, none with two
(fp32 outputs, the widest tiles), where each later subtile waits its whole round trip. A
ping-pong warpgroup keeps its own mbarriers (the buffers are shared, in turn; the phases are
each warpgroup's own).

C is the output itself (an in-place residual) or, with ``Epilogue.c_tensor``, a tensor of
its own of the output's shape and major (the ``residual`` launch argument). ``Epilogue.dact``
reads its saved pre-activation the same way (the same launch argument and loop; the kernel
combines it as ``acc · act'(C)`` instead of ``acc + beta · C``). Either way each
subtile is read before its own store, so in place is safe, and a C that overlaps the output
only in part is not (the host never passes one).

So C costs one TMA read and no extra registers, never an extra kernel or a
full-output pass in torch. TMA clips at C's edges (zeros past them, never stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

__all__ = [
    "ResidualLoad",
    "barrier_count",
    "init_barriers",
    "issue",
    "later_load",
    "phase",
    "prefetch",
    "tile_views",
    "value",
    "wait",
]


@dataclass(frozen=True)
class ResidualLoad:
    """The residual's TMA load for one epilogue warpgroup (set): the atom, C's TMA
    coordinates cut into output tiles (tile_m, tile_n, tiles_m, tiles_n, L), the epilogue
    buffers (epi_m, epi_n, E), the first of this set's E mbarriers and a subtile's bytes."""

    tma: Any
    gR_mnl: Any
    sC: Any
    barriers: Any
    stages: int
    subtile_bytes: int


def barrier_count(epi_stages: int, pingpong: bool, loader: bool = False) -> int:
    """mbarriers the residual needs: one per epilogue buffer, per ping-pong warpgroup; with a
    loader warp (a cooperative dgated tile's: ``dgated``) one more per buffer, after them, on
    which the store warp says the buffer's stores have read it."""
    return epi_stages * (2 if pingpong else 1) * (2 if loader else 1)


def init_barriers(barriers, count: int):
    """Arm ``count`` mbarriers for one arrival each (the expect-tx of the load). One thread."""
    with cute.arch.elect_one():
        for i in range(count):
            cute.arch.mbarrier_init(barriers + i, 1)
    cute.arch.mbarrier_init_fence()


def tile_views(load: ResidualLoad, tile, epi_tile, batch=None):
    """``tile``'s subtiles of C and the buffers, partitioned for the TMA load:
    ((TMA, E), (TMA, (subtiles_m, subtiles_n))); ``batch``: C's L coordinate, if not the
    tile's (``dgated``'s halves)."""
    l = tile.l if batch is None else batch  # noqa: E741
    gR = load.gR_mnl[(None, None, tile.m, tile.n, l)]
    return cpasync.tma_partition(
        load.tma,
        0,
        cute.make_layout(1),
        cute.group_modes(load.sC, 0, 2),
        cute.zipped_divide(gR, epi_tile),
    )


def phase(load: ResidualLoad, s):
    """The mbarrier phase of the subtile numbered ``s`` (this set's count since the start)."""
    return (s // load.stages) % 2


def issue(load: ResidualLoad, views, order, e, s):
    """The store warp's: subtile ``e`` of the tile (``order``: subtile -> (row, col) of
    subtiles), the ``s``-th of this set, into buffer ``s % E``, which no store or thread still
    reads."""
    buf = s % load.stages
    bar = load.barriers + buf
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bar, load.subtile_bytes)
    sR, gR = views
    cute.copy(load.tma, gR[(None, order.get_hier_coord(e))], sR[(None, buf)], tma_bar_ptr=bar)


def prefetch(load: ResidualLoad, views, order, first, subtiles: int):
    """The store warp's: once every earlier store has read its buffer, the tile's first
    ``min(E, subtiles)`` loads (``first``: the number of the tile's first subtile)."""
    cute.arch.cp_async_bulk_wait_group(0, read=True)
    for e in range(min(load.stages, subtiles)):
        issue(load, views, order, e, first + e)


def later_load(stages: int, e: int, subtiles: int) -> int | None:
    """The subtile whose load subtile ``e``'s turn issues (E - 2 past it, the first E having
    been prefetched), or None."""
    f = e + stages - 2
    return f if stages <= f < subtiles else None


def wait(load: ResidualLoad, s):
    """Every epilogue thread: the ``s``-th subtile's C has landed in its buffer."""
    cute.arch.mbarrier_wait(load.barriers + s % load.stages, phase(load, s))


def value(sC_buf, coord, epi_tile) -> cutlass.Float32:
    """The residual at tile coordinate ``coord`` ((row, col) in the tile), in fp32: its
    element of the subtile's buffer ``sC_buf``."""
    epi_m, epi_n = epi_tile
    return sC_buf[(coord[0] % epi_m, coord[1] % epi_n)].to(cutlass.Float32)
