"""Warp-specialized cp.async + mma.sync GEMM for sm_80 / sm_86 / sm_89 (also runs on sm_90a)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

from wsgemm.kernels.common import trace
from wsgemm.kernels.common.arrive import check_arrive_count
from wsgemm.kernels.common.budget import barrier_bytes
from wsgemm.kernels.common.pipeline import CpAsyncPipeline
from wsgemm.kernels.sm80.config import BUFFER_ALIGN_BYTES, smem_bytes
from wsgemm.kernels.sm80.kernel import Sm80Kernel
from wsgemm.kernels.sm80.load import OperandLoader, make_operand_loader
from wsgemm.kernels.sm80.mma import make_accumulators, make_mma_fragments
from wsgemm.kernels.sm80.plan import Sm80Plan, carve_smem, zero_fill
from wsgemm.support import MBARRIER_BYTES, WARP_SIZE, has_mbarrier_try_wait
from wsgemm.trace_format import Event, Role

__all__ = ["Sm80WsGemm"]


class Sm80WsGemm(Sm80Kernel):
    """Warp-specialized GEMM: one cp.async producer warp feeds 4 or 8 mma.sync consumer warps.

    ``C[m, n, l] = sum_k A[m, k, l] * B[n, k, l]``, one (tile_m, tile_n) tile per CTA (grid
    ``(ceil(M / tile_m), ceil(N / tile_n), L)``), all four A/B majors, any M, N, K, L >= 1
    (major extents multiples of 8: ``needs_vector_extent``). ``config.mma_warps_m`` x
    ``mma_warps_n`` sets the consumers: 2 x 2 warps (160 threads with the producer), 2 x 4 or
    4 x 2 (288 threads).

    Roles
        * warp 0, producer (32 threads): cp.async.cg 16-byte copies of all of the A and B
          k-tiles of the CTA's tile into a ``stages``-deep shared ring (Swizzle<3,3,3> atoms);
          k-tile 0 carries the K residue, rows past M/N are never copied (zero-filled stages).
          A tile with every row in range is loaded by a second copy of the loop without row
          predicates (``config.fast_interior``): this one warp issues every copy of the CTA.
        * warps 1 .. mma_warps, consumers (mma_warps_m x mma_warps_n warps of m16n8k16, 128 or
          256 threads): ldmatrix (transposed for M/N-major operands) + mma.sync into fp32 or fp16
          accumulators, then the epilogue: convert, stage through the (reused) A/B shared
          buffer, 16-byte predicated stores.

    Pipelines
        * ``ab`` (:class:`~wsgemm.kernels.common.pipeline.CpAsyncPipeline`), producer ->
          consumers, ``stages`` deep. ``full[s]``: 32 arrivals a phase, one
          ``cp.async.mbarrier.arrive.noinc`` per producer thread, fired when that thread's
          copies of the stage have landed. ``empty[s]``: ``mma_threads`` (128 or 256) arrivals
          a phase, every consumer thread, once its warp has issued
          its last ldmatrix of the stage. No block-wide barrier after the start; the producer
          runs up to ``stages`` k-tiles ahead of the oldest stage still being read.
        * epilogue: named barrier 1 over the ``mma_threads`` (128 or 256) consumer threads (the
          producer has exited).

    Per-role timeline
        * producer: k-tile t into stage s = t % stages: acquire ``empty[s]`` (parity
          1 ^ (t // stages) & 1) -> cp.async A and B of k-tile t -> commit ``full[s]``; after
          the last k-tile, drain its copies and exit.
        * consumer: wait ``full[s]``, ldmatrix k-block 0; then per k-block b of the stage:
          ldmatrix b+1 into the other register slot while mma.sync consumes b; once the
          stage's last ldmatrix and the MMAs of the k-block before it are issued, release
          ``empty[s]`` (before the stage's last MMAs); k-block 0 of the next stage is read only
          after waiting on its ``full``. After the last k-tile: barrier -> accumulators to
          shared -> barrier -> 16-byte stores, per pass of columns.

    Registers: ptxas budgets an SM sub-partition, so the producer warp costs the consumers
    registers the multistage baseline keeps; the shipped tiles and why: docs/perf.md entry 14.
    """

    name = "sm80"

    #: Lanes of a consumer warp that arrive on ``empty[s]`` per stage: every one
    #: (``CpAsyncPipeline.consumer_release``); checked against the barrier's count.
    RELEASE_LANES_PER_WARP = WARP_SIZE

    #: Warp 0 loads; the consumers are the warps after it.
    PRODUCER_WARPS = 1

    @property
    def threads(self) -> int:
        """The CTA: the producer warp and one consumer warp per warp of the tiled MMA."""
        return (self.PRODUCER_WARPS + self.config.mma_warps) * WARP_SIZE

    @property
    def consumer_warps(self) -> int:
        """The warps of the launched CTA after the producer's (they release stages)."""
        return self.threads // WARP_SIZE - self.PRODUCER_WARPS

    def full_barrier_arrivals(self) -> int:
        """What ``full[s]`` is initialised to expect per phase: every producer thread."""
        return self.PRODUCER_WARPS * WARP_SIZE

    def empty_barrier_arrivals(self) -> int:
        """What ``empty[s]`` is initialised to expect per phase: every MMA thread."""
        return self.config.mma_threads

    def arrive_counts(self) -> tuple[int, int]:
        """(full, empty) arrivals per phase of the ``ab`` ring, checked against the roles; also
        checks the epilogue's named barrier against the consumer threads of the launch."""
        full = check_arrive_count(
            "sm80 ab full",
            self.full_barrier_arrivals(),
            {
                "producer warps": self.PRODUCER_WARPS,
                "threads per warp": WARP_SIZE,
                "cp.async.mbarrier.arrive.noinc per thread per stage": 1,
            },
        )
        empty = check_arrive_count(
            "sm80 ab empty",
            self.empty_barrier_arrivals(),
            {
                "consumer warps": self.consumer_warps,
                "arriving lanes per warp per stage": self.RELEASE_LANES_PER_WARP,
            },
        )
        check_arrive_count(
            "sm80 epilogue named barrier",
            self.config.mma_threads,
            {"consumer warps": self.consumer_warps, "threads per warp": WARP_SIZE},
        )
        return full, empty

    def shared_memory_bytes(self) -> int:
        """Dynamic shared memory per CTA: the mbarriers plus max(A/B ring, epilogue slab)."""
        return smem_bytes(
            self.config, self.ab_dtype, self.c_dtype, barrier_stages=self.config.stages
        )

    @property
    def load_threads(self) -> int:
        return self.PRODUCER_WARPS * WARP_SIZE

    @cute.kernel
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        plan: cutlass.Constexpr,
        trace_buffer,
    ):
        """Set up the ring (its arrive counts checked against the roles while tracing), then
        hand each warp its role."""
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bm, bn, bl = cute.arch.block_idx()
        c = plan.config

        smem = SmemAllocator()
        barriers = smem.allocate_array(cutlass.Int64, 2 * c.stages, byte_alignment=MBARRIER_BYTES)
        slots = trace.smem_slots(trace_buffer, smem, self.threads // WARP_SIZE)
        buffer_bytes = self.shared_memory_bytes() - BUFFER_ALIGN_BYTES - barrier_bytes(c.stages)
        buffer = smem.allocate(buffer_bytes, byte_alignment=BUFFER_ALIGN_BYTES)
        views = carve_smem(plan, buffer)
        pipe = CpAsyncPipeline(barriers, c.stages, has_mbarrier_try_wait(self.gpu_arch))
        if tidx == 0:
            pipe.init(*self.arrive_counts())
        # Stages start zeroed: residue vectors are skipped, not copied (see the ``plan`` module).
        zero_fill(buffer, views.ab_bytes, tidx, self.threads)
        # The kernel's only block-wide barrier: the mbarriers and the zeros are visible to both
        # roles before either starts.
        cute.arch.sync_threads()

        if warp_idx < self.PRODUCER_WARPS:
            rec = trace.open_recorder(trace_buffer, slots, Role.PRODUCER, self.gpu_arch, WARP_SIZE)
            trace.fetch(rec, (bm, bn, bl))
            self.load(plan, mA[None, None, bl], mB[None, None, bl], views, pipe, bm, bn, tidx, rec)
            trace.close(rec)
        else:
            rec = trace.open_recorder(trace_buffer, slots, Role.CONSUMER, self.gpu_arch, WARP_SIZE)
            trace.fetch(rec, (bm, bn, bl))
            tid = tidx - self.PRODUCER_WARPS * WARP_SIZE
            tiled_mma = plan.tiled_mma()
            k_tiles = cute.ceil_div(cute.size(mA, mode=[1]), c.tile_k)
            acc = self.mma(plan, tiled_mma, views, pipe, k_tiles, tid, rec)
            trace.record(rec, Event.EPILOGUE_BEGIN)
            self.epilogue(plan, tiled_mma, acc, views.sC, mC[None, None, bl], (bm, bn), tid)
            trace.record(rec, Event.EPILOGUE_END)
            trace.close(rec)

    @cute.jit
    def load(
        self,
        plan: Sm80Plan,
        mA_mk: cute.Tensor,
        mB_nk: cute.Tensor,
        views,
        pipe: CpAsyncPipeline,
        bm: cutlass.Int32,
        bn: cutlass.Int32,
        tid: cutlass.Int32,
        rec=None,
    ):
        """Producer warp, thread ``tid``: every k-tile of this CTA's A and B, in order, into
        the ring. ``rec``: the warp's trace recorder (None: untraced)."""
        c = plan.config
        load_a = make_operand_loader(
            plan.g2s_copy_a(), mA_mk, views.sA, c.tile_m, c.tile_k, bm, tid
        )
        load_b = make_operand_loader(
            plan.g2s_copy_b(), mB_nk, views.sB, c.tile_n, c.tile_k, bn, tid
        )
        k_tiles = cute.size(load_a.tXgX, mode=[3])

        # k-tile 0 (the K residue) into stage 0, whose empty barrier the producer may pass at
        # once (parity 1: the phase before the first).
        trace.record(rec, Event.WAIT_EMPTY_BEGIN, 0, 0)
        pipe.producer_acquire(0, 1)
        trace.record(rec, Event.WAIT_EMPTY_END, 0, 0)
        load_a.load_first(0)
        load_b.load_first(0)
        pipe.producer_commit(0)
        trace.record(rec, Event.LOAD_ISSUE, 0, 0)
        if cutlass.const_expr(c.fast_interior):
            if load_a.interior and load_b.interior:
                self.load_k_tiles(load_a, load_b, pipe, k_tiles, predicated=False, rec=rec)
            else:
                self.load_k_tiles(load_a, load_b, pipe, k_tiles, predicated=True, rec=rec)
        else:
            self.load_k_tiles(load_a, load_b, pipe, k_tiles, predicated=True, rec=rec)
        # Stay resident until the last copies (and the arrivals they trigger) have landed.
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def load_k_tiles(
        self,
        load_a: OperandLoader,
        load_b: OperandLoader,
        pipe: CpAsyncPipeline,
        k_tiles: cutlass.Int32,
        predicated: cutlass.Constexpr,
        rec=None,
    ):
        """k-tiles 1 .. k_tiles - 1 (full in k), rows predicated unless the tile is interior.
        k-tile t goes to stage t % stages, after waiting for phase parity 1 ^ (t // stages) & 1
        of ``empty`` (the producer's view of the ring: every stage starts free)."""
        stages = pipe.stages
        for k_tile in cutlass.range(1, k_tiles, unroll=1):
            stage = k_tile % stages
            trace.record(rec, Event.WAIT_EMPTY_BEGIN, k_tile, stage)
            pipe.producer_acquire(stage, (k_tile // stages + 1) % 2)
            trace.record(rec, Event.WAIT_EMPTY_END, k_tile, stage)
            load_a.load(k_tile, stage, predicated)
            load_b.load(k_tile, stage, predicated)
            pipe.producer_commit(stage)
            trace.record(rec, Event.LOAD_ISSUE, k_tile, stage)

    @cute.jit
    def mma(
        self,
        plan: Sm80Plan,
        tiled_mma: cute.TiledMma,
        views,
        pipe: CpAsyncPipeline,
        k_tiles: cutlass.Int32,
        tid: cutlass.Int32,
        rec=None,
    ) -> cute.Tensor:
        """Consumer warps: the whole K loop into register accumulators. ``rec``: the warp's
        trace recorder (None: untraced)."""
        frags = make_mma_fragments(plan, tiled_mma, views.sA, views.sB, tid)
        acc = make_accumulators(plan, tiled_mma)
        k_blocks = plan.k_blocks

        state = pipe.consumer_state()
        trace.record(rec, Event.WAIT_FULL_BEGIN, 0, state.index)
        pipe.consumer_wait(state)
        trace.record(rec, Event.WAIT_FULL_END, 0, state.index)
        frags.load(0, state.index, 0)
        for k_tile in cutlass.range(k_tiles, unroll=1):
            for kb in cutlass.range_constexpr(k_blocks):
                next_slot = (kb + 1) % 2
                if cutlass.const_expr(kb == k_blocks - 1):
                    # k-block kb is the stage's last and already in registers; the next one
                    # is k-block 0 of the next stage, readable only once its full barrier
                    # has flipped.
                    state.advance()
                    if k_tile + 1 < k_tiles:
                        trace.record(rec, Event.WAIT_FULL_BEGIN, k_tile + 1, state.index)
                        pipe.consumer_wait(state)
                        trace.record(rec, Event.WAIT_FULL_END, k_tile + 1, state.index)
                        frags.load(0, state.index, next_slot)
                else:
                    frags.load(kb + 1, state.index, next_slot)
                frags.mma(tiled_mma, acc, kb % 2)
                if cutlass.const_expr(kb == k_blocks - 2):
                    # The stage's last ldmatrix is issued: hand the stage back before its last
                    # MMA. After this k-block's MMAs, not before them: the arrive's release
                    # fence (MEMBAR.CTA on sm_80) waits for the ldmatrix results, and the
                    # tensor cores should not wait with it.
                    pipe.consumer_release(state)
                    trace.record(rec, Event.STAGE_RELEASE, k_tile, state.index)
            trace.record(rec, Event.MMA_ISSUE, k_tile, k_tile % pipe.stages)
        return acc
