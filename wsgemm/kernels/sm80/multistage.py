"""Multistage (non-specialized) cp.async + mma.sync GEMM: the ablation baseline of ``sm80``."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

from wsgemm.kernels.common import trace
from wsgemm.kernels.sm80.config import BUFFER_ALIGN_BYTES, smem_bytes
from wsgemm.kernels.sm80.kernel import Sm80Kernel
from wsgemm.kernels.sm80.load import OperandLoader, make_operand_loader
from wsgemm.kernels.sm80.mma import make_accumulators, make_mma_fragments
from wsgemm.kernels.sm80.plan import Sm80Plan, carve_smem, zero_fill
from wsgemm.support import WARP_SIZE
from wsgemm.trace_format import Event, Role

__all__ = ["Sm80MultistageGemm"]


class Sm80MultistageGemm(Sm80Kernel):
    """The ablation baseline of :class:`~wsgemm.kernels.sm80.specialized.Sm80WsGemm`: the same tile,
    stages, shared layouts, fragment double buffer and epilogue, but no warp specialization.
    Every warp both loads and computes, the way CUTLASS's sm80 multistage GEMM does; comparing
    the two measures what specialization buys.

    Roles
        * warps 0 .. mma_warps - 1 (``mma_warps_m`` x ``mma_warps_n`` warps of m16n8k16: 128
          or 256 threads), all alike: cp.async.cg 16-byte copies of A and B k-tiles into a
          ``stages``-deep ring, ldmatrix + mma.sync, then the epilogue shared with the WS
          kernel.

    Pipelines
        * ``ab``: cp.async commit groups, one per k-tile (empty ones past the last k-tile keep
          the count uniform). A stage is read after ``cp.async.wait_group(stages - 2)`` plus
          ``__syncthreads`` (each thread waits for its own copies; the block barrier makes
          everyone's copies visible and proves everyone is done reading the stage refilled
          next). No mbarriers.
        * epilogue: named barrier 1 over all ``mma_threads`` (128 or 256) threads.

    Per-role timeline
        * prologue: issue k-tiles 0 .. stages-2 (k-tile 0 residue-predicated), wait for k-tile
          0, ldmatrix its k-block 0.
        * steady state, per k-block b of k-tile t: at b = 0, issue k-tile t + stages - 1 into
          the stage read during t - 1 and commit; ldmatrix b + 1 into the other register slot
          while mma.sync consumes b; at the last b, ``wait_group`` + ``__syncthreads`` and
          ldmatrix k-block 0 of k-tile t + 1 instead.
        * end: barrier -> accumulators to shared -> barrier -> 16-byte stores, per pass.

    Registers: the MMA threads here also keep the cp.async addresses and predicates live; the
    shipped tiles (the specialized kernel's) and why: docs/perf.md entry 14.
    """

    name = "sm80-multistage"

    @property
    def threads(self) -> int:
        """Every warp is an MMA warp (and a loader, and an epilogue warp)."""
        return self.config.mma_threads

    def shared_memory_bytes(self) -> int:
        """Dynamic shared memory per CTA: max(A/B ring, epilogue slab); no mbarriers."""
        return smem_bytes(self.config, self.ab_dtype, self.c_dtype, barrier_stages=0)

    @cute.kernel
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        plan: cutlass.Constexpr,
        trace_buffer,
    ):
        """Zero the ring, then every warp loads and multiplies, then stores."""
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, bl = cute.arch.block_idx()

        smem = SmemAllocator()
        slots = trace.smem_slots(trace_buffer, smem, self.threads // WARP_SIZE)
        buffer = smem.allocate(
            self.shared_memory_bytes() - BUFFER_ALIGN_BYTES, byte_alignment=BUFFER_ALIGN_BYTES
        )
        views = carve_smem(plan, buffer)
        # Stages start zeroed: residue vectors are skipped, not copied (see the ``plan`` module).
        zero_fill(buffer, views.ab_bytes, tidx, self.threads)
        cute.arch.sync_threads()

        rec = trace.open_recorder(trace_buffer, slots, Role.WORKER, self.gpu_arch, WARP_SIZE)
        trace.fetch(rec, (bm, bn, bl))
        tiled_mma = plan.tiled_mma()
        acc = self.load_and_mma(
            plan, tiled_mma, mA[None, None, bl], mB[None, None, bl], views, bm, bn, tidx, rec
        )
        trace.record(rec, Event.EPILOGUE_BEGIN)
        self.epilogue(plan, tiled_mma, acc, views.sC, mC[None, None, bl], (bm, bn), tidx)
        trace.record(rec, Event.EPILOGUE_END)
        trace.close(rec)

    @cute.jit
    def load_and_mma(
        self,
        plan: Sm80Plan,
        tiled_mma: cute.TiledMma,
        mA_mk: cute.Tensor,
        mB_nk: cute.Tensor,
        views,
        bm: cutlass.Int32,
        bn: cutlass.Int32,
        tid: cutlass.Int32,
        rec=None,
    ) -> cute.Tensor:
        """All warps: load k-tiles ``stages - 1`` ahead and multiply the current one. ``rec``:
        the warp's trace recorder (None: untraced)."""
        c = plan.config
        stages = c.stages
        load_a = make_operand_loader(
            plan.g2s_copy_a(), mA_mk, views.sA, c.tile_m, c.tile_k, bm, tid
        )
        load_b = make_operand_loader(
            plan.g2s_copy_b(), mB_nk, views.sB, c.tile_n, c.tile_k, bn, tid
        )
        k_tiles = cute.size(load_a.tXgX, mode=[3])
        frags = make_mma_fragments(plan, tiled_mma, views.sA, views.sB, tid)
        acc = make_accumulators(plan, tiled_mma)
        k_blocks = plan.k_blocks
        interior = load_a.interior and load_b.interior

        # k-tile j always lives in stage j % stages.
        trace.record(rec, Event.LOAD_BEGIN)
        load_a.load_first(0)
        load_b.load_first(0)
        cute.arch.cp_async_commit_group()
        for s in cutlass.range_constexpr(1, stages - 1):
            if s < k_tiles:
                load_a.load(s, s)
                load_b.load(s, s)
            cute.arch.cp_async_commit_group()
        trace.record(rec, Event.LOAD_END)
        trace.record(rec, Event.WAIT_FULL_BEGIN, 0, 0)
        cute.arch.cp_async_wait_group(stages - 2)
        cute.arch.sync_threads()
        trace.record(rec, Event.WAIT_FULL_END, 0, 0)
        frags.load(0, 0, 0)

        # Two copies of the main loop, chosen once per CTA: the copies of an interior tile need
        # no row predicates (fewer instructions in the loop every warp runs).
        if cutlass.const_expr(c.fast_interior):
            if interior:
                self.load_and_mma_k_tiles(
                    load_a, load_b, frags, tiled_mma, acc, k_tiles, k_blocks, stages, False, rec
                )
            else:
                self.load_and_mma_k_tiles(
                    load_a, load_b, frags, tiled_mma, acc, k_tiles, k_blocks, stages, True, rec
                )
        else:
            self.load_and_mma_k_tiles(
                load_a, load_b, frags, tiled_mma, acc, k_tiles, k_blocks, stages, True, rec
            )
        return acc

    @cute.jit
    def load_and_mma_k_tiles(
        self,
        load_a: OperandLoader,
        load_b: OperandLoader,
        frags,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        k_tiles: cutlass.Int32,
        k_blocks: cutlass.Constexpr,
        stages: cutlass.Constexpr,
        predicated: cutlass.Constexpr,
        rec=None,
    ):
        """Steady state: every k-tile into ``acc``; refills rows-predicated or not. Traced:
        each k-tile is a compute phase holding the refill's load phase and the wait for the
        next k-tile (``WAIT_FULL``; at the last k-tile, the closing barrier)."""
        stage = cutlass.Int32(0)
        for k_tile in cutlass.range(k_tiles, unroll=1):
            trace.record(rec, Event.COMPUTE_BEGIN, k_tile, stage)
            for kb in cutlass.range_constexpr(k_blocks):
                next_slot = (kb + 1) % 2
                if cutlass.const_expr(kb == k_blocks - 1):
                    # k-tile t + 1 has landed once at most stages - 2 groups are pending; the
                    # barrier publishes everyone's copies and closes everyone's reads of the
                    # stage refilled at the next k-tile's first k-block.
                    trace.record(rec, Event.WAIT_FULL_BEGIN, k_tile + 1)
                    cute.arch.cp_async_wait_group(stages - 2)
                    cute.arch.sync_threads()
                    trace.record(rec, Event.WAIT_FULL_END, k_tile + 1)
                    if k_tile + 1 < k_tiles:
                        frags.load(0, (stage + 1) % stages, next_slot)
                else:
                    frags.load(kb + 1, stage, next_slot)
                if cutlass.const_expr(kb == 0):
                    # The stage of k-tile t - 1: every thread passed the barrier after its
                    # last ldmatrix of it.
                    refill = k_tile + stages - 1
                    trace.record(rec, Event.LOAD_BEGIN, refill)
                    if refill < k_tiles:
                        refill_stage = (stage + stages - 1) % stages
                        load_a.load(refill, refill_stage, predicated)
                        load_b.load(refill, refill_stage, predicated)
                    cute.arch.cp_async_commit_group()
                    trace.record(rec, Event.LOAD_END, refill)
                frags.mma(tiled_mma, acc, kb % 2)
            trace.record(rec, Event.COMPUTE_END, k_tile, stage)
            stage = (stage + 1) % stages
