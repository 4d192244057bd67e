"""``wsgemm.grouped_mm`` on the CPU (issue #26): the four forms' shapes and checks, the
routes, the kernel road's views (a dispatcher whose grouped kernel is a float64 stand-in that
reads the offsets as the kernel does), the torch road, the fake implementation and autograd.
The kernel itself runs in tests/gpu/test_gpu_grouped.py."""

import functools

import pytest
import torch
from op_helpers import grouped_meta_operands, tile_map_tiles
from stand_ins import address_entry
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm.api import Dispatcher
from wsgemm.api import grouped as core
from wsgemm.api.epilogue import Epilogue, torch_activation
from wsgemm.host import grouped as registry_grouped
from wsgemm.host import registry
from wsgemm.host.dispatch import StandInDevices

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


class GroupedStandIn:
    """The grouped kernel in float64: C[r] = A[r] B[g]^T for the rows of group g, each end
    clamped to [previous end, rows] as the kernel clamps it; rows past the groups untouched."""

    def __init__(self):
        self.launches = []

    def __call__(self, a, b, c, clusters, raster, split, workspace, sems, bias, alpha, beta,
                 residual, row_scale, offs, *, epilogue="none"):  # fmt: skip
        self.launches.append(dict(a=a, b=b, c=c, offs=offs, epilogue=epilogue,
                                  row_scale=row_scale))  # fmt: skip
        assert a.stride(2) == 0 and c.stride(2) == 0 and b.shape[2] == len(offs)
        assert (raster, split, workspace, sems, bias, alpha, beta) == (0, 1, None, None, None,
                                                                       None, None)  # fmt: skip
        spec = Epilogue.parse(epilogue)
        assert (row_scale is None) == (spec.row_scale == "none")
        if row_scale is not None:  # one contiguous factor per row of A, of the epilogue's dtype
            assert row_scale.shape == (a.shape[0],) and row_scale.stride() == (1,)
            assert row_scale.dtype == (torch.float32 if spec.row_scale == "fp32" else a.dtype)
        if spec.gated:  # B's view is the gate's rows; the up rows follow in memory
            assert b.stride(1) == 1 and b.shape[0] == c.shape[1]
            b = b.as_strided((2 * b.shape[0], *b.shape[1:]), b.stride())
        rows, prev = a.shape[0], 0
        for g, end in enumerate(offs.tolist()):
            lo, hi = prev, min(max(end, prev), rows)
            y = a[lo:hi, :, 0].double() @ b[:, :, g].double().T
            if spec.gated:
                half = y.shape[1] // 2
                y = torch_activation(spec.activation, y[:, :half]) * y[:, half:]
            else:
                y = torch_activation(spec.activation, y)
            if row_scale is not None:
                y = y * row_scale[lo:hi, None].double()
            c[lo:hi, :, 0] = y.to(c.dtype)
            prev = hi


class RaggedKStandIn:
    """The ragged-K grouped kernel (2D x 2D) in float64: C[:, :, g] = A[:, lo:hi] B[:, lo:hi]^T
    with each group's [lo, hi) read from the ends as the kernel reads them (each on its own,
    clamped into K); checks the launch's views and its descriptor workspace."""

    def __init__(self):
        self.launches = []

    def __call__(self, a, b, c, clusters, raster, split, workspace, sems, bias, alpha, beta,
                 residual, row_scale, offs, *, epilogue="none"):  # fmt: skip
        self.launches.append(dict(a=a, b=b, c=c, offs=offs, epilogue=epilogue))
        assert row_scale is None
        groups = len(offs)
        assert a.stride(2) == 0 and b.stride(2) == 0 and c.shape[2] == groups
        assert a.stride(0) == 1 and b.stride(0) == 1, "K must be strided (M-, N-major)"
        assert c.stride(1) == 1
        assert (raster, split, sems, bias, alpha, beta) == (0, 1, None, None, None, None)
        # 128 bytes for each of A's and B's descriptors, per CTA of the clusters launched
        assert workspace.dtype == torch.float32 and workspace.numel() == clusters * 2 * 64
        k, ends = a.shape[1], offs.tolist()
        for g in range(groups):
            lo = min(max(ends[g - 1], 0), k) if g else 0
            hi = min(max(ends[g], lo), k)
            y = a[:, lo:hi, 0].double() @ b[:, lo:hi, 0].double().T
            c[:, :, g] = torch_activation(Epilogue.parse(epilogue).activation, y).to(c.dtype)


class Cache:
    def __init__(self):
        self.kernel = GroupedStandIn()
        self.k_kernel = RaggedKStandIn()
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)
        assert variant.grouping in ("m", "k")
        kernel = self.kernel if variant.grouping == "m" else self.k_kernel
        return functools.partial(kernel, epilogue=variant.epilogue)


def dispatcher(capability=(9, 0)):
    return Dispatcher(Cache(), StandInDevices(capability, 132))


def reference(a, b, offs, form):
    """float64, per group, from the offsets read on the host."""
    a64, b64 = a.double(), b.double()
    if form == "3d3d":
        return a64 @ b64
    ends = [0, *offs.tolist()]
    if form == "2d3d":
        return [(ends[g], ends[g + 1], a64[ends[g] : ends[g + 1]] @ b64[g]) for g in range(len(b))]
    if form == "2d2d":
        return torch.stack([a64[:, ends[g] : ends[g + 1]] @ b64[ends[g] : ends[g + 1]]
                            for g in range(len(offs))])  # fmt: skip
    return [(ends[g], ends[g + 1], a64[g] @ b64[:, ends[g] : ends[g + 1]]) for g in range(len(a))]


def tolerance(dtype, k):
    eps = torch.finfo(dtype).eps
    return 2 * eps * max(k, 1) ** 0.5 + eps


def assert_rows(out, ref, k, dim=0):
    for lo, hi, block in ref:
        got = out[lo:hi] if dim == 0 else out[:, lo:hi]
        err = (got.double() - block).abs().max().item() if block.numel() else 0.0
        scale = block.abs().max().item() if block.numel() else 1.0
        assert err <= tolerance(out.dtype, k) * max(scale, 1.0), (lo, hi, err)


def ends(*sizes):
    return torch.tensor(list(torch.tensor(sizes).cumsum(0)), dtype=torch.int32)


# ----------------------------------------------------------------------------- shapes and checks


@pytest.mark.parametrize(
    "a, b, offs, form, groups, shape",
    [
        ((10, 8), (3, 8, 16), 3, "2d3d", 3, (10, 16)),
        ((3, 10, 8), (3, 8, 16), None, "3d3d", 3, (3, 10, 16)),
        ((10, 40), (40, 16), 4, "2d2d", 4, (4, 10, 16)),
        ((3, 10, 8), (8, 48), 3, "3d2d", 3, (10, 48)),
    ],
)
def test_the_four_forms(a, b, offs, form, groups, shape):
    assert core.result_shape(a, b, offs) == (form, groups, shape)


@pytest.mark.parametrize(
    "a, b, offs, match",
    [
        ((10, 8), (3, 8, 16), None, "needs offs"),
        ((3, 10, 8), (3, 8, 16), 3, "takes no offs"),
        ((10, 8), (3, 9, 16), 3, "must equal"),
        ((2, 10, 8), (3, 8, 16), None, "groups"),
        ((10, 8), (3, 8, 16), 4, "4 entries"),
        ((10,), (3, 8, 16), 3, "2-D or 3-D"),
    ],
)
def test_shapes_that_do_not_fit_are_refused(a, b, offs, match):
    with pytest.raises(ValueError, match=match):
        core.result_shape(a, b, offs)


def test_results_are_row_major_with_rows_padded_to_16_bytes():
    assert core.result_strides((5, 13), F16) == (16, 1)
    assert core.result_strides((3, 5, 13), F16) == (80, 16, 1)
    assert core.result_strides((3, 5, 13), F32) == (80, 16, 1)
    assert core.result_strides((4, 16), BF16) == (16, 1)


