"""The grouped sm90 kernel (issue #26) compiles without a GPU, spill-free, to the dense kernel's
hardware path plus what a ragged group needs: the offsets read from global memory and the
predicated stores of a group's last tile (16-byte vectors inside C's columns) beside the TMA
stores of whole tiles.

The default run compiles the variant ``auto`` runs for small groups (64x128 ping-pong); the
sweep (``-m sweep``) the shipped tiles, both majors of each operand, bf16, an fp32 output and
the gated grouped kernel (SwiGLU, the MoE FC1: a half-width C).
"""

import dataclasses

import pytest
from sass_checks import assert_clean

from wsgemm import host, sass
from wsgemm.kernels.sm90.config import Sm90Config

SMALL = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong")
REPRESENTATIVE = host.Variant("sm90-pingpong", "sm_90a", config=SMALL, grouping="m")
SWEEP = [
    host.Variant("sm90", "sm_90a", grouping="m"),
    host.Variant("sm90-pingpong", "sm_90a", grouping="m"),
    host.Variant("sm90", "sm_90a", "bfloat16", "float32", grouping="m"),
    host.Variant("sm90", "sm_90a", b_major="n", grouping="m"),
    host.Variant(
        "sm90-pingpong", "sm_90a", "bfloat16", "bfloat16", config=SMALL, b_major="n", grouping="m"
    ),  # fmt: skip
    host.Variant("sm90", "sm_90a", config=Sm90Config(tile_n=128, cluster_n=2), grouping="m"),
    host.Variant("sm90", "sm_90a", epilogue="gated+silu", grouping="m"),
]

NEEDS = {
    "HGMMA": "consumers issue warpgroup MMA",
    "UTMALDG": "the producer loads tiles with TMA",
    "UTMASTG": "whole tiles are stored with TMA",
    "USETMAXREG": "the producer gives registers to the consumers",
    "SYNCS": "roles meet on mbarriers",
}


def _grouped_opcodes(r) -> set:
    """What every grouped kernel compiles to (clean, ``NEEDS``, no CALL, the offsets read by
    every role's schedule); its opcodes, for the checks of its kind."""
    assert_clean(r)
    ops = set(sass.opcodes(r.sass_text))
    for op, why in NEEDS.items():
        assert any(o.startswith(op) for o in ops), f"no {op}: {why}"
    assert not any(o.startswith("CALL") for o in ops), "a CALL in the kernel"
    assert any(o.startswith("LDG.E") for o in ops), "the offsets are not read"
    return ops


def _assert_grouped(r) -> None:
    """A group's last tile: a run inside C's columns read from shared memory and stored as one
    16-byte vector (element-wise copies cost a skewed moe call ~20%: docs/perf.md entry 121),
    element by element only across C's last column."""
    ops = _grouped_opcodes(r)
    assert "LDS.128" in ops, "the subtile is not read from shared memory in 16-byte vectors"
    assert "STG.E.128" in ops, "a group's last tile is not stored in 16-byte vectors"
    assert any(o.startswith("STG.E") and o != "STG.E.128" for o in ops), "no element store"


def test_the_grouped_kernel_compiles_spill_free(compiled):
    _assert_grouped(compiled(REPRESENTATIVE).report)


@pytest.mark.sweep
@pytest.mark.parametrize("variant", SWEEP, ids=lambda v: v.key())
def test_every_grouped_variant_compiles_spill_free(compiled, variant):
    _assert_grouped(compiled(variant).report)


def test_grouped_keys_are_apart_and_dense_keys_unchanged():
    dense = host.Variant("sm90", "sm_90a")
    grouped = dataclasses.replace(dense, grouping="m")
    assert grouped.key() == dense.key() + "-grouping=m"
    assert "grouping" not in dense.key()
    assert grouped.kernel_class().__name__ == "Sm90GroupedGemm"


def test_a_backend_without_a_grouped_kernel_is_refused():
    with pytest.raises(ValueError, match="no grouped GEMM"):
        host.Variant("sm80", "sm_80", grouping="m")


@pytest.mark.parametrize(
    "options, what",
    [
        (dict(config=Sm90Config(split_k=2)), "split-K"),
        (dict(config=Sm90Config(swap_ab=True, tile_n=32, schedule="pingpong", tile_m=64)), "swap"),
        (dict(epilogue="bias_col"), "bias"),
    ],
)
def test_the_grouped_kernel_refuses_what_it_does_not_have(options, what):
    variant = host.Variant("sm90", "sm_90a", grouping="m", **options)
    with pytest.raises(ValueError, match=what):
        host.make_kernel(variant)


def test_the_grouped_launch_takes_the_offsets_last():
    """The host passes (raster group, split, workspace, semaphores, bias, alpha, beta, residual,
    row scale, offs): the dense kernel's, then the grouped kernel's own two."""
    cls = host.Variant("sm90", "sm_90a", grouping="m").kernel_class()
    names = [name for name, _ in cls.LAUNCH_EXTRAS]
    assert names[-6:] == ["bias", "alpha", "beta", "residual", "row_scale", "offs"]
    assert cls.launch_defaults() == (0, 1, *(None,) * 8)


