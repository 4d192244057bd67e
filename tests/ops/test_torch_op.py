"""The registered op and the layer above the core, without a GPU: fake tensors (shapes, dtypes,
strides against torch.matmul's own), torch.compile / make_fx / AOTAutograd graphs, autocast,
the eager roads' conditions, and the N-D folding and backward against a CPU stand-in for the
core (tests/op_helpers.py)."""

import pytest
import torch
from background import fresh_interpreter
from op_helpers import capture, cuda_autocast, fake_cuda, install, ops_in
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import wsgemm
from wsgemm import api, ops
from wsgemm.api.epilogue import torch_activation

F16, BF16 = torch.float16, torch.bfloat16

# (a shape, b shape): 1-D, 2-D, 3-D, 4-D+, broadcast batches, size-1 and zero sizes
SHAPES = [
    ((7,), (7,)),
    ((7,), (7, 5)),
    ((3, 7), (7,)),
    ((3, 7), (7, 5)),
    ((3, 7), (7, 1)),
    ((2, 3, 7), (7, 5)),
    ((3, 7), (2, 7, 5)),
    ((7,), (2, 7, 5)),
    ((2, 3, 7), (7,)),
    ((1, 3, 7), (4, 7, 5)),
    ((1, 3, 7), (7, 5)),
    ((3, 7), (1, 7, 5)),
    ((4, 3, 7), (1, 7, 5)),
    ((2, 4, 3, 7), (2, 4, 7, 5)),
    ((2, 1, 3, 7), (1, 4, 7, 5)),
    ((2, 4, 3, 7), (7, 5)),
    ((3, 7), (2, 4, 7, 5)),
    ((2, 4, 3, 7), (1, 1, 7, 5)),
    ((5, 1, 2, 3, 7), (4, 1, 7, 5)),
    ((0, 3, 7), (7, 5)),
    ((2, 3, 0), (0, 5)),
]


# ----------------------------------------------------------------------------- surface


def test_ops_are_registered():
    assert "wsgemm::matmul(Tensor a, Tensor b" in str(torch.ops.wsgemm.matmul.default._schema)
    out_schema = str(torch.ops.wsgemm.matmul_out.default._schema)
    assert "Tensor(a!) out" in out_schema and out_schema.endswith("-> ()")
    assert torch.ops.wsgemm.matmul.default.has_kernel_for_dispatch_key("AutocastCUDA")


# ----------------------------------------------------------------------------- fake tensors


@pytest.mark.parametrize("sa, sb", SHAPES)
def test_fake_result_is_torch_matmuls(sa, sb):
    with FakeTensorMode():
        for a, b in [
            (fake_cuda(sa), fake_cuda(sb)),
            (fake_cuda(sa, transposed=True), fake_cuda(sb, transposed=True)),
        ]:
            got, want = wsgemm.matmul(a, b), torch.matmul(a, b)
            assert (got.shape, got.stride(), got.dtype, got.device) == (
                want.shape,
                want.stride(),
                want.dtype,
                want.device,
            )
        got = wsgemm.matmul(fake_cuda(sa, BF16), fake_cuda(sb, BF16), out_dtype=torch.float32)
        assert got.dtype == torch.float32 and got.shape == want.shape


def test_fake_out_variant_returns_out_without_touching_data():
    with FakeTensorMode():
        a, b = fake_cuda((2, 4, 3, 7)), fake_cuda((7, 5))
        out = fake_cuda((2, 4, 3, 5), torch.float32)
        assert wsgemm.matmul(a, b, out=out) is out  # fake data_ptr() would raise


def test_meta_tensors_get_shapes():
    a = torch.empty(2, 4, 3, 7, dtype=BF16, device="meta")
    got = wsgemm.matmul(a, torch.empty(7, 5, dtype=BF16, device="meta"))
    assert got.shape == (2, 4, 3, 5) and got.device.type == "meta"


# ----------------------------------------------------------------------------- tracing


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_holds_the_op(dynamic):
    torch._dynamo.reset()
    graphs = []

    def block(x, w, w2, bias, out):
        h = wsgemm.linear(x, w, bias).relu()
        y = wsgemm.matmul(h, w2, out_dtype=torch.float32)
        return y, wsgemm.matmul(h, w2, out=out)

    fn = torch.compile(block, backend=capture(graphs), fullgraph=True, dynamic=dynamic)
    with FakeTensorMode():
        w, w2, bias = fake_cuda((64, 32)), fake_cuda((64, 16)), fake_cuda((64,))
        for m in (33, 65):
            x = fake_cuda((2, m, 32))
            y, z = fn(x, w, w2, bias, fake_cuda((2, m, 16)))
            assert y.shape == (2, m, 16) and y.dtype == torch.float32 and z.shape == (2, m, 16)
    assert len(graphs) == (1 if dynamic else 2), "dynamic=True recompiled for a new M"
    gm = graphs[0]
    assert len(ops_in(gm)) == 2 and len(ops_in(gm, "wsgemm.matmul_out.default")) == 1