def _args(**over):
    args = dict(
        a=torch.randn(10, 8, dtype=F16), b=torch.randn(3, 8, 16, dtype=F16),
        offs=ends(2, 3, 5), out=None, out_dtype=None, backend="auto",
    )  # fmt: skip
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, error, match",
    [
        (dict(offs=torch.tensor([2, 5, 10])), ValueError, "int32"),
        (dict(offs=ends(2, 3, 5)[None]), ValueError, "1-D"),
        (dict(offs=[2, 5, 10]), TypeError, "offs must be a torch.Tensor"),
        (dict(b=torch.randn(3, 8, 16, dtype=BF16)), TypeError, "equal dtypes"),
        (
            dict(a=torch.randn(10, 8).double(), b=torch.randn(3, 8, 16).double()),
            TypeError,
            "float64",
        ),
        (dict(out_dtype=BF16), TypeError, "out_dtype"),
        (dict(out=torch.empty(10, 15, dtype=F16)), ValueError, "shape"),
        (dict(backend="fast"), ValueError, "unknown backend"),
        (dict(backend=3), TypeError, "backend must be a str"),
        (dict(backend="sm80"), ValueError, "no grouped kernel"),
    ],
)
def test_bad_calls_are_refused_with_what_is_allowed(over, error, match):
    args = _args(**over)
    with pytest.raises(error, match=match):
        core.check_grouped(*args.values(), device_types=("cpu",))


def test_a_cpu_tensor_is_refused_on_the_gpu_road():
    with pytest.raises(ValueError, match="CUDA tensor"):
        core.check_grouped(*_args().values())


def test_out_with_autograd_is_refused():
    args = _args(a=torch.randn(10, 8, dtype=F16, requires_grad=True),
                 out=torch.empty(10, 16, dtype=F16))  # fmt: skip
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        core.check_grouped(*args.values(), device_types=("cpu",))


# ----------------------------------------------------------------------------- the kernel road


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("a_layout", ["row", "col", "offset", "odd_k"])
@pytest.mark.parametrize("b_layout", ["k_major", "n_major"])
def test_the_kernel_road_matches_float64_per_group(dtype, a_layout, b_layout):
    torch.manual_seed(0)
    k = 21 if a_layout == "odd_k" else 24
    sizes = (5, 0, 17, 1, 40)
    m, groups, n = sum(sizes) + 3, len(sizes), 40
    a = torch.randn(m, k, dtype=dtype)
    if a_layout == "col":
        a = torch.randn(k, m, dtype=dtype).t()
    elif a_layout == "offset":
        a = torch.randn(m + 1, k + 8, dtype=dtype)[1:, 8:]
    w = torch.randn(groups, n, k, dtype=dtype)  # expert weights (G, N, K), passed transposed
    b = w.transpose(1, 2) if b_layout == "k_major" else w.transpose(1, 2).contiguous()
    d = dispatcher()
    offs = ends(*sizes)
    out = core.grouped_mm(a, b, offs, dispatcher=d)
    assert out.shape == (m, n) and out.dtype == dtype
    assert_rows(out, reference(a, b, offs, "2d3d"), k)
    v = d.cache.variants[-1]
    assert (v.grouping, v.ab_dtype) == ("m", str(dtype)[6:])
    assert v.b_major == ("k" if b_layout == "k_major" else "n")
    assert v.a_major == "k"  # an M-major A is copied K-major (the grouped kernel's TMA)


def test_out_keeps_the_rows_past_the_last_group():
    a, b = torch.randn(30, 16, dtype=F16), torch.randn(2, 16, 24, dtype=F16)
    out = torch.full((30, 24), 7.0, dtype=F16)
    offs = ends(4, 20)
    assert core.grouped_mm(a, b, offs, out=out, dispatcher=dispatcher()) is out
    assert (out[24:] == 7).all()
    assert_rows(out, reference(a, b, offs, "2d3d"), 16)


def test_an_out_the_kernel_cannot_write_gets_the_rows_copied_in():
    """A column-major out: the kernel writes a temporary; only the groups' rows are copied."""
    a, b = torch.randn(30, 16, dtype=F16), torch.randn(2, 16, 24, dtype=F16)
    out = torch.full((24, 30), 7.0, dtype=F16).t()
    offs = ends(4, 20)
    core.grouped_mm(a, b, offs, out=out, dispatcher=dispatcher())
    assert (out[24:] == 7).all()
    assert_rows(out, reference(a, b, offs, "2d3d"), 16)


def test_a_narrow_result_has_padded_rows_and_the_right_values():
    a, b = torch.randn(9, 16, dtype=F16), torch.randn(2, 16, 13, dtype=F16)
    offs = ends(4, 5)
    out = core.grouped_mm(a, b, offs, dispatcher=dispatcher())
    assert out.shape == (9, 13) and out.stride() == (16, 1)
    assert_rows(out, reference(a, b, offs, "2d3d"), 16)


def test_an_fp32_result():
    a, b = torch.randn(9, 16, dtype=BF16), torch.randn(2, 16, 8, dtype=BF16)
    offs = ends(4, 5)
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, out_dtype=F32, dispatcher=d)
    assert out.dtype == F32 and d.cache.variants[-1].c_dtype == "float32"
    assert_rows(out, reference(a, b, offs, "2d3d"), 16)


def test_k_zero_writes_zeros_in_the_groups_rows_only():
    a, b = torch.randn(10, 0, dtype=F16), torch.randn(2, 0, 8, dtype=F16)
    out = torch.full((10, 8), 3.0, dtype=F16)
    d = dispatcher()
    core.grouped_mm(a, b, ends(2, 5), out=out, dispatcher=d)
    assert (out[:7] == 0).all() and (out[7:] == 3).all()
    assert d.cache.kernel.launches == []


@pytest.mark.parametrize(
    "shape", [((0, 8), (2, 8, 8), 2), ((4, 8), (2, 8, 0), 2), ((4, 8), (0, 8, 8), 0)]
)
def test_empty_problems_launch_nothing(shape):
    (m, k), (g, _, n), count = shape
    d = dispatcher()
    offs = torch.zeros(count, dtype=torch.int32)
    out = core.grouped_mm(torch.randn(m, k, dtype=F16), torch.randn(g, k, n, dtype=F16), offs,
                          dispatcher=d)  # fmt: skip
    assert out.shape == (m, n) and d.cache.kernel.launches == []


def test_the_tile_follows_the_mean_group():
    from wsgemm import host

    assert host.grouped_config("auto", 8 * 256, 256)[1].tile_m == 64
    name, config = host.grouped_config("auto", 200 * 8, 8)
    assert name == "sm90-pingpong"
    assert (config.tile_m, config.tile_n, config.cluster_m, config.cluster_n) == (128, 128, 1, 2)
    assert host.grouped_config("auto", 32 * 8, 8)[1].tile_m == 64
    assert host.grouped_config("auto", 4096 * 8, 8) == ("sm90", None)
    assert host.grouped_config("sm90", 8, 8) == ("sm90", None)


# ----------------------------------------------------------------------------- the other roads


def test_off_hopper_and_fp32_run_torch():
    a, b, offs = torch.randn(10, 8, dtype=F16), torch.randn(3, 8, 16, dtype=F16), ends(2, 3, 5)
    for d, (x, y) in ((dispatcher((8, 0)), (a, b)), (dispatcher(), (a.float(), b.float()))):
        out = core.grouped_mm(x, y, offs, dispatcher=d)
        assert d.cache.variants == []
        assert_rows(out, reference(x, y, offs, "2d3d"), 8)
    with pytest.raises(ValueError, match="capability"):
        core.grouped_mm(a, b, offs, backend="sm90", dispatcher=dispatcher((8, 0)))


@pytest.mark.parametrize("form", ["2d2d", "3d2d"])
def test_the_torch_road_forms(form):
    torch.manual_seed(1)
    if form == "2d2d":
        a, b, offs = torch.randn(6, 30, dtype=BF16), torch.randn(30, 8, dtype=BF16), ends(10, 0, 20)
        out = core.grouped_mm(a, b, offs, dispatcher=dispatcher())
        ref = reference(a, b, offs, form)
        assert out.shape == ref.shape
        assert (out.double() - ref).abs().max() <= tolerance(BF16, 30) * ref.abs().max()
        assert (out[1] == 0).all()  # the empty K slice
    else:
        a, b, offs = (
            torch.randn(3, 6, 8, dtype=BF16),
            torch.randn(8, 40, dtype=BF16),
            ends(8, 8, 16),
        )
        out = core.grouped_mm(a, b, offs, dispatcher=dispatcher())
        assert out.shape == (6, 40)
        assert_rows(out, reference(a, b, offs, form), 8, dim=1)


