"""The gated epilogue's pairing (issue #25 step 2), traced without a GPU: output value v of
output subtile e is ``act(gate) * up`` of two accumulator values one thread holds, the gate's
computed at the output coordinate (row, col) and the up projection's at (row, col + tile_n / 2),
B's second half; and sB's two halves are the stage's first and last ``tile_n / 2`` rows."""

from dataclasses import replace

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
import pytest
from cutlass.tensor_utils import LayoutEnum
from sass_checks import assert_clean

from wsgemm import host, sass
from wsgemm import inspection as insp
from wsgemm.host.choosing.menu import entry as menu_entry
from wsgemm.kernels.epilogue import ACTIVATIONS, Epilogue
from wsgemm.kernels.sm90.config import Sm90Config
from wsgemm.kernels.sm90.kernel import Sm90Gemm, Sm90Plan, epilogue_subtile_order

F16, F32 = cutlass.Float16, cutlass.Float32
GATED = Epilogue(activation="silu", gated=True)
#: The gated swap-AB decode tile: a ping-pong warpgroup's two 64-row bands, the gate's rows
#: and the up projection's (``kernel.gated_swap_refusal``), a few tokens in its N.
SWAP_GATED = Sm90Config(tile_m=128, tile_n=8, tile_k=64, schedule="pingpong", swap_ab=True)