def fake_linear(in_features, out_features, bias=True):
    """An nn.Linear with fake CUDA bf16 parameters (call inside FakeTensorMode). Its init cannot
    run on fake CUDA tensors without a CUDA build, and fake CUDA leaves that need grad neither
    (see ``meta``): an inference layer."""
    layer = torch.nn.Linear(in_features, out_features, bias=bias, device="meta")
    layer.weight = torch.nn.Parameter(fake_cuda((out_features, in_features), BF16), False)
    if bias:
        layer.bias = torch.nn.Parameter(fake_cuda((out_features,), BF16), False)
    return layer


def test_compile_module_after_replace_linear():
    torch._dynamo.reset()
    graphs = []
    with FakeTensorMode():
        model = torch.nn.Sequential(
            fake_linear(32, 64), torch.nn.GELU(), fake_linear(64, 32, bias=False)
        )
        assert wsgemm.nn.replace_linear(model) == ["0", "2"]
        fn = torch.compile(model, backend=capture(graphs), fullgraph=True)
        assert fn(fake_cuda((4, 9, 32), BF16)).shape == (4, 9, 32)
    assert len(ops_in(graphs[0])) == 2


def test_compile_linear_module_under_autocast():
    torch._dynamo.reset()
    graphs = []
    with FakeTensorMode():
        layer = torch.nn.Linear(32, 16, device="meta")
        layer.weight = torch.nn.Parameter(fake_cuda((16, 32), torch.float32), False)
        layer.bias = torch.nn.Parameter(fake_cuda((16,), torch.float32), False)
        wsgemm.nn.replace_linear(layer)
        fn = torch.compile(layer, backend=capture(graphs), fullgraph=True)
        with cuda_autocast(BF16):  # fp32 parameters: wsgemm runs, as torch would in bf16
            assert fn(fake_cuda((4, 32), torch.float32)).dtype == BF16
    assert len(ops_in(graphs[0])) == 1


def test_make_fx_of_matmul_and_linear_holds_the_op():
    with FakeTensorMode():
        a, b = fake_cuda((2, 3, 8, 32)), fake_cuda((32, 16))
        w, bias = fake_cuda((16, 32)), fake_cuda((16,))
    gm = make_fx(lambda a, b: wsgemm.matmul(a, b), tracing_mode="fake")(a, b)
    assert len(ops_in(gm)) == 1
    gm = make_fx(lambda x, w, bias: wsgemm.linear(x, w, bias), tracing_mode="fake")(a, w, bias)
    # the bias is fused: one op, no add after it
    assert len(ops_in(gm)) == 1 and not any("add" in str(n.target) for n in gm.graph.nodes)


def meta(shape, dtype=BF16):
    # autograd on fake *CUDA* leaves needs a CUDA build (AccumulateGrad asks for a device guard);
    # meta tensors take the same op road and trace the same graphs
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=True)


@pytest.mark.parametrize(
    "sa, sb, expect_sum",
    [
        ((4, 8, 32), (32, 16), False),
        ((8, 32), (3, 32, 16), False),  # a serves every batch: one GEMM over all of them
        ((2, 1, 8, 32), (1, 3, 32, 16), True),
        ((32,), (32, 16), False),
    ],
)
def test_backward_graph_is_two_wsgemm_products(sa, sb, expect_sum):
    def fwd_bwd(a, b):
        return torch.autograd.grad(wsgemm.matmul(a, b).sum(), (a, b))

    gm = make_fx(fwd_bwd, tracing_mode="fake")(meta(sa), meta(sb))
    assert len(ops_in(gm)) == 3  # forward, dA, dB
    sums = [n for n in gm.graph.nodes if str(n.target) == "aten.sum.dim_IntList"]
    assert bool(sums) == expect_sum  # only a broadcast batched operand's gradient is summed
    ga, gb = (n.meta["val"] for n in gm.graph.output_node().args[0])
    assert (ga.shape, ga.dtype, gb.shape, gb.dtype) == (sa, BF16, sb, BF16)


def test_aot_autograd_graphs_of_linear():
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    from torch._functorch.aot_autograd import make_boxed_func

    fw, bw = [], []

    def boxed(graphs):
        return lambda gm, example_inputs: make_boxed_func(capture(graphs)(gm, example_inputs))

    backend = aot_autograd(fw_compiler=boxed(fw), bw_compiler=boxed(bw))
    fn = torch.compile(lambda x, w: wsgemm.linear(x, w).relu(), backend=backend, fullgraph=True)
    x, w = meta((4, 8, 32)), meta((16, 32))
    fn(x, w).sum().backward()
    assert len(ops_in(fw[0])) == 1 and len(ops_in(bw[0])) == 2
    assert w.grad.shape == w.shape and w.grad.is_contiguous()  # dW in the weight's layout


