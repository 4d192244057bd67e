"""What both sm80 kernels share: contract attributes, validated constructor, the host entry
``__call__`` (checks, plan, launch) and the ``epilogue`` role."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from wsgemm.kernels.sm80.config import Sm80Config
from wsgemm.kernels.sm80.epilogue import store_accumulators
from wsgemm.kernels.sm80.plan import Sm80Plan, check_operands, make_plan
from wsgemm.support import arch_major, check_dtypes


def launch_grid(m_tiles, n_tiles, batches) -> tuple:
    """One CTA per output tile and batch. The (m, n) tiles go on x, whose limit is 2^31 - 1
    blocks (y and z hold 65535: N / tile_n on y would cap N), m fastest, so CTAs launch in the
    order an (m, n, batch) grid would; the batch goes on z (the host splits larger batches).
    Plain ``*``, so it runs on Python ints (tests) and DSL values (the launch) alike."""
    return (m_tiles * n_tiles, 1, batches)


def block_tile(block_x, m_tiles) -> tuple:
    """The (m, n) output tile of block ``block_x`` of :func:`launch_grid`."""
    return block_x % m_tiles, block_x // m_tiles


class Sm80Kernel:
    """The sm80 family's host side and epilogue. Each kernel class sets ``name`` and ``threads``
    (and ``load_threads`` when not every thread loads), and writes its device entry ``kernel``
    (a ``@cute.kernel`` taking ``(mA, mB, mC, plan)``) and its ``load`` / ``mma`` roles."""

    name = "sm80"
    arch = "sm_80"
    # cp.async moves whole 16-byte vectors: the host pads unit-stride extents to 8 elements
    needs_vector_extent = True

    def __init__(self, config: Sm80Config, ab_dtype, c_dtype, acc_dtype, gpu_arch: str = "sm_80"):
        """``gpu_arch``: the DSL target this object is compiled for (the host passes the
        variant's); it picks how mbarrier waits are written and must fit the config."""
        if not isinstance(config, Sm80Config):
            raise ValueError(f"{self.name} takes an Sm80Config, got {type(config).__name__}")
        check_dtypes(ab_dtype, c_dtype, acc_dtype)
        if arch_major(gpu_arch) < 8:
            raise ValueError(f"{self.name} needs sm_80 or later, got gpu_arch={gpu_arch!r}")
        if config.target == "sm_90a" and gpu_arch != "sm_90a":
            raise ValueError(
                f"{self.name}: this Sm80Config has target='sm_90a' (Hopper's shared memory or "
                f"setmaxnreg), it cannot be built for {gpu_arch}; other GPUs take "
                "target='sm_80' configs"
            )
        self.gpu_arch = gpu_arch
        self.config = config
        self.ab_dtype = ab_dtype
        self.c_dtype = c_dtype
        self.acc_dtype = acc_dtype

    @property
    def load_threads(self) -> int:
        """Threads that issue the cp.async copies (all of them, or the producer warps)."""
        return self.threads

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
        raster_group: cutlass.Int32 = 0,
    ):
        """The host entry: check the operands, build the static plan, launch one CTA per
        (tile_m, tile_n) output tile and batch (:func:`launch_grid`) with the config's shared
        memory and launch bounds. The launch arguments of persistent kernels
        (``max_active_clusters``, ``raster_group``) are accepted and unused."""
        check_operands(mA, mB, mC, self.ab_dtype, self.c_dtype)
        c = self.config
        plan = make_plan(c, self.ab_dtype, self.c_dtype, self.acc_dtype, mA, mB, self.load_threads)
        m_tiles, n_tiles, batches = cute.ceil_div(mC.shape, (c.tile_m, c.tile_n, 1))
        self.kernel(mA, mB, mC, plan).launch(
            grid=launch_grid(m_tiles, n_tiles, batches),
            block=[self.threads, 1, 1],
            smem=self.shared_memory_bytes(),
            stream=stream,
            **c.launch_bounds(self.threads),
        )

    @cute.jit
    def output_tile(self, mC: cute.Tensor):
        """(m tile, n tile, batch) of this CTA (:func:`launch_grid`)."""
        block, _, batch = cute.arch.block_idx()
        bm, bn = block_tile(block, cute.ceil_div(cute.size(mC, mode=[0]), self.config.tile_m))
        return bm, bn, batch

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
