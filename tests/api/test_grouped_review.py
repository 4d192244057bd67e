"""``wsgemm.grouped_mm`` against ``torch._grouped_mm``'s semantics, on the CPU (a review's
findings, each with its fix; the fake result's strides for empty results are checked in
``test_grouped.py``'s meta test): ``result_strides`` is torch's formula; the public call takes
meta tensors as its op does; ``out=`` is an op (``grouped_mm_out``) that fake tensors and
torch.compile take; torch's fused kernel is handed contiguous offsets; a named backend's dtypes
are refused by the checks the fake runs."""

import pytest
import torch
from op_helpers import capture, fake_cuda, grouped_meta_operands, install_grouped, ops_in
from stand_ins import cpu_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm.api import grouped as core

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
I32 = torch.int32


def ends(*sizes):
    return torch.tensor(list(torch.tensor(sizes).cumsum(0)), dtype=I32)


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ----------------------------------------------------------------------------- strides


def test_result_strides_are_torchs_formula():
    assert core.result_strides((5, 13), F16) == (16, 1)
    assert core.result_strides((3, 5, 13), F32) == (80, 16, 1)
    assert core.result_strides((7, 0), BF16) == (0, 1)
    assert core.result_strides((4, 0, 20), BF16) == (0, 24, 1)
    assert core.result_strides((4, 7, 0), F32) == (0, 0, 1)


# ----------------------------------------------------------------------------- meta and CPU


@pytest.mark.parametrize("form", core.FORMS)
def test_the_public_call_takes_meta_tensors_as_its_op_does(form):
    """Without a gradient the public call took its eager road to the core for any plain
    tensor, which refused meta ones ("a must be a CUDA tensor, got one on meta"), while the op
    (and the same call with requires_grad) gave the fake result: now only CUDA tensors take the
    eager road, as ``matmul``'s."""
    a, b, offs = grouped_meta_operands(form, 10, 20, 3, 16)
    got = wsgemm.grouped_mm(a, b, offs)
    want = torch.ops.wsgemm.grouped_mm(a, b, offs)
    assert (got.shape, got.stride(), got.device) == (want.shape, want.stride(), want.device)
    fp32 = wsgemm.grouped_mm(a, b, offs, out_dtype=F32)
    assert fp32.dtype == F32 and fp32.shape == want.shape


def test_cpu_tensors_are_still_refused_with_the_cores_errors():
    a, b = torch.randn(10, 16, dtype=BF16), torch.randn(3, 16, 20, dtype=BF16)
    out = torch.empty(10, 20, dtype=BF16)
    for kw in ({}, {"out": out}):
        with pytest.raises(ValueError, match="a must be a CUDA tensor, got one on cpu"):
            wsgemm.grouped_mm(a, b, ends(2, 3, 5), **kw)
        with pytest.raises(TypeError, match="offs must be a torch.Tensor or None, got list"):
            wsgemm.grouped_mm(a, b, [2, 5, 10], **kw)
    with pytest.raises(TypeError, match="row_scale must be a torch.Tensor"):
        wsgemm.grouped_mm(a, b, ends(2, 3, 5), row_scale=[1.0] * 10)


# ----------------------------------------------------------------------------- out= as an op


FORMS = {  # (a, b, offs, result's shape)
    "2d3d": ((10, 16), (3, 16, 20), ends(2, 0, 5), (10, 20)),
    "3d3d": ((3, 5, 16), (3, 16, 20), None, (3, 5, 20)),
    "2d2d": ((5, 16), (16, 20), ends(4, 0, 9), (3, 5, 20)),
    "3d2d": ((3, 5, 16), (16, 20), ends(8, 0, 10), (5, 20)),
}


@pytest.mark.parametrize("form", FORMS)
def test_out_on_meta_and_fake_tensors(form):
    """``out=`` went to the core whatever the tensors: meta ones were refused and fake CUDA
    ones reached the GPU query ("Torch not compiled with CUDA enabled" here; a launch on a
    GPU). Off the eager road it is the op ``grouped_mm_out``, whose fake checks out as the core
    does."""
    a_shape, b_shape, offs, shape = FORMS[form]
    offs = None if offs is None else offs.to("meta")
    a, b = meta(*a_shape), meta(*b_shape)
    for dtype in (BF16, F32):
        out = meta(*shape, dtype=dtype)
        assert wsgemm.grouped_mm(a, b, offs, out=out) is out
    with pytest.raises(ValueError, match="out has shape"):
        wsgemm.grouped_mm(a, b, offs, out=meta(*shape[:-1], shape[-1] + 1))
    with pytest.raises(TypeError, match="out_dtype"):
        wsgemm.grouped_mm(a, b, offs, out=meta(*shape, dtype=F16))
    with pytest.raises(ValueError, match="stride 0"):
        wsgemm.grouped_mm(a, b, offs, out=meta(shape[-1]).expand(shape))
    with FakeTensorMode():
        a, b = fake_cuda(a_shape, BF16), fake_cuda(b_shape, BF16)
        offs = None if offs is None else fake_cuda(offs.shape, I32)
        out = fake_cuda(shape, BF16)
        assert wsgemm.grouped_mm(a, b, offs, out=out) is out