def test_out_dtype_fp32_backward_rounds_the_grad_to_the_input_dtype():
    def fwd_bwd(a, b):
        return torch.autograd.grad(wsgemm.matmul(a, b, out_dtype=torch.float32).sum(), (a, b))

    gm = make_fx(fwd_bwd, tracing_mode="fake")(meta((8, 32), F16), meta((32, 16), F16))
    to_half = [
        n
        for n in gm.graph.nodes
        if str(n.target) == "aten._to_copy.default" and n.kwargs.get("dtype") == F16
    ]
    assert len(to_half) == 1 and len(ops_in(gm)) == 3


# ----------------------------------------------------------------------------- autocast


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_autocast_casts_fp32_inputs_like_torch_matmul(dtype):
    with FakeTensorMode(), cuda_autocast(dtype):
        a, b = fake_cuda((2, 8, 32), torch.float32), fake_cuda((32, 16), torch.float32)
        assert torch.matmul(a, b).dtype == dtype  # the emulation is faithful
        assert wsgemm.matmul(a, b).dtype == dtype
        assert torch.ops.wsgemm.matmul(a, b).dtype == dtype
        w, bias = fake_cuda((16, 32), torch.float32), fake_cuda((16,), torch.float32)
        assert wsgemm.linear(a, w, bias).dtype == dtype
        # out= is never autocast (torch's rule): fp32 operands, which auto hands to torch
        out = fake_cuda((2, 8, 16), torch.float32)
        assert wsgemm.matmul(a, b, out=out) is out
        with pytest.raises(TypeError, match="float32"):  # a named backend takes none
            wsgemm.matmul(a, b, out=out, backend="sm80")
    with FakeTensorMode():
        a, b = fake_cuda((8, 32), torch.float32), fake_cuda((32, 16), torch.float32)
    with cuda_autocast(dtype):
        gm = make_fx(lambda a, b: wsgemm.matmul(a, b), tracing_mode="fake")(a, b)
    casts = [n for n in gm.graph.nodes if n.kwargs.get("dtype") == dtype]
    assert len(casts) == 2 and len(ops_in(gm)) == 1


# ----------------------------------------------------------------------------- the eager roads


class RecordingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append((str(func), ops._no_modes()))
        return func(*args, **(kwargs or {}))


class NoopFunctionMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_fast_road_conditions():
    from torch.utils.flop_counter import FlopCounterMode

    assert ops._no_modes()
    with FakeTensorMode():
        assert not ops._no_modes()
    with RecordingMode():
        assert not ops._no_modes()
    with FlopCounterMode(display=False):
        assert not ops._no_modes()
    with NoopFunctionMode():
        assert not ops._no_modes()
    with torch.device("cpu"):  # set_default_device's mode only picks factories' device
        assert ops._no_modes()
        with NoopFunctionMode():
            assert not ops._no_modes()
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        assert not ops._no_modes()
    seen = []
    torch.vmap(lambda x: seen.append(ops._no_modes()) or x)(torch.ones(3, 2))
    torch.func.grad(lambda x: seen.append(ops._no_modes()) or x.sum())(torch.ones(3))
    assert seen == [False, False]
    with FakeTensorMode():
        t = fake_cuda((4, 4))
        assert t.is_cuda and not ops._plain(t, t)
    assert not ops._plain(torch.ones(2, 2), torch.ones(2, 2))  # CPU


def test_flop_counter_counts_wsgemm():
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode():
        a, b = fake_cuda((2, 3, 8, 32)), fake_cuda((32, 16))
        with FlopCounterMode(display=False) as counter:
            wsgemm.matmul(a, b)
        with FlopCounterMode(display=False) as theirs:
            torch.matmul(a, b)
    assert counter.get_total_flops() == theirs.get_total_flops() == 2 * 2 * 3 * 8 * 16 * 32