def test_the_grouped_kernel_refuses_an_m_major_a():
    """A group starts at any row; a TMA box may not start at any element of A's contiguous
    dimension (an illegal instruction on the H200, docs/perf.md entry 39): refused when traced,
    and the host copies such an A K-major (tests/api/test_grouped.py)."""
    with pytest.raises(ValueError, match="K-major A"):
        host.compile_variant(host.Variant("sm90", "sm_90a", a_major="m", grouping="m"))


# ----------------------------------------------------------------------------- ragged K (2D x 2D)

RAGGED_K = host.Variant("sm90", "sm_90a", a_major="m", b_major="n", grouping="k")
RAGGED_K_SWEEP = [
    host.Variant("sm90-pingpong", "sm_90a", a_major="m", b_major="n", grouping="k"),
    host.Variant("sm90", "sm_90a", "bfloat16", "float32", a_major="m", b_major="n", grouping="k"),
    host.Variant(
        "sm90",
        "sm_90a",
        a_major="m",
        b_major="n",
        config=Sm90Config(tile_n=128, cluster_n=2),
        grouping="k",
    ),  # fmt: skip
]


def _assert_ragged_k(r) -> None:
    """The dense kernel's hardware path, plus the per-CTA descriptors: copied from the launch's
    (16-byte global stores), rewritten per group, released to the TMA unit's proxy
    (``fence.proxy.tensormap::generic.release``: a GPU-scope memory barrier) and acquired
    before the loads that use them (a descriptor-cache invalidation)."""
    ops = _grouped_opcodes(r)
    assert "STG.E.128" in ops, "the launch's descriptors are not copied to the CTA's slots"
    assert "MEMBAR.ALL.GPU" in ops, "no release of the rewritten descriptors"
    assert "UTMACCTL.IV" in ops, "no acquire (descriptor invalidation) before the loads"
    # nothing of the ragged-M store path: the output's tiles are whole (C's batch per group)
    assert not any(o.startswith("LDS") for o in ops)


def test_the_ragged_k_kernel_compiles_spill_free(compiled):
    _assert_ragged_k(compiled(RAGGED_K).report)


@pytest.mark.sweep
@pytest.mark.parametrize("variant", RAGGED_K_SWEEP, ids=lambda v: v.key())
def test_every_ragged_k_variant_compiles_spill_free(compiled, variant):
    _assert_ragged_k(compiled(variant).report)


@pytest.mark.parametrize("majors", [("k", "n"), ("m", "k")])
def test_the_ragged_k_kernel_refuses_a_contiguous_k(majors):
    """A group starts at any k: K must be each operand's strided dimension (the host copies)."""
    variant = host.Variant("sm90", "sm_90a", a_major=majors[0], b_major=majors[1], grouping="k")
    with pytest.raises(ValueError, match="M-major A and an N-major B"):
        host.compile_variant(variant)


def test_the_ragged_k_kernel_is_its_own_variant():
    assert RAGGED_K.key().endswith("-grouping=k")
    assert RAGGED_K.kernel_class().__name__ == "Sm90KGroupedGemm"
    assert RAGGED_K.kernel_class().grouped == "k"
    assert set(host.ragged_k_variants()) >= {RAGGED_K}
    assert all(v.grouping == "k" and (v.a_major, v.b_major) == ("m", "n")
               for v in host.ragged_k_variants())  # fmt: skip
    # the descriptor workspace: two 128-byte descriptors per CTA of the clusters launched
    assert host.ragged_k_workspace_words("sm90", None, 66) == 66 * 2 * 2 * 128 // 4


@pytest.mark.sweep
@pytest.mark.parametrize(
    "epilogue, load", [("row_scale_fp32", "LDG.E"), ("gated+silu+row_scale_input", "LDG.E.U16")]
)
def test_a_row_scale_is_one_load_per_row_and_one_multiply_per_element(compiled, epilogue, load):
    """``grouped_mm(row_scale=)`` in the grouped kernel's epilogue: the plain variant's code
    plus each thread's rows' factors (two rows of each 64-row MMA atom: two more loads of the
    vector's dtype, shared by the registers of a row) and one FMUL per output element; no
    spill (``kernels/epilogue/row_scale.py``)."""
    import collections

    base_epi = "gated+silu" if "gated" in epilogue else "none"
    scaled = dataclasses.replace(REPRESENTATIVE, epilogue=epilogue)
    base = dataclasses.replace(REPRESENTATIVE, epilogue=base_epi)
    ops, base_ops = (
        collections.Counter(sass.opcodes(compiled(v).report.sass_text)) for v in (scaled, base)
    )  # fmt: skip
    _grouped_opcodes(compiled(scaled).report)
    assert ops[load] - base_ops[load] == 2, (ops[load], base_ops[load])
    elements = 64 * 128 // 128 // (2 if "gated" in epilogue else 1)  # per thread of a warpgroup
    assert ops["FMUL"] - base_ops["FMUL"] == elements


@pytest.mark.parametrize("grouping", ["none", "k"])
def test_a_row_scale_is_the_ragged_m_kernels_only(grouping):
    """The dense and ragged-K kernels have no row-scale launch argument: they refuse the
    epilogue rather than take a vector they would never be passed."""
    variant = host.Variant("sm90", "sm_90a", epilogue="row_scale_fp32", grouping=grouping)
    with pytest.raises(ValueError, match="ragged-M grouped kernel's"):
        host.make_kernel(variant)
