"""The sm80 epilogue: accumulators -> output dtype -> swizzled shared slab -> 16-byte global
stores, run by the MMA threads only."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from wsgemm.kernels.sm80.plan import COPY_BITS, Sm80Plan
from wsgemm.support import BarrierId, vector_elems

#: The epilogue's barrier among the MMA threads.
EPILOGUE_BARRIER_ID = int(BarrierId.EPILOGUE)


@cute.jit
def store_accumulators(
    plan: Sm80Plan,
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    sC: cute.Tensor,
    mC: cute.Tensor,
    tile_mn,
    tid,
):
    """Write this CTA's (tile_m, tile_n) tile of ``mC`` (one batch, (M, N), N-major).

    Runs on the ``config.mma_threads`` MMA threads only (``tid`` in [0, mma_threads)) and
    synchronises them with named barrier :data:`EPILOGUE_BARRIER_ID`, which counts exactly
    those threads; the first barrier also guarantees that every MMA warp is done
    reading the A/B ring before the slab overwrites it. The tile goes out in passes of
    ``epi_n`` columns when the whole of it does not fit in the ring.
    """
    c = plan.config
    c_dtype = plan.c_dtype
    vec = vector_elems(c_dtype)
    epi_n = plan.epi_n
    mma_threads = c.mma_threads
    barrier = cutlass.pipeline.NamedBarrier(barrier_id=EPILOGUE_BARRIER_ID, num_threads=mma_threads)

    # Registers -> shared: two adjacent columns per store, the MMA's accumulator pairs.
    r2s = cute.make_tiled_copy_C(
        cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), c_dtype, num_bits_per_copy=2 * c_dtype.width
        ),
        tiled_mma,
    )
    thr_r2s = r2s.get_slice(tid)
    tRsC = thr_r2s.partition_D(sC)
    pass_layout = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((c.tile_m, epi_n))).layout
    pass_size = cute.size(pass_layout)

    # Shared -> global: one 16-byte vector per thread, threads along N, whole rows per pass of
    # the threads (``epilogue_tile_n`` checked that they divide the slab).
    along_n = epi_n // vec
    s2g = cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), c_dtype, num_bits_per_copy=COPY_BITS),
        cute.make_layout((mma_threads // along_n, along_n), stride=(along_n, 1)),
        cute.make_layout((1, vec)),
    )
    thr_s2g = s2g.get_slice(tid)
    tSsC = thr_s2g.partition_S(sC)  # (CPY, CPY_M, CPY_N)

    gC = cute.local_tile(mC, (c.tile_m, c.tile_n), tile_mn)
    cC = cute.local_tile(cute.make_identity_tensor(mC.shape), (c.tile_m, c.tile_n), tile_mn)
    extent = mC.shape
    for p in cutlass.range_constexpr(c.tile_n // epi_n):
        # The accumulators' N mode is the outermost, so a pass is a contiguous run of them.
        acc_pass = cute.make_tensor(acc.iterator + p * pass_size, pass_layout)
        out = cute.make_fragment_like(acc_pass, c_dtype)
        out.store(acc_pass.load().to(c_dtype))
        # Pass 0: every MMA warp is done with the A/B ring. Later passes: done reading the slab.
        barrier.arrive_and_wait()
        cute.copy(r2s, thr_r2s.retile(out), tRsC)
        barrier.arrive_and_wait()

        gC_pass = cute.local_tile(gC, (c.tile_m, epi_n), (0, p))
        cC_pass = cute.local_tile(cC, (c.tile_m, epi_n), (0, p))
        tSgC = thr_s2g.partition_D(gC_pass)
        tScC = thr_s2g.partition_D(cC_pass)
        tSrC = cute.make_fragment_like(tSsC)
        cute.autovec_copy(tSsC, tSrC)
        for m in cutlass.range_constexpr(cute.size(tSrC, mode=[1])):
            for n in cutlass.range_constexpr(cute.size(tSrC, mode=[2])):
                coord = tScC[0, m, n]
                if cute.elem_less(coord[0], extent[0]) and cute.elem_less(coord[1], extent[1]):
                    cute.copy(s2g, tSrC[None, m, n], tSgC[None, m, n])
