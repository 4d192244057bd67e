"""``wsgemm.matmul(a, b, c=, alpha=, beta=)`` above the core, without a GPU (issue #25's
residual): torch.addmm's meaning with any number of batch dimensions (``c`` broadcast, folded
with the result, ``out=c`` handed to the core as its own output), gradients of a, b, c and the
bias on both eager roads against float64, the registered op's fake shapes, ``opcheck`` and a
fullgraph compile, and the errors. The core is the CPU stand-in of tests/op_helpers.py."""

import pytest
import torch
from op_helpers import addmm_reference as reference
from op_helpers import fake_cuda, install
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm import ops
from wsgemm.api.epilogue import torch_activation

F16, BF16 = torch.float16, torch.bfloat16


def rand(shape, seed, dtype=BF16):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def close(got, want, k):
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * (1 + k) ** 0.5)


CASES = [
    # (a, b, c): c's shape broadcasts to torch.matmul's result
    ((5, 7), (7, 6), (5, 6)),
    ((5, 7), (7, 6), (6,)),
    ((2, 5, 7), (7, 6), (2, 5, 6)),
    ((2, 5, 7), (7, 6), (5, 1)),
    ((2, 3, 5, 7), (3, 7, 6), (2, 3, 5, 6)),
    ((2, 3, 5, 7), (3, 7, 6), (1, 3, 1, 6)),
    ((7,), (7, 6), (6,)),
    ((5, 7), (7,), (5,)),
]


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
@pytest.mark.parametrize("sa, sb, sc", CASES)
def test_forward_matches_addmm(monkeypatch, fast, sa, sb, sc):
    install(monkeypatch, fast=fast)
    a, b, c = rand(sa, 0), rand(sb, 1), rand(sc, 2)
    got = wsgemm.matmul(a, b, c=c, alpha=0.5, beta=-2.0)
    close(got, reference(a, b, c, 0.5, -2.0), sa[-1])
    assert got.shape == torch.matmul(a, b).shape and got.dtype == BF16


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_out_c_is_the_cores_in_place_residual(monkeypatch, fast):
    core = install(monkeypatch, fast=fast)
    a, b = rand((2, 3, 5, 7), 0), rand((3, 7, 6), 1)
    out = rand((2, 3, 5, 6), 2)
    want = reference(a, b, out, 1.0, 1.0)
    assert wsgemm.matmul(a, b, c=out, out=out) is out
    close(out, want, 7)
    _, _, core_out = core.calls[-1]
    assert core_out.data_ptr() == out.data_ptr()  # folded: the core's output is out itself


@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_gradients_of_a_b_c_and_the_bias(monkeypatch, fast):
    install(monkeypatch, fast=fast)
    a = rand((2, 5, 16), 0).requires_grad_()
    b = rand((16, 8), 1).requires_grad_()
    c = rand((5, 8), 2).requires_grad_()
    bias = rand((8,), 3).requires_grad_()
    y = wsgemm.matmul(a, b, c=c, alpha=1.5, beta=0.5, bias=bias, activation="gelu_tanh")
    grad = rand(y.shape, 4)
    got = torch.autograd.grad(y, (a, b, c, bias), grad)
    leaves = [t.detach().double().requires_grad_() for t in (a, b, c, bias)]
    want = reference(*leaves[:3], 1.5, 0.5, leaves[3], "gelu_tanh")
    wants = torch.autograd.grad(want, leaves, grad.double())
    close(y, want, 16)
    for g, w, leaf in zip(got, wants, (a, b, c, bias), strict=True):
        assert g.shape == leaf.shape and g.dtype == leaf.dtype
        close(g, w, 16)


