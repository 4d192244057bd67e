"""A plain MLP's training step without a GPU (issue #25's backward): the op
``torch.ops.wsgemm.act_grad`` (``opcheck`` on the CPU stand-in of the dact kernel, its fake),
``wsgemm.mlp.mlp`` compiled with autograd, and ``nn.MLP``: inference through its fused
``up_proj``, training through the fused step against float64, the module's own road where the
step would change behaviour. The core is tested in tests/api/test_act_grad.py, the kernel in
tests/gpu."""

import pytest
import torch
from op_helpers import (
    capture,
    close,
    fake_cuda,
    float64_mlp_step,
    install,
    install_act_grad,
    ops_in,
)
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm import nn as wnn
from wsgemm.api.epilogue import torch_activation

BF16, F16 = torch.bfloat16, torch.float16
MATMUL = "wsgemm.matmul.default"


def test_opcheck_of_the_act_grad_op(monkeypatch):
    """``torch.ops.wsgemm.act_grad``: schema, the fake implementation against the CPU stand-in
    of the dact kernel, dynamic shapes; the fake's checks."""
    variants = install_act_grad(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(300, 32, generator=gen).to(BF16)
    w_down = (torch.randn(32, 64, generator=gen) / 4).to(BF16)
    preact = torch.randn(300, 64, generator=gen).to(BF16)
    torch.library.opcheck(torch.ops.wsgemm.act_grad.default, (dy, w_down, preact, "gelu"))
    assert variants and variants[-1].epilogue == "dact+gelu"
    with FakeTensorMode():
        got = torch.ops.wsgemm.act_grad(fake_cuda((7, 32), BF16), fake_cuda((32, 24), BF16),
                                        fake_cuda((7, 24), BF16), "silu")  # fmt: skip
        assert got.shape == (7, 24) and got.dtype == BF16
        with pytest.raises(ValueError, match=r"\(M, I\)"):
            torch.ops.wsgemm.act_grad(fake_cuda((7, 32), BF16), fake_cuda((32, 24), BF16),
                                      fake_cuda((7, 40), BF16), "silu")  # fmt: skip


@pytest.mark.parametrize("rows, biased", [(2048, True), (5, False)])
def test_opcheck_of_the_linear_preact_op(monkeypatch, rows, biased):
    """``torch.ops.wsgemm.linear_preact`` (``h`` and its pre-activation, the plain MLP's
    forward): schema, the fake implementation against the CPU stand-in, dynamic shapes; the
    fake's checks. (Small problems: the product, then torch's activation; which products one
    preact kernel runs: tests/api/test_act_grad.py.)"""
    install_act_grad(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 32, generator=gen).to(BF16)
    w_up = (torch.randn(64, 32, generator=gen) / 4).to(BF16)
    bias = torch.randn(64, generator=gen).to(BF16) if biased else None
    torch.library.opcheck(torch.ops.wsgemm.linear_preact.default, (x, w_up, "gelu", bias))
    h, pre = torch.ops.wsgemm.linear_preact(x, w_up, "gelu", bias)
    want = x.double() @ w_up.double().t() + (0 if bias is None else bias.double())
    assert close(pre, want, BF16, 32) and close(h, torch_activation("gelu", want), BF16, 32)
    with FakeTensorMode():
        h, pre = torch.ops.wsgemm.linear_preact(fake_cuda((7, 32), BF16),
                                                fake_cuda((24, 32), BF16), "silu")  # fmt: skip
        assert h.shape == pre.shape == (7, 24) and h.dtype == pre.dtype == BF16
        with pytest.raises(ValueError, match=r"\(M, K\) and \(I, K\)"):
            torch.ops.wsgemm.linear_preact(fake_cuda((7, 32), BF16), fake_cuda((24, 40), BF16),
                                           "silu")  # fmt: skip


def test_compile_of_the_mlp_training_step():
    """``mlp.mlp`` compiled with autograd (meta tensors): the forward one ``linear_preact`` (h
    and its pre-activation) and down's product; the backward one
    ``act_grad`` (the activation's gradient fused into ``dy @ w_down``) and three products
    (dx, the two weights' gradients): no elementwise pass over ``dh`` in the graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from wsgemm.mlp import mlp

    torch._dynamo.reset()
    fw, bw = [], []

    def boxed(graphs):
        return lambda gm, example_inputs: make_boxed_func(capture(graphs)(gm, example_inputs))

    backend = aot_autograd(fw_compiler=boxed(fw), bw_compiler=boxed(bw))
    fn = torch.compile(mlp, backend=backend, fullgraph=True)
    x = torch.empty(2, 5, 32, dtype=BF16, device="meta", requires_grad=True)
    w_up = torch.empty(48, 32, dtype=BF16, device="meta", requires_grad=True)
    b_up = torch.empty(48, dtype=BF16, device="meta", requires_grad=True)
    w_d = torch.empty(32, 48, dtype=BF16, device="meta", requires_grad=True)
    y = fn(x, w_up, b_up, w_d, None, "gelu_tanh")
    assert y.shape == (2, 5, 32) and y.dtype == BF16
    y.sum().backward()
    assert len(ops_in(fw[0], "wsgemm.linear_preact.default")) == 1
    assert len(ops_in(fw[0], MATMUL)) == 1  # down
    assert len(ops_in(bw[0], "wsgemm.act_grad.default")) == 1
    assert len(ops_in(bw[0], MATMUL)) == 3
    assert x.grad.shape == x.shape and w_up.grad.shape == w_up.shape
    assert b_up.grad.shape == b_up.shape and w_d.grad.shape == w_d.shape


@pytest.fixture
def fused_training(monkeypatch):
    """``MLP``'s fused training step on the CPU: matmul's core a float64 stand-in, the dact
    kernel on and run by the CPU stand-in of its contract. Returns its compiled variants."""
    install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "_fuses_act_grad", lambda x: True)
    return install_act_grad(monkeypatch)


def _mlp_reference(mlp, x, grad):
    """Every gradient of the step in float64 (torch's formula)."""
    return float64_mlp_step(
        mlp, x, grad, "up_proj", lambda pre: torch_activation(mlp.activation, pre)
    )


@pytest.mark.parametrize("act, bias", [("gelu", True), ("gelu_tanh", False), ("relu2", True)])
def test_an_mlp_trains_with_the_activation_s_gradient_fused(fused_training, bias, act):
    """Where the plain MLP's kernels run, ``MLP``'s training step is ``mlp.mlp``: its forward
    the up projection's kernel storing ``h`` and the pre-activation (on the cooperative tile
    the policy picks at 1024 tokens), its backward the dact kernel (``dpre`` from ``d_out @
    w_down`` and the saved pre-activation), then dx, dW and the biases' sums; every gradient
    against float64, an N-D input folded."""
    torch.manual_seed(3)
    mlp = wnn.MLP(512, 2048, activation=act, bias=bias, dtype=BF16)
    x = torch.randn(2, 512, 512, dtype=BF16, requires_grad=True)
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_MLPBackward"
    grad = torch.randn_like(out)
    out.backward(grad)
    prefix = "bias_col+" if bias else ""
    assert [v.epilogue for v in fused_training] == [f"{prefix}preact+{act}", f"dact+{act}"]
    want_out, want = _mlp_reference(mlp, x, grad)
    assert (out.double() - want_out).abs().max() <= 0.02 * want_out.abs().max()
    for name, got in [("x", x.grad), *((n, q.grad) for n, q in mlp.named_parameters())]:
        assert got is not None and got.shape == want[name].shape, name
        err = (got.double() - want[name]).abs().max().item()
        assert err <= 0.02 * want[name].abs().max().item() + 1e-3, name


def test_an_mlp_infers_through_its_fused_up_projection(monkeypatch):
    """Without a gradient the up projection is one ``wsgemm.linear`` with the module's
    activation (fused into its GEMM's epilogue with the bias); on the CPU the layers fall back
    to torch with the same values."""
    stub = install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    torch.manual_seed(6)
    mlp = wnn.MLP(64, 96, activation="gelu_tanh", dtype=BF16)
    assert mlp.activation == "gelu_tanh" and mlp.up_proj.activation is None
    x = torch.randn(4, 64, dtype=BF16)
    with torch.no_grad():
        got = mlp(x).double()
    assert len(stub.calls) == 2
    monkeypatch.undo()
    with torch.no_grad():
        torch_road = mlp(x).double()  # CPU tensors: torch's F.linear, then the activation
    want, _ = _mlp_reference(mlp, x, torch.zeros(4, 64))
    for y in (got, torch_road):
        assert (y - want.detach()).abs().max() <= 0.02 * want.abs().max()


def test_an_mlp_step_keeps_the_module_road_where_it_would_change_behaviour(fused_training):
    """A hook on a projection (the fused step bypasses its forward), no gradient to compute,
    or a double backward: the module's own road runs the hook; with create_graph the step's
    backward differentiates torch's formula on the saved inputs (a second derivative that
    reaches x, against float64)."""
    torch.manual_seed(4)
    mlp = wnn.MLP(64, 96, activation="gelu", dtype=BF16)
    x = torch.randn(3, 64, dtype=BF16, requires_grad=True)
    for layer in (mlp.up_proj, mlp.down_proj):
        seen = []
        handle = layer.register_forward_hook(lambda *a, seen=seen: seen.append(1))
        mlp(x).sum().backward()
        assert seen == [1] and not fused_training
        handle.remove()
    with torch.no_grad():
        assert not mlp._trains_fused(x)
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_MLPBackward"
    (gx,) = torch.autograd.grad(out.float().pow(2).sum(), x, create_graph=True)
    x.grad = None
    gx.float().pow(2).sum().backward()  # a second derivative, through the step's formula
    x64 = x.detach().double().requires_grad_()
    w = {n: q.detach().double() for n, q in mlp.named_parameters()}
    pre = x64 @ w["up_proj.weight"].T + w["up_proj.bias"]
    out64 = torch_activation("gelu", pre) @ w["down_proj.weight"].T + w["down_proj.bias"]
    (g64,) = torch.autograd.grad(out64.pow(2).sum(), x64, create_graph=True)
    g64.pow(2).sum().backward()
    err = (x.grad.double() - x64.grad).abs().max().item()
    assert err <= 0.05 * x64.grad.abs().max().item() + 1e-3


@pytest.mark.parametrize(
    "families, capability, fuses",
    [("on", (9, 0), True), ("on", (8, 0), False), ("off", (9, 0), False)],
)
def test_the_fused_step_runs_where_a_dact_kernel_does(monkeypatch, families, capability, fuses):
    """``MLP``'s fused training step needs a GPU whose kernels fuse the activation's
    gradient: Hopper with ``DACT_FAMILIES`` on; CPU tensors never."""
    from wsgemm.host import registry
    from wsgemm.host.dispatch import DISPATCHER, StandInDevices

    on = registry.EPILOGUE_FAMILIES if families == "on" else frozenset()
    monkeypatch.setattr(registry, "DACT_FAMILIES", on)
    monkeypatch.setattr(DISPATCHER, "devices", StandInDevices(capability, 132))
    with FakeTensorMode():
        assert wnn._fuses_act_grad(fake_cuda((4, 8))) == fuses
    assert not wnn._fuses_act_grad(torch.zeros(4, 8))


def test_mlp_is_public_and_refuses_no_activation():
    assert wsgemm.nn.MLP is wnn.MLP
    with pytest.raises(ValueError, match="needs an activation"):
        wnn.MLP(8, 16, activation=None)
    from wsgemm.mlp import mlp

    with pytest.raises(ValueError, match="needs an activation"):
        mlp(torch.zeros(2, 8), torch.zeros(16, 8), None, torch.zeros(8, 16), None, None)


def test_a_step_without_the_fused_kernel_recomputes_no_product(monkeypatch):
    """Where no kernel fuses the gradient, a training step is torch's MLP on wsgemm's products:
    up_proj's product, torch's activation (which autograd saves), down; its backward four
    products (dh, dx, both weights'), none to recompute the pre-activation; float64's
    gradients."""
    stub = install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "_fuses_act_grad", lambda x: False)
    torch.manual_seed(8)
    mlp = wnn.MLP(64, 96, activation="gelu", dtype=BF16)
    x = torch.randn(2, 3, 64, dtype=BF16, requires_grad=True)
    out = mlp(x)
    assert len(stub.calls) == 2 and stub.calls[0][1].shape == (64, 96)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert len(stub.calls) == 2 + 4
    want_out, want = _mlp_reference(mlp, x, grad)
    assert (out.double() - want_out).abs().max() <= 0.02 * want_out.abs().max()
    for name, got in [("x", x.grad), *((n, q.grad) for n, q in mlp.named_parameters())]:
        err = (got.double() - want[name]).abs().max().item()
        assert err <= 0.02 * want[name].abs().max().item() + 1e-3, name


def test_mlp_on_cpu_tensors_is_torch_s_formula():
    """``mlp.mlp`` on tensors wsgemm's kernels do not take (CPU): torch's formula, its forward
    and backward (the fused step's op would refuse a CPU gradient); float64's gradients."""
    from wsgemm.mlp import mlp

    torch.manual_seed(2)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    w_up, w_d = torch.randn(32, 16, dtype=torch.float64), torch.randn(16, 32, dtype=torch.float64)
    b_up = torch.randn(32, dtype=torch.float64, requires_grad=True)
    out = mlp(x, w_up, b_up, w_d, None, "relu2")
    assert type(out.grad_fn).__name__ != "_MLPBackward"
    out.sum().backward()
    x64 = x.detach().clone().requires_grad_()
    b64 = b_up.detach().clone().requires_grad_()
    (torch_activation("relu2", x64 @ w_up.T + b64) @ w_d.T).sum().backward()
    assert torch.allclose(x.grad, x64.grad) and torch.allclose(b_up.grad, b64.grad)


def test_restore_linear_keeps_the_mlp_s_activation(monkeypatch):
    """The module holds its activation: with its layers restored to ``nn.Linear`` (or replaced
    by a subclass, or hooked) the forward is still ``down(act(up(x)))``; the ``state_dict`` is
    two ``nn.Linear``s'; ``print`` names the activation."""
    torch.manual_seed(9)
    mlp = wnn.MLP(16, 32, activation="relu", dtype=torch.float64)
    x = torch.randn(3, 16, dtype=torch.float64)
    want = mlp(x)
    assert sorted(mlp.state_dict()) == [
        "down_proj.bias", "down_proj.weight", "up_proj.bias", "up_proj.weight",
    ]  # fmt: skip
    assert "activation='relu'" in repr(mlp)
    wnn.restore_linear(mlp)
    assert type(mlp.up_proj) is torch.nn.Linear
    assert torch.equal(mlp(x), want)
    stub = install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    half = mlp.to(BF16)
    wnn.replace_linear(half)
    assert type(half.up_proj) is wnn.Linear
    got = half(x.to(BF16))
    assert len(stub.calls) == 2 and (got.double() - want).abs().max() <= 0.02 * want.abs().max()


def test_compile_mlp_fullgraph_with_dynamic_shapes():
    """One graph of two wsgemm ops (the up projection with its bias and activation fused, then
    down_proj's product), which a new token count reuses."""
    torch._dynamo.reset()
    graphs = []
    with FakeTensorMode():
        mlp = wnn.MLP(32, 64, activation="gelu_tanh", device="meta")
        for lin, shape in ((mlp.up_proj, (64, 32)), (mlp.down_proj, (32, 64))):
            lin.weight = torch.nn.Parameter(fake_cuda(shape, BF16), False)
            lin.bias = torch.nn.Parameter(fake_cuda((shape[0],), BF16), False)
        fn = torch.compile(mlp, backend=capture(graphs), fullgraph=True, dynamic=True)
        for tokens in (5, 9):
            y = fn(fake_cuda((2, tokens, 32), BF16))
            assert y.shape == (2, tokens, 32) and y.dtype == BF16
    assert len(graphs) == 1, "recompiled for a new token count"
    first, second = ops_in(graphs[0], MATMUL)
    assert "gelu_tanh" in (*first.args, *first.kwargs.values())
