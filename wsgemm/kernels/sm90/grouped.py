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

__all__ = ["Sm90GroupedGemm"]


class Sm90GroupedGemm(Sm90Gemm):
    """The ragged-M grouped GEMM (module docstring). No split-K, stream-K, swap-AB, tracing or
    fused bias yet (``ValueError`` at construction); an activation epilogue works."""

    grouped = "m"
    # the dense kernel's launch arguments, then the groups' end rows (int32, one per group)
    LAUNCH_EXTRAS = (*Sm90Gemm.LAUNCH_EXTRAS, ("offs", None))

    def fake_launch_extras(self) -> tuple:
        import cutlass.cute as cute
        from cutlass import Int32
        from cutlass.cute.runtime import make_fake_tensor

        offs = make_fake_tensor(Int32, (cute.sym_int64(),), (1,), assumed_align=4)
        return (*super().fake_launch_extras(), offs)
