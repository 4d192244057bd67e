"""The host entry both sm80 kernels share: contract attributes, validated constructor, launch."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from wsgemm.kernels.sm80.config import Sm80Config
from wsgemm.kernels.sm80.plan import check_operands, check_target, make_tiles
from wsgemm.support import check_dtypes


class Sm80Kernel:
    """What both sm80 kernel classes share: the contract's attributes, a validated constructor
    and the host entry (``kernel``); each subclass sets ``name``, ``threads``, ``device_call``
    (and ``load_threads`` when not every thread loads) and writes its own roles."""

    name = "sm80"
    arch = "sm_80"
    # cp.async moves whole 16-byte vectors: the host pads unit-stride extents to 8 elements
    needs_vector_extent = True

    def __init__(self, config: Sm80Config, ab_dtype, c_dtype, acc_dtype):
        if not isinstance(config, Sm80Config):
            raise ValueError(f"{self.name} takes an Sm80Config, got {type(config).__name__}")
        check_dtypes(ab_dtype, c_dtype, acc_dtype)
        self.config = config
        self.ab_dtype = ab_dtype
        self.c_dtype = c_dtype
        self.acc_dtype = acc_dtype

    @property
    def load_threads(self) -> int:
        """Threads that issue the cp.async copies (all of them, or the producer warps)."""
        return self.threads

    @cute.jit
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """The host's entry: check the operands, build the static tiles, launch one CTA per
        (tile_m, tile_n) output tile and batch with the config's shared memory and launch
        bounds. Each kernel class supplies ``device_call`` (its traced ``@cute.kernel``)."""
        check_operands(mA, mB, mC, self.ab_dtype, self.c_dtype)
        c = self.config
        check_target(c, self.name)
        tiles = make_tiles(
            c, self.ab_dtype, self.c_dtype, self.acc_dtype, mA, mB, self.load_threads
        )
        self.device_call(mA, mB, mC, tiles).launch(
            grid=cute.ceil_div(mC.shape, (c.tile_m, c.tile_n, 1)),
            block=[self.threads, 1, 1],
            smem=self.shared_memory_bytes(),
            stream=stream,
            **c.launch_bounds(self.threads),
        )

    # ``cute.compile(kernel_object, ...)`` (the host's call) compiles ``__call__``.
    __call__ = kernel
