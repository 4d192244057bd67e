"""What both sm80 kernels share: contract attributes, validated constructor, the host entry
``__call__`` (checks, plan, launch) and the ``epilogue`` role."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from wsgemm.kernels.base import GemmKernel
from wsgemm.kernels.common import trace
from wsgemm.kernels.sm80.config import BUFFER_ALIGN_BYTES, MIN_ARCH_MAJOR, Sm80Config, smem_bytes
from wsgemm.kernels.sm80.epilogue import store_accumulators
from wsgemm.kernels.sm80.plan import Sm80Plan, check_operands, make_plan
from wsgemm.support import MAX_GRID_DIM, VECTOR_BYTES, WARP_SIZE, arch_major, check_dtypes


def launch_columns(config: Sm80Config) -> int:
    """Columns of C one launch covers: grid y holds :data:`~wsgemm.support.MAX_GRID_DIM` [1]
    n tiles, so a wider C goes out in several launches over column slices of B and C."""
    return MAX_GRID_DIM[1] * config.tile_n


def column_slices(n: int, config: Sm80Config) -> list[tuple[int, int]]:
    """(first column, width) of each launch for a C with ``n`` columns (host replay of
    ``__call__``'s loop; one launch unless N > 65535 tiles)."""
    cols = launch_columns(config)
    return [(first, min(cols, n - first)) for first in range(0, n, cols)]


def _slice_mode(t: cute.Tensor, mode: int, first, width) -> cute.Tensor:
    """``t`` restricted to ``[first, first + width)`` along ``mode``, the same strides: a view.
    ``first`` is a whole number of 16-byte vectors along a unit stride and the other strides
    are 16-byte multiples, so the base stays 16-byte aligned."""
    shape = tuple(width if i == mode else t.shape[i] for i in range(cute.rank(t)))
    base = (t.iterator + first * t.stride[mode]).align(VECTOR_BYTES)
    return cute.make_tensor(base, cute.make_layout(shape, stride=t.stride))


class Sm80Kernel(GemmKernel):
    """The sm80 family's host side and epilogue. Each kernel class sets ``name`` and ``threads``
    (and ``load_threads`` when not every thread loads), and writes its device entry ``kernel``
    (a ``@cute.kernel`` taking ``(mA, mB, mC, plan)``) and its ``load`` / ``mma`` roles."""

    name = "sm80"
    arch = "sm_80"
    # cp.async moves whole 16-byte vectors: the host pads unit-stride extents to 8 elements
    needs_vector_extent = True

    def __init__(
        self,
        config: Sm80Config,
        ab_dtype,
        c_dtype,
        acc_dtype,
        gpu_arch: str = "sm_80",
        trace: bool = False,
    ):
        """``gpu_arch``: the DSL target this object is compiled for (the host passes the
        variant's); it picks how mbarrier waits are written, and the config's shared memory
        must fit its budget (``Sm80Config.check_smem``). ``trace``: build the traced variant
        (launched through ``traced``; module ``wsgemm.kernels.common.trace``)."""
        if not isinstance(config, Sm80Config):
            raise ValueError(f"{self.name} takes an Sm80Config, got {type(config).__name__}")
        check_dtypes(ab_dtype, c_dtype, acc_dtype)
        if arch_major(gpu_arch) < MIN_ARCH_MAJOR:
            raise ValueError(f"{self.name} needs sm_80 or later, got gpu_arch={gpu_arch!r}")
        config.check_smem(gpu_arch)
        self.gpu_arch = gpu_arch
        self.trace = bool(trace)
        self.config = config
        self.ab_dtype = ab_dtype
        self.c_dtype = c_dtype
        self.acc_dtype = acc_dtype

    @property
    def load_threads(self) -> int:
        """Threads that issue the cp.async copies (all of them, or the producer warps)."""
        return self.threads

    def check_traced(self) -> None:
        """The recorders' shared slots go in front of the A/B buffer, in the slack its 1 KiB
        alignment leaves (``smem_bytes``), so the traced kernel has the same budget. A traced
        sm80 kernel records row ``cta * warps + w`` for warp w of the CTA with linear index
        ``cta`` (grid x fastest); CTAs past the rows record nothing. One launch only: the host
        traces no C wider than ``launch_columns``."""
        front = self.shared_memory_bytes() - smem_bytes(
            self.config, self.ab_dtype, self.c_dtype, barrier_stages=0
        )
        slots = 4 * trace.slot_words(self.threads // WARP_SIZE)
        if front + slots > BUFFER_ALIGN_BYTES:
            raise ValueError(
                f"{front} bytes of barriers and {slots} of trace slots do not fit in the "
                f"{BUFFER_ALIGN_BYTES}-byte alignment slack before the shared buffer"
            )

    @cute.jit
    def _call(self, mA, mB, mC, max_active_clusters, stream, raster_group, launch, trace_buffer):
        """One CTA per (tile_m, tile_n) output tile and batch (grid x: m, y: n, z: batch) with
        the config's shared memory and launch bounds; past 65535 n tiles, one launch per column
        slice. The persistent kernels' launch arguments (``max_active_clusters``,
        ``raster_group``) are accepted and unused; there are no others."""
        trace.check_entry(self.trace, trace_buffer)
        check_operands(mA, mB, mC, self.ab_dtype, self.c_dtype)
        c = self.config
        plan = make_plan(c, self.ab_dtype, self.c_dtype, self.acc_dtype, mA, mB, self.load_threads)
        # Grid y holds 65535 n tiles: a wider C goes out in launches over column slices
        # (views of B and C), one launch otherwise.
        n = cute.size(mC, mode=[1])
        cols = launch_columns(c)
        for first in cutlass.range(0, n, cols, unroll=1):
            width = cutlass.min(cols, n - first)
            mB_part = _slice_mode(mB, 0, first, width)
            mC_part = _slice_mode(mC, 1, first, width)
            self._launch(mA, mB_part, mC_part, plan, stream, trace_buffer)

    @cute.jit
    def _launch(self, mA, mB, mC, plan: Sm80Plan, stream, trace_buffer):
        c = self.config
        self.kernel(mA, mB, mC, plan, trace_buffer).launch(
            grid=cute.ceil_div(mC.shape, (c.tile_m, c.tile_n, 1)),
            block=[self.threads, 1, 1],
            smem=self.shared_memory_bytes(),
            stream=stream,
            **c.launch_bounds(self.threads),
        )

    @cute.jit
    def epilogue(
        self,
        plan: Sm80Plan,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        sC: cute.Tensor,
        mC_mn: cute.Tensor,
        tile_mn,
        tid: cutlass.Int32,
    ):
        """MMA threads (``tid`` in [0, mma_threads)): this CTA's tile of ``mC_mn`` (one batch)
        from the accumulators, through the shared slab (``store_accumulators``)."""
        store_accumulators(plan, tiled_mma, acc, sC, mC_mn, tile_mn, tid)