def test_the_torch_road_returns_torchs_own_result(monkeypatch):
    """A fresh result on torch's road is torch's own tensor where it has the result's layout:
    no second pass over it (a weight gradient's (G, M, N) is the largest tensor of the call);
    ``out=`` and another layout still go through the masked copy."""
    copies = []
    monkeypatch.setattr(core, "_write", lambda *args: copies.append(args))
    # (a column-major, as a weight gradient's x.T: torch's fused kernel needs no aligned
    # groups then, so auto keeps it: core._torch_needs_aligned_groups)
    a, b, offs = torch.randn(30, 6, dtype=BF16).t(), torch.randn(30, 8, dtype=BF16), ends(10, 0, 20)
    made = []
    real = core._torch_grouped
    monkeypatch.setattr(core, "_torch_grouped", lambda *args: made.append(real(*args)) or made[-1])
    out = core.grouped_mm(a, b, offs, dispatcher=dispatcher())
    assert out is made[-1] and copies == []
    given = torch.empty(3, 6, 8, dtype=BF16)
    assert core.grouped_mm(a, b, offs, out=given, dispatcher=dispatcher()) is given
    assert len(copies) == 1


@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("a_layout", ["row", "col"])
def test_3d2d_runs_the_grouped_kernel_transposed(a_layout, b_layout):
    """float16 3D x 2D, which torch can only loop over (a sync): the ragged-M kernel on the
    transposed problem, the result's columns its rows; columns past offs[-1] kept."""
    torch.manual_seed(4)
    g, m, k, n = 4, 9, 24, 56
    a = torch.randn(g, m, k, dtype=F16)
    if a_layout == "col":  # each group's a[g] M-major
        a = torch.randn(g, k, m, dtype=F16).transpose(1, 2)
    b = torch.randn(k, n, dtype=F16) if b_layout == "row" else torch.randn(n, k, dtype=F16).t()
    offs = ends(16, 0, 9, 23)  # 48 of 56 columns; an empty group, groups at odd columns
    d = dispatcher()
    out = torch.full((m, n), 7.0, dtype=F16)
    got = core.grouped_mm(a, b, offs, out=out, dispatcher=d)
    assert got is out and (out[:, 48:] == 7).all()
    assert_rows(out, reference(a, b, offs, "3d2d"), k, dim=1)
    (variant,) = d.cache.variants
    assert variant.grouping == "m" and variant.epilogue == "none"
    launch = d.cache.kernel.launches[-1]
    assert launch["a"].shape == (n, k, g) and launch["b"].shape == (m, k, g)
    assert launch["a"].stride(1) == 1  # the kernel's A (b transposed) is K-major, copied if not
    fresh = core.grouped_mm(a, b, offs, dispatcher=d, activation="relu")
    want = [(lo, hi, torch.relu(y)) for lo, hi, y in reference(a, b, offs, "3d2d")]
    assert_rows(fresh, want, k, dim=1)


def test_3d2d_routes():
    """bfloat16 in and out: the kernel under auto too (torch._grouped_mm's fused kernel would
    assert on column groups that are not whole 16 bytes: core._torch_needs_aligned_groups)
    and when named; a float32 result (torch has none): the kernel; off Hopper: torch."""
    a, b, offs = torch.randn(2, 8, 16, dtype=BF16), torch.randn(16, 32, dtype=BF16), ends(8, 24)
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, dispatcher=d)
    assert len(d.cache.variants) == 1
    assert_rows(out, reference(a, b, offs, "3d2d"), 16, dim=1)
    assert "transposed problem" in core.explain(d, a, b, offs)
    out = core.grouped_mm(a, b, offs, backend="sm90", dispatcher=d)
    assert [v.backend for v in d.cache.variants][-1] == "sm90"
    assert_rows(out, reference(a, b, offs, "3d2d"), 16, dim=1)
    before = len(d.cache.variants)
    out32 = core.grouped_mm(a, b, offs, out_dtype=F32, dispatcher=d)
    assert len(d.cache.variants) == before + 1 and out32.dtype == F32
    assert_rows(out32, reference(a, b, offs, "3d2d"), 16, dim=1)
    assert "transposed problem" in core.explain(d, a, b, offs, out_dtype=F32)
    off = dispatcher((8, 0))
    core.grouped_mm(a.half(), b.half(), offs, dispatcher=off)
    assert off.cache.variants == []


def test_the_loop_reads_the_ends_as_the_kernel_does():
    """Decreasing ends and ends past the rows: clamped to [previous end, rows]."""
    a, b = torch.randn(12, 8, dtype=F16), torch.randn(3, 8, 4, dtype=F16)
    offs = torch.tensor([6, 2, 40], dtype=torch.int32)
    p = core.check_grouped(a, b, offs, None, None, "auto", ("cpu",))
    got = core._loop(p, a, b, offs)
    want = torch.cat([a[:6].double() @ b[0].double(), a[6:].double() @ b[2].double()])
    assert (got.double() - want).abs().max() < 1e-2


# ----------------------------------------------------------------------------- the op


def test_the_fake_implementation_gives_shape_and_strides():
    with FakeTensorMode():
        a = torch.empty(100, 64, dtype=BF16, device="cuda")
        b = torch.empty(8, 64, 20, dtype=BF16, device="cuda")
        offs = torch.empty(8, dtype=torch.int32, device="cuda")
        out = torch.ops.wsgemm.grouped_mm(a, b, offs)
        assert out.shape == (100, 20) and out.stride() == (24, 1) and out.dtype == BF16
        out = torch.ops.wsgemm.grouped_mm(a, b, offs, F32)
        assert out.dtype == F32 and out.stride() == (20, 1)
        a3 = torch.empty(8, 5, 64, dtype=BF16, device="cuda")
        assert torch.ops.wsgemm.grouped_mm(a3, b).shape == (8, 5, 20)
        with pytest.raises(ValueError, match="needs offs"):
            torch.ops.wsgemm.grouped_mm(a, b)