def reference(a, b, grad=None):
    """torch.matmul in float64 on leaves of ``a`` and ``b``: the product and, given ``grad``,
    the gradients."""
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    out = torch.matmul(a64, b64)
    if grad is None:
        return out
    return out, *torch.autograd.grad(out, (a64, b64), grad.double())


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
@pytest.mark.parametrize("sa, sb", SHAPES)
def test_forward_and_backward_match_torch(monkeypatch, fast, sa, sb):
    core = install(monkeypatch, fast=fast)
    gen = torch.Generator().manual_seed(len(sa) * 10 + len(sb))
    a = torch.randn(sa, generator=gen).to(BF16).requires_grad_()
    b = torch.randn(sb, generator=gen).to(BF16).requires_grad_()
    out = wsgemm.matmul(a, b)
    road = type(out.grad_fn).__name__
    assert road == (
        "_MatmulBackward" if fast else "GeneratedBackwardFor_wsgemm_matmul_defaultBackward"
    )
    grad = torch.randn(out.shape, generator=gen).to(BF16)
    ga, gb = torch.autograd.grad(out, (a, b), grad)
    want, want_a, want_b = reference(a, b, grad)
    assert out.shape == want.shape and out.dtype == BF16 and not out._is_view()
    assert (ga.shape, ga.dtype, gb.shape, gb.dtype) == (a.shape, BF16, b.shape, BF16)
    # the stub rounds each product once; the backward adds one rounding of a batch sum
    for got, ref in ((out, want), (ga, want_a), (gb, want_b)):
        torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=2e-2 * (1 + sa[-1]) ** 0.5)
    assert len(core.calls) == 3


def test_batches_fold_into_views(monkeypatch):
    core = install(monkeypatch)
    a = torch.randn(2, 4, 3, 8).to(F16)
    b = torch.randn(2, 4, 8, 5).to(F16)
    wsgemm.matmul(a, b)
    wsgemm.matmul(a, b[0, 0])
    wsgemm.matmul(a.transpose(0, 1), b.transpose(0, 1))  # batch dims do not collapse: a copy
    (a1, b1, _), (a2, b2, _), (a3, b3, _) = core.calls
    assert a1.shape == (8, 3, 8) and a1.data_ptr() == a.data_ptr()
    assert b1.shape == (8, 8, 5) and b1.data_ptr() == b.data_ptr()
    assert a2.data_ptr() == a.data_ptr() and b2.dim() == 2
    assert a3.data_ptr() != a.data_ptr()
    torch.testing.assert_close(
        wsgemm.matmul(a.transpose(0, 1), b.transpose(0, 1)).double(),
        reference(a.transpose(0, 1), b.transpose(0, 1)),
        rtol=1e-2,
        atol=1e-2,
    )


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_out_nd(monkeypatch, fast):
    core = install(monkeypatch, fast=fast)
    a, b = torch.randn(2, 4, 3, 8).to(F16), torch.randn(8, 5).to(F16)
    want = reference(a, b)
    out = torch.full((2, 4, 3, 5), float("nan"), dtype=torch.float32)
    assert wsgemm.matmul(a, b, out=out) is out
    assert core.calls[-1][2].data_ptr() == out.data_ptr()  # the kernel writes out itself
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    # batch dims that do not collapse: computed aside, then copied in
    base = torch.full((4, 2, 3, 5), float("nan"), dtype=F16)
    out = base.transpose(0, 1)
    assert wsgemm.matmul(a, b, out=out) is out
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)
    out = torch.empty(3, dtype=F16)
    assert wsgemm.matmul(torch.randn(3, 8).to(F16), torch.randn(8).to(F16), out=out) is out


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_out_refuses_autograd_like_torch(monkeypatch, fast):
    install(monkeypatch, fast=fast)
    a = torch.randn(4, 8).to(F16).requires_grad_()
    b = torch.randn(8, 5).to(F16)
    out = torch.empty(4, 5, dtype=F16)
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        wsgemm.matmul(a, b, out=out)
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        wsgemm.matmul(b.t(), b, out=torch.empty(5, 5, dtype=F16, requires_grad=True))
    with torch.no_grad():
        wsgemm.matmul(a, b, out=out)
    torch.testing.assert_close(out.double(), reference(a, b), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_out_write_bumps_the_version_counter(monkeypatch, fast):
    install(monkeypatch, fast=fast)
    w = torch.randn(4, 5, requires_grad=True)
    target = torch.randn(4, 5)
    loss = (w * target).sum()  # saves target for backward
    with torch.no_grad():
        wsgemm.matmul(torch.randn(4, 8).to(F16), torch.randn(8, 5).to(F16), out=target)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_fp32_out_backward_matches_torch_rounding_the_grad(monkeypatch, fast):
    install(monkeypatch, fast=fast)
    a = torch.randn(6, 16).to(F16).requires_grad_()
    b = torch.randn(16, 5).to(F16).requires_grad_()
    out = wsgemm.matmul(a, b, out_dtype=torch.float32)
    grad = torch.randn(6, 5) * 1e-3
    ga, gb = torch.autograd.grad(out, (a, b), grad)
    assert out.dtype == torch.float32 and ga.dtype == gb.dtype == F16
    g16 = grad.to(F16).double()  # the documented rule: one rounding of the grad to fp16
    torch.testing.assert_close(ga.double(), g16 @ b.double().T, rtol=2e-3, atol=1e-6)
    torch.testing.assert_close(gb.double(), a.double().T @ g16, rtol=2e-3, atol=1e-6)


def test_double_backward(monkeypatch):
    install(monkeypatch)
    a = torch.randn(3, 4).to(BF16).requires_grad_()
    b = torch.randn(4, 2).to(BF16).requires_grad_()
    (ga,) = torch.autograd.grad(wsgemm.matmul(a, b).square().sum(), a, create_graph=True)
    (gb,) = torch.autograd.grad(ga.sum(), b)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (ga64,) = torch.autograd.grad((a64 @ b64).square().sum(), a64, create_graph=True)
    (gb64,) = torch.autograd.grad(ga64.sum(), b64)
    torch.testing.assert_close(gb.double(), gb64, rtol=5e-2, atol=5e-2)


VMAP_CASES = [
    # (a per sample, b per sample, in_dims): vectors, matrices, batches, either side unmapped,
    # a mapped dimension that is not the first, fewer per-sample batch dimensions than the other
    ((3, 8), (8,), (0, 0)),
    ((8,), (8, 5), (0, None)),
    ((8,), (8,), (0, 0)),
    ((3, 8), (8, 5), (None, 0)),
    ((2, 3, 8), (8, 5), (0, 0)),
    ((3, 8), (2, 8, 5), (0, None)),
    ((3, 8), (2, 8, 5), (1, 0)),
    ((4, 1, 3, 8), (2, 8, 5), (0, 2)),
    ((8,), (2, 8, 5), (0, 0)),
    ((2, 3, 8), (8,), (None, 0)),
]


def _mapped(shape, dim, size=6):
    shape = list(shape)
    if dim is not None:
        shape.insert(dim, size)
    return torch.randn(shape).to(F16)


@pytest.mark.parametrize("a_shape, b_shape, in_dims", VMAP_CASES)
def test_vmap_is_one_product_with_torchs_answer(a_shape, b_shape, in_dims, monkeypatch):
    """The batching rule: one call of the core for the whole vmap (not torch's per-sample
    loop), and torch.vmap(torch.matmul)'s result."""
    core = install(monkeypatch, fast=True)
    a, b = _mapped(a_shape, in_dims[0]), _mapped(b_shape, in_dims[1])
    got = torch.vmap(wsgemm.matmul, in_dims=in_dims)(a, b)
    want = torch.vmap(torch.matmul, in_dims=in_dims)(a.double(), b.double())
    assert got.shape == want.shape and got.dtype == F16
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)
    assert len(core.calls) == 1


