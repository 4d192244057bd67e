"""Global -> shared for the sm80 kernels: one thread's residue-aware cp.async copies of one
operand (see ``plan``'s module docstring for how residues are handled)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from wsgemm.support import VECTOR_BYTES


@dataclass(frozen=True)
class OperandLoader:
    """One thread's cp.async work for one operand (A or B) of one CTA tile."""

    tiled_copy: cute.TiledCopy
    tXgX: cute.Tensor  # (CPY, CPY_MN, CPY_K, k_tiles) global source, residue-shifted along k
    tXsX: cute.Tensor  # (CPY, CPY_MN, CPY_K, stages) shared destination
    tXcX: cute.Tensor  # (CPY, CPY_MN, CPY_K, k_tiles) (mn, k) coordinates of the source
    tXpX: cute.Tensor  # (CPY_V, CPY_MN, CPY_K) row-in-range predicates, broadcast along k
    #: Whether every row of the CTA's tile is in range (run-time, uniform over the CTA).
    interior: cutlass.Boolean

    @cute.jit
    def load(self, k_tile, stage, predicated: cutlass.Constexpr = True):
        """A k-tile after the first: every k is in range; rows are predicated unless the
        caller knows the tile is ``interior`` (then each copy is one instruction, with no
        predicate to rebuild: the producer warp's budget, docs/sm80.md)."""
        # Row group by row group, the k-direction copies of a row group back to back: they
        # share one address (constant offsets), which the compiler then computes once.
        for i in cutlass.range_constexpr(cute.size(self.tXsX, mode=[1])):
            cute.copy(
                self.tiled_copy,
                self.tXgX[None, i, None, k_tile],
                self.tXsX[None, i, None, stage],
                pred=self.tXpX[None, i, None] if predicated else None,
            )

    @cute.jit
    def load_first(self, stage):
        """k-tile 0 holds the k residue: vectors at negative (shifted) k are skipped and keep
        the zeros of the stage."""
        for k in cutlass.range_constexpr(cute.size(self.tXsX, mode=[2])):
            if cute.elem_less(cutlass.Int32(-1), self.tXcX[0, 0, k, 0][1]):
                cute.copy(
                    self.tiled_copy,
                    self.tXgX[None, None, k, 0],
                    self.tXsX[None, None, k, stage],
                    pred=self.tXpX[None, None, k],
                )


def _row_in_range(tXcX: cute.Tensor, v, i, extent_mn):
    """Whether vector ``v`` of row group ``i`` of a thread's copies lies in rows [0, extent)."""
    return cute.elem_less(tXcX[(0, v), i, 0, 0][0], extent_mn)


@cute.jit
def make_operand_loader(
    tiled_copy: cute.TiledCopy,
    mX: cute.Tensor,
    sX: cute.Tensor,
    tile_mn: cutlass.Constexpr,
    tile_k: cutlass.Constexpr,
    tile_idx,
    tid,
) -> OperandLoader:
    """``mX``: one batch of the operand, (MN, K); ``tile_idx``: this CTA's tile along MN."""
    gX = cute.local_tile(mX, (tile_mn, tile_k), (tile_idx, None))  # (tile_mn, tile_k, k_tiles)
    cX = cute.local_tile(cute.make_identity_tensor(mX.shape), (tile_mn, tile_k), (tile_idx, None))
    # Shift the k-tiles so the partial one is first (its start is <= 0).
    residue_k = cute.size(mX, mode=[1]) - tile_k * cute.size(gX, mode=[2])
    gX = cute.domain_offset((0, residue_k, 0), gX)
    cX = cute.domain_offset((0, residue_k, 0), cX)
    # The shift is a multiple of 8 elements along a stride-1 K or a K stride that is a
    # multiple of 8, so every k-tile still starts on a 16-byte boundary: one cp.async vector.
    gX = cute.make_tensor(gX.iterator.align(VECTOR_BYTES), gX.layout)

    thr = tiled_copy.get_slice(tid)
    tXgX = thr.partition_S(gX)
    tXsX = thr.partition_D(sX)
    tXcX = thr.partition_S(cX)
    tXpX = cute.make_rmem_tensor(
        cute.make_layout(
            (tXsX.shape[0][1], cute.size(tXsX, mode=[1]), cute.size(tXsX, mode=[2])),
            stride=(cute.size(tXsX, mode=[1]), 1, 0),
        ),
        cutlass.Boolean,
    )
    extent_mn = cute.size(mX, mode=[0])
    for v in cutlass.range_constexpr(tXpX.shape[0]):
        for i in cutlass.range_constexpr(tXpX.shape[1]):
            tXpX[v, i, 0] = _row_in_range(tXcX, v, i, extent_mn)
    interior = (tile_idx + 1) * tile_mn <= extent_mn
    return OperandLoader(tiled_copy, tXgX, tXsX, tXcX, tXpX, interior)