def _walk(gemm, tiled_mma, r2s, threads, found):
    """The kernel's gated pairing, walked in plain Python (static values) while traced."""
    cfg = gemm.config
    half = cfg.tile_n // 2
    order = epilogue_subtile_order(cfg, half)
    c_tile = cute.make_identity_tensor((cfg.tile_m, cfg.tile_n))
    c_sub = cute.make_identity_tensor((*cfg.epi_tile, 1))
    cols = cfg.tile_n // cfg.epi_tile[1]
    for t in threads:
        computed = r2s.retile(tiled_mma.get_slice(t).partition_C(c_tile))
        written = r2s.get_slice(t).partition_S(c_sub)[(None, None, None, 0)]
        per = cute.size(written)
        # the same in every subtile: read once (each read of a traced tensor costs ~1 ms)
        in_subtile = [written[v] for v in range(per)]
        for e in range((cfg.tile_m // cfg.epi_tile[0]) * (half // cfg.epi_tile[1])):
            sub_m, sub_n = order.get_hier_coord(e)
            r, c = e // (cols // 2), e % (cols // 2)  # the kernel's own arithmetic
            for v in range(per):
                m, n, _ = in_subtile[v]
                out = (sub_m * cfg.epi_tile[0] + m, sub_n * cfg.epi_tile[1] + n)
                gate = computed[(r * cols + c) * per + v]
                up = computed[(r * cols + c + cols // 2) * per + v]
                found.append((out, tuple(gate), tuple(up)))


def _pairs(config, threads):
    gemm = Sm90Gemm(config, F16, F16, F32, epilogue=GATED)
    found = []

    @cute.jit
    def trace():
        tiled_mma = gemm.make_tiled_mma(LayoutEnum.ROW_MAJOR, LayoutEnum.ROW_MAJOR)
        r2s = gemm.make_epilogue_copy(tiled_mma, LayoutEnum.ROW_MAJOR)
        _walk(gemm, tiled_mma, r2s, threads, found)

    cute.compile(trace, options="--gpu-arch sm_90a")
    return found


@pytest.mark.parametrize(
    "config",
    [Sm90Config(tile_m=128, tile_n=256), Sm90Config(tile_m=128, tile_n=128, schedule="pingpong")],
    ids=["cooperative-128x256", "pingpong-128x128"],
)
def test_each_output_value_pairs_its_gate_and_up_columns(config):
    found = _pairs(config, range(32))  # a warp: st.matrix moves values inside one
    half = config.tile_n // 2
    assert found
    for out, gate, up in found:
        assert gate == out, (out, gate)
        assert up == (out[0], out[1] + half), (out, up)
    outs = {out for out, _, _ in found}
    assert len(outs) == len(found)  # each output written once


def _swap_pairs(config, threads):
    """The gated swap-AB pairing, read off the kernel's own register arithmetic
    (``Sm90Gemm._product_register``, ``_up_registers``): (output coordinate in the output
    tile, the gate register's product coordinate, the up register's)."""
    gemm = Sm90Gemm(config, F16, F16, F32, epilogue=GATED)
    plan = Sm90Plan(config, F16, F16, F32, *(None,) * 6, LayoutEnum.COL_MAJOR, GATED)
    found = []

    def walk(tiled_mma, r2s):
        out_m = plan.out_tile_m
        order = epilogue_subtile_order(config, plan.out_tile_n, out_m)
        c_tile = cute.make_identity_tensor((config.tile_m, config.tile_n))
        c_sub = cute.make_identity_tensor((*config.epi_tile, 1))
        for t in threads:
            computed = r2s.retile(tiled_mma.get_slice(t).partition_C(c_tile))
            written = r2s.get_slice(t).partition_S(c_sub)[(None, None, None, 0)]
            per = cute.size(written)
            in_subtile = [written[v] for v in range(per)]
            up_at = Sm90Gemm._up_registers(plan, per)
            for e in range(plan.product_subtiles):
                sub_m, sub_n = order.get_hier_coord(e)
                for v in range(per):
                    m, n, _ = in_subtile[v]
                    out = (sub_m * config.epi_tile[0] + m, sub_n * config.epi_tile[1] + n)
                    gate = Sm90Gemm._product_register(plan, e, per, v)
                    found.append((out, tuple(computed[gate]), tuple(computed[gate + up_at])))

    @cute.jit
    def trace():
        tiled_mma = gemm.make_tiled_mma(LayoutEnum.ROW_MAJOR, LayoutEnum.ROW_MAJOR)
        walk(tiled_mma, gemm.make_epilogue_copy(tiled_mma, LayoutEnum.COL_MAJOR))

    cute.compile(trace, options="--gpu-arch sm_90a")
    return found, plan


@pytest.mark.parametrize("tile_n", [8, 16])
def test_each_swap_output_value_pairs_its_gate_and_up_rows(tile_n):
    """Under swap-AB the weights are the product's rows: output value (r, c) of the 64-row
    output tile is ``act(gate) * up`` of the product's rows r (the gate's) and r + 64 (the up
    projection's), both held by the thread that writes (r, c)."""
    found, plan = _swap_pairs(replace(SWAP_GATED, tile_n=tile_n), range(128))
    assert plan.out_tile_m == 64 and plan.out_tile_n == tile_n
    assert found
    for out, gate, up in found:
        assert gate == out, (out, gate)
        assert up == (out[0] + plan.out_tile_m, out[1]), (out, up)
    outs = {out for out, _, _ in found}
    assert len(outs) == len(found) == plan.out_tile_m * tile_n  # each output written once


def test_the_swap_smem_halves_are_the_stage_rows_split_in_two():
    """sA of the gated swap-AB tile (128 rows, one swizzle atom along K) split by rows: half
    h, row r is full row h * 64 + r, and a half is laid out as a 64-row tile's own stage (the
    layout its TMA box is built for)."""
    checked = []

    def walk():
        full = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (128, 8, 64), F16, 3).outer
        box = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, 8, 64), F16, 3).outer
        halves = cute.logical_divide(full, (64,))
        for h in range(2):
            for r in (0, 1, 7, 8, 63):
                for k in (0, 5, 63):
                    checked.append((halves(((r, h), k, 0)), full((h * 64 + r, k, 0))))
                    # within a stage, a half is the box's layout moved by the half's start
                    checked.append((halves(((r, h), k, 0)) - halves(((0, h), 0, 0)),
                                    box((r, k, 0))))  # fmt: skip

    @cute.jit
    def trace():
        walk()

    cute.compile(trace, options="--gpu-arch sm_90a")
    assert checked and all(a == b for a, b in checked)


def test_the_smem_halves_are_the_stage_rows_split_in_two():
    """logical_divide of sB's rows by tile_n / 2: half h, row r, column k, stage s is full row
    h * half + r (the offsets before the swizzle, which then agree too)."""
    checked = []

    def walk():
        full = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (128, 256, 64), F16, 3).outer
        halves = cute.logical_divide(full, (128,))
        for h in range(2):
            for r in (0, 1, 7, 8, 63, 127):
                for k in (0, 5, 63):
                    for s in range(3):
                        checked.append((halves(((r, h), k, s)), full((h * 128 + r, k, s))))

    @cute.jit
    def trace():
        walk()

    cute.compile(trace, options="--gpu-arch sm_90a")
    assert checked and all(a == b for a, b in checked)