@pytest.mark.parametrize("form", core.FORMS)
def test_the_fake_implementation_is_torch_grouped_mms_meta(form, monkeypatch):
    """bfloat16 in and out, each form: the op's fake result, and the public call's on meta
    tensors, have torch._grouped_mm's own meta result's shape, dtype and strides (rows padded
    to 16 bytes with no floor: N = 20 -> 24, N = 0 a row stride of 0, M = 0 a group stride of
    0; N = 1; one row; no group). torch's meta kernel gives the CUDA build's layout only where
    torch.version.cuda is set: it is, here."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    cases = ((100, 20, 4), (5, 64, 4), (1, 1, 4), (0, 20, 4), (7, 0, 4), (0, 0, 4), (5, 8, 0),
             (1, 1, 1))  # fmt: skip
    for m, n, groups in cases:
        a, b, offs = grouped_meta_operands(form, m, n, groups, 64)
        try:
            want = torch._grouped_mm(a, b, offs)
        except NotImplementedError:
            pytest.skip("this torch has no meta kernel for torch._grouped_mm")
        for call in (torch.ops.wsgemm.grouped_mm, wsgemm.grouped_mm):
            got = call(a, b, offs)
            assert (got.shape, got.stride(), got.dtype, got.device) == (
                want.shape, want.stride(), want.dtype, want.device
            ), (call, m, n, groups)  # fmt: skip


def test_it_is_public_and_registered():
    assert wsgemm.grouped_mm.__module__ == "wsgemm.grouped"
    assert "grouped_mm" in wsgemm.__all__
    assert hasattr(torch.ops.wsgemm, "grouped_mm")


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("form", ["2d3d", "2d2d", "3d2d"])
def test_gradients_match_float64(form, dtype, monkeypatch):
    """Through the registered op's autograd, on the stand-in dispatcher (CPU tensors); in
    float16 the 2D x 3D form's dB (and the 2D x 2D form's forward) is the ragged-K kernel's
    2D x 2D product. (The 3D x 3D form is ``wsgemm.matmul``'s batched product, whose gradients
    tests/ops checks.)"""
    d = dispatcher()
    monkeypatch.setattr(core, "host_dispatcher", lambda: d)
    torch.manual_seed(2)
    shapes = {
        "2d3d": ((20, 8), (3, 8, 16), ends(4, 0, 12)),
        "2d2d": ((5, 24), (24, 16), ends(8, 0, 12)),
        "3d2d": ((3, 5, 8), (8, 24), ends(8, 0, 12)),
    }
    a_shape, b_shape, offs = shapes[form]
    a = torch.randn(a_shape, dtype=F32).to(dtype).requires_grad_()
    b = torch.randn(b_shape, dtype=F32).to(dtype).requires_grad_()
    out = torch.ops.wsgemm.grouped_mm(a, b, offs)
    grad = torch.randn_like(out)
    out.backward(grad)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = _reference_op(a64, b64, offs, form)
    ref.backward(grad.double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert got.shape == want.shape
        err = (got.double() - want).abs().max().item()
        assert err <= 4 * tolerance(dtype, 24) * max(want.abs().max().item(), 1.0), err
    if dtype == F16 and form in ("2d3d", "2d2d"):  # dB (the forward) on the ragged-K kernel
        assert "k" in {v.grouping for v in d.cache.variants}


def _reference_op(a, b, offs, form):
    """The forward in float64 with ops autograd differentiates; what the groups leave unwritten
    is a constant zero (so its gradient is zero)."""
    e = [0, *offs.tolist()]
    if form == "2d3d":
        parts = [a[e[g] : e[g + 1]] @ b[g] for g in range(len(b))]
        rest = torch.zeros(a.shape[0] - e[-1], b.shape[2], dtype=a.dtype)
        return torch.cat([*parts, rest])
    if form == "2d2d":
        return torch.stack([a[:, e[g] : e[g + 1]] @ b[e[g] : e[g + 1]] for g in range(len(offs))])
    parts = [a[g] @ b[:, e[g] : e[g + 1]] for g in range(len(a))]
    rest = torch.zeros(a.shape[1], b.shape[1] - e[-1], dtype=a.dtype)
    return torch.cat([*parts, rest], dim=1)


# ----------------------------------------------------------------------------- epilogues


def _moe_fc1(dtype=BF16, sizes=(5, 0, 17, 1, 40), n_half=24, k=32):
    torch.manual_seed(4)
    m = sum(sizes) + 3
    a = torch.randn(m, k, dtype=dtype)
    w = torch.randn(len(sizes), 2 * n_half, k, dtype=dtype)  # experts' [w_gate; w_up]
    return a, w.transpose(1, 2), ends(*sizes)


def _gated_reference(a, b, offs, act):
    half = b.shape[2] // 2
    return [(lo, hi, torch_activation(act, y[:, :half]) * y[:, half:])
            for lo, hi, y in reference(a, b, offs, "2d3d")]  # fmt: skip


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_a_gated_unit_on_the_grouped_kernel(fused, act, monkeypatch):
    fusing = registry.EPILOGUE_FAMILIES if fused else frozenset()
    monkeypatch.setattr(registry, "FUSING_FAMILIES", fusing)
    a, b, offs = _moe_fc1()
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, activation=act, gated=True, dispatcher=d)
    assert out.shape == (a.shape[0], b.shape[2] // 2)
    assert_rows(out, _gated_reference(a, b, offs, act), 32)
    want = f"gated+{act}" if fused else "none"
    assert [v.epilogue for v in d.cache.variants] == [want]


def test_an_activation_on_the_grouped_kernel(monkeypatch):
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    a, b, offs = _moe_fc1()
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, activation="relu", dispatcher=d)
    ref = [(lo, hi, torch.relu(y)) for lo, hi, y in reference(a, b, offs, "2d3d")]
    assert_rows(out, ref, 32)
    assert d.cache.variants[-1].epilogue == "relu"


def test_a_gated_unit_off_hopper_and_with_an_n_major_weight(monkeypatch):
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    a, b, offs = _moe_fc1()
    for d, bb in ((dispatcher((8, 0)), b), (dispatcher(), b.contiguous())):
        out = core.grouped_mm(a, bb, offs, activation="silu", gated=True, dispatcher=d)
        assert_rows(out, _gated_reference(a, bb, offs, "silu"), 32)
        assert all(v.epilogue == "none" for v in d.cache.variants)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(gated=True), "needs an activation"),
        (dict(gated=True, activation="silu", b=torch.randn(3, 8, 15, dtype=F16)), "even N"),
        (dict(activation="tanh"), "not one of"),
        (dict(gated=1, activation="silu"), "gated must be a bool"),
    ],
)
def test_bad_epilogues_are_refused(kw, match):
    args = _args(b=kw.pop("b", torch.randn(3, 8, 16, dtype=F16)))
    with pytest.raises((TypeError, ValueError), match=match):
        core.check_grouped(*args.values(), device_types=("cpu",), **kw)


def test_the_fake_implementation_halves_a_gated_width():
    with FakeTensorMode():
        a = torch.empty(100, 64, dtype=BF16, device="cuda")
        b = torch.empty(8, 64, 48, dtype=BF16, device="cuda")
        offs = torch.empty(8, dtype=torch.int32, device="cuda")
        out = torch.ops.wsgemm.grouped_mm(a, b, offs, None, "auto", "silu", True)
        assert out.shape == (100, 24)


def _assert_gated_fc1_gradients(a, b, offs, grad):
    """``a.grad`` and ``b.grad`` of a gated silu FC1 (8 output columns, K 16) against autograd
    of the float64 formula, per group, the rows past the groups zero."""
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    e = [0, *offs.tolist()]
    parts = []
    for g in range(len(offs)):
        y = a64[e[g] : e[g + 1]] @ b64[g]
        parts.append(torch_activation("silu", y[:, :8]) * y[:, 8:])
    parts.append(torch.zeros(a.shape[0] - e[-1], 8, dtype=torch.float64))
    torch.cat(parts).backward(grad.double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= 4 * tolerance(BF16, 16) * max(want.abs().max().item(), 1.0), err


def test_gated_gradients_match_float64(monkeypatch):
    d = dispatcher()
    monkeypatch.setattr(core, "host_dispatcher", lambda: d)
    a, b, offs = _moe_fc1(n_half=8, k=16)
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    out = torch.ops.wsgemm.grouped_mm(a, b, offs, None, "auto", "silu", True)
    grad = torch.randn_like(out)
    out.backward(grad)
    _assert_gated_fc1_gradients(a, b, offs, grad)


def test_explain_says_where_a_grouped_call_runs():
    meta = dict(device="meta")
    a = torch.empty(1000, 7168, dtype=BF16, **meta)
    b = torch.empty(256, 4096, 7168, dtype=BF16, **meta).transpose(1, 2)
    offs = torch.empty(256, dtype=torch.int32, **meta)
    text = wsgemm.explain(a, b, offs=offs, activation="silu", gated=True)
    assert "grouped 2D x 3D, 256 groups" in text and "(1000, 2048)" in text
    assert "tile 64x128" in text and "no sync" in text
    assert "epilogue: gated+silu: in the kernel" in text
    assert "kernel: torch" in wsgemm.explain(a, b, offs=offs, cc=(8, 0))
    a3, b3 = torch.empty(4, 10, 64, dtype=F16, **meta), torch.empty(4, 64, 32, dtype=F16, **meta)
    assert "batched GEMM" in wsgemm.explain(a3, b3, grouped=True)
    with pytest.raises(ValueError, match="needs offs"):
        wsgemm.explain(a, b, grouped=True)


def test_with_autograd_the_gated_product_is_saved_not_recomputed(monkeypatch):
    """``wsgemm.grouped_mm`` with a gradient to compute: the grouped product, then act(gate) *
    up in torch, saved by autograd: three grouped products in all (forward, dA, dB), the
    gradients those of the float64 formula."""
    from wsgemm import grouped as layer

    d = dispatcher()
    monkeypatch.setattr(core, "host_dispatcher", lambda: d)
    calls = []
    op = layer._GROUPED_MM

    def counting(*args):
        calls.append(args[3:])
        return op(*args)

    monkeypatch.setattr(layer, "_GROUPED_MM", counting)
    a, b, offs = _moe_fc1(n_half=8, k=16)
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    out = wsgemm.grouped_mm(a, b, offs, activation="silu", gated=True)
    assert out.shape == (a.shape[0], 8)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert len(calls) == 3 and calls[0][2:] == (None, False)  # the forward: no epilogue
    _assert_gated_fc1_gradients(a, b, offs, grad)


@pytest.mark.parametrize(
    "offs, match",
    [
        ([3, 2, 8], r"offs\[1\] = 2 is below offs\[0\] = 3"),
        ([-1, 2, 8], r"offs\[0\] = -1 is negative"),
        ([3, 5, 9], r"offs\[2\] = 9 passes a's rows \(8\)"),
    ],
)
def test_check_offs_reads_the_offsets_once_and_says_what_is_wrong(offs, match):
    import wsgemm

    a = torch.zeros(8, 16, dtype=torch.float16)
    b = torch.zeros(3, 16, 24, dtype=torch.float16)
    with pytest.raises(ValueError, match=match):
        wsgemm.grouped_mm(a, b, torch.tensor(offs, dtype=torch.int32), check_offs=True)
    with pytest.raises(TypeError, match="check_offs must be a bool"):
        wsgemm.grouped_mm(a, b, torch.tensor(offs, dtype=torch.int32), check_offs="yes")
    wsgemm.grouped._check_offs_values(a, b, torch.tensor([3, 5, 8], dtype=torch.int32))  # fine


# ----------------------------------------------------------------------------- 2D x 2D, ragged K


@pytest.mark.parametrize("out_dtype", [None, F32])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("a_layout", ["row", "col"])
def test_2d2d_runs_the_ragged_k_kernel_on_a_named_backend(a_layout, b_layout, out_dtype):
    """A weight gradient's form (K split by offs, one M x N product a group) on the ragged-K
    kernel: A M-major and B N-major as the kernel reads them (the weight gradient's own
    layouts, ``dY^T`` and ``X``, read in place; others copied), empty groups zero, every group
    within the float64 tolerance."""
    torch.manual_seed(7)
    m, n, sizes = 24, 40, (10, 0, 33, 1, 0, 20)
    k = sum(sizes)
    a = torch.randn(m, k, dtype=F16) if a_layout == "row" else torch.randn(k, m, dtype=F16).t()
    b = torch.randn(k, n, dtype=F16) if b_layout == "row" else torch.randn(n, k, dtype=F16).t()
    d, offs = dispatcher(), ends(*sizes)
    out = core.grouped_mm(a, b, offs, out_dtype=out_dtype, backend="sm90", dispatcher=d)
    [variant] = d.cache.variants
    assert (variant.grouping, variant.a_major, variant.b_major) == ("k", "m", "n")
    launch = d.cache.k_kernel.launches[0]
    assert (launch["a"].data_ptr() == a.data_ptr()) == (a_layout == "col")  # in place: M-major
    assert (launch["b"].data_ptr() == b.data_ptr()) == (b_layout == "row")  # N-major
    ref = reference(a, b, offs, "2d2d")
    assert out.shape == ref.shape == (len(sizes), m, n)
    assert out.dtype == (out_dtype or F16)
    assert (out.double() - ref).abs().max() <= tolerance(out.dtype, 33) * ref.abs().max()
    assert (out[1] == 0).all() and (out[4] == 0).all()


def test_2d2d_writes_an_out_it_cannot_address_through_a_buffer():
    a, b, offs = torch.randn(8, 30, dtype=BF16), torch.randn(30, 12, dtype=BF16), ends(9, 21)
    a = a.t().contiguous().t()
    out = torch.full((2, 8, 24), 7.0, dtype=BF16)[:, :, ::2]  # stride 2: no TMA view
    core.grouped_mm(a, b, offs, out=out, backend="sm90", dispatcher=dispatcher())
    ref = reference(a, b, offs, "2d2d")
    assert (out.double() - ref).abs().max() <= tolerance(BF16, 21) * ref.abs().max()


def test_2d2d_activation_and_k_zero():
    a = torch.randn(8, 30, dtype=F16).t().contiguous().t()
    b, offs = torch.randn(30, 16, dtype=F16), ends(9, 21)
    out = core.grouped_mm(a, b, offs, backend="sm90", activation="relu", dispatcher=dispatcher())
    ref = reference(a, b, offs, "2d2d").clamp_min(0)
    assert (out.double() - ref).abs().max() <= tolerance(F16, 21) * ref.abs().max()
    d = dispatcher()
    a0, b0 = torch.randn(8, 0, dtype=F16), torch.randn(0, 16, dtype=F16)
    empty = core.grouped_mm(a0, b0, ends(0, 0), backend="sm90", activation="gelu_tanh",
                            dispatcher=d)  # fmt: skip
    assert d.cache.variants == [] and (empty == 0).all() and empty.shape == (2, 8, 16)


def test_2d2d_under_auto_takes_the_kernel_where_torch_loops(monkeypatch):
    """``auto`` runs the 2D x 2D form on the ragged-K kernel where torch has no fused kernel
    (float16, or a float32 result: torch loops over the groups with a sync), keeps bfloat16 in
    and out on ``torch._grouped_mm`` where each group's result is small (where the kernel did
    not beat it) and takes the kernel where it is large, and keeps torch when the family is
    not in RAGGED_K_FAMILIES; explain says which and why."""
    a, b, offs = torch.randn(8, 30, dtype=F16), torch.randn(30, 16, dtype=F16), ends(9, 21)
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, dispatcher=d)
    assert [v.grouping for v in d.cache.variants] == ["k"]
    ref = reference(a, b, offs, "2d2d")
    assert (out.double() - ref).abs().max() <= tolerance(F16, 21) * ref.abs().max()
    text = core.explain(d, a, b, offs)
    assert "ragged K" in text and "A: copied" in text and "B: read in place" in text
    bf = dispatcher()
    at = a.bfloat16().t().contiguous().t()  # column-major, as x.T: torch's rule applies
    core.grouped_mm(at, b.bfloat16(), offs, dispatcher=bf)
    assert bf.cache.variants == []
    assert "8x16 result is below the size" in core.explain(bf, at, b.bfloat16(), offs)
    monkeypatch.setattr(registry_grouped, "RAGGED_K_BF16_MIN_GROUP_ELEMENTS", 8 * 16)
    core.grouped_mm(at, b.bfloat16(), offs, dispatcher=bf)
    assert [v.grouping for v in bf.cache.variants] == ["k"]
    monkeypatch.setattr(registry_grouped, "RAGGED_K_BF16_MIN_GROUP_ELEMENTS", 8 * 16 + 1)
    bf = dispatcher()
    core.grouped_mm(at, b.bfloat16(), offs, out_dtype=F32, dispatcher=bf)
    assert [v.grouping for v in bf.cache.variants] == ["k"]
    monkeypatch.setattr(registry_grouped, "RAGGED_K_FAMILIES", frozenset())
    off = dispatcher()
    core.grouped_mm(a, b, offs, dispatcher=off)
    assert off.cache.variants == []
    assert "RAGGED_K_FAMILIES" in core.explain(off, a, b, offs)


# ----------------------------------------------------------------------------- the row scale


def _scaled(blocks, scale):
    """Reference blocks (lo, hi, y) with each row times its factor (float64)."""
    return [(lo, hi, y * scale[lo:hi, None].double()) for lo, hi, y in blocks]


@pytest.mark.parametrize("scale_dtype", [F32, BF16])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("epilogue", ["none", "relu", "gated"])
def test_a_row_scale_on_the_grouped_kernel(scale_dtype, fused, epilogue, monkeypatch):
    """A router weight per row, last: on the kernel's epilogue where the family scales rows
    (``ROW_SCALE_FAMILIES``; the launch gets the vector and the variant says its dtype), else
    the plain kernel and the scale in torch; the rows past the groups are left as they were."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES if fused
                        else frozenset())  # fmt: skip
    a, b, offs = _moe_fc1()
    scale = torch.rand(a.shape[0], dtype=F32).to(scale_dtype)
    kw = {}
    if epilogue == "gated":
        kw = dict(activation="silu", gated=True)
        ref = _gated_reference(a, b, offs, "silu")
    elif epilogue == "relu":
        kw = dict(activation="relu")
        ref = [(lo, hi, torch.relu(y)) for lo, hi, y in reference(a, b, offs, "2d3d")]
    else:
        ref = reference(a, b, offs, "2d3d")
    d = dispatcher()
    out = torch.full((a.shape[0], b.shape[2] // (2 if kw.get("gated") else 1)), 7.0, dtype=BF16)
    core.grouped_mm(a, b, offs, out=out, dispatcher=d, row_scale=scale, **kw)
    assert_rows(out, _scaled(ref, scale), 32)
    assert (out[int(offs[-1]) :] == 7.0).all()
    launch = d.cache.kernel.launches[-1]
    kind = "fp32" if scale_dtype == F32 else "input"
    if fused:
        assert d.cache.variants[-1].epilogue.endswith(f"row_scale_{kind}")
        assert launch["row_scale"] is not None
    else:
        assert "row_scale" not in d.cache.variants[-1].epilogue and launch["row_scale"] is None


def test_a_strided_row_scale_is_read_contiguous_and_k_zero_scales_act_zero(monkeypatch):
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES)
    a, b, offs = _moe_fc1()
    scale = torch.rand(2 * a.shape[0], dtype=F32)[::2]
    d = dispatcher()
    out = core.grouped_mm(a, b, offs, dispatcher=d, row_scale=scale)
    assert_rows(out, _scaled(reference(a, b, offs, "2d3d"), scale), 32)
    assert d.cache.kernel.launches[-1]["row_scale"].stride() == (1,)
    # K = 0: every product is zero, so act(0) * scale = 0 for relu, gelu_tanh(0) = 0 too
    a0, b0 = a[:, :0], b[:, :0]
    out = core.grouped_mm(a0, b0, offs, dispatcher=d, row_scale=scale, activation="relu")
    assert (out[: int(offs[-1])] == 0).all()


@pytest.mark.parametrize(
    "over, error, match",
    [
        (dict(row_scale=[1.0] * 10), TypeError, "row_scale must be a torch.Tensor"),
        (dict(row_scale=torch.ones(9)), ValueError, r"shape \(10,\)"),
        (dict(row_scale=torch.ones(10, 1)), ValueError, r"shape \(10,\)"),
        (dict(row_scale=torch.ones(10, dtype=torch.float64)), TypeError, "float32 or a's dtype"),
        (dict(row_scale=torch.ones(10, dtype=BF16)), TypeError, "float32 or a's dtype"),
        (dict(row_scale=torch.ones(10, device="meta")), ValueError, "one device"),
    ],
)
def test_bad_row_scales_are_refused(over, error, match):
    args = _args()
    with pytest.raises(error, match=match):
        core.check_grouped(*args.values(), device_types=("cpu", "meta"), **over)


def test_a_row_scale_is_for_the_2d3d_form():
    a, b = torch.randn(3, 10, 8, dtype=F16), torch.randn(3, 8, 16, dtype=F16)
    with pytest.raises(ValueError, match="2D x 3D form"):
        core.check_grouped(a, b, None, None, None, "auto", ("cpu",), row_scale=torch.ones(10))


def test_the_fake_implementation_takes_a_row_scale():
    with FakeTensorMode():
        a = torch.empty(100, 64, dtype=BF16, device="cuda")
        b = torch.empty(8, 64, 48, dtype=BF16, device="cuda")
        offs = torch.empty(8, dtype=torch.int32, device="cuda")
        scale = torch.empty(100, dtype=F32, device="cuda")
        out = torch.ops.wsgemm.grouped_mm(a, b, offs, None, "auto", None, False, scale)
        assert out.shape == (100, 48) and out.dtype == BF16
        with pytest.raises(ValueError, match=r"shape \(100,\)"):
            short = torch.empty(99, dtype=F32, device="cuda")
            torch.ops.wsgemm.grouped_mm(a, b, offs, row_scale=short)


def _scaled_reference_grads(a, b, offs, scale, grad, act=None):
    """float64 autograd of ``act(a @ b[g]) * scale`` per group, the rows past the groups a
    constant zero."""
    a64, b64, s64 = (t.detach().double().requires_grad_() for t in (a, b, scale))
    e = [0, *offs.tolist()]
    parts = [torch_activation(act or "none", a64[e[g] : e[g + 1]] @ b64[g]) for g in range(len(b))]
    parts.append(torch.zeros(a.shape[0] - e[-1], b.shape[2], dtype=torch.float64))
    (torch.cat(parts) * s64[:, None]).backward(grad.double())
    return a64.grad, b64.grad, s64.grad


@pytest.mark.parametrize("entry", ["op", "wsgemm"])
@pytest.mark.parametrize("act", [None, "gelu_tanh"])
def test_row_scale_gradients_match_float64(entry, act, monkeypatch):
    """Through the op's own backward (``torch.ops.wsgemm.grouped_mm``: the scale's gradient
    from the product recomputed) and through ``wsgemm.grouped_mm`` (the unfused road autograd
    saves); the scale's entries past the groups get zero."""
    d = dispatcher()
    monkeypatch.setattr(core, "host_dispatcher", lambda: d)
    torch.manual_seed(5)
    a = torch.randn(20, 8, dtype=BF16).requires_grad_()
    b = torch.randn(3, 8, 16, dtype=BF16).requires_grad_()
    offs = ends(4, 0, 12)
    scale = torch.rand(20, dtype=F32).requires_grad_()
    if entry == "op":
        out = torch.ops.wsgemm.grouped_mm(a, b, offs, None, "auto", act, False, scale)
    else:
        out = wsgemm.grouped_mm(a, b, offs, activation=act, row_scale=scale)
    grad = torch.randn_like(out)
    out.backward(grad)
    want = _scaled_reference_grads(a, b, offs, scale, grad, act)
    for got, ref in zip((a.grad, b.grad, scale.grad), want, strict=True):
        assert got is not None and got.shape == ref.shape and got.dtype != torch.float64
        err = (got.double() - ref).abs().max().item()
        assert err <= 4 * tolerance(BF16, 24) * max(ref.abs().max().item(), 1.0), err
    assert (scale.grad[16:] == 0).all()


def test_a_row_scale_only_gradient():
    """Only the scale wants a gradient (frozen experts): it still gets one."""
    d = dispatcher()
    a, b, offs = _moe_fc1(n_half=8, k=16)
    scale = torch.rand(a.shape[0], dtype=F32).requires_grad_()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "host_dispatcher", lambda: d)
        out = wsgemm.grouped_mm(a, b, offs, row_scale=scale)
        out.sum().backward()
    ref = [(lo, hi, y) for lo, hi, y in reference(a, b, offs, "2d3d")]
    for lo, hi, y in (block for block in ref if block[1] > block[0]):
        err = (scale.grad[lo:hi].double() - y.sum(-1)).abs().max().item()
        assert err <= 4 * tolerance(BF16, 16) * max(y.sum(-1).abs().max().item(), 1.0)
    assert (scale.grad[int(offs[-1]) :] == 0).all()


