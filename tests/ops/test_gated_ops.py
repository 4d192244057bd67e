"""The registered op ``torch.ops.wsgemm.gated_linear`` without a GPU: ``opcheck`` on the CPU
stand-ins of the gated core and of ``wsgemm.matmul``'s (its backward's products;
tests/op_helpers.py), and torch.compile of ``nn.GatedMLP`` (fullgraph, dynamic token counts) on
fake CUDA tensors and of ``gated_linear``'s autograd on meta tensors. The core is tested in
tests/api/test_gated.py, the kernel in tests/gpu."""

import pytest
import torch
from op_helpers import (
    capture,
    close,
    fake_cuda,
    install,
    install_gated,
    install_gated_training,
    ops_in,
)
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm import ops

BF16, F16 = torch.bfloat16, torch.float16
GATED, MATMUL = "wsgemm.gated_linear.default", "wsgemm.matmul.default"


@pytest.mark.parametrize(
    "x_shape, act, dtype, grad, biased",
    [((2, 3, 16), "silu", BF16, False, False), ((2, 3, 16), "silu", BF16, True, False),
     ((5, 16), "gelu_tanh", F16, True, False), ((2, 3, 16), "silu", BF16, True, True),
     ((5, 16), "relu2", F16, False, True)],
)  # fmt: skip
def test_opcheck(monkeypatch, x_shape, act, dtype, grad, biased):
    """torch's own checks of the registration (schema, autograd registration, the fake
    implementation against the CPU kernel, AOTAutograd with dynamic shapes and, where x and the
    weight need gradients, the op's own backward: the product recomputed, then dx and dW, and
    the bias's gradient, a sum over the rows)."""
    core = install(monkeypatch)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    gated = install_gated(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=gen).to(dtype).requires_grad_(grad)
    w = (torch.randn(2 * 12, 16, generator=gen) / 4).to(dtype).requires_grad_(grad)
    kwargs = dict(activation=act)
    if biased:
        kwargs["bias"] = torch.randn(2 * 12, generator=gen).to(dtype).requires_grad_(grad)
    torch.library.opcheck(torch.ops.wsgemm.gated_linear.default, (x, w), kwargs)
    assert gated.calls and all(call[0].dim() == 2 for call in gated.calls)  # folded
    assert all((len(call) == 3) == biased for call in gated.calls)
    assert bool(core.calls) == grad  # the backward's products, on wsgemm.matmul
    got = torch.ops.wsgemm.gated_linear(x.detach(), w.detach(), act)
    assert got.shape == (*x_shape[:-1], 12) and got.dtype == dtype  # unfolded


def test_the_op_s_backward_gives_the_bias_its_gradient(monkeypatch):
    """A direct op call with a gradient (its own backward): the bias's gradient is the sum over
    the rows of d[gate; up], as autograd through torch's formula gives it."""
    from wsgemm.api.epilogue import gated_unit

    install(monkeypatch)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    install_gated(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 16, generator=gen, dtype=torch.float64).to(F16).requires_grad_()
    w = (torch.randn(24, 16, generator=gen) / 4).to(F16).requires_grad_()
    b = torch.randn(24, generator=gen).to(F16).requires_grad_()
    torch.ops.wsgemm.gated_linear(x, w, "silu", b).sum().backward()
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    gated_unit("silu", x64 @ w64.T + b64).sum().backward()
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2)


def fake_gated_mlp(hidden, ffn, act="silu"):
    """A GatedMLP with fake CUDA bf16 parameters (call inside FakeTensorMode; an inference
    layer: fake CUDA leaves cannot need gradients without a CUDA build)."""
    mlp = wsgemm.nn.GatedMLP(hidden, ffn, activation=act, device="meta")
    for lin, shape in ((mlp.gate_up_proj, (2 * ffn, hidden)), (mlp.down_proj, (hidden, ffn))):
        lin.weight = torch.nn.Parameter(fake_cuda(shape, BF16), False)
    return mlp


def test_compile_gated_mlp_fullgraph_with_dynamic_shapes():
    """One graph of two wsgemm ops (the gated product, then down_proj's matmul), which a new
    token count reuses."""
    torch._dynamo.reset()
    graphs = []
    with FakeTensorMode():
        mlp = fake_gated_mlp(32, 64, "gelu_tanh")
        fn = torch.compile(mlp, backend=capture(graphs), fullgraph=True, dynamic=True)
        for tokens in (5, 9):
            y = fn(fake_cuda((2, tokens, 32), BF16))
            assert y.shape == (2, tokens, 32) and y.dtype == BF16
    assert len(graphs) == 1, "recompiled for a new token count"
    (node,) = ops_in(graphs[0], GATED)
    assert "gelu_tanh" in (*node.args, *node.kwargs.values())
    assert len(ops_in(graphs[0], MATMUL)) == 1