def test_a_gated_config_must_split_into_whole_subtiles():
    with pytest.raises(ValueError, match="gated epilogue needs tile_n"):
        Sm90Gemm(Sm90Config(tile_m=128, tile_n=32), F16, F16, F32, epilogue=GATED)
    with pytest.raises(ValueError, match="ping-pong 128-row tile"):
        Sm90Gemm(Sm90Config(tile_m=64, tile_n=64, schedule="pingpong", swap_ab=True), F16, F16,
                 F32, epilogue=GATED)  # fmt: skip
    with pytest.raises(ValueError, match="ping-pong 128-row tile"):
        Sm90Gemm(Sm90Config(tile_m=128, tile_n=32, swap_ab=True), F16, F16, F32, epilogue=GATED)
    for swap in (False, True):  # two atoms along K would interleave the halves' atom columns
        with pytest.raises(ValueError, match="tile_k=64"):
            Sm90Gemm(Sm90Config(tile_m=128, tile_n=64, tile_k=128, schedule="pingpong",
                                swap_ab=swap), F16, F16, F32, epilogue=GATED)  # fmt: skip
    biased = Epilogue(bias="col", activation="silu", gated=True)  # the swap tile's is a row bias
    with pytest.raises(ValueError, match="no a column bias"):
        Sm90Gemm(SWAP_GATED, F16, F16, F32, epilogue=biased)
    with pytest.raises(ValueError, match="no split-K"):
        Sm90Gemm(Sm90Config(tile_m=128, tile_n=8, schedule="pingpong", swap_ab=True, split_k=0),
                 F16, F16, F32, epilogue=GATED)  # fmt: skip
    with pytest.raises(ValueError, match="activation"):
        Epilogue(gated=True)


#: The gated kernel's SASS (no GPU): the default run's one compile (GeGLU's tanh form with a
#: bias on the cooperative schedule); the sweep compiles every activation a gated epilogue takes
#: on both schedules, with and without a bias, and SwiGLU in the grouped kernel
#: (``grouping="m"``).
GATED_VARIANT = host.Variant("sm90", "sm_90a", epilogue="bias_col+gated+gelu_tanh")
GATED_SWEEP = [
    host.Variant(backend, "sm_90a", epilogue=f"{bias}gated+{act}", grouping=grouping)
    for backend in ("sm90", "sm90-pingpong")
    for act, grouping in [(a, "none") for a in ACTIVATIONS if a != "none"] + [("silu", "m")]
    for bias in ("", "bias_col+")
    if not (bias and grouping != "none")  # the grouped kernel takes no bias
] + [
    # the small row tile (ping-pong 64x128 in 2x1 clusters, docs/perf.md entry 88)
    host.Variant("sm90-pingpong", "sm_90a", config=menu_entry("pingpong-64x128-c2x1")
                 .variant_config(), epilogue=f"{bias}gated+silu")
    for bias in ("", "bias_col+")
]  # fmt: skip


def _assert_gated(r: insp.Report, activation: str) -> None:
    """A's load and B's two half loads per stage (3 UTMALDG), no spills, no CALL (an IEEE
    division or libm call would be one), the logistic activations on the SFU."""
    assert_clean(r)
    ops = set(sass.opcodes(r.sass_text))
    assert r.sass["UTMALDG"] == 3
    assert not any(o.startswith("CALL") for o in ops), f"gated {activation}: a CALL in the kernel"
    if activation in ("silu", "gelu", "gelu_tanh"):
        assert {"MUFU.EX2", "MUFU.RCP"} <= ops, f"gated {activation}: not on the SFU"


def test_a_gated_kernel_compiles_without_calls_or_spills(compiled):
    report = compiled(GATED_VARIANT).report
    _assert_gated(report, "gelu_tanh")
    assert report.sass["LDG"] > 0  # the bias's loads (the plain gated kernel has none)