@pytest.mark.parametrize("in_dims", [(0, None), (None, 0), (0, 0)])
def test_vmap_refuses_a_scalar_per_sample_as_matmul_does(in_dims, monkeypatch):
    install(monkeypatch, fast=True)
    scalars, w = torch.randn(4).to(F16), torch.randn(4, 1, 3).to(F16)
    a, b = (scalars, w[0] if in_dims[1] is None else w) if in_dims[0] == 0 else (w[0], scalars)
    with pytest.raises(ValueError, match="both operands must be at least 1-D"):
        torch.vmap(wsgemm.matmul, in_dims=in_dims)(a, b)


def test_vmap_backpropagates_through_the_one_product(monkeypatch):
    core = install(monkeypatch, fast=True)
    a = torch.randn(6, 3, 8).to(F16).requires_grad_()
    b = torch.randn(6, 8, 5).to(F16).requires_grad_()
    torch.vmap(wsgemm.matmul)(a, b).float().square().sum().backward()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64).square().sum().backward()
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=2e-2, atol=2e-2)
    assert len(core.calls) == 3  # the product, then one GEMM per gradient


class _Linear(torch.nn.Module):
    def forward(self, x, w, bias):
        return wsgemm.linear(x, w, bias)


@pytest.mark.parametrize("strict", [False, True])
def test_torch_export_holds_the_op_with_a_dynamic_token_count(strict):
    """torch.export (fake CUDA inputs): the op stays one node of the exported graph, and the
    program takes another token count."""
    with FakeTensorMode():
        x, w, bias = fake_cuda((4, 8, 64)), fake_cuda((32, 64)), fake_cuda((32,))
        tokens = torch.export.Dim("tokens", min=2, max=4096)
        ep = torch.export.export(
            _Linear(), (x, w, bias), dynamic_shapes=({1: tokens}, None, None), strict=strict
        )
        assert len(ops_in(ep.graph_module)) == 1
        out = ep.module()(fake_cuda((4, 100, 64)), w, bias)
    assert out.shape == (4, 100, 32) and out.dtype == F16


# ----------------------------------------------------------------------------- errors


