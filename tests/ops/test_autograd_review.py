"""Gradients of the registered ops against torch's, on the CPU (found by a review of the ops'
autograd): a double backward through an op with an epilogue (activation, gated unit, row
scale) differentiates the recomputed pre-activation too (it was computed under no_grad: the
second derivative through it was silently dropped), and float64 operands keep float64 in the
backward's sums and scalings and in vmap's epilogue (they were rounded to float32)."""

import pytest
import torch
import torch.nn.functional as F
from op_helpers import grouped_reference, install, install_grouped
from torch.autograd import gradcheck, gradgradcheck

import wsgemm
from wsgemm import api
from wsgemm.api.epilogue import gated_unit, torch_activation

F64, BF16 = torch.float64, torch.bfloat16
ACTS = ["relu", "relu2", "gelu", "gelu_tanh", "silu"]
MATMUL = torch.ops.wsgemm.matmul


def _r(*shape, dtype=F64):
    return torch.randn(shape, dtype=dtype, generator=_GEN).requires_grad_()


_GEN = torch.Generator().manual_seed(0)


def _fp64_core(monkeypatch):
    """A float64 stand-in for the core (the CPU road's torch fallback computes ``alpha`` and
    ``c`` in fp32, which gradcheck cannot take): ``act(alpha · a @ b + beta · c + bias)``."""

    def core(a, b, *, out=None, out_dtype=None, accumulate=torch.float32, backend="auto",
             bias=None, activation=None, c=None, alpha=1.0, beta=1.0):  # fmt: skip
        y = alpha * torch.matmul(a, b)
        if c is not None and beta != 0:
            y = y + beta * c
        if bias is not None:
            y = y + bias
        y = torch_activation(activation or "none", y).to(out_dtype or a.dtype)
        return y if out is None else out.copy_(y)

    monkeypatch.setattr(api, "matmul", core)


@pytest.mark.parametrize("act", ACTS)
def test_the_op_with_an_activation_is_twice_differentiable(act):
    """``torch.ops.wsgemm.matmul`` with an activation and a bias (its own backward), float64
    on the CPU: gradgradcheck (the pre-activation was recomputed under no_grad)."""
    a, b, bias = _r(2, 3, 4), _r(4, 5), _r(5)
    if act in ("relu", "relu2"):  # away from the kink, where finite differences fail
        bias = (bias.detach() + 0.3 * bias.detach().sign()).requires_grad_()
    fn = lambda a, b, bias: MATMUL(a, b, None, torch.float32, "auto", bias, act)  # noqa: E731
    assert gradcheck(fn, (a, b, bias))
    assert gradgradcheck(fn, (a, b, bias))


def test_the_op_with_an_activation_double_backward_matches_torch():
    a, b = _r(3, 4), _r(4, 5)
    (ga,) = torch.autograd.grad(MATMUL(a, b, None, torch.float32, "auto", None, "gelu").sum(), a,
                                create_graph=True)  # fmt: skip
    (gb,) = torch.autograd.grad(ga.sum(), b)
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    (ga2,) = torch.autograd.grad(F.gelu(a2 @ b2).sum(), a2, create_graph=True)
    (gb2,) = torch.autograd.grad(ga2.sum(), b2)
    torch.testing.assert_close(gb, gb2)


@pytest.mark.parametrize("direct", [False, True])
def test_residual_and_alpha_are_twice_differentiable_in_fp64(monkeypatch, direct):
    _fp64_core(monkeypatch)
    a, b, c, bias = _r(2, 3, 4), _r(4, 5), _r(3, 5), _r(5)
    if direct:
        fn = lambda a, b, c, bias: MATMUL(a, b, None, torch.float32, "auto", bias, "silu", c,  # noqa: E731
                                          0.5, 2.0)  # fmt: skip
    else:
        fn = lambda a, b, c, bias: wsgemm.matmul(a, b, c=c, bias=bias, alpha=0.5, beta=2.0,  # noqa: E731
                                                 activation="silu")  # fmt: skip
    assert gradcheck(fn, (a, b, c, bias))
    assert gradgradcheck(fn, (a, b, c, bias))


