"""The sm90 kernel's epilogue (``EpilogueLoops``, which ``Sm90Gemm`` inherits): each tile's
subtile loop, from the consumers' accumulators through the fused epilogue
(``wsgemm.kernels.epilogue``: bias, activation, alpha and beta, row scale) to the TMA stores,
in its forms (plain; a residual's or dact's C read per subtile; preact's extra stores; the
gated unit; the dgated gradient, ``dgated.py``; a grouped tile's ragged rows, ``ragged.py``),
and the views and registers they share. ``kernel.py`` builds the arguments (``_EpilogueArgs``,
``Sm90Gemm._epilogue_args``) and calls ``epilogue`` per tile; ``traced.py`` has its traced
loop.
"""

from dataclasses import dataclass, replace
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import cpasync

from wsgemm.kernels.epilogue import activation as epilogue_activation
from wsgemm.kernels.epilogue import bias as epilogue_bias
from wsgemm.kernels.epilogue import row_scale as epilogue_row_scale
from wsgemm.kernels.sm90 import dgated, ragged, residual
from wsgemm.kernels.sm90.config import Sm90Config, epilogue_stage_bytes

__all__ = ["BIAS_AHEAD", "EpilogueLoops", "epilogue_subtile_order"]

#: How many subtiles ahead a fused bias is loaded: its global-memory round trip (hundreds of
#: cycles from L2) then hides under two subtiles' stores, and the first ones' under the
#: mainloop. Loaded by the subtile that adds it, every subtile of a tile waited one round trip
#: (issue #25: +2% geomean, +5% at 1024-4096 tokens on an H100).
BIAS_AHEAD = 2