def test_compile_with_autograd_saves_the_product():
    """Compiled with a gradient to compute, ``gated_linear`` is the (rows, 2I) product on
    wsgemm and ``act(gate) * up`` in torch: one product forward, two backward (dx, dW), none
    recomputed and no gated op."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    torch._dynamo.reset()
    fw, bw = [], []

    def boxed(graphs):
        return lambda gm, example_inputs: make_boxed_func(capture(graphs)(gm, example_inputs))

    backend = aot_autograd(fw_compiler=boxed(fw), bw_compiler=boxed(bw))
    fn = torch.compile(wsgemm.gated_linear, backend=backend, fullgraph=True)
    x = torch.empty(2, 5, 32, dtype=BF16, device="meta", requires_grad=True)
    w = torch.empty(2 * 24, 32, dtype=BF16, device="meta", requires_grad=True)
    y = fn(x, w, "silu")
    assert y.shape == (2, 5, 24) and y.dtype == BF16
    y.sum().backward()
    assert len(ops_in(fw[0], MATMUL)) == 1 and len(ops_in(bw[0], MATMUL)) == 2
    assert not ops_in(fw[0], GATED) and not ops_in(bw[0], GATED)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("exact", [False, True])
def test_the_training_road_takes_the_bias(monkeypatch, exact):
    """``wsgemm.gated_linear(..., bias=)`` with a gradient (or ``exact``): the product with its
    bias on wsgemm.matmul, then torch's unit; every gradient as float64 autograd's."""
    from wsgemm.api.epilogue import gated_unit

    core = install(monkeypatch)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    gated = install_gated(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=gen).to(BF16).requires_grad_()
    w = (torch.randn(24, 16, generator=gen) / 4).to(BF16).requires_grad_()
    b = torch.randn(24, generator=gen).to(BF16).requires_grad_()
    out = wsgemm.gated_linear(x, w, "gelu_tanh", exact, bias=b)
    assert not gated.calls and core.calls  # not the fused op: the product, then torch's unit
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = gated_unit("gelu_tanh", x64 @ w64.T + b64)
    assert torch.allclose(out.double(), want, rtol=3e-2, atol=3e-2)
    out.float().pow(2).sum().backward()
    want.pow(2).sum().backward()
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert torch.allclose(got.double(), ref, rtol=5e-2, atol=5e-2)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        wsgemm.gated_linear(x, w, bias=[0.0] * 24)


def test_the_training_road_casts_under_cuda_autocast(monkeypatch):
    """Under CUDA autocast the training road (which the op's autocast kernel does not see)
    casts x, the weight and the bias as torch.matmul would before its checks (fp32
    parameters of a GatedMLP trained in bf16 raised a dtype mismatch); here CPU tensors
    stand in for CUDA ones."""
    from op_helpers import cuda_autocast

    install(monkeypatch)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    install_gated(monkeypatch)
    monkeypatch.setattr(ops, "autocast_dtype", lambda t, dtype: dtype)  # (autocast_cast's)
    x = torch.randn(3, 16, requires_grad=True)
    w = (torch.randn(24, 16) / 4).requires_grad_()
    b = torch.randn(24, requires_grad=True)
    with cuda_autocast(BF16):
        out = wsgemm.gated_linear(x, w, "silu", bias=b)
    assert out.dtype == BF16
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (x, w, b))


@pytest.mark.parametrize("rows, biased", [(300, True), (5, False)])
def test_opcheck_of_the_gated_linear_preact_op(monkeypatch, rows, biased):
    """``torch.ops.wsgemm.gated_linear_preact`` (``h`` and the pre-activation ``[gate | up]``,
    ``GatedMLP``'s forward): schema, the fake implementation against the CPU stand-in, dynamic
    shapes; the fake's checks."""
    install_gated_training(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(rows, 32, generator=gen).to(BF16)
    w = (torch.randn(2 * 24, 32, generator=gen) / 4).to(BF16)
    bias = torch.randn(2 * 24, generator=gen).to(BF16) if biased else None
    torch.library.opcheck(torch.ops.wsgemm.gated_linear_preact.default, (x, w, "silu", bias))
    h, y = torch.ops.wsgemm.gated_linear_preact(x, w, "silu", bias)
    want = x.double() @ w.double().t() + (0 if bias is None else bias.double())
    unit = torch.nn.functional.silu(want[:, :24]) * want[:, 24:]
    assert close(y, want, BF16, 32) and close(h, unit, BF16, 32)
    with FakeTensorMode():
        h, y = torch.ops.wsgemm.gated_linear_preact(fake_cuda((7, 32), BF16),
                                                    fake_cuda((48, 32), BF16), "gelu")  # fmt: skip
        assert (h.shape, y.shape) == ((7, 24), (7, 48)) and h.dtype == y.dtype == BF16
        with pytest.raises(ValueError, match=r"2 \* out_features"):
            torch.ops.wsgemm.gated_linear_preact(fake_cuda((7, 32), BF16),
                                                 fake_cuda((47, 32), BF16), "gelu")  # fmt: skip


def test_opcheck_of_the_gated_grad_op(monkeypatch):
    """``torch.ops.wsgemm.gated_grad`` (the unit's gradient from ``dy @ w_down`` and the saved
    pre-activation): schema, the fake implementation against the CPU stand-in of the dgated
    kernel (``stand_ins.GatedKernels``), dynamic shapes; the fake's checks."""
    variants = install_gated_training(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(7, 32, generator=gen).to(BF16)
    w_down = (torch.randn(32, 24, generator=gen) / 4).to(BF16)
    preact = torch.randn(7, 48, generator=gen).to(BF16)
    torch.library.opcheck(torch.ops.wsgemm.gated_grad.default, (dy, w_down, preact, "silu"))
    assert variants and variants[-1].epilogue == "dgated+silu"
    with FakeTensorMode():
        got = torch.ops.wsgemm.gated_grad(fake_cuda((7, 32), BF16), fake_cuda((32, 24), BF16),
                                          fake_cuda((7, 48), BF16), "gelu")  # fmt: skip
        assert got.shape == (7, 48) and got.dtype == BF16
        with pytest.raises(ValueError, match=r"\(M, 2I\)"):
            torch.ops.wsgemm.gated_grad(fake_cuda((7, 32), BF16), fake_cuda((32, 24), BF16),
                                        fake_cuda((7, 40), BF16), "silu")  # fmt: skip


def test_compile_of_the_fused_training_step():
    """``gated.gated_mlp`` compiled with autograd (meta tensors): the forward is one
    ``gated_linear_preact`` (h and its pre-activation) and down's product; the backward one
    ``gated_grad`` (the unit's gradient fused into ``dy @ w_down``) and three
    products (dx, the two weights' gradients): no elementwise pass over ``dh`` in the graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from wsgemm.gated import gated_mlp

    torch._dynamo.reset()
    fw, bw = [], []

    def boxed(graphs):
        return lambda gm, example_inputs: make_boxed_func(capture(graphs)(gm, example_inputs))

    backend = aot_autograd(fw_compiler=boxed(fw), bw_compiler=boxed(bw))
    fn = torch.compile(gated_mlp, backend=backend, fullgraph=True)
    x = torch.empty(2, 5, 32, dtype=BF16, device="meta", requires_grad=True)
    w_gu = torch.empty(2 * 24, 32, dtype=BF16, device="meta", requires_grad=True)
    w_d = torch.empty(32, 24, dtype=BF16, device="meta", requires_grad=True)
    y = fn(x, w_gu, None, w_d, None, "silu")
    assert y.shape == (2, 5, 32) and y.dtype == BF16
    y.sum().backward()
    assert len(ops_in(fw[0], "wsgemm.gated_linear_preact.default")) == 1
    assert len(ops_in(fw[0], MATMUL)) == 1  # down
    assert len(ops_in(bw[0], "wsgemm.gated_grad.default")) == 1
    assert len(ops_in(bw[0], MATMUL)) == 3
    assert x.grad.shape == x.shape and w_gu.grad.shape == w_gu.shape
    assert w_d.grad.shape == w_d.shape


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "activation, error, match",
    [(None, ValueError, "needs an activation"), (3, TypeError, "str or None")],
)
def test_an_activation_that_is_not_a_name_gets_the_core_s_error(grad, activation, error, match):
    """With or without a gradient (the op's schema said RuntimeError without one)."""
    x = torch.randn(4, 8, dtype=torch.float16, requires_grad=grad)
    with pytest.raises(error, match=match):
        wsgemm.gated_linear(x, torch.randn(16, 8, dtype=torch.float16), activation)