def test_the_registered_op_differentiates_c_and_alpha(monkeypatch):
    install(monkeypatch)
    a, b = rand((5, 16), 0).requires_grad_(), rand((16, 8), 1).requires_grad_()
    c = rand((5, 8), 2).requires_grad_()
    y = torch.ops.wsgemm.matmul(a, b, c=c, alpha=2.0, beta=-1.0, activation="silu")
    grad = rand(y.shape, 4)
    got = torch.autograd.grad(y, (a, b, c), grad)
    leaves = [t.detach().double().requires_grad_() for t in (a, b, c)]
    want = reference(*leaves, 2.0, -1.0, None, "silu")
    for g, w in zip(got, torch.autograd.grad(want, leaves, grad.double()), strict=True):
        close(g, w, 16)


def test_fake_shapes_and_opcheck(monkeypatch):
    install(monkeypatch)
    with FakeTensorMode():
        a, b = fake_cuda((2, 5, 16)), fake_cuda((16, 8))
        out = torch.ops.wsgemm.matmul(a, b, c=fake_cuda((8,)), alpha=2.0)
        assert out.shape == (2, 5, 8) and out.dtype == F16
        with pytest.raises(ValueError, match="does not broadcast"):
            torch.ops.wsgemm.matmul(a, b, c=fake_cuda((3, 8)))
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    a, b, c = (rand(s, i, F16).requires_grad_() for i, s in enumerate([(5, 16), (16, 8), (5, 8)]))
    torch.library.opcheck(torch.ops.wsgemm.matmul.default, (a, b), dict(c=c, alpha=2.0, beta=0.5))
    a, b, c = a.detach(), b.detach(), c.detach()
    out = torch.empty(5, 8, dtype=F16)
    torch.library.opcheck(torch.ops.wsgemm.matmul_out.default, (a, b, out), dict(c=c, beta=3.0))


def test_compile_fullgraph_holds_the_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, w, r):
        return wsgemm.matmul(x, w, c=r, alpha=0.5)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    with FakeTensorMode():
        compiled(fake_cuda((4, 16)), fake_cuda((16, 8)), fake_cuda((4, 8)))
    nodes = [n for g in graphs for n in g.graph.nodes if "wsgemm.matmul" in str(n.target)]
    assert len(nodes) == 1 and 0.5 in (*nodes[0].args, *nodes[0].kwargs.values())


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(c=rand((5, 8), 2), alpha=True), TypeError, "alpha must be a real number"),
        (dict(c=[1.0]), TypeError, "c must be a torch.Tensor"),
        (dict(c=rand((5, 8), 2, F16)), TypeError, "output's dtype"),
        (dict(c=rand((4, 8), 2)), ValueError, "does not broadcast"),
    ],
)
@pytest.mark.parametrize("fast", [False, True], ids=["op", "fast"])
def test_bad_input_raises(monkeypatch, fast, kw, exc, words):
    install(monkeypatch, fast=fast)
    with pytest.raises(exc, match=words):
        wsgemm.matmul(rand((5, 16), 0), rand((16, 8), 1), **kw)


def test_out_with_c_refuses_autograd(monkeypatch):
    install(monkeypatch, fast=True)
    c = rand((5, 8), 2).requires_grad_()
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        wsgemm.matmul(rand((5, 16), 0), rand((16, 8), 1), c=c, out=torch.empty(5, 8, dtype=BF16))


@pytest.mark.parametrize(
    "in_dims, c_shape",
    [
        ((None, None, 0), (3, 5, 6)),  # only c mapped: a batch of results from one product
        ((None, None, 0), (5, 6)),  # 5 samples of (6,): along the samples, not the rows
        ((0, None, 0), (4, 6)),
        ((0, None, None), (5, 6)),
    ],
)
def test_vmap_with_c(monkeypatch, in_dims, c_shape):
    install(monkeypatch)
    a0, b = rand((5, 7), 0), rand((7, 6), 1)
    samples = c_shape[0] if in_dims[2] == 0 else 4
    a = torch.stack([a0 + i for i in range(samples)]) if in_dims[0] == 0 else a0
    c = rand(c_shape, 2)

    def f(x, y, r):
        return wsgemm.matmul(x, y, c=r, alpha=0.5, beta=2.0)

    got = torch.vmap(f, in_dims=in_dims)(a, b, c)
    want = torch.stack([
        reference(a[i] if in_dims[0] == 0 else a, b, c[i] if in_dims[2] == 0 else c, 0.5, 2.0)
        for i in range(samples)
    ])  # fmt: skip
    assert got.shape == want.shape
    close(got, want, 7)