def epilogue_subtile_order(
    config: Sm90Config, tile_n: int | None = None, tile_m: int | None = None
) -> cute.Layout:
    """Subtile index -> (subtile row, subtile column). Row-major, because that is the order in
    which the retiled accumulator holds them (every column of a WGMMA band, 64 rows of one
    warpgroup or 128 of two, then the next band). ``tile_n``/``tile_m``: the output tile's
    width/height when it is not the product's (a gated epilogue writes half of it)."""
    width = config.tile_n if tile_n is None else tile_n
    height = config.tile_m if tile_m is None else tile_m
    grid = (height // config.epi_tile[0], width // config.epi_tile[1])
    return cute.make_layout(grid, stride=(grid[1], 1))


@dataclass(frozen=True)
class _EpilogueArgs:
    tiled_copy_r2s: Any
    # accumulator viewed per r2s copy; flat, it holds the subtiles in epilogue_subtile_order:
    # a band's column strips (inside mode 0), then the next band's (mode 1)
    tRS_rAcc: Any
    tRS_sC: Any  # (R2S, R2S_M, R2S_N, epi_stages)
    rD_shape: Any  # one subtile of registers in the copy's source shape: (R2S, R2S_M, R2S_N)
    tma_c: Any
    sC: Any  # (epi_m, epi_n, epi_stages)
    gC_mnl: Any  # (tile_m, tile_n, tiles_m, tiles_n, L)
    barrier: Any
    is_store_warp: Any
    # a fused bias or residual: each accumulator's (row, col) in the tile, retiled as
    # ``tRS_rAcc``; the bias vector and the output's extent along it (a gated bias is twice
    # that long: its up half follows) (None, None, None without either)
    tRS_cAcc: Any
    bias: Any
    bias_extent: Any
    ragged: Any = None  # a grouped kernel's ``ragged.RaggedStore``; None for a dense one
    # ``Epilogue.scale``/``residual``: (alpha, beta), and the residual's ``residual.ResidualLoad``
    # (None without)
    scalars: Any = None
    residual: Any = None
    # ``Epilogue.row_scale``: the vector and its length (None, None without)
    row_scale: Any = None
    row_scale_extent: Any = None
    # ``Epilogue.preact``: (its TMA store atom, its coordinates cut into output tiles
    # (tile_m, out_tile_n, tiles_m, tiles_n, 2 or L): a gated product's gate half, then its up
    # half; a plain product's batches)
    preact: Any = None


@dataclass(frozen=True)
class _TileEpilogue:
    """One tile's epilogue: its TMA store views, the subtile order and one subtile's registers."""

    bSG_sC: Any  # (TMA, epi_stages)
    bSG_gC: Any  # (TMA, (subtiles_m, subtiles_n)) this tile's subtiles in C
    order: Any  # epilogue_subtile_order
    tRS_rD: Any  # (R2S, R2S_M, R2S_N) accumulator dtype (fp32 with a fused epilogue)
    tRS_rD_out: Any  # (R2S, R2S_M, R2S_N) C's dtype
    origin: Any  # the tile's first (row, col) in the problem
    # a row scale's factors, one list of fp32 values per subtile (``_row_scale_tile``), or None
    row_scale: Any = None
    # the outputs a subtile stores besides the first (``_Output`` each): a dgated tile's up
    # half; a gated preact's gate and up halves of the product, a plain one's pre-activation.
    # None for others
    more: Any = None


@dataclass(frozen=True)
class _Output:
    """One more output of an epilogue subtile: its TMA store atom and views (the buffers'
    side, the tile's subtiles) and the subtile's registers in fp32 and in C's dtype."""

    tma: Any
    bSG_sC: Any  # (TMA, epi_stages)
    bSG_gC: Any  # (TMA, (subtiles_m, subtiles_n))
    tRS_rD: Any
    tRS_rD_out: Any


class EpilogueLoops:
    """The epilogue of ``Sm90Gemm``'s consumers (a mixin: ``self`` is the kernel): each tile's
    subtile loop, from the accumulators through the fused epilogue to the TMA stores, in its
    forms (plain, residual and dact, preact, gated, dgated, ragged groups), and the pieces
    they share."""

    @cute.jit
    def epilogue(
        self,
        plan: cutlass.Constexpr,
        args: _EpilogueArgs,
        store_pipeline,
        tile,
        subtiles_done,
        rec=None,
        bias_ahead=None,
        scales=None,
    ):
        """Accumulators -> output dtype -> smem subtile -> TMA store, one subtile at a time.
        ``scales``: a row scale's factors of the tile (``_row_scale_tile``, loaded before the
        mainloop; None loads them here).
        ``bias_ahead``: a fused bias's addends of the first subtiles (``_bias_ahead``, loaded
        before the mainloop); each subtile then loads the bias of the one ``BIAS_AHEAD`` past
        it, so no subtile waits a global-memory round trip for its own. A residual's C comes by
        TMA into each subtile's own buffer, the first ones' under the mainloop or at the start,
        each later one's E - 2 subtiles ahead (``residual``).

        Buffer ``b`` is rewritten only after the store that last read it has finished reading
        (the store warp waits for at most E-1 pending stores, then the barrier tells everyone;
        a residual's C load into it waits for that store itself).
        A grouped kernel's tile whose rows run past its group's end copies its subtiles' rows
        out of the buffers itself (``ragged.store_rows``) after every pending store is done.
        """
        cfg = plan.config
        if const_expr(args.ragged is None):
            gC = args.gC_mnl[(None, None, tile.m, tile.n, tile.l)]  # (tile_m, tile_n)
        else:
            gC = ragged.c_tile(args.ragged.mC_tma, tile, (cfg.tile_m, plan.out_tile_n))
        gC_epi = cute.zipped_divide(gC, cfg.epi_tile)  # ((epi_m, epi_n), (subtiles_m, subtiles_n))
        # (TMA, epi_stages), (TMA, (subtiles_m, subtiles_n))
        bSG_sC, bSG_gC = cpasync.tma_partition(
            args.tma_c, 0, cute.make_layout(1), cute.group_modes(args.sC, 0, 2), gC_epi
        )
        more = None  # the (M, N, 2) outputs' halves are their L (``dgated.halves``)
        if const_expr(plan.epilogue.preact and plan.epilogue.gated):  # the product's halves
            more = [self._output(plan, args, *args.preact, tile, h) for h in range(2)]
        elif const_expr(plan.epilogue.preact):  # a plain product's pre-activation, batch L
            more = [self._output(plan, args, *args.preact, tile, tile.l)]
        if const_expr(plan.epilogue.dgated):  # the output's up half
            more = [self._output(plan, args, args.tma_c, args.gC_mnl, tile, 1)]
        views = _TileEpilogue(
            bSG_sC=bSG_sC,
            bSG_gC=bSG_gC,
            order=epilogue_subtile_order(cfg, plan.out_tile_n, plan.out_tile_m),
            tRS_rD=cute.make_rmem_tensor(args.rD_shape, self._epilogue_dtype(plan)),
            tRS_rD_out=cute.make_rmem_tensor(args.rD_shape, plan.c_dtype),
            origin=self._tile_origin(plan, tile),
            row_scale=self._row_scale_tile(plan, args, tile) if scales is None else scales,
            more=more,
        )
        if const_expr(plan.epilogue.dgated):
            self._dgated_epilogue(plan, args, store_pipeline, views, tile, subtiles_done)
            return
        if const_expr(args.ragged is not None):
            # (traced too: its tiles' store waits are not recorded, the epilogue's span is)
            self._ragged_epilogue(plan, args, store_pipeline, views, tile, subtiles_done)
            return
        if const_expr(rec is not None):
            # the store waits' times stay in lanes until the last subtile (traced.py)
            self._epilogue_lanes(plan, args, store_pipeline, views, subtiles_done, rec)
            return
        ahead = [] if const_expr(bias_ahead is None) else list(bias_ahead)
        load = args.residual
        res_views = None
        if const_expr(plan.epilogue.reads_c_per_subtile):
            res_views = residual.tile_views(load, tile, cfg.epi_tile)
            if const_expr(not self._residual_under_mainloop(plan)):
                self.residual_prefetch(plan, args, tile, subtiles_done)
        for e in cutlass.range_constexpr(plan.out_subtiles):
            if const_expr(bias_ahead is not None and e + BIAS_AHEAD < plan.out_subtiles):
                ahead.append(self._bias_subtile(plan, args, views.origin, e + BIAS_AHEAD))
            bias = ahead[e] if const_expr(bias_ahead is not None) else None
            buf = (subtiles_done + e) % plan.epi_stages
            if const_expr(plan.epilogue.reads_c_per_subtile):
                # C's subtile is in buffer `buf` (loaded once the buffer's last store had read
                # it), and a later subtile's load leaves behind the store of two before
                later = residual.later_load(plan.epi_stages, e, plan.out_subtiles)
                if const_expr(later is not None):
                    if args.is_store_warp:
                        cute.arch.cp_async_bulk_wait_group(1, read=True)
                        residual.issue(load, res_views, views.order, later, subtiles_done + later)
                residual.wait(load, subtiles_done + e)
                sC_buf = args.sC[(None, None, buf)]
                self._subtile_to_registers(plan, args, views, e, bias, sC_buf)
                # _store_subtile's first barrier: every thread has read its residual
            elif const_expr(plan.epilogue.preact and not plan.epilogue.gated):
                # two stores a subtile from one set of registers (a ping-pong tile's 128
                # accumulators a thread leave no room for a second): the pre-activation's,
                # then, the activation applied in place, the output's
                self._subtile_to_registers(plan, args, views, e, bias)
                first = subtiles_done + 2 * e
                for j in cutlass.range_constexpr(2):
                    if args.is_store_warp:
                        store_pipeline.producer_acquire()
                    output = None
                    if const_expr(j == 0):
                        output = replace(views.more[0], tRS_rD_out=views.tRS_rD_out)
                    else:
                        self._activate(plan, views)
                    slot = (first + j) % plan.epi_stages
                    self._store_subtile(args, store_pipeline, views, slot, e, output)
            elif const_expr(plan.epilogue.preact):
                # three stores a subtile: the output's, then the product's gate and up halves
                self._subtile_to_registers(plan, args, views, e, bias)
                first = subtiles_done + 3 * e
                for j in cutlass.range_constexpr(3):
                    if args.is_store_warp:
                        store_pipeline.producer_acquire()
                    output = None if const_expr(j == 0) else views.more[j - 1]
                    slot = (first + j) % plan.epi_stages
                    self._store_subtile(args, store_pipeline, views, slot, e, output)
            else:
                self._subtile_to_registers(plan, args, views, e, bias)
                if args.is_store_warp:
                    store_pipeline.producer_acquire()  # buffer `buf`'s previous store has read it
            if const_expr(not plan.epilogue.preact):
                self._store_subtile(args, store_pipeline, views, buf, e)

    @staticmethod
    def _output(plan, args, tma, g_mnl, tile, half) -> _Output:
        """A subtile's ``_Output`` into half ``half`` (L) of an (M, N, 2) output's tiles
        ``g_mnl`` (tile_m, out_tile_n, tiles_m, tiles_n, 2) through ``tma``."""
        gC = g_mnl[(None, None, tile.m, tile.n, half)]
        bSG_sC, bSG_gC = cpasync.tma_partition(
            tma, 0, cute.make_layout(1), cute.group_modes(args.sC, 0, 2),
            cute.zipped_divide(gC, plan.config.epi_tile),
        )  # fmt: skip
        return _Output(
            tma=tma, bSG_sC=bSG_sC, bSG_gC=bSG_gC,
            tRS_rD=cute.make_rmem_tensor(args.rD_shape, cutlass.Float32),
            tRS_rD_out=cute.make_rmem_tensor(args.rD_shape, plan.c_dtype),
        )  # fmt: skip

    @cute.jit
    def _dgated_epilogue(self, plan: cutlass.Constexpr, args, store_pipeline, views, tile,
                         subtiles_done):  # fmt: skip
        """``epilogue``'s subtile loop for the gated unit's gradient (``dgated``): per product
        subtile, its two halves' pre-activation by TMA into a pair of buffers, then
        ``dgate = acc · up · act'(gate)`` and ``dup = acc · act(gate)`` stored from them."""
        cfg = plan.config
        load = args.residual
        if const_expr(not self._residual_under_mainloop(plan)):
            self.residual_prefetch(plan, args, tile, subtiles_done)
        per_subtile = cute.size(views.tRS_rD)
        up_half = views.more[0]
        for e in cutlass.range_constexpr(plan.product_subtiles):
            s0 = subtiles_done + 2 * e  # the gate half's number in this set; the up half's next
            # a cooperative tile's loader warp loads, its store warp frees; a ping-pong tile's
            # whole pre-activation was loaded at the epilogue's start (``residual_prefetch``)
            if const_expr(self._dgated_loader and e > 0):
                # (the last tile's last pair: freed under the mainloop)
                self._free_pair(plan, args, s0)
            residual.wait(load, s0)
            residual.wait(load, s0 + 1)
            gate_buf = args.sC[(None, None, s0 % plan.epi_stages)]
            up_buf = args.sC[(None, None, (s0 + 1) % plan.epi_stages)]
            for v in cutlass.range_constexpr(per_subtile):
                dh = cutlass.Float32(args.tRS_rAcc[e * per_subtile + v])
                coord = args.tRS_cAcc[e * per_subtile + v]
                gate = residual.value(gate_buf, coord, cfg.epi_tile)
                up = residual.value(up_buf, coord, cfg.epi_tile)
                act, grad = epilogue_activation.value_and_grad(plan.epilogue.activation, gate)
                views.tRS_rD[v] = dh * up * grad
                up_half.tRS_rD[v] = dh * act
            views.tRS_rD_out.store(views.tRS_rD.load().to(plan.c_dtype))
            up_half.tRS_rD_out.store(up_half.tRS_rD.load().to(plan.c_dtype))
            # the first store's first barrier: every thread has read both buffers
            self._store_subtile(args, store_pipeline, views, s0 % plan.epi_stages, e)
            self._store_subtile(args, store_pipeline, views, (s0 + 1) % plan.epi_stages, e, up_half)

    @cute.jit
    def _free_pair(self, plan: cutlass.Constexpr, args: _EpilogueArgs, s):
        """The store warp's, on a cooperative dgated tile (its loader warp loads): the pair
        stored before subtile ``s`` (its subtiles s - 2 and s - 1; none before the first), once
        its stores have read its two buffers, freed for the loader (an arrival on each
        buffer's second mbarrier)."""
        if args.is_store_warp:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            if s > 0:
                free = args.residual.barriers + plan.epi_stages
                with cute.arch.elect_one():
                    for h in cutlass.range_constexpr(2):
                        cute.arch.mbarrier_arrive(free + (s - 2 + h) % plan.epi_stages)

    @staticmethod
    def _residual_load(plan, tma_r, mR, sC, barriers) -> residual.ResidualLoad:
        """The residual's (or the dgated pre-activation's) TMA load through ``tma_r`` of C's
        coordinates ``mR``, cut into output tiles, into the epilogue buffers ``sC``, completing
        on the E mbarriers from ``barriers`` on (the consumers' and the loader warp's)."""
        return residual.ResidualLoad(
            tma=tma_r,
            gR_mnl=cute.local_tile(mR, (plan.out_tile_m, plan.out_tile_n), (None, None, None)),
            sC=sC,
            barriers=barriers,
            stages=plan.epi_stages,
            subtile_bytes=epilogue_stage_bytes(*plan.config.epi_tile, plan.c_dtype.width // 8),
        )

    @staticmethod
    def _residual_under_mainloop(plan) -> bool:
        """Whether a residual's first C loads leave under the tile's mainloop (cooperative,
        unsplit) rather than at the start of its epilogue (``residual``); on a cooperative
        dgated tile, whose loader warp loads them all, the previous tile's last pair is freed
        there instead (``residual_prefetch``)."""
        cfg = plan.config
        return plan.epilogue.reads_c and not cfg.pingpong and not cfg.splits_in_kernel

    @cute.jit
    def residual_prefetch(self, plan: cutlass.Constexpr, args: _EpilogueArgs, tile, subtiles_done):
        """The store warp's: the tile's first C subtiles on their way (``residual.prefetch``;
        a ping-pong dgated tile's whole pre-activation, ``dgated.prefetch``); on a cooperative
        dgated tile, whose loader warp loads, the previous tile's last pair freed for it
        instead, so that it loads this tile's first E subtiles under the mainloop
        (``_free_pair``)."""
        if const_expr(self._dgated_loader):
            self._free_pair(plan, args, subtiles_done)
        elif args.is_store_warp:
            order = epilogue_subtile_order(plan.config, plan.out_tile_n, plan.out_tile_m)
            if const_expr(plan.epilogue.dgated):
                views = dgated.tile_views(args.residual, tile, plan.config.epi_tile)
                dgated.prefetch(args.residual, views, order, subtiles_done, plan.out_subtiles)
            else:
                views = residual.tile_views(args.residual, tile, plan.config.epi_tile)
                residual.prefetch(args.residual, views, order, subtiles_done, plan.out_subtiles)

    @cute.jit
    def _ragged_epilogue(self, plan: cutlass.Constexpr, args, store_pipeline, views, tile,
                         subtiles_done):  # fmt: skip
        """``epilogue``'s subtile loop for a grouped kernel: TMA stores for a tile inside its
        group, predicated copies for one that runs past the group's end."""
        cfg = plan.config
        epi_m, epi_n = cfg.epi_tile
        rows_left = tile.rows_left(cfg.tile_m)
        if rows_left < cfg.tile_m:
            if args.is_store_warp:
                # the copies write the buffers without the ring's turns: no store may still
                # be reading one
                store_pipeline.producer_tail()
        for e in cutlass.range_constexpr(plan.out_subtiles):
            self._subtile_to_registers(plan, args, views, e)
            buf = (subtiles_done + e) % plan.epi_stages
            if rows_left >= cfg.tile_m:
                if args.is_store_warp:
                    store_pipeline.producer_acquire()
                self._store_subtile(args, store_pipeline, views, buf, e)
            else:
                sub_m, sub_n = views.order.get_hier_coord(e)
                args.barrier.arrive_and_wait()
                cute.copy(
                    args.tiled_copy_r2s, views.tRS_rD_out, args.tRS_sC[(None, None, None, buf)]
                )
                args.barrier.arrive_and_wait()
                ragged.store_rows(
                    args.ragged,
                    args.sC[(None, None, buf)],
                    tile.row0 + tile.m * cfg.tile_m + sub_m * epi_m,
                    tile.n * plan.out_tile_n + sub_n * epi_n,
                    rows_left - sub_m * epi_m,
                    cfg.epi_tile,
                    args.ragged.threads,
                )

    @staticmethod
    def _epilogue_dtype(plan):
        """The epilogue's register dtype: the accumulator's, fp32 with a fused epilogue."""
        return plan.acc_dtype if plan.epilogue.plain else cutlass.Float32

    def _tile_origin(self, plan, tile):
        """The tile's first (row, col) in the problem, and its batch (a ragged-M grouped
        kernel's row: in every group's rows, from its group's first)."""
        row = tile.m * plan.out_tile_m
        if const_expr(self.grouped == "m"):
            row = tile.row0 + row
        return (row, tile.n * plan.out_tile_n, tile.l)

    @staticmethod
    def _subtile_origin(plan, views, e):
        """Subtile ``e``'s first (row, col) in the problem, and its batch."""
        sub_m, sub_n = views.order.get_hier_coord(e)
        epi_m, epi_n = plan.config.epi_tile
        row, col, batch = views.origin
        return (row + sub_m * epi_m, col + sub_n * epi_n, batch)

    def _bias_subtile(self, plan, args, origin, e) -> list:
        """Subtile ``e``'s bias addends, one fp32 value per accumulator register (the
        registers that share a row or column share the load). Under a gated epilogue, per
        output register the pair (the gate's ``bias[n]``, the up projection's ``bias[N + n]``)
        of its output column ``n`` (on the swap-AB tile its output row: the feature): the bias
        is ``[b_gate; b_up]``, 2N long."""
        per_subtile = cute.size(args.tRS_rAcc) // plan.out_subtiles
        if const_expr(plan.epilogue.gated):
            per_subtile = per_subtile // 2  # the product's subtiles are twice the output's
            # the output's columns N, or on the swap-AB tile (``gated_rows``) its rows: the
            # features, each the gate's row r of the first band and the up projection's r of
            # the second, so the bias runs along the tile's M
            n = args.bias_extent
            mode = plan.epilogue.bias  # "row" only on the swap-AB tile (``gated_swap_refusal``)
            row, col = origin[0], origin[1]
            up_origin = (row + n, col) if const_expr(mode == "row") else (row, col + n)
            coords = [
                args.tRS_cAcc[self._product_register(plan, e, per_subtile, v)]
                for v in range(per_subtile)
            ]
            return [
                (
                    epilogue_bias.addend(mode, args.bias, c, origin, n),
                    epilogue_bias.addend(mode, args.bias, c, up_origin, 2 * n),
                )
                for c in coords
            ]
        return [
            epilogue_bias.addend(
                plan.epilogue.bias,
                args.bias,
                args.tRS_cAcc[e * per_subtile + v],
                origin,
                args.bias_extent,
            )
            for v in range(per_subtile)
        ]

    def _row_scale_tile(self, plan, args, tile):
        """A row scale's factors of ``tile``, one list per output subtile (each one fp32 value
        per accumulator register of the subtile; a thread's registers of one row share the
        load, so a thread reads each of its rows once), loaded before the tile's mainloop (its
        round trip hidden under it); None without a row scale. A gated epilogue's subtile reads
        the gate subtile's rows (the output's)."""
        if const_expr(plan.epilogue.row_scale == "none"):
            return None
        origin = self._tile_origin(plan, tile)
        per_subtile = cute.size(args.tRS_rAcc) // plan.out_subtiles
        if const_expr(plan.epilogue.gated):
            per_subtile = per_subtile // 2  # the product's subtiles are twice the output's
        return [
            [
                epilogue_row_scale.factor(
                    args.row_scale,
                    args.tRS_cAcc[self._product_register(plan, e, per_subtile, v)],
                    origin,
                    args.row_scale_extent,
                )
                for v in range(per_subtile)
            ]
            for e in range(plan.out_subtiles)
        ]

    @staticmethod
    def _product_register(plan, e, per_subtile, v) -> int:
        """Output subtile ``e``'s register ``v`` in the product's flat accumulator registers:
        the same index, or under a gated epilogue the gate subtile's (the output's rows)."""
        if const_expr(not plan.epilogue.gated or plan.gated_rows):
            # gated swap-AB: the output's subtiles are the product's first band's, in order
            return e * per_subtile + v
        cols = plan.config.tile_n // plan.config.epi_tile[1]  # the product's subtile columns
        r, c = e // (cols // 2), e % (cols // 2)
        return (r * cols + c) * per_subtile + v

    @staticmethod
    def _up_registers(plan, per_subtile) -> int:
        """How far a gated product's up subtile is from its gate subtile in the flat
        accumulator registers: half the subtile columns of a band on, or under swap-AB
        (``gated_rows``) the next band's (same thread: each holds the same rows of both)."""
        epi_m, epi_n = plan.config.epi_tile
        cols = plan.config.tile_n // epi_n  # the product's subtile columns
        if const_expr(plan.gated_rows):
            return (plan.out_tile_m // epi_m) * cols * per_subtile
        return (cols // 2) * per_subtile

    def _bias_ahead(self, plan, args, tile):
        """The first ``BIAS_AHEAD`` subtiles' bias addends of ``tile`` (None without a
        bias, or when the tile's epilogue is not the dense one that takes them)."""
        if const_expr(plan.epilogue.bias == "none" or args.ragged is not None):
            return None
        origin = self._tile_origin(plan, tile)
        first = min(BIAS_AHEAD, plan.out_subtiles)
        return [self._bias_subtile(plan, args, origin, e) for e in range(first)]

    @cute.jit
    def _subtile_to_registers(
        self, plan: cutlass.Constexpr, args, views, e, bias=None, sC_buf=None
    ):
        """Subtile ``e``'s accumulators, through the fused epilogue (fp32: alpha times them,
        plus beta times the residual, plus the bias, then the activation) and converted to the
        output dtype in ``views.tRS_rD_out``. ``bias``: the subtile's ``_bias_subtile`` when
        loaded ahead; None loads it here. ``sC_buf``: the buffer holding the residual's
        subtile (``residual.issue``), or ``dact``'s pre-activation subtile: then the output is
        the accumulators times the activation's gradient there."""
        per_subtile = cute.size(views.tRS_rD)
        epi = plan.epilogue
        if const_expr(epi.plain):
            for v in cutlass.range_constexpr(per_subtile):
                views.tRS_rD[v] = args.tRS_rAcc[e * per_subtile + v]
        elif const_expr(epi.dact):
            # the activation's gradient at the saved pre-activation, C's subtile in `sC_buf`
            for v in cutlass.range_constexpr(per_subtile):
                dh = cutlass.Float32(args.tRS_rAcc[e * per_subtile + v])
                coord = args.tRS_cAcc[e * per_subtile + v]
                pre = residual.value(sC_buf, coord, plan.config.epi_tile)
                views.tRS_rD[v] = epilogue_activation.grad_through(epi.activation, dh, pre)
        elif const_expr(epi.gated):
            # output subtile (row r, column c) pairs the product's subtiles (r, c), the gate's,
            # and (r, c + half), the up projection's (under swap-AB: (r + half, c)): the same
            # registers of one thread
            gate = self._product_register(plan, e, per_subtile, 0)
            up = gate + self._up_registers(plan, per_subtile)
            if const_expr(epi.bias != "none" and bias is None):
                bias = self._bias_subtile(plan, args, views.origin, e)
            for v in cutlass.range_constexpr(per_subtile):
                g = cutlass.Float32(args.tRS_rAcc[gate + v])
                u = cutlass.Float32(args.tRS_rAcc[up + v])
                if const_expr(epi.bias != "none"):
                    g, u = g + bias[v][0], u + bias[v][1]
                if const_expr(epi.preact):
                    views.more[0].tRS_rD[v] = g
                    views.more[1].tRS_rD[v] = u
                x = epilogue_activation.apply(epi.activation, g) * u
                if const_expr(epi.row_scale != "none"):
                    x = x * views.row_scale[e][v]
                views.tRS_rD[v] = x
        else:
            if const_expr(epi.bias != "none" and bias is None):
                bias = self._bias_subtile(plan, args, views.origin, e)
            for v in cutlass.range_constexpr(per_subtile):
                x = cutlass.Float32(args.tRS_rAcc[e * per_subtile + v])
                if const_expr(epi.scale):
                    x = args.scalars[0] * x
                if const_expr(epi.residual):
                    coord = args.tRS_cAcc[e * per_subtile + v]
                    x = x + args.scalars[1] * residual.value(sC_buf, coord, plan.config.epi_tile)
                if const_expr(epi.bias != "none"):
                    x = x + bias[v]
                if const_expr(not epi.preact):  # (with preact: _activate, once it is stored)
                    x = epilogue_activation.apply(epi.activation, x)
                if const_expr(epi.row_scale != "none"):
                    x = x * views.row_scale[e][v]
                views.tRS_rD[v] = x
        views.tRS_rD_out.store(views.tRS_rD.load().to(plan.c_dtype))
        if const_expr(epi.preact and epi.gated):
            for h in cutlass.range_constexpr(2):
                views.more[h].tRS_rD_out.store(views.more[h].tRS_rD.load().to(plan.c_dtype))

    @cute.jit
    def _activate(self, plan: cutlass.Constexpr, views):
        """A plain ``preact`` subtile's activation, applied in place to its fp32 registers
        (``_subtile_to_registers`` left the pre-activation there) and converted."""
        for v in cutlass.range_constexpr(cute.size(views.tRS_rD)):
            views.tRS_rD[v] = epilogue_activation.apply(plan.epilogue.activation, views.tRS_rD[v])
        views.tRS_rD_out.store(views.tRS_rD.load().to(plan.c_dtype))

    @cute.jit
    def _store_subtile(self, args, store_pipeline, views, buf, e, output=None):
        """``views.tRS_rD_out`` into smem buffer ``buf`` (which the store warp has acquired,
        or a residual's C load has filled, after the buffer's last store read it), then its TMA
        store to subtile ``e`` of the tile; ``output``: one of ``views.more`` instead."""
        if const_expr(output is None):
            registers, tma, sC, gC = views.tRS_rD_out, args.tma_c, views.bSG_sC, views.bSG_gC
        else:
            registers, tma, sC, gC = output.tRS_rD_out, output.tma, output.bSG_sC, output.bSG_gC
        args.barrier.arrive_and_wait()
        cute.copy(args.tiled_copy_r2s, registers, args.tRS_sC[(None, None, None, buf)])
        # Generic-proxy smem writes must be visible to the TMA (async proxy) store.
        cute.arch.fence_proxy("async.shared", space="cta")
        args.barrier.arrive_and_wait()
        if args.is_store_warp:
            cute.copy(tma, sC[(None, buf)], gC[(None, views.order.get_hier_coord(e))])
            store_pipeline.producer_commit()
