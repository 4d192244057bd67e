"""The ragged-M grouped GEMM's pieces of the sm90 kernel (``grouped.Sm90GroupedGemm``).

Group ``g`` multiplies rows ``[end[g - 1], end[g])`` of A (all groups' rows in one matrix) by
B's batch ``g`` into the same rows of C (``common.grouped_scheduler``). The kernel is the dense
one with three differences, each a function here that ``kernel.Sm90Gemm`` calls where a
grouped kernel differs:

* the operands: A and C arrive as (rows, cols, groups) views whose batch stride is 0 (the
  address entry has one L for all three operands); the kernel takes their first batch
  (:func:`first_batch`), and B's batch is the group;
* the loads: a tile's A rows start at its group's first row, which need not be a multiple of
  the tile (:func:`a_tile`: TMA coordinates offset by that row; rows past the group are loaded
  and computed, and never stored);
* the stores: TMA clips only at the tensor's edge, so a tile whose rows run past its group's
  end (every group's last tile, unless the group is a multiple of ``tile_m``) would store into
  the next group's rows. Such a tile goes through shared memory as usual, then every epilogue
  thread copies its rows of the subtile with a row and column predicate (:func:`store_rows`);
  whole tiles keep the TMA store (:func:`c_tile`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from wsgemm.support import VECTOR_BYTES

__all__ = ["RaggedStore", "a_tile", "c_tile", "first_batch", "store_rows", "tile_view"]


def first_batch(t: cute.Tensor) -> cute.Tensor:
    """(rows, cols, 1): batch 0 of a (rows, cols, L) tensor (the grouped kernel's A and C,
    whose L is B's group count with batch stride 0)."""
    layout = cute.make_layout((t.shape[0], t.shape[1], 1), stride=(t.stride[0], t.stride[1], 0))
    return cute.make_tensor(t.iterator, layout)


@dataclass(frozen=True)
class RaggedStore:
    """What the epilogue of a grouped kernel needs beyond the dense one's: C's TMA coordinates
    (rows, cols, 1), C itself (rows, cols) for the predicated copies, the thread's index among
    the epilogue threads and their count."""

    mC_tma: Any
    mC: Any
    tidx: Any
    threads: int


@cute.jit
def tile_view(tma, mX_tma, sX, cta, ctas: cutlass.Constexpr, offset, index,
              tile: cutlass.Constexpr):  # fmt: skip
    """(TMA, k_tiles): the TMA view of tile ``index`` (along its rows) of an operand whose
    coordinates start at ``offset`` ((row, k) of ``mX_tma``, its TMA coordinates (rows, K, 1));
    ``cta``/``ctas``: this CTA's slice of a tile its cluster multicasts, among how many. A
    grouped kernel's tiles start where their group does: at a row (ragged M, ``a_tile``) or
    at an element of K (ragged K, ``ragged_k.k_slice``)."""
    mX = cute.domain_offset(offset, mX_tma[(None, None, 0)])
    gX = cute.local_tile(mX, tile, (index, None))  # (tile_rows, tile_k, k_tiles)
    _, tXgX = cpasync.tma_partition(
        tma, cta, cute.make_layout(ctas), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2)
    )
    return tXgX


def a_tile(tma_a, mA_tma, sA, a_cta, cluster_n: int, tile, tile_mk: tuple):
    """(TMA, k_tiles): the TMA view of unit ``tile``'s A rows, from its group's first row on
    (``mA_tma``: A's TMA coordinates, (rows, K, 1); ``a_cta``: this CTA's slice of a tile that
    its cluster row multicasts)."""
    return tile_view(tma_a, mA_tma, sA, a_cta, cluster_n, (tile.row0, 0), tile.m, tile_mk)


@cute.jit
def c_tile(mC_tma, tile, tile_mn: cutlass.Constexpr):
    """(tile_m, tile_n): unit ``tile``'s output tile in C's TMA coordinates."""
    mC_group = cute.domain_offset((tile.row0, 0), mC_tma[(None, None, 0)])
    return cute.local_tile(mC_group, tile_mn, (tile.m, tile.n))


@cute.jit
def store_rows(store: RaggedStore, sC_buf, row, col, rows_left, epi_tile: cutlass.Constexpr,
               threads: cutlass.Constexpr):  # fmt: skip
    """Subtile ``sC_buf`` (epi_m, epi_n; complete in shared memory and visible to every
    epilogue thread) into C at (``row``, ``col``): its first ``rows_left`` rows, and its
    columns inside C. Each thread copies runs of one 16-byte vector's elements, a run per
    ``threads`` (``store.threads``, given again as a compile-time value; no thread waits on
    another; the caller's next barrier frees the buffer). A run inside C's columns goes out as
    one 16-byte load and store (a warp's runs lie side by side along the subtile's rows), one
    across C's last column element by element. (Every run element by element, 2-byte stores
    16 bytes apart each writing sectors in part, cost a skewed moe call ~20%: the ragged
    tile's epilogue 8.6 us against 1.9, and every other tile's loads waited twice as long;
    docs/perf.md entries 119, 121.)"""
    epi_m, epi_n = epi_tile
    run = min(VECTOR_BYTES * 8 // store.mC.element_type.width, epi_n)
    runs_per_row = epi_n // run
    runs = epi_m * runs_per_row
    cols = cute.size(store.mC, mode=[1])
    rows = cutlass.min(rows_left, epi_m)
    # C row-major (the grouped kernel's only form): a run's elements are consecutive, and the
    # row stride a multiple of a vector (the host passes 16-byte aligned rows; compile.py)
    if const_expr(
        not isinstance(store.mC.stride[1], int)
        or store.mC.stride[1] != 1
        or run * store.mC.element_type.width != VECTOR_BYTES * 8
    ):
        raise TypeError(
            f"store_rows copies {VECTOR_BYTES}-byte runs of a row-major C (a static column "
            f"stride of 1, a subtile at least a run wide); got C strides {store.mC.stride} "
            f"and {run} elements of {store.mC.element_type.width} bits a run"
        )
    for i in cutlass.range_constexpr((runs + threads - 1) // threads):
        r_idx = store.tidx + i * threads
        r = r_idx // runs_per_row
        v = r_idx - r * runs_per_row
        c = v * run
        if const_expr(runs % threads != 0):
            # the last round's surplus threads copy nothing: their row is past the subtile
            r = cutlass.select_(r_idx < runs, r, Int32(epi_m))
        if r < rows:
            values = cute.make_rmem_tensor((run,), store.mC.element_type)
            cute.autovec_copy(cute.local_tile(sC_buf, (1, run), (r, v))[(0, None)], values)
            if col + c + run <= cols:
                # (64-bit: a grouped C may hold more than 2**31 elements)
                start = cutlass.Int64(row + r) * store.mC.stride[0] + (col + c)
                out = cute.make_tensor(store.mC.iterator + cute.assume(start, divby=run),
                                       cute.make_layout(run))  # fmt: skip
                cute.autovec_copy(values, out)
            else:  # a run across C's last column
                for j in cutlass.range_constexpr(run):
                    if col + c + j < cols:
                        store.mC[(row + r, col + c + j)] = values[j]