def test_explain_says_where_a_row_scale_runs(monkeypatch):
    a, b, offs = _moe_fc1()
    scale = torch.rand(a.shape[0])
    for families, words in ((frozenset(), "ROW_SCALE_FAMILIES"),
                            (registry.EPILOGUE_FAMILIES, "in the kernel")):  # fmt: skip
        monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", families)
        text = core.explain(dispatcher(), a, b, offs, row_scale=scale)
        assert "row_scale_fp32" in text and words in text, text


def test_the_bf16_weight_gradient_rule_on_the_moe_suite():
    """The rule's split of the moe suite's weight gradients (each group's N x K): qwen3-30b-a3b
    stays on torch (the kernel ran 0.89-1.02x it), the others take the kernel (qwen3-235b-a22b
    and mixtral-8x7b: 1.02-1.20x; deepseek-v3 held out)."""
    from wsgemm.bench import moe

    takes_kernel = {
        name: [registry_grouped.ragged_k_beats_torch(n, k) for _, n, k in model.projections()]
        for name, model in moe.MODELS.items()
    }
    assert takes_kernel == {
        "deepseek-v3": [True, True], "qwen3-30b-a3b": [False, False],
        "qwen3-235b-a22b": [True, True], "mixtral-8x7b": [True, True],
    }  # fmt: skip


