"""The residual of the sm90 epilogue: ``beta · C``, C the output's own values before the call.

A residual epilogue (``Epilogue.residual``) reads each output subtile before it stores it:

1. every epilogue thread loads its share of the subtile from global memory into registers in
   16-byte vectors along C's contiguous mode (``load``: a subtile at C's edge, element by
   element with a predicate; ``ResidualCopy.rounds`` vectors a thread), one subtile ahead of
   the one it works on, so the round trip hides under a subtile's work;
2. once the subtile's store buffer is free, writes them into it (``stage``), and after a
   barrier every thread reads its accumulators' elements back from it (``value``): the
   buffer's layout turns the coalesced vectors into the accumulators' thread layout, which
   holds two adjacent columns and rows eight apart per thread (loading those directly took a
   64-bit address per element and spilled the 128-wide tiles);
3. after a second barrier the buffer is the store's again.

So C costs one coalesced read of the output and a pass through shared memory per subtile,
never an extra kernel or a full-output pass in torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from wsgemm.support import VECTOR_BYTES

__all__ = ["ResidualCopy", "fragment", "load", "make_copy", "stage", "value"]


@dataclass(frozen=True)
class ResidualCopy:
    """One thread's view of the residual's subtile copies: the vector copy, this thread's
    slice of it, and C (M, N, L) with its (M, N)."""

    tiled_copy: Any
    thr_copy: Any
    mC: Any
    extent: Any  # (M, N)


def make_copy(mC, c_major_m: bool, epi_tile, threads: int, tidx) -> ResidualCopy:
    """The 16-byte vector copy of one (epi_m, epi_n) subtile by ``threads`` threads, vectors
    along C's contiguous mode (M when ``c_major_m``), for thread ``tidx``. A subtile of fewer
    vectors than threads (the 8-wide swap-AB tile: 64 of them for 128 threads) is copied by as
    many threads as it has vectors, each vector by ``threads // vectors`` of them (the same
    values loaded and stored twice: no thread's copy reaches past the subtile)."""
    epi_m, epi_n = epi_tile
    vector = VECTOR_BYTES * 8 // mC.element_type.width
    atom = cute.make_copy_atom(
        cute.nvgpu.CopyUniversalOp(), mC.element_type, num_bits_per_copy=VECTOR_BYTES * 8
    )
    used = min(threads, epi_m * epi_n // vector)
    if const_expr(threads % used != 0):
        raise ValueError(f"a residual subtile of {used} vectors for {threads} threads")
    if const_expr(c_major_m):
        across = epi_m // vector  # threads along M, one vector each
        thr = cute.make_layout((across, used // across), stride=(1, across))
        val = cute.make_layout((vector, 1))
    else:
        across = epi_n // vector
        thr = cute.make_layout((used // across, across), stride=(across, 1))
        val = cute.make_layout((1, vector))
    tiled = cute.make_tiled_copy_tv(atom, thr, val)
    extent = (Int32(cute.size(mC, mode=[0])), Int32(cute.size(mC, mode=[1])))
    return ResidualCopy(tiled, tiled.get_slice(tidx % used), mC, extent)


def fragment(copy: ResidualCopy, epi_tile):
    """The registers one thread loads a subtile into."""
    blank = cute.make_identity_tensor(epi_tile)
    return cute.make_rmem_tensor(copy.thr_copy.partition_S(blank).shape, copy.mC.element_type)


@cute.jit
def load(copy: ResidualCopy, frag, origin, epi_tile: cutlass.Constexpr):
    """The subtile at ``origin`` ((row, col, batch) of its first element in C) into ``frag``:
    16-byte vectors when the whole subtile lies inside C, else each element inside C alone
    (the others are never stored)."""
    epi_m, epi_n = epi_tile
    row, col, batch = origin
    mC_l = copy.mC[(None, None, batch)]
    inside = (row + epi_m <= copy.extent[0]) & (col + epi_n <= copy.extent[1])
    if inside:
        sub = cute.local_tile(mC_l, epi_tile, (row // epi_m, col // epi_n))
        cute.copy(copy.tiled_copy, copy.thr_copy.partition_S(sub), frag)
    else:
        coords = copy.thr_copy.partition_S(cute.make_identity_tensor(epi_tile))
        for i in cutlass.range_constexpr(cute.size(frag)):
            r = row + coords[i][0]
            c = col + coords[i][1]
            if (r < copy.extent[0]) & (c < copy.extent[1]):
                frag[i] = mC_l[(r, c)]


@cute.jit
def stage(copy: ResidualCopy, frag, sC_buf):
    """``frag`` (``load``'s) into the subtile's shared buffer ``sC_buf`` (epi_m, epi_n)."""
    cute.copy(copy.tiled_copy, frag, copy.thr_copy.partition_D(sC_buf))


def value(sC_buf, coord, epi_tile) -> cutlass.Float32:
    """The staged residual at tile coordinate ``coord`` ((row, col) in the tile), in fp32:
    its element of the subtile ``sC_buf``."""
    epi_m, epi_n = epi_tile
    return sC_buf[(coord[0] % epi_m, coord[1] % epi_n)].to(cutlass.Float32)