def test_out_under_compile_fullgraph_is_one_op():
    """torch.compile(fullgraph=True) of an out= call failed (dynamo in the core's checks);
    now it holds the one mutating op, and a new token count reuses the graph."""
    torch._dynamo.reset()
    graphs = []

    def fn(x, w, offs, out):
        return wsgemm.grouped_mm(x, w.transpose(-2, -1), offs, out=out)

    compiled = torch.compile(fn, backend=capture(graphs), fullgraph=True, dynamic=True)
    with FakeTensorMode():
        w, offs = fake_cuda((3, 20, 16), BF16), fake_cuda((3,), I32)
        for m in (10, 30):
            out = fake_cuda((m, 20), BF16)
            assert compiled(fake_cuda((m, 16), BF16), w, offs, out) is out
    assert len(graphs) == 1
    assert len(ops_in(graphs[0], "wsgemm.grouped_mm_out.default")) == 1


@pytest.mark.parametrize("out_dtype", [BF16, F32])
@pytest.mark.parametrize("form", FORMS)
def test_opcheck_of_the_out_op(monkeypatch, form, out_dtype):
    """torch's checks of ``grouped_mm_out`` (schema and mutation, fake against the CPU kernel,
    AOTAutograd) on the core's CPU stand-in, which writes out."""
    stub = install_grouped(monkeypatch)
    a_shape, b_shape, offs, shape = FORMS[form]
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(a_shape, generator=gen).to(BF16)
    b = torch.randn(b_shape, generator=gen).to(BF16)
    out = torch.full(shape, 7.0, dtype=out_dtype)
    torch.library.opcheck(torch.ops.wsgemm.grouped_mm_out.default, (a, b, offs, out), {})
    assert set(stub.calls) == {form}


def test_the_out_op_refuses_autograd_and_counts_flops():
    a = meta(10, 16).requires_grad_()
    b, offs, out = meta(3, 16, 20), meta(3, dtype=I32), meta(10, 20)
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        torch.ops.wsgemm.grouped_mm_out(a, b, offs, out)
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        wsgemm.grouped_mm(a, b, offs, out=out)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        wsgemm.grouped_mm(a, b, offs, out=out)
    assert counter.get_total_flops() == 2 * 10 * 20 * 16


# ----------------------------------------------------------------------------- torch's road


def test_torchs_fused_kernel_is_handed_contiguous_offsets(monkeypatch):
    """torch's fused grouped kernel reads the ends at offs's data pointer as a contiguous
    vector (``prepare_grouped_gemm_data``: ``offs->const_data_ptr<int32_t>()``, no stride):
    a strided offs garbled the groups, silently. A stand-in of that kernel reads them so."""

    def fused_as_cuda_reads(a, b, offs):
        raw = offs.as_strided((offs.shape[0],), (1,))  # from the data pointer, stride 1
        result = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype)
        lo = 0
        for g, hi in enumerate(raw.tolist()):
            result[lo:hi] = (a[lo:hi].float() @ b[g].float()).to(a.dtype)
            lo = hi
        return result

    monkeypatch.setattr(torch, "_grouped_mm", fused_as_cuda_reads)
    torch.manual_seed(5)
    a, b = torch.randn(12, 8, dtype=BF16), torch.randn(3, 8, 16, dtype=BF16)
    offs = torch.tensor([4, 99, 4, 99, 12, 99], dtype=I32)[::2]  # ends 4, 4, 12: strided
    d = cpu_dispatcher((8, 0))  # no grouped kernel: torch's road
    p = core.check_grouped(a, b, offs, None, None, "auto", ("cpu",))
    assert core.route(d, p, a, b, "auto") == core.TORCH
    got = core.grouped_mm(a, b, offs, dispatcher=d)
    want = torch.cat([a[:4].double() @ b[0].double(), a[4:].double() @ b[2].double()])
    assert (got.double() - want).abs().max() <= 0.05 * want.abs().max()


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("form", FORMS)
def test_a_named_backend_refuses_float32_in_the_checks_the_fake_runs(form):
    """backend='sm90' with float32 operands: the 2D forms raised ValueError at the route
    (after the checks: the fake implementation took the call), 3D x 3D matmul's TypeError.
    Now every form's checks raise the TypeError, the fake's included; 'auto' takes float32."""
    a_shape, b_shape, offs, shape = FORMS[form]
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    with pytest.raises(TypeError, match=r"backend 'sm90' runs float16 and bfloat16 only"):
        core.check_grouped(a, b, offs, None, None, "sm90", ("cpu",))
    assert core.check_grouped(a, b, offs, None, None, "auto", ("cpu",)).shape == shape
    m_offs = None if offs is None else offs.to("meta")
    with pytest.raises(TypeError, match=r"runs float16 and bfloat16 only"):
        torch.ops.wsgemm.grouped_mm(meta(*a_shape, dtype=F32), meta(*b_shape, dtype=F32),
                                    m_offs, backend="sm90")  # fmt: skip