def test_a_non_tensor_operand_with_a_row_scale_gets_the_type_error():
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        wsgemm.grouped_mm([[1.0]], torch.randn(1, 1, 2), ends(1), row_scale=torch.ones(1))
    with pytest.raises(TypeError, match="row_scale must be a torch.Tensor"):
        wsgemm.grouped_mm(torch.randn(2, 1), torch.randn(1, 1, 2), ends(2), row_scale=[1.0, 2.0])


def test_explain_with_host_offsets_gives_the_tile_map():
    """``offs`` on the CPU (the host holds the ends: no sync) adds the grouped kernel's tile
    map, from the schedule's host replay: each group's tiles and the CTAs that run them, the
    padding of each group's last m-tile; a meta ``a`` (a stand-in GPU) takes it too."""
    a = torch.empty(700, 64, dtype=BF16, device="meta")
    b = torch.empty(4, 64, 512, dtype=BF16, device="meta")
    offs = torch.tensor([300, 300, 301, 690], dtype=torch.int32)
    text = wsgemm.explain(a, b, offs=offs)
    lines = [line.strip() for line in text.splitlines()]
    head = next(line for line in lines if line.startswith("tile map"))
    # 128x128 tiles (the 175-row mean's tile): 3 + 0 + 1 + 4 m-tiles, 4 n-tiles each
    assert "32 tiles of 128x128" in head and "the busiest running 1" in head
    assert "group 0: rows 0-299 (300): 3 x 4 tiles, its last m-tile 44/128 rows; CTAs 0-11" in lines
    assert "group 1: no rows, no tiles" in lines
    written, computed = 690 * 4, (3 + 1 + 4) * 128 * 4
    assert f"{1 - written / computed:.0%} of the computed elements are padding" in head
    # without host offsets no map (reading a GPU tensor would be a sync)
    assert "tile map" not in wsgemm.explain(a, b, offs=torch.empty(4, dtype=torch.int32,
                                                                    device="meta"))  # fmt: skip