def t(*shape, dtype=F16, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "a, b, kw, exc, words",
    [
        ("x", t(4, 4), {}, TypeError, ["a must be a torch.Tensor", "str"]),
        (t(4, 4), None, {}, TypeError, ["b must be a torch.Tensor", "NoneType"]),
        (t(4, 4), t(4, 4), {"out": [1]}, TypeError, ["out must be a torch.Tensor"]),
        (t(4, 4), t(4, 4), {"out_dtype": "half"}, TypeError, ["out_dtype must be a torch.dtype"]),
        (t(4, 4), t(4, 4), {"accumulate": 32}, TypeError, ["accumulate must be a torch.dtype"]),
        (t(4, 4), t(4, 4), {"backend": None}, TypeError, ["backend must be a str"]),
        (t(), t(4), {}, ValueError, ["at least 1-D"]),
        (t(2, 3, 4, 5), t(2, 3, 4, 5), {}, ValueError, ["inner dimensions", "K=5", "K=4"]),
        (t(4), t(5), {}, ValueError, ["inner dimensions", "only dim"]),
        (t(2, 3, 4, 4), t(3, 3, 4, 4), {}, ValueError, ["do not broadcast", "(2, 3)", "(3, 3)"]),
        (t(2, 3, 4, 4, dtype=torch.float32), t(4, 4), {}, TypeError, ["float32"]),
        (t(2, 3, 4, 4), t(4, 4), {"out": t(2, 3, 4, 5)}, ValueError, ["out has shape"]),
        (
            t(2, 3, 4, 4),
            t(4, 4),
            {"out": t(2, 3, 4, 4), "out_dtype": torch.float32},
            TypeError,
            ["out has dtype", "out_dtype"],
        ),
        # a named backend (backend="auto" runs torch's matmul on CPU tensors)
        (t(2, 3, 4, 4), t(4, 4), {"backend": "sm90"}, ValueError, ["must be a CUDA tensor"]),
        (t(4, 4), t(4, 4), {"backend": "sm80"}, ValueError, ["must be a CUDA tensor"]),
    ],
)
def test_bad_input_raises_on_cpu(a, b, kw, exc, words):
    with pytest.raises(exc) as info:
        wsgemm.matmul(a, b, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize(
    "sa, sb, kw, exc, words",
    [
        ((4, 4), (4, 4), {"accumulate": torch.float16, "dtype": BF16}, ValueError, ["float16"]),
        ((4, 4), (4, 4), {"dtype": torch.float32, "backend": "sm80"}, TypeError, ["float32"]),
        (
            (4, 4),
            (4, 4),
            {"dtype": torch.float32, "accumulate": torch.float16},
            ValueError,
            ["torch.matmul", "accumulates in fp32"],
        ),
        ((2, 4, 4), (3, 4, 4), {}, ValueError, ["do not broadcast"]),
        ((4, 4), (4, 4), {"backend": "cublas"}, ValueError, ["backend='cublas'", "sm90"]),
        ((4, 4), (4, 4), {"out_dtype": torch.int8}, TypeError, ["out_dtype", "float32"]),
    ],
)
def test_bad_input_raises_in_fake_mode(sa, sb, kw, exc, words):
    dtype = kw.pop("dtype", F16)
    with FakeTensorMode(), pytest.raises(exc) as info:
        wsgemm.matmul(fake_cuda(sa, dtype), fake_cuda(sb, dtype), **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        ({"weight": "w"}, TypeError, ["weight must be a torch.Tensor"]),
        ({"weight": t(2, 3, 4)}, ValueError, ["weight must be 2-D", "(2, 3, 4)"]),
        ({"bias": 1.0}, TypeError, ["bias must be a torch.Tensor"]),
        ({"bias": t(3, dtype=torch.float32)}, TypeError, ["bias has dtype torch.float32"]),
        ({"bias": t(4)}, ValueError, ["bias has shape (4,)", "(3,)"]),
        ({"input": t()}, ValueError, ["at least 1-D"]),
        # in linear's words, not the product's (issue #27 item 9)
        ({"input": t(2, 5)}, ValueError, ["input has 5 features", "in_features=4"]),
        ({"input": t(2, 4, dtype=torch.bfloat16)}, TypeError, ["input is torch.bfloat16"]),
        ({"input": "x"}, TypeError, ["input must be a torch.Tensor"]),
        ({"input": t(2, 4, dtype=torch.int8)}, TypeError,
         ["input has dtype torch.int8", "linear takes torch.float16"]),
        ({"weight": t(3, 4, device="meta"), "bias": None}, ValueError,
         ["input is on cpu and weight on meta", "one device"]),
    ],
)  # fmt: skip
def test_linear_bad_input_raises(kw, exc, words):
    args = dict(input=t(2, 4), weight=t(3, 4), bias=t(3)) | kw
    with pytest.raises(exc) as info:
        wsgemm.linear(**args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_auto_runs_torch_s_matmul_on_cpu_tensors(caplog):
    """Issue #27: a device wsgemm does not take falls back under ``auto`` (one INFO line, the
    same meaning: out_dtype, out=, an epilogue, fp32 accumulation; ``accumulate=float16``
    refused), ``explain`` says so; a named backend raises (``test_bad_input_raises_on_cpu``)."""
    import logging

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 8, generator=gen).half(), torch.randn(8, 3, generator=gen).half()
    want = a.double() @ b.double()
    d = wsgemm.api.Dispatcher()  # CUDA devices (none here), a fresh say-once memory
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        for _ in range(2):  # the second call takes the signature's launcher
            got = wsgemm.api.dispatch.call(d, a, b, None, None, torch.float32, "auto", None)
    said = [r.getMessage() for r in caplog.records if r.name == "wsgemm"]
    assert said == ["cpu: backend='auto' runs torch.matmul (fallback): CPU tensors (wsgemm's "
                    "kernels run on CUDA GPUs)"]  # fmt: skip
    assert got.dtype == F16 and (got.double() - want).abs().max() < 2e-2
    out = torch.empty(5, 3)
    assert wsgemm.matmul(a, b, out=out, out_dtype=torch.float32) is out
    assert (out.double() - want).abs().max() < 1e-3
    y = wsgemm.linear(a, b.t().contiguous(), torch.ones(3).half(), activation="relu")
    assert (y.double() - torch.relu(want + 1)).abs().max() < 2e-2
    with pytest.raises(ValueError, match="accumulates in fp32"):
        wsgemm.matmul(a, b, accumulate=torch.float16)
    text = wsgemm.api.dispatch.explain(d, a, b, None, None, torch.float32, "auto")
    assert "torch.matmul (fallback): CPU tensors" in text