# ----------------------------------------------------------------------------- aligned groups
# torch._grouped_mm's fused kernel asserts on the GPU (torch 2.8 on, GroupMMCommon.cuh) that
# each group but the last spans a whole multiple of 16 bytes along offs's dimension, for 3D x 2D
# always and for 2D x 2D and 2D x 3D in some layouts. A failed device assert ends the process's
# CUDA context; the group sizes are on the GPU, so such calls never take that kernel.


def test_which_layouts_torchs_fused_kernel_needs_aligned_groups_for():
    col, row = torch.randn(30, 6).t(), torch.randn(6, 30)  # a (6, 30) column- and row-major
    b_row, b_col = torch.randn(30, 8), torch.randn(8, 30).t()
    need = core._torch_needs_aligned_groups
    assert need("3d2d", torch.randn(2, 6, 30), b_row) and need("3d2d", torch.randn(2, 6, 30), b_col)
    assert not need("2d2d", col, b_row)  # a weight gradient's x.T and dy: K strided in both
    assert need("2d2d", row, b_row) and need("2d2d", col, b_col) and need("2d2d", row, b_col)
    b3 = torch.randn(3, 30, 8)
    assert not need("2d3d", torch.randn(6, 30), b3) and need("2d3d", col.t().t(), b3)
    assert not need("3d3d", torch.randn(2, 6, 30), torch.randn(2, 30, 8))


@pytest.mark.parametrize("a_layout", ["row", "col"])
def test_auto_keeps_torchs_fused_kernel_only_where_it_needs_no_aligned_groups(a_layout):
    """On Hopper under auto: bfloat16 3D x 2D takes the grouped kernel (as float16's does);
    bfloat16 2D x 2D keeps torch's fused kernel (small groups) only where a is column-major
    and b row-major, else the ragged-K kernel."""
    d = cpu_dispatcher((9, 0))
    a = torch.randn(6, 30, dtype=BF16) if a_layout == "row" else torch.randn(30, 6, dtype=BF16).t()
    b, offs = torch.randn(30, 8, dtype=BF16), ends(10, 0, 20)
    p = core.check_grouped(a, b, offs, None, None, "auto", ("cpu",))
    assert core.route(d, p, a, b, "auto") == (core.TORCH if a_layout == "col" else core.KERNEL)
    a3, b2 = torch.randn(3, 6, 30, dtype=BF16), torch.randn(30, 24, dtype=BF16)
    p = core.check_grouped(a3, b2, ends(5, 3, 16), None, None, "auto", ("cpu",))
    assert core.route(d, p, a3, b2, "auto") == core.KERNEL


def test_off_hopper_calls_that_need_aligned_groups_loop_in_torch(monkeypatch):
    """Off Hopper (no grouped kernel) torch's road takes its fused kernel only where that needs
    no aligned groups (a stand-in of it fails as its device assert would); else the loop over
    the groups, which explain names."""

    def fused(a, b, offs):
        sizes = torch.diff(offs, prepend=offs.new_zeros(1))[:-1]
        if core._torch_needs_aligned_groups(form, a, b) and (sizes % 8).any():
            raise AssertionError("device-side assert: not a multiple of 16 bytes")
        return real(a, b, offs)

    real = torch._grouped_mm if hasattr(torch, "_grouped_mm") else None
    if real is None:
        pytest.skip("this torch has no torch._grouped_mm")
    monkeypatch.setattr(torch, "_grouped_mm", fused)
    d = cpu_dispatcher((8, 0))
    torch.manual_seed(3)
    cases = {
        "3d2d": (
            torch.randn(3, 6, 30, dtype=BF16),
            torch.randn(30, 24, dtype=BF16),
            ends(5, 3, 16),
        ),
        "2d2d": (torch.randn(6, 30, dtype=BF16), torch.randn(30, 8, dtype=BF16), ends(9, 1, 20)),
    }
    for form, (a, b, offs) in cases.items():
        got = core.grouped_mm(a, b, offs, dispatcher=d)
        e = [0, *offs.tolist()]
        if form == "3d2d":
            want = torch.cat([a[g].double() @ b[:, e[g] : e[g + 1]].double() for g in range(3)], 1)
            got = got[:, : e[-1]]
        else:
            want = torch.stack([a[:, e[g]:e[g + 1]].double() @ b[e[g]:e[g + 1]].double()
                                for g in range(3)])  # fmt: skip
        assert (got.double() - want).abs().max() <= 0.02 * want.abs().max()
        text = core.explain(d, a, b, offs)
        assert "would assert on the GPU" in text