def test_the_tile_map_names_every_tile_once():
    from wsgemm.host.grouped import tile_map

    ends = [5, 5, 700, 701, 2000]
    lines = tile_map("sm90", ends, 2003, 1000, 132, shown=5)
    assert f"{tile_map_tiles(lines)} tiles of" in lines[0]


def test_the_tile_map_counts_a_clusters_surplus_and_takes_fake_and_empty_calls():
    """The shipped 128x256 tile clusters two m-tiles: a group of one m-tile also computes its
    cluster's second (stored nowhere), which the map counts as computed and padding; fake
    CUDA operands (no GPU here) and a call of no groups are explained too."""
    from wsgemm.host.grouped import tile_map

    lines = tile_map("sm90", [100 * i for i in range(1, 9)], 800, 512, 132)
    assert "32 tiles of 128x256" in lines[0]
    assert f"{1 - 800 * 512 / (32 * 128 * 256):.0%} of the computed elements" in lines[0]
    assert "1 x 2 tiles (+2 computed and not stored" in lines[1]
    offs = torch.tensor([300, 300, 301, 690], dtype=torch.int32)  # a real host tensor
    with FakeTensorMode():
        a = torch.empty(700, 64, dtype=BF16, device="cuda")
        b = torch.empty(4, 64, 512, dtype=BF16, device="cuda")
    assert "tile map" in wsgemm.explain(a, b, offs=offs, cc=(9, 0))
    a0 = torch.empty(5, 64, dtype=BF16, device="meta")
    b0 = torch.empty(0, 64, 512, dtype=BF16, device="meta")
    assert "tile map" not in wsgemm.explain(a0, b0, offs=torch.zeros(0, dtype=torch.int32))


def test_explain_names_the_bf16_rule_only_where_it_decides(monkeypatch):
    # (a column-major, as x.T: where torch's fused kernel needs no aligned groups)
    a = torch.empty_strided((8, 2048), (1, 8), dtype=BF16, device="meta")
    b = torch.empty(2048, 4096, dtype=BF16, device="meta")
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    small = wsgemm.explain(a, b, offs=offs)  # 8 x 4096: below the rule's size
    assert "below the size" in small
    big_a = torch.empty_strided((4096, 2048), (1, 4096), dtype=BF16, device="meta")
    assert "ragged K" in wsgemm.explain(big_a, b, offs=offs)  # 4096 x 4096 groups: the kernel
    text = wsgemm.explain(big_a, b, offs=offs, cc=(8, 0))  # no grouped kernel on an A100
    assert "below the size" not in text and "no grouped kernel" in text


# ----------------------------------------------------------------------------- kept launchers


class AddressCache:
    """Compiled address entries (``stand_ins.address_entry``) whose body is ``GroupedStandIn``:
    what a launcher kept for a signature passes at a later call must be that call's operands."""

    def __init__(self):
        self.kernel = GroupedStandIn()
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)

        def body(a, b, c, launch):
            self.kernel(a, b, c, *launch.values(), epilogue=variant.epilogue)

        return address_entry(variant, body)


def test_a_kept_launcher_runs_later_calls_at_their_own_addresses(monkeypatch):
    """The second call of a signature skips the checks and the planning: the kernel bound at
    the first call's views gets the later call's addresses, offsets and row scale (fused row
    scale and gated unit), each result right against float64 per group."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES)
    d = Dispatcher(AddressCache(), StandInDevices((9, 0), 132))
    checks = []
    real_check = core.check_grouped
    monkeypatch.setattr(
        core, "check_grouped", lambda *a, **k: checks.append(1) or real_check(*a, **k)
    )
    kw = dict(activation="silu", gated=True)
    for round_, sizes in enumerate([(5, 0, 17, 1, 40), (0, 30, 2, 9, 22)]):
        a, b, offs = _moe_fc1(sizes=sizes)
        a, b = a.clone() + round_, b.clone()  # new addresses, other values
        scale = torch.rand(a.shape[0], dtype=F32)
        out = core.grouped_mm(a, b, offs, dispatcher=d, row_scale=scale, **kw)
        assert_rows(out, _scaled(_gated_reference(a, b, offs, "silu"), scale), 32)
    assert len(checks) == 1 and len(d.cache.variants) == 1
    assert d.cache.kernel.launches[-1]["row_scale"] is not None


def _counting_checks(monkeypatch) -> list:
    checks = []
    real_check = core.check_grouped
    monkeypatch.setattr(
        core, "check_grouped", lambda *a, **k: checks.append(1) or real_check(*a, **k)
    )
    return checks


def test_a_kept_launcher_writes_out_and_checks_overlap(monkeypatch):
    """With ``out=``: the rows past the groups keep their values, the version counter moves,
    and a later call whose out overlaps an input (same sizes and strides, so the same
    signature) is refused as the first call would have been, by the kept launcher; strided
    offsets are read contiguous."""
    checks = _counting_checks(monkeypatch)
    d = Dispatcher(AddressCache(), StandInDevices((9, 0), 132))
    a, b, offs = _moe_fc1(n_half=16)  # b (G, 32, 32): a (M, 32) and out (M, 32) alike
    strided = torch.stack([offs, offs], 1).reshape(-1)[::2]
    for _ in range(2):
        out = torch.full((a.shape[0], 32), 7.0, dtype=BF16)
        version = out._version
        core.grouped_mm(a, b, strided, out=out, dispatcher=d)
        assert_rows(out, reference(a, b, offs, "2d3d"), 32)
        assert (out[int(offs[-1]) :] == 7.0).all() and out._version > version
    assert len(d.cache.variants) == 1 and len(d.cache.kernel.launches) == 2
    with pytest.raises(ValueError, match="overlaps an input"):
        core.grouped_mm(a, b, strided, out=a, dispatcher=d)
    assert len(d.cache.kernel.launches) == 2 and len(checks) == 1  # refused on the kept road


@pytest.mark.parametrize("kept", [False, True])
def test_an_out_over_the_offsets_or_the_row_scale_is_refused(kept, monkeypatch):
    """The kernel reads the offsets and the row scale while it writes out: out may share no
    byte with them, on a signature's first call or a kept launcher's."""
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES)
    d = Dispatcher(AddressCache(), StandInDevices((9, 0), 132))
    a, b, offs = _moe_fc1(n_half=16)
    m = a.shape[0]
    for over in ("row_scale", "offs"):
        buf = torch.zeros(m, 32, dtype=BF16)
        if over == "row_scale":
            scale = buf.view(-1)[:m]  # the scale in out's first row(s)
            given = offs
        else:
            scale = torch.rand(m, dtype=BF16)
            given = buf.view(torch.int32).view(-1)[: len(offs)]
        if kept:  # the signature's first call, with inputs of the same layout elsewhere
            other = torch.zeros(m, 32, dtype=BF16)
            first = scale.clone() if over == "row_scale" else scale
            core.grouped_mm(a, b, offs if over == "row_scale" else given.clone(), out=other,
                            dispatcher=d, row_scale=first)  # fmt: skip
        given.copy_(offs) if over == "offs" else None
        with pytest.raises(ValueError, match="overlaps an input"):
            core.grouped_mm(a, b, given, out=buf, dispatcher=d, row_scale=scale)


@pytest.mark.parametrize("later", [1, 1.0])
def test_a_non_bool_gated_is_refused_after_a_bool_one(later, monkeypatch):
    """``gated=1`` equals ``gated=True`` as a key: the kept launcher must not take it."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    d = Dispatcher(AddressCache(), StandInDevices((9, 0), 132))
    a, b, offs = _moe_fc1()
    core.grouped_mm(a, b, offs, dispatcher=d, activation="silu", gated=True)
    with pytest.raises(TypeError, match="gated must be a bool"):
        core.grouped_mm(a, b, offs, dispatcher=d, activation="silu", gated=later)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(activation=["silu"]), "activation must be"),
        (dict(backend=["sm90"]), "backend must be a str"),
        (dict(gated=[True], activation="silu"), "gated must be a bool"),
    ],
)
def test_unhashable_arguments_get_the_checks_message(kw, match):
    a, b, offs = _moe_fc1()
    with pytest.raises(TypeError, match=match):
        core.grouped_mm(a, b, offs, dispatcher=dispatcher(), **kw)