def test_a_compiled_call_on_cpu_tensors_runs_torch_s_matmul():
    """The op's fake takes CPU tensors under ``auto`` as its eager road does."""
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b: wsgemm.matmul(a, b), backend="eager", fullgraph=True)
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 8, generator=gen).half(), torch.randn(8, 4, generator=gen).half()
    got = fn(a, b)
    assert got.dtype == F16 and (got.double() - a.double() @ b.double()).abs().max() < 2e-2


def test_linear_matches_functional_linear(monkeypatch):
    install(monkeypatch, fast=True)
    x = torch.randn(2, 5, 8).to(BF16)
    for weight, bias in [(torch.randn(3, 8), torch.randn(3)), (torch.randn(3, 8), None),
                         (torch.randn(8), torch.randn(()))]:  # fmt: skip
        weight = weight.to(BF16)
        bias = None if bias is None else bias.to(BF16)
        want = torch.nn.functional.linear(x.double(), weight.double(),
                                          None if bias is None else bias.double())  # fmt: skip
        got = wsgemm.linear(x, weight, bias)
        assert got.dtype == BF16
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "sa, sb, kw",
    [((2, 3, 10, 8), (3, 8, 6), {"out_dtype": torch.float32}), ((8,), (2, 8, 6), {})],
)
def test_opcheck_with_the_cpu_stub(monkeypatch, sa, sb, kw):
    """torch's own checks of the registration (schema, autograd registration, fake vs real,
    AOTAutograd with dynamic shapes, gradients included); the GPU suite runs them on the
    kernels."""
    install(monkeypatch)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(sa, generator=gen).to(F16).requires_grad_()
    b = torch.randn(sb, generator=gen).to(F16).requires_grad_()
    torch.library.opcheck(torch.ops.wsgemm.matmul.default, (a, b), kw)
    out = torch.empty(ops.result_shape(sa, sb), dtype=F16)
    torch.library.opcheck(torch.ops.wsgemm.matmul_out.default, (a.detach(), b.detach(), out), {})


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "relu2"])
def test_an_activation_with_autograd_keeps_its_pre_activation(monkeypatch, fast, act):
    """With a gradient to compute, the activation runs as torch's own op on the bias-fused
    product, which autograd saves: three products in all (forward, dA, dB), none recomputed;
    the gradients those of torch's unfused path. Without one, the core fuses it."""
    core = install(monkeypatch, fast=fast)
    acts = []
    stub = api.matmul

    def recording(*args, activation=None, **kwargs):
        acts.append(activation)
        return stub(*args, activation=activation, **kwargs)

    monkeypatch.setattr(api, "matmul", recording)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, 32, generator=gen).to(BF16).requires_grad_()
    w = torch.randn(16, 32, generator=gen).to(BF16).requires_grad_()
    bias = torch.randn(16, generator=gen).to(BF16).requires_grad_()
    y = wsgemm.linear(x, w, bias, activation=act)
    grad = torch.randn(y.shape, generator=gen).to(BF16)
    gx, gw, gb = torch.autograd.grad(y, (x, w, bias), grad)
    assert len(core.calls) == 3 and acts == [None, None, None]

    def torch_path(dtype):  # torch's own unfused path: its product, bias, activation
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, bias)]
        out = torch_activation(act, torch.nn.functional.linear(*leaves))
        return out, *torch.autograd.grad(out, leaves, grad.to(dtype))

    want, theirs = torch_path(torch.float64), torch_path(BF16)
    for got, ref, other in zip((y, gx, gw, gb), want, theirs, strict=True):
        bound = 2 * (other.double() - ref).abs().max().item() + 1e-2 * ref.abs().max().item()
        assert (got.double() - ref).abs().max().item() <= bound
    with torch.no_grad():
        wsgemm.linear(x, w, bias, activation=act)
    assert acts[-1] == act  # inference: fused


