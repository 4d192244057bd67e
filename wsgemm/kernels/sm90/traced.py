"""The traced sm90 kernel's hot loops (issue #13): the producer's k-loop, the consumer's mainloop
and the epilogue's subtile loop as a kernel built with ``trace=True`` runs them.

``Sm90Gemm`` inherits ``TracedLoops``. Its roles ``load``, ``mma`` and ``epilogue`` hand their
loop to the one here when they hold a trace recorder (a traced build) and run their own, which
records nothing, otherwise; the untraced kernel never reaches this module. Each loop here does
its role's work through the role's own steps (``_load_k_tile``, ``_mma_k_tile``,
``_subtile_to_registers``, ``_store_subtile``), in the same order, and adds timer reads around
the waits and issues.

The times are staged in lanes (``kernels/common/trace.py``): the loop keeps the low word of each
time in a register of lane ``j % 32`` (k-tile or subtile j), and the writer's warp writes the
staged events together, one per lane, after every 32nd k-tile's issue and at the end, every lane
from the writer lane's count and tile (``trace.warp_hot``). Tile-level events (fetch, order
waits, fix-up, epilogue begin and end, the final drains) are recorded by the roles themselves.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from wsgemm.kernels.common import trace
from wsgemm.support import BarrierId as _Barrier
from wsgemm.trace_format import Event

__all__ = ["TracedLoops"]


class TracedLoops:
    """The lanes loops of ``Sm90Gemm``'s roles (a mixin: ``self`` is the kernel)."""

    # ------------------------------------------------------------------------ load (producer warp)

    @cute.jit
    def _load_lanes(self, plan, args, ab_pipeline, state, tAgA, tBgB, k_begin, k_end, rec):
        """``load``'s k-loop over one unit: k-tile j of the unit keeps its three times (wait on
        empty begin and end, load issue) in lane j % 32; after the loads of every 32nd k-tile,
        and at the end, the warp writes the staged k-tiles' events (3 each, in k order), one
        k-tile per lane. Returns the producer's pipeline state."""
        hot = trace.warp_hot(rec)
        lane = cute.arch.lane_idx()
        stage0 = state.index
        s0 = Int32(0)
        s1 = Int32(0)
        s2 = Int32(0)
        for k in cutlass.range(k_begin, k_end, unroll=1):
            j = k - k_begin
            t0 = trace.now_lo(rec)
            ab_pipeline.producer_acquire(state)
            t1 = trace.now_lo(rec)
            self._load_k_tile(args, ab_pipeline, state, tAgA, tBgB, k)
            t2 = trace.now_lo(rec)
            slot = j % trace.LANES
            if slot == 0 and j > 0:
                self._flush_load(plan, hot, lane, (s0, s1, s2), j - trace.LANES, j, k_begin, stage0)
            s0 = trace.stage_lane(lane, slot, t0, s0)
            s1 = trace.stage_lane(lane, slot, t1, s1)
            s2 = trace.stage_lane(lane, slot, t2, s2)
            state.advance()
        count = k_end - k_begin
        first = trace.last_window(count)
        self._flush_load(plan, hot, lane, (s0, s1, s2), first, count, k_begin, stage0)
        hot.count = hot.count + trace.load_offset(count)
        hot.cool()
        return state

    @cute.jit
    def _flush_load(self, plan, hot, lane, staged, first, end, k_begin, stage0):
        """Write the producer's staged k-tiles ``first .. end - 1`` (``first`` a multiple of
        32; lane ``j % 32`` holds k-tile j): events ``3 j .. 3 j + 2`` of the tile's."""
        j = first + lane
        if j < end:
            ref = hot.now()
            n = hot.count + trace.load_offset(j)
            stage = (stage0 + j) % plan.ab_stages
            k = k_begin + j
            kinds = (Event.WAIT_EMPTY_BEGIN, Event.WAIT_EMPTY_END, Event.LOAD_ISSUE)
            for i in cutlass.range_constexpr(3):
                t = trace.widen(staged[i], ref)
                trace.store_checked(hot, n + i, kinds[i], t, k, stage)

    # -------------------------------------------------------------------- mma (consumer warpgroups)

    @cute.jit
    def _mma_lanes(self, plan, args, ab_pipeline, read_state, acc, k_begin, k_count, rec,
                   prefetch=None):  # fmt: skip
        """``mma`` with its times staged: the loop reads the timer six times a k-tile and keeps
        the low words in lane j % 32 (iteration j: its wait on full, its issue, then the
        previous k-tile's MMA wait and release); after the issue of every 32nd iteration the
        writer's warp writes the staged iterations' events, one iteration per lane, in the
        order of a k-tile's waits, issue and release. The last k-tile's wait and release are
        written by the writer lane (``hot.emit_released``). ``prefetch``: ``mma``'s (a
        residual's or a dgated tile's first C loads, issued after the first k-tile's WGMMAs as
        ``mma`` issues them: without them the epilogue would wait forever). Returns the read
        state."""
        hot = trace.warp_hot(rec)
        lane = cute.arch.lane_idx()
        flusher = trace.writer_warp(rec)
        stage0 = read_state.index
        release_state = read_state.clone()
        acc.fill(0.0)
        warpgroup.fence()
        t0 = trace.now_lo(rec)
        ab_pipeline.consumer_wait(read_state)
        t1 = trace.now_lo(rec)
        self._mma_k_tile(args, acc, read_state.index)
        warpgroup.commit_group()
        t2 = trace.now_lo(rec)
        zero = Int32(0)
        s0 = trace.stage_lane(lane, 0, t0, zero)
        s1 = trace.stage_lane(lane, 0, t1, zero)
        s2 = trace.stage_lane(lane, 0, t2, zero)
        s3 = zero
        s4 = zero
        s5 = zero
        read_state.advance()
        if const_expr(prefetch is not None):
            self.residual_prefetch(plan, *prefetch)
        for k in cutlass.range(1, k_count, unroll=1):
            t0 = trace.now_lo(rec)
            ab_pipeline.consumer_wait(read_state)
            t1 = trace.now_lo(rec)
            self._mma_k_tile(args, acc, read_state.index)
            warpgroup.commit_group()
            t2 = trace.now_lo(rec)
            slot = k % trace.LANES
            if slot == 0:
                if flusher:
                    staged = (s0, s1, s2, s3, s4, s5)
                    self._flush_mma(plan, hot, lane, staged, k - trace.LANES, k, k_begin, stage0)
            w0 = trace.now_lo(rec)
            warpgroup.wait_group(1)
            w1 = trace.now_lo(rec)
            ab_pipeline.consumer_release(release_state)
            w2 = trace.now_lo(rec)
            s0 = trace.stage_lane(lane, slot, t0, s0)
            s1 = trace.stage_lane(lane, slot, t1, s1)
            s2 = trace.stage_lane(lane, slot, t2, s2)
            s3 = trace.stage_lane(lane, slot, w0, s3)
            s4 = trace.stage_lane(lane, slot, w1, s4)
            s5 = trace.stage_lane(lane, slot, w2, s5)
            release_state.advance()
            read_state.advance()
        if const_expr(plan.config.pingpong):
            self._order_arrive(_Barrier.MMA_ORDER, 1 - args.warpgroup)
        w0 = hot.now()
        warpgroup.wait_group(0)
        w1 = hot.now()
        ab_pipeline.consumer_release(release_state)
        w2 = hot.now()
        if flusher:
            staged = (s0, s1, s2, s3, s4, s5)
            first = trace.last_window(k_count)
            self._flush_mma(plan, hot, lane, staged, first, k_count, k_begin, stage0)
        # iterations 0 .. k_count - 1 wrote 3 + 6 (k_count - 1) events; the last release 3
        hot.count = hot.count + trace.mma_staged_events(k_count)
        hot.emit_released((w0, w1, w2), k_begin + k_count - 1, release_state.index)
        hot.cool()
        return read_state

    @cute.jit
    def _flush_mma(self, plan, hot, lane, staged, first, end, k_begin, stage0):
        """Write staged iterations ``first .. end - 1`` (``first`` a multiple of 32; lane
        ``j % 32`` holds iteration j). Iteration j's events, in the row's order: its k-tile's
        wait on full, end, issue at ``max(6 j - 3, 0)``; then (j >= 1) k-tile j - 1's MMA wait
        begin, end and release at ``6 j``."""
        j = first + lane
        if j < end:
            ref = hot.now()
            stage = (stage0 + j) % plan.ab_stages
            n = hot.count + trace.mma_issued_offset(j)
            k = k_begin + j
            issued = (Event.WAIT_FULL_BEGIN, Event.WAIT_FULL_END, Event.MMA_ISSUE)
            for i in cutlass.range_constexpr(3):
                t = trace.widen(staged[i], ref)
                trace.store_checked(hot, n + i, issued[i], t, k, stage)
            if j > 0:
                prev = (stage0 + j + plan.ab_stages - 1) % plan.ab_stages
                m = hot.count + trace.mma_released_offset(j)
                released = (Event.MMA_WAIT_BEGIN, Event.MMA_WAIT_END, Event.STAGE_RELEASE)
                for i in cutlass.range_constexpr(3):
                    t = trace.widen(staged[3 + i], ref)
                    trace.store_checked(hot, m + i, released[i], t, k - 1, prev)

    # --------------------------------------------------------------- epilogue (consumer warpgroups)

    @cute.jit
    def _epilogue_lanes(self, plan, args, store_pipeline, views, subtiles_done, rec):
        """``epilogue``'s subtile loop with its store waits staged: the store warp reads the
        timer around each wait and lane e keeps subtile e's two times; after the last subtile
        the warp writes the 2 x subtiles events (subtile order) in parallel."""
        cfg = plan.config
        if const_expr(cfg.num_epi_subtiles > trace.LANES):
            raise ValueError(
                f"{cfg.num_epi_subtiles} epilogue subtiles: a traced epilogue stages at most "
                f"{trace.LANES} (one per lane)"
            )
        hot = trace.warp_hot(rec)
        lane = cute.arch.lane_idx()
        b0 = Int32(0)
        b1 = Int32(0)
        for e in cutlass.range_constexpr(cfg.num_epi_subtiles):
            self._subtile_to_registers(plan, args, views, e)
            buf = (subtiles_done + e) % plan.epi_stages
            if args.is_store_warp:
                t0 = trace.now_lo(rec)
                store_pipeline.producer_acquire()  # buffer `buf`'s previous store has read it
                t1 = trace.now_lo(rec)
                b0 = trace.stage_lane(lane, e, t0, b0)
                b1 = trace.stage_lane(lane, e, t1, b1)
            self._store_subtile(args, store_pipeline, views, buf, e)
        if args.is_store_warp:
            if trace.writer_warp(rec):
                if lane < cfg.num_epi_subtiles:
                    ref = hot.now()
                    n = hot.count + trace.store_wait_offset(lane)
                    buf = (subtiles_done + lane) % plan.epi_stages
                    k = Int32(-1)
                    t = trace.widen(b0, ref)
                    trace.store_checked(hot, n, Event.STORE_WAIT_BEGIN, t, k, buf)
                    t = trace.widen(b1, ref)
                    trace.store_checked(hot, n + 1, Event.STORE_WAIT_END, t, k, buf)
                hot.count = hot.count + trace.store_wait_offset(cfg.num_epi_subtiles)
                hot.cool()
