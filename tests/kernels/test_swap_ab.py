"""Swap-AB on the CPU: a dispatcher posing as an H200 whose kernel is a float64 stand-in that
insists on what an sm90 swap-AB kernel takes. A swap config computes C^T (N, M) = B^T A^T: the
kernel's A is the caller's B (N, K), its B the caller's A (M, K), and it writes the caller's C
through an M-major view, without a copy when C is row-major."""

import dataclasses

import pytest
import torch
from operands import make
from stand_ins import LAYOUTS, StandInCache, StandInKernel, matmul, reference

from wsgemm.api import Dispatcher
from wsgemm.host.dispatch import StandInDevices
from wsgemm.kernels.sm90.config import Sm90Config

F16 = torch.float16
SWAP = Sm90Config(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True)


class SwapKernel(StandInKernel):
    """Writes C only through an M-major (N, M, L)... i.e. the kernel's (M, N, L) C with a unit
    stride along its M, as the compiled swap kernel demands (its __call__ raises otherwise)."""

    def __call__(self, a, b, c, clusters):
        assert c.stride(0) == 1 or c.shape[0] == 1, f"C is not M-major: {c.stride()}"
        super().__call__(a, b, c, clusters)


def swap_dispatcher() -> Dispatcher:
    cache = StandInCache()
    cache.kernel = SwapKernel()
    return Dispatcher(cache, StandInDevices((9, 0), 132))


@pytest.mark.parametrize("sa, sb, a_col, b_col, use_out", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 3])
def test_swap_gives_the_product_fresh_and_from_the_launcher(sa, sb, a_col, b_col, use_out, offset):
    d = swap_dispatcher()
    gen = torch.Generator().manual_seed(sum(sa) + offset)

    def operands():
        a = make(sa, F16, "cpu", col_major=a_col, offset=offset, gen=gen)
        b = make(sb, F16, "cpu", col_major=b_col, offset=offset, gen=gen)
        out = torch.full(reference(a, b).shape, float("nan"), dtype=F16) if use_out else None
        return a, b, out

    for _ in range(3):  # the first call plans; the others run the signature's launcher
        a, b, out = operands()
        got = matmul(d, a, b, out, backend="sm90-pingpong", config=SWAP)
        assert got is out if use_out else got.shape == reference(a, b).shape
        torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    assert len(d.launchers) == 1
    assert all(v.kernel_config() == SWAP for v in d.cache.variants)


@pytest.mark.parametrize("m", [1, 7, 16, 33])
def test_a_decode_call_passes_the_callers_tensors_swapped_without_copies(m):
    d = swap_dispatcher()
    x = torch.randn(m, 256).half()  # tokens x hidden
    w = torch.randn(512, 256).half()  # out_features x hidden: x @ w.T
    for _ in range(2):
        out = torch.empty(m, 512, dtype=F16)
        matmul(d, x, w.T, out, backend="sm90-pingpong", config=SWAP)
        torch.testing.assert_close(out, reference(x, w.T), rtol=0, atol=0)
        a_ptr, b_ptr, c_ptr, _ = d.cache.kernel.launches[-1]
        assert (a_ptr, b_ptr, c_ptr) == (w.data_ptr(), x.data_ptr(), out.data_ptr())


def test_a_column_major_out_goes_through_a_temporary():
    """The swap kernel writes C^T M-major, i.e. a row-major C in place; a column-major C is
    the one layout it cannot address, so it gets a temporary and a copy back."""
    d = swap_dispatcher()
    a, b = torch.randn(8, 64).half(), torch.randn(64, 40).half()
    out = torch.empty(40, 8, dtype=F16).T
    matmul(d, a, b, out, backend="sm90-pingpong", config=SWAP)
    torch.testing.assert_close(out, reference(a, b), rtol=0, atol=0)
    assert d.cache.kernel.launches[-1][2] != out.data_ptr()


def test_swap_is_part_of_the_config_and_validated():
    assert dataclasses.replace(SWAP, swap_ab=False) != SWAP
    with pytest.raises(ValueError, match="tile_n must be one of 8, 16, 32, 64"):
        Sm90Config(tile_m=64, tile_n=24, schedule="pingpong", swap_ab=True)
    with pytest.raises(ValueError, match="tile_n=8 is the swap-AB decode tile"):
        Sm90Config(tile_m=64, tile_n=8, schedule="pingpong")
    assert Sm90Config(tile_m=64, tile_n=8, schedule="pingpong", swap_ab=True).tile_n == 8


@pytest.mark.parametrize(
    "entry, stsm, hgmma",
    [
        ("swap-pingpong-64x16x128-c1x1", "STSM.16.MT88.4", "HGMMA.64x16x16"),
        # the 8-wide decode tile: st.matrix x2 (x4 covers 16 columns)
        ("swap-pingpong-64x8x128-c1x1", "STSM.16.MT88.2", "HGMMA.64x8x16"),
    ],
    ids=["64x16", "64x8"],
)
def test_the_swap_kernel_compiles_for_sm_90a_with_a_transposed_epilogue(
    compiled, entry, stsm, hgmma
):
    """The menu's two swap-AB tiles (the session's compiles, shared with test_menu_sass.py):
    spill-free, WGMMA from TMA-loaded stages, transposed st.matrix into the M-major subtile,
    TMA store."""
    from sass_checks import assert_clean

    from wsgemm import host, sass
    from wsgemm.host import choosing

    config = choosing.entry(entry).variant_config()
    v = host.Variant("sm90-pingpong", "sm_90a", "float16", "float16", config=config)
    r = compiled(v).report
    assert_clean(r)
    ops = set(sass.opcodes(r.sass_text))
    assert stsm in ops, sorted(o for o in ops if o.startswith("STSM"))
    assert hgmma in r.sass_text
    assert r.sass["HGMMA"] > 0 and r.sass["UTMALDG"] > 0 and r.sass["UTMASTG"] > 0