@pytest.mark.parametrize("which", ["a", "b", "out", "row_scale"])
def test_a_negative_view_is_refused(which):
    """The kernels read memory, not a view's sign bit: refused as ``matmul`` refuses it."""
    a, b, offs = _moe_fc1(n_half=16)
    kw = dict(out=torch.zeros(a.shape[0], 32, dtype=BF16), row_scale=torch.rand(a.shape[0]))
    args = dict(a=a, b=b, **kw)
    args[which] = torch._neg_view(args[which])
    with pytest.raises(ValueError, match=f"{which} is a negative view"):
        core.grouped_mm(args["a"], args["b"], offs, out=args["out"], dispatcher=dispatcher(),
                        row_scale=args["row_scale"])  # fmt: skip


# ----------------------------------------------------------------------------- out's own memory


def _out_case(form: str, road: str):
    """A call of ``form`` (a, b, offs; its result's shape) on ``road`` ("kernel": a stand-in
    grouped kernel, or matmul for 3D x 3D; "torch"), its dispatcher and backend. 3D x 3D runs
    float32 on both (matmul's stand-in dispatcher has no batched kernel: torch.matmul)."""
    dtype = F32 if form == "3d3d" else F16
    a, b, offs, shape = {
        "2d3d": ((12, 8), (3, 8, 16), ends(2, 3, 5), (12, 16)),
        "3d3d": ((3, 10, 8), (3, 8, 16), None, (3, 10, 16)),
        "2d2d": ((10, 40), (40, 16), ends(10, 0, 20, 6), (4, 10, 16)),
        "3d2d": ((3, 10, 8), (8, 48), ends(8, 8, 16), (10, 48)),
    }[form]
    a, b = torch.randn(a, dtype=dtype), torch.randn(b, dtype=dtype)
    d = dispatcher((9, 0) if road == "kernel" else (8, 0))
    backend = "sm90" if road == "kernel" and form == "2d2d" else "auto"
    p = core.check_grouped(a, b, offs, None, None, backend, ("cpu",))
    want = {"kernel": core.BATCHED if form == "3d3d" else core.KERNEL, "torch": core.TORCH}[road]
    if form != "3d3d":
        assert core.route(d, p, a, b, backend) == want
    return a, b, offs, shape, d, backend


def _overlapping(shape, dtype):
    """An out of ``shape`` whose rows (each 16 wide or more) start 4 elements apart."""
    *outer, m, n = shape
    strides = (m * 4 + n,) * len(outer) + (4, 1)
    size = sum((s - 1) * st for s, st in zip(shape, strides, strict=True)) + 1
    return torch.full((size,), 7.0, dtype=dtype).as_strided(shape, strides)


@pytest.mark.parametrize("road", ["kernel", "torch"])
@pytest.mark.parametrize("form", core.FORMS)
@pytest.mark.parametrize("kind", ["rows", "stride0_row", "stride0_col"])
def test_an_out_whose_elements_overlap_is_refused_before_anything_is_written(form, road, kind):
    """matmul's rule (``validate.check_out_memory``) in every form, on either road: an out
    whose rows overlap, or of stride 0 along a dimension of size > 1 (a broadcast row or
    column), is a ValueError saying so, raised before a launch or a write (the kernel's stores
    would race; torch's copy_ would fail untyped or write garbage)."""
    a, b, offs, shape, d, backend = _out_case(form, road)
    dtype = a.dtype
    if kind == "rows":
        out = _overlapping(shape, dtype)
        match = r"out's rows overlap in memory .*pass a tensor without overlap"
    elif kind == "stride0_row":  # every row (and group) one row
        out = torch.full(shape[-1:], 7.0, dtype=dtype).expand(shape)
        match = r"out has stride 0 along a dimension .*pass a tensor without overlap"
    else:  # every column one element
        out = torch.full((*shape[:-1], 1), 7.0, dtype=dtype).expand(shape)
        match = r"out has stride 0 along a dimension .*pass a tensor without overlap"
    with pytest.raises(ValueError, match=match):
        core.grouped_mm(a, b, offs, out=out, backend=backend, dispatcher=d)
    assert (out == 7).all()
    assert d.cache.variants == [] and d.cache.kernel.launches == []
    assert d.cache.k_kernel.launches == []


@pytest.mark.parametrize("road", ["kernel", "torch"])
@pytest.mark.parametrize("form", core.FORMS)
def test_a_padded_strided_out_is_written(form, road):
    """A non-overlapping out with padded rows (and groups): the checks take it; the result is
    the fresh one's, the padding untouched."""
    torch.manual_seed(3)
    a, b, offs, shape, d, backend = _out_case(form, road)
    *outer, m, n = shape
    buf = torch.full((*outer, m + 1, n + 8), 7.0, dtype=a.dtype)
    out = buf[..., :m, :n]
    assert out.stride()[-1] == 1 and not out.is_contiguous()
    assert core.grouped_mm(a, b, offs, out=out, backend=backend, dispatcher=d) is out
    fresh = core.grouped_mm(a, b, offs, backend=backend, dispatcher=d)
    if offs is not None and form in ("2d3d", "3d2d"):  # past offs[-1] out keeps its values
        end = int(offs[-1])
        kept = out[end:] if form == "2d3d" else out[:, end:]
        assert (kept == 7).all()
        out, fresh = (out[:end], fresh[:end]) if form == "2d3d" else (out[:, :end], fresh[:, :end])
    assert torch.equal(out, fresh)
    assert (buf[..., m:, :] == 7).all() and (buf[..., n:] == 7).all()
    if road == "kernel" and form != "3d3d":
        assert d.cache.variants


@pytest.mark.parametrize("form", core.FORMS)
def test_out_memory_is_checked_on_meta_and_fake_tensors(form):
    """Sizes and strides only (no data pointer): the fake implementation's check refuses an
    overlapping or stride-0 out of meta and fake tensors, and takes a padded one."""
    a, b, offs, shape, _, _ = _out_case(form, "torch")
    strides = _overlapping(shape, a.dtype).stride()
    padded = core.result_strides(shape, a.dtype)
    for device, context in (("meta", torch.device("meta")), ("cuda", FakeTensorMode())):
        with context:
            x = torch.empty(a.shape, dtype=a.dtype, device=device)
            y = torch.empty(b.shape, dtype=a.dtype, device=device)
            ends_ = None if offs is None else torch.empty(offs.shape, dtype=torch.int32,
                                                          device=device)  # fmt: skip
            devices = (device,)
            overlapping = torch.empty_strided(shape, strides, dtype=a.dtype, device=device)
            broadcast = torch.empty(shape[-1:], dtype=a.dtype, device=device).expand(shape)
            good = torch.empty_strided(shape, padded, dtype=a.dtype, device=device)
            with pytest.raises(ValueError, match="rows overlap in memory"):
                core.check_grouped(x, y, ends_, overlapping, None, "auto", devices)
            with pytest.raises(ValueError, match="stride 0"):
                core.check_grouped(x, y, ends_, broadcast, None, "auto", devices)
            assert core.check_grouped(x, y, ends_, good, None, "auto", devices).shape == shape


def test_the_public_call_refuses_an_overlapping_out():
    """The reviewer's call, through ``wsgemm.grouped_mm`` (its out= road is the core's)."""
    a, b = torch.randn(12, 8, dtype=F16), torch.randn(3, 8, 16, dtype=F16)
    out = torch.zeros(12 * 4 + 16, dtype=F16).as_strided((12, 16), (4, 1))
    with pytest.raises(ValueError, match="overlap in memory"):
        wsgemm.grouped_mm(a, b, torch.tensor([2, 5, 10], dtype=torch.int32), out=out)
    assert (out == 0).all()