def test_an_activations_backward_graph_recomputes_no_product():
    def fwd_bwd(x, w, bias):
        y = wsgemm.linear(x, w, bias, activation="gelu_tanh")
        return torch.autograd.grad(y.sum(), (x, w, bias))

    gm = make_fx(fwd_bwd, tracing_mode="fake")(meta((4, 8, 32)), meta((16, 32)), meta((16,)))
    assert len(ops_in(gm)) == 3  # forward (the bias fused, no activation), dA, dB
    assert any("gelu" in str(n.target) for n in gm.graph.nodes)  # torch's, saved for backward


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_an_unknown_activation_with_autograd_is_refused(monkeypatch, fast):
    install(monkeypatch, fast=fast)
    x = torch.randn(4, 32).to(BF16).requires_grad_()
    w = torch.randn(16, 32).to(BF16)
    with pytest.raises(ValueError, match="activation='none' is not one of"):
        wsgemm.linear(x, w, activation="none")


# ----------------------------------------------------------------------------- a fresh interpreter


@pytest.fixture(scope="module", autouse=True)
def import_cost():
    """A fresh interpreter that imports wsgemm, touches its API, then imports torch (seconds),
    for ``test_public_surface_and_import_cost``: started with this module's first test, it runs
    beside the in-process tests (on the other core), and the test, last, reads what it printed."""
    code = (
        "import sys, wsgemm\n"
        "print(sorted(m for m in ('torch', 'cutlass') if m in sys.modules))\n"
        "wsgemm.matmul, wsgemm.nn.Linear\n"
        "import torch\n"
        "print(hasattr(torch.ops.wsgemm, 'matmul') and hasattr(torch.ops.wsgemm, 'grouped_mm'),"
        " 'cutlass' in sys.modules)\n"
    )
    with fresh_interpreter(code) as child:
        yield child


def test_public_surface_and_import_cost(import_cost):
    assert set(wsgemm.__all__) == {
        "matmul",
        "linear",
        "grouped_mm",
        "gated_linear",
        "nn",
        "explain",
        "available_backends",
        "trace",
        "config",
        "tune",
    }
    assert wsgemm.matmul is ops.matmul and wsgemm.linear is ops.linear
    assert wsgemm.grouped_mm.__module__ == "wsgemm.grouped"
    assert set(wsgemm.__all__) <= set(dir(wsgemm))
    with pytest.raises(AttributeError, match="no attribute 'mat_mul'"):
        wsgemm.mat_mul  # noqa: B018
    # `import wsgemm` loads neither torch nor the DSL; the API loads torch and registers the op
    out, err = import_cost.communicate()
    assert import_cost.returncode == 0, err
    assert out.split("\n")[:2] == ["[]", "True False"]


def test_the_fake_implementation_refuses_an_fp16_accumulator_on_cpu_as_eager_does():
    """CPU tensors take torch's road, which sums in fp32: eager refuses ``accumulate=fp16``
    there, and so does the fake implementation (a compiled graph refused at trace time, not at
    run time). Fake CUDA tensors keep it: which road a GPU takes is not known there."""
    a, b = torch.randn(4, 5, dtype=torch.float16), torch.randn(5, 3, dtype=torch.float16)
    with pytest.raises(ValueError, match="accumulate=torch.float16 needs one of wsgemm's"):
        wsgemm.matmul(a, b, accumulate=torch.float16)
    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        with pytest.raises(ValueError, match="accumulate=torch.float16 needs one of wsgemm's"):
            torch.ops.wsgemm.matmul(fa, fb, accumulate=torch.float16)
        ca = torch.empty(4, 5, dtype=torch.float16, device="cuda")
        cb = torch.empty(5, 3, dtype=torch.float16, device="cuda")
        assert torch.ops.wsgemm.matmul(ca, cb, accumulate=torch.float16).shape == (4, 3)
