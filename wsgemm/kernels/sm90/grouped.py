"""The grouped sm90 GEMM: the dense kernel (``kernel.Sm90Gemm``) over groups of rows.

``Sm90GroupedGemm`` computes ``C[r, :] = A[r, :] @ B[g]^T`` for every row ``r`` of group ``g``,
the rows ``[offs[g - 1], offs[g])`` (``offs[-1] = 0``), with ``offs`` an int32 launch argument
on the GPU: a mixture-of-experts layer's tokens sorted by expert, ``torch._grouped_mm``'s 2D x
3D form. Its operands come through the same entries as the dense kernel's: A (rows, K, G) and
C (rows, N, G) with batch stride 0 (every group's rows in one matrix), B (N, K, G). Rows past
``offs[-1]`` are left as they were.

Roles, pipelines and the per-role timeline are the dense kernel's; what differs (the schedule
``common.grouped_scheduler.RaggedMScheduler``, A's row offset, the predicated store of a
group's last tile) is in ``ragged.py``.
"""

from __future__ import annotations

from wsgemm.kernels.sm90.kernel import Sm90Gemm

__all__ = ["Sm90GroupedGemm", "Sm90KGroupedGemm"]


class Sm90GroupedGemm(Sm90Gemm):
    """The ragged-M grouped GEMM (module docstring). No split-K, stream-K, swap-AB or fused
    bias yet (``ValueError`` at construction); an activation epilogue works. Built with
    ``trace=True`` it records as the dense kernel does (its tiles' fetches carry the tile in
    its group and the group), its grouped epilogue's store waits aside."""

    grouped = "m"
    # the dense kernel's launch arguments, then a row scale (a vector of every group's rows:
    # ``Epilogue.row_scale``; None without) and the groups' end rows (int32, one per group)
    LAUNCH_EXTRAS = (*Sm90Gemm.LAUNCH_EXTRAS, ("row_scale", None), ("offs", None))

    def fake_launch_extras(self) -> tuple:
        import cutlass.cute as cute
        from cutlass import Int32
        from cutlass.cute.runtime import make_fake_tensor

        scale = None
        if self.fused_epilogue.row_scale != "none":
            dtype = self._row_scale_dtype()
            scale = make_fake_tensor(dtype, (cute.sym_int64(),), (1,),
                                     assumed_align=dtype.width // 8)  # fmt: skip
        offs = make_fake_tensor(Int32, (cute.sym_int64(),), (1,), assumed_align=4)
        return (*super().fake_launch_extras(), scale, offs)


class Sm90KGroupedGemm(Sm90GroupedGemm):
    """The ragged-K grouped GEMM: ``C[:, :, g] = A[:, lo:hi] @ B[:, lo:hi]^T`` with ``[lo, hi)``
    group ``g``'s slice of K (``offs``' ends along K), ``torch._grouped_mm``'s 2D x 2D form (a
    mixture-of-experts layer's weight gradient). Operands: A (M, K, G) and B (N, K, G) with
    batch stride 0 (every group's K in one matrix; A M-major, B N-major), C (M, N, G); the
    ``workspace`` launch argument holds each CTA's descriptors
    (``config.RAGGED_K_WORDS_PER_CTA`` fp32 words a CTA, the launch's clusters x cluster size
    CTAs). The schedule is the dense one over
    C's tiles; each unit's loads start at its group's first k and read zeros past its last
    (``ragged_k.py``). The same limits as ``Sm90GroupedGemm``, and no traced variant."""

    grouped = "k"

    def fake_launch_extras(self) -> tuple:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_tensor

        count, _, semaphores, *rest = super().fake_launch_extras()
        # the descriptor slots: 128-byte aligned (a torch allocation is)
        workspace = make_fake_tensor(cutlass.Float32, (cute.sym_int64(),), (1,), assumed_align=128)
        return (count, workspace, semaphores, *rest)