#: The gated swap-AB decode tile's SASS: the default run's one compile (SwiGLU, 8 tokens).
SWAP_GATED_VARIANT = host.Variant("sm90-pingpong", "sm_90a", config=SWAP_GATED,
                                  epilogue="gated+silu")  # fmt: skip


def test_the_gated_swap_kernel_loads_two_weight_halves_and_stores_half_the_rows(compiled):
    """Clean as the gated kernel (3 UTMALDG a stage: A's two halves and B), and half the plain
    swap-AB tile's TMA stores and st.matrix (its output tile is one 64-row band, not two)."""
    report = compiled(SWAP_GATED_VARIANT).report
    _assert_gated(report, "silu")
    plain = compiled(host.Variant("sm90-pingpong", "sm_90a", config=SWAP_GATED)).report
    assert plain.sass["UTMALDG"] == 2
    assert report.sass["UTMASTG"] * 2 == plain.sass["UTMASTG"]
    assert report.sass["STSM"] * 2 == plain.sass["STSM"]
    assert report.sass["HGMMA"] == plain.sass["HGMMA"]  # the product is the same


SWAP_GATED_SWEEP = [
    host.Variant(
        "sm90-pingpong",
        "sm_90a",
        ab_dtype=ab,
        c_dtype=ab,
        config=replace(SWAP_GATED, tile_n=n),
        epilogue=f"gated+{act}",
    )  # fmt: skip
    for n in (8, 16, 32)
    for act in ACTIVATIONS
    for ab in ("float16", "bfloat16")
    if act != "none" and (n, act, ab) != (8, "silu", "float16")
] + [
    # with a bias along the tile's rows (``GATED_SWAP_BIAS_FAMILIES``)
    host.Variant("sm90-pingpong", "sm_90a", config=replace(SWAP_GATED, tile_n=n),
                 epilogue="bias_row+gated+silu")
    for n in (8, 32)
]  # fmt: skip


@pytest.mark.sweep
@pytest.mark.parametrize(
    "variant",
    SWAP_GATED_SWEEP,
    ids=lambda v: f"{v.config.tile_n}-{v.epilogue}-{v.ab_dtype}",
)
def test_every_gated_swap_kernel_is_clean(compiled, variant):
    epilogue = Epilogue.parse(variant.epilogue)
    _assert_gated(compiled(variant).report, epilogue.activation)
    assert (compiled(variant).report.sass["LDG"] > 0) == (epilogue.bias == "row")  # its bias


def test_a_gated_row_tile_refuses_a_row_bias():
    """A row bias is the swap-AB tile's (the weights' rows); on a row tile ``[b_gate; b_up]``
    runs along the columns."""
    with pytest.raises(ValueError, match="a gated row tile's bias"):
        Sm90Gemm(Sm90Config(), cutlass.Float16, cutlass.Float16, cutlass.Float32,
                 epilogue=Epilogue(bias="row", activation="silu", gated=True))  # fmt: skip


@pytest.mark.sweep
@pytest.mark.parametrize(
    "variant", GATED_SWEEP, ids=lambda v: f"{v.backend}-{v.epilogue}-grouping-{v.grouping}"
)
def test_every_gated_kernel_compiles_to_two_b_loads_and_half_the_stores(compiled, variant):
    """Every gated activation on both schedules: clean as above, and the dense plain kernel's
    TMA stores halve (half the subtiles)."""
    epilogue = Epilogue.parse(variant.epilogue)
    _assert_gated(compiled(variant).report, epilogue.activation)
    if variant.grouping == "none":  # (the grouped kernel loads its offsets with LDG too)
        loads = compiled(variant).report.sass["LDG"]
        if epilogue.bias == "col":  # both halves' addends: as many loads as a plain bias's
            biased = host.Variant(variant.backend, "sm_90a", config=variant.config,
                                  epilogue="bias_col")  # fmt: skip
            assert loads == compiled(biased).report.sass["LDG"] > 0
        else:
            assert loads == 0
    plain = host.Variant(variant.backend, "sm_90a", config=variant.config,
                         grouping=variant.grouping)  # fmt: skip
    assert compiled(variant).report.sass["UTMASTG"] * 2 == compiled(plain).report.sass["UTMASTG"]