@pytest.mark.parametrize("fast", [False, True])
def test_fp64_bias_residual_and_alpha_grads_stay_fp64(monkeypatch, fast):
    """The bias's and c's gradients and alpha's scaling of the product's were taken in fp32
    (``grad.float()``) on float64 operands: 1e-5 off for a gradient of 1e3."""
    _fp64_core(monkeypatch)
    if fast:  # the eager fast road (CPU tensors taken for plain CUDA ones)
        monkeypatch.setattr(wsgemm.ops, "_plain", lambda *ts: True)
    a, b, bias, c = _r(3, 4), _r(4, 5), _r(5), _r(3, 5)
    g = torch.randn(3, 5, dtype=F64, generator=_GEN) * 1e3 + 1 / 3
    y = wsgemm.matmul(a, b, bias=bias, c=c, alpha=0.3, beta=0.7)
    ga, gbias, gc = torch.autograd.grad(y, (a, bias, c), g)
    torch.testing.assert_close(gbias, g.sum(0), rtol=1e-12, atol=0)
    torch.testing.assert_close(gc, 0.7 * g, rtol=1e-12, atol=0)
    torch.testing.assert_close(ga, 0.3 * g @ b.detach().T, rtol=1e-12, atol=1e-12)
    y = MATMUL(a, b, None, torch.float32, "auto", bias, "gelu", c, 0.3, 0.7)
    ga, gbias = torch.autograd.grad(y, (a, bias), g)
    a2, b2, bias2, c2 = (t.detach().requires_grad_() for t in (a, b, bias, c))
    y2 = F.gelu(0.3 * a2 @ b2 + 0.7 * c2 + bias2)
    ga2, gbias2 = torch.autograd.grad(y2, (a2, bias2), g)
    torch.testing.assert_close(gbias, gbias2, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(ga, ga2, rtol=1e-12, atol=1e-9)


def test_vmap_epilogue_keeps_fp64():
    """vmap's rule for alpha, c or a per-sample bias computed the product and the epilogue in
    fp32 for float64 operands."""
    a = torch.randn(6, 3, 4, dtype=F64, generator=_GEN)
    b = torch.randn(4, 5, dtype=F64, generator=_GEN)
    bias, c = torch.randn(6, 5, dtype=F64, generator=_GEN), torch.randn(6, 3, 5, dtype=F64)
    y = torch.vmap(lambda a, bias: wsgemm.matmul(a, b, bias=bias))(a, bias)
    torch.testing.assert_close(y, a @ b + bias[:, None], rtol=1e-13, atol=1e-13)
    y = torch.vmap(lambda a, c: torch.ops.wsgemm.matmul(a, b, None, torch.float32, "auto", None,
                                                        None, c, 0.5, 2.0))(a, c)  # fmt: skip
    torch.testing.assert_close(y, 0.5 * a @ b + 2 * c, rtol=1e-13, atol=1e-13)


def test_the_fast_road_is_twice_differentiable(monkeypatch):
    """The eager fast road (``_Matmul``, then torch's activation), bf16 against float64."""
    install(monkeypatch, fast=True)
    a = torch.randn(3, 8, generator=_GEN).to(BF16).requires_grad_()
    b = torch.randn(8, 4, generator=_GEN).to(BF16).requires_grad_()
    bias = torch.randn(4, generator=_GEN).to(BF16).requires_grad_()
    (ga,) = torch.autograd.grad(wsgemm.matmul(a, b, bias=bias, activation="silu").float().sum(),
                                a, create_graph=True)  # fmt: skip
    gb, gbias = torch.autograd.grad(ga.float().square().sum(), (b, bias))
    a2, b2, bias2 = (t.detach().double().requires_grad_() for t in (a, b, bias))
    (ga2,) = torch.autograd.grad(F.silu(a2 @ b2 + bias2).sum(), a2, create_graph=True)
    gb2, gbias2 = torch.autograd.grad(ga2.square().sum(), (b2, bias2))
    for got, want in ((gb, gb2), (gbias, gbias2)):  # (bf16: compared as a whole)
        assert ((got.double() - want).norm() / want.norm()).item() < 3e-2


@pytest.mark.parametrize("act", ACTS)
def test_the_gated_op_is_twice_differentiable(act):
    """``torch.ops.wsgemm.gated_linear``'s own backward under create_graph (CPU, bf16) against
    float64: its second derivatives w.r.t. x, the weight and the bias (the bias's was None)."""
    x = torch.randn(2, 5, 8, generator=_GEN).to(BF16).requires_grad_()
    w = torch.randn(6, 8, generator=_GEN).to(BF16).requires_grad_()
    bias = torch.randn(6, generator=_GEN).to(BF16).requires_grad_()
    gy = torch.randn(2, 5, 3, generator=_GEN).to(BF16)
    gs = torch.autograd.grad(torch.ops.wsgemm.gated_linear(x, w, act, bias), (x, w, bias), gy,
                             create_graph=True)  # fmt: skip
    gg = torch.autograd.grad(sum(g.float().square().sum() for g in gs), (x, w, bias))
    x2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    y2 = gated_unit(act, x2 @ w2.T + b2)
    gs2 = torch.autograd.grad(y2, (x2, w2, b2), gy.double(), create_graph=True)
    gg2 = torch.autograd.grad(sum(g.square().sum() for g in gs2), (x2, w2, b2))
    for got, want in zip(gg, gg2, strict=True):
        assert ((got.double() - want).norm() / want.norm()).item() < 3e-2


def test_the_gated_op_double_backward_with_a_partial_gradient():
    x = torch.randn(4, 8, generator=_GEN).to(BF16).requires_grad_()
    w = torch.randn(6, 8, generator=_GEN).to(BF16)  # no gradient wanted
    (gx,) = torch.autograd.grad(torch.ops.wsgemm.gated_linear(x, w).float().sum(), x,
                                create_graph=True)  # fmt: skip
    (ggx,) = torch.autograd.grad(gx.float().square().sum(), x)
    x2 = x.detach().double().requires_grad_()
    (gx2,) = torch.autograd.grad(gated_unit("silu", x2 @ w.double().T).sum(), x2,
                                 create_graph=True)  # fmt: skip
    (ggx2,) = torch.autograd.grad(gx2.square().sum(), x2)
    assert ((ggx.double() - ggx2).norm() / ggx2.norm()).item() < 3e-2


GROUPED = [  # (a, b, offs, activation, gated, row scale)
    ((7, 4), (2, 4, 6), [3, 5], "silu", False, False),
    ((7, 4), (2, 4, 6), [3, 5], "silu", True, False),
    ((7, 4), (2, 4, 6), [3, 5], None, False, True),
    ((7, 4), (2, 4, 6), [3, 5], "gelu", True, True),
    ((2, 3, 4), (2, 4, 6), None, "relu2", False, False),
    ((3, 7), (7, 6), [3, 5], "gelu", False, False),
    ((2, 3, 4), (4, 7), [3, 5], "silu", False, False),
]


@pytest.mark.parametrize("sa, sb, offs, act, gated, scaled", GROUPED)
def test_the_grouped_op_is_twice_differentiable(monkeypatch, sa, sb, offs, act, gated, scaled):
    """``torch.ops.wsgemm.grouped_mm``'s own backward with an epilogue under create_graph (the
    CPU stand-in of the core, fp32) against float64: every second derivative."""
    install_grouped(monkeypatch)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    a, b = torch.randn(sa, generator=_GEN).requires_grad_(), torch.randn(sb, generator=_GEN)
    b.requires_grad_()
    s = torch.rand(sa[0], generator=_GEN).requires_grad_() if scaled else None
    ins = (a, b) if s is None else (a, b, s)
    y = torch.ops.wsgemm.grouped_mm(a, b, offs, None, "auto", act, gated, s)
    gy = torch.randn(y.shape, generator=_GEN)
    if offs is not None and len(sa) == 2 and len(sb) == 3:  # rows past offs[-1]: unspecified
        gy[offs[-1] :] = 0
    if offs is not None and len(sa) == 3 and len(sb) == 2:
        gy[:, offs[-1] :] = 0
    gs = torch.autograd.grad(y, ins, gy, create_graph=True)
    gg = torch.autograd.grad(sum(g.square().sum() for g in gs), ins)
    ins2 = [t.detach().double().requires_grad_() for t in ins]
    y2 = grouped_reference(ins2[0], ins2[1], offs)
    if act is not None:
        y2 = (gated_unit if gated else torch_activation)(act, y2)
    if s is not None:
        y2 = y2 * ins2[2][:, None]
    gs2 = torch.autograd.grad(y2, ins2, gy.double(), create_graph=True)
    gg2 = torch.autograd.grad(sum(g.square().sum() for g in gs2), ins2)
    for got, want in zip((*gs, *gg), (*gs2, *gg2), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_grouped_mm_with_an_epilogue_and_a_gradient_compiles_fullgraph(monkeypatch):
    """``wsgemm.grouped_mm`` with an activation, gated unit or row scale and a gradient broke
    torch.compile(fullgraph=True) (its autograd road's checks read ``is_neg()``); compiled,
    it takes the op (its own backward), with the eager road's values and gradients."""
    install_grouped(monkeypatch)
    torch._dynamo.reset()
    offs = torch.tensor([2, 5], dtype=torch.int32)
    fn = lambda a, b, s: wsgemm.grouped_mm(a, b, offs, activation="silu", gated=True,  # noqa: E731
                                           row_scale=s)  # fmt: skip
    a, b = torch.randn(6, 4, generator=_GEN), torch.randn(2, 4, 6, generator=_GEN)
    s = torch.rand(6, generator=_GEN)
    ins = [t.clone().requires_grad_() for t in (a, b, s)]
    ins2 = [t.clone().requires_grad_() for t in (a, b, s)]
    y = torch.compile(fn, backend="aot_eager", fullgraph=True)(*ins)
    y2 = fn(*ins2)
    gy = torch.randn(6, 3, generator=_GEN)
    gy[5:] = 0  # (the row past offs[-1]: unspecified)
    y.backward(gy)
    y2.backward(gy)
    torch.testing.assert_close(y[:5], y2[:5])
    for got, want in zip(ins, ins2, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_the_cpu_road_keeps_fp64_through_alpha_and_c():
    """The core's torch road (``api.fallback.run`` / ``epilogue.combine_in_torch``) computed
    alpha and c in fp32 for float64 operands (off by ~2e-7, so gradcheck failed on any CPU
    call with them): now in fp64, and gradcheck passes without a stand-in."""
    gen = torch.Generator().manual_seed(11)
    a, b, c = (torch.randn(s, dtype=torch.float64, generator=gen) for s in ((5, 7), (7, 3), (5, 3)))
    y = wsgemm.matmul(a, b, c=c, alpha=0.5, beta=2.0)
    assert (
        torch.equal(y, 0.5 * (a @ b) + 2.0 * c) or (y - (0.5 * a @ b + 2 * c)).abs().max() < 1e-14
    )
    inputs = tuple(t.clone().requires_grad_() for t in (a, b, c))
    assert torch.autograd.gradcheck(
        lambda a, b, c: wsgemm.matmul(a, b, c=c, alpha=0.5, beta=2.0, activation="gelu"), inputs
    )
