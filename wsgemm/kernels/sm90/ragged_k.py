"""The ragged-K grouped GEMM's pieces of the sm90 kernel (``grouped.Sm90KGroupedGemm``).

Group ``g`` sums over its own slice ``[end[g - 1], end[g])`` of K: ``C[:, :, g] = A[:, lo:hi]
@ B[:, lo:hi]^T`` (``torch._grouped_mm``'s 2D x 2D form, a mixture-of-experts layer's weight
gradient, K its tokens sorted by expert). The output's tiles are known on the host (``groups``
batches of ``M x N``), so the schedule is the dense one over them
(``common.grouped_scheduler.RaggedKScheduler``); what differs is where each unit's K starts and
ends, and the ends matter: a group's last k-tile runs past its slice into the next group's,
which must read as zero (in *both* operands: a zero in one and an Inf in the other is a NaN).

TMA zero-fills what lies past a descriptor's extent, so each CTA keeps its own copy of A's and
B's descriptors in global memory (the ``workspace`` launch argument: :data:`WORDS_PER_CTA` fp32
words per CTA) and, whenever its unit's group changes, rewrites their K extent to the group's
end (``tensormap.replace``) before it loads, once every load it issued earlier has landed (the
producer first waits for the consumers to release the stage it filled last,
``Sm90Gemm._drain``: without that wait an H100 read an empty group's k-tile through the
previous group's extent, docs/perf.md entry 58): a unit's loads start at its group's first element
of K (TMA coordinates offset by it, as the ragged-M kernel offsets rows) and stop being real at
its end. An empty group takes one k-tile loaded wholly past the extent: zeros, so its tile is
zero (``grouped_scheduler.group_k_span``).

Only the producer warp differs from the dense kernel (its descriptors and its tile views);
the consumers see a dense unit with ``k_tiles`` k-tiles. K must be an operand's strided
dimension (A M-major, B N-major: the weight gradient's natural layout, ``dY^T`` and ``X``):
a group starts at any element of K, and a box start inside the contiguous dimension that is
not 16-byte aligned is an illegal instruction (docs/perf.md entry 39).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils.tensormap import TensorMapManager, TensorMapUpdateMode

from wsgemm.kernels.sm90.config import RAGGED_K_WORDS_PER_CTA as WORDS_PER_CTA
from wsgemm.kernels.sm90.config import TMA_DESCRIPTOR_BYTES as DESCRIPTOR_BYTES
from wsgemm.kernels.sm90.ragged import tile_view

__all__ = ["DESCRIPTOR_BYTES", "WORDS_PER_CTA", "Descriptors", "k_slice"]

#: Turns workspace addresses into descriptor pointers (the descriptors live in global memory).
_TENSORMAPS = TensorMapManager(TensorMapUpdateMode.GMEM, DESCRIPTOR_BYTES)


@dataclass(frozen=True)
class Descriptors:
    """One CTA's copies of A's and B's TMA descriptors (global memory) and what rewrites
    them: the TMA atoms, A (rows, K, 1) and B (cols, K, 1) as the host passed them."""

    tma_a: Any
    tma_b: Any
    mA: Any
    mB: Any
    ptr_a: Any  # the descriptors' global addresses (tensormap pointers)
    ptr_b: Any

    @staticmethod
    def of_cta(tma_a, tma_b, mA, mB, workspace) -> Descriptors:
        """This CTA's slot of ``workspace`` (its linear index in the launch grid)."""
        bx, by, bz = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        cta = (bz * gy + by) * gx + bx
        base = workspace.iterator + cta * WORDS_PER_CTA
        return Descriptors(tma_a, tma_b, mA, mB, _TENSORMAPS.get_tensormap_ptr(base),
                           _TENSORMAPS.get_tensormap_ptr(base + WORDS_PER_CTA // 2))  # fmt: skip

    @cute.jit
    def init(self):
        """Copy the launch's descriptors into this CTA's slot (the producer warp, once)."""
        with cute.arch.elect_one():
            cpasync.copy_tensormap(self.tma_a, self.ptr_a)
            cpasync.copy_tensormap(self.tma_b, self.ptr_b)
        cute.arch.sync_warp()

    @cute.jit
    def retarget(self, k_extent):
        """Both descriptors' K extent set to ``k_extent`` (the whole producer warp: the
        rewrite, then the release and acquire fences that order it before the next loads)."""
        for atom, t, ptr in ((self.tma_a, self.mA, self.ptr_a), (self.tma_b, self.mB, self.ptr_b)):
            view = cute.make_tensor(
                t.iterator, cute.make_layout((t.shape[0], k_extent, 1), stride=t.stride)
            )
            cpasync.update_tma_descriptor(atom, view, ptr)
        cute.arch.sync_warp()
        cpasync.fence_tma_desc_release()
        cpasync.fence_tma_desc_acquire(self.ptr_a)
        cpasync.fence_tma_desc_acquire(self.ptr_b)

    def a(self):
        """A's descriptor address for ``cute.copy(..., tma_desc_ptr=)``."""
        return _TENSORMAPS.get_tensormap_ptr(self.ptr_a, cute.AddressSpace.generic)

    def b(self):
        return _TENSORMAPS.get_tensormap_ptr(self.ptr_b, cute.AddressSpace.generic)


def k_slice(tma, mX_tma, sX, cta, ctas: int, index, k_start, tile: tuple):
    """(TMA, k_tiles): the TMA view of tile ``index`` of an operand (``mX_tma``: its TMA
    coordinates, (rows, K, 1)) from element ``k_start`` of K on (``ragged.tile_view``)."""
    return tile_view(tma, mX_tma, sX, cta, ctas, (0, k_start), index, tile)


def check_operands(a_major, b_major, row_major) -> None:
    """K must be each operand's strided dimension (module docstring)."""
    if const_expr(a_major == row_major or b_major == row_major):
        raise ValueError(
            "the ragged-K grouped kernel reads an M-major A and an N-major B (a group starts "
            "at any element of K; the host copies others)"
        )