def test_the_gradient_road_checks_the_bias(monkeypatch):
    install(monkeypatch, fast=True)
    a = rand((5, 16), 0).requires_grad_()
    with pytest.raises(TypeError, match="bias has dtype"):
        wsgemm.matmul(a, rand((16, 8), 1), alpha=2.0, bias=torch.zeros(8))


def test_alpha_scales_a_product_too_large_for_the_output_on_the_gradient_road(monkeypatch):
    install(monkeypatch, fast=True)
    a = torch.full((4, 256), 16.0, dtype=F16).requires_grad_()
    y = wsgemm.matmul(a, torch.full((256, 4), 16.0, dtype=F16), alpha=0.5)
    assert torch.equal(y, torch.full((4, 4), 32768.0, dtype=F16))


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu2"])
def test_exact_is_torchs_activation_of_the_rounded_product(monkeypatch, act):
    """``exact=True``: bit for bit torch's activation applied to ``matmul``'s output (the
    core, here the CPU stand-in, never sees the activation)."""
    core = install(monkeypatch)
    seen = []
    stub = core.__call__

    def recording(*args, activation=None, **kwargs):
        seen.append(activation)
        return stub(*args, activation=activation, **kwargs)

    monkeypatch.setattr(ops.api, "matmul", recording)
    x, w, bias = rand((2, 5, 16), 0), rand((8, 16), 1), rand((8,), 2)
    got = wsgemm.linear(x, w, bias, activation=act, exact=True)
    assert torch.equal(got, torch_activation(act, wsgemm.linear(x, w, bias)))
    out = torch.empty(2, 5, 8, dtype=BF16)
    assert wsgemm.matmul(x, w.t(), bias=bias, activation=act, exact=True, out=out) is out
    assert torch.equal(out, got) and set(seen) == {None}
    y = wsgemm.gated_linear(x, rand((16, 16), 3), act, exact=True)
    both = wsgemm.matmul(x, rand((16, 16), 3).t())
    assert torch.equal(y, torch_activation(act, both[..., :8]) * both[..., 8:])


def test_exact_must_be_a_bool_and_bad_operands_keep_their_typed_errors(monkeypatch):
    install(monkeypatch)
    x, w = rand((5, 16), 0), rand((16, 16), 1)
    with pytest.raises(TypeError, match="exact must be a bool"):
        wsgemm.matmul(x, w, activation="silu", exact="no")
    with pytest.raises(TypeError, match="exact must be a bool"):
        wsgemm.gated_linear(x, w, "silu", exact=1)
    for exact in (False, True):
        with pytest.raises(TypeError, match="input must be a torch.Tensor, got list"):
            wsgemm.gated_linear([[1.0] * 16], w, "silu", exact=exact)


def test_exact_with_gradients_is_torchs_unfused_path(monkeypatch):
    """``exact=True`` with autograd: the forward and the gradients of torch's own activation
    applied to the product (here the CPU stand-in's, rounded as the core rounds)."""
    install(monkeypatch, fast=True)
    x = rand((3, 16), 0).requires_grad_()
    w = rand((8, 16), 1).requires_grad_()
    bias = rand((8,), 2).requires_grad_()
    y = wsgemm.linear(x, w, bias, activation="gelu_tanh", exact=True)
    grad = rand(y.shape, 3)
    got = torch.autograd.grad(y, (x, w, bias), grad)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, bias)]
    product = wsgemm.linear(*leaves)  # the same stand-in product, then torch's activation
    want = torch_activation("gelu_tanh", product)
    assert torch.equal(y, want)
    for g, ref in zip(got, torch.autograd.grad(want, leaves, grad), strict=True):
        assert torch.equal(g, ref)
