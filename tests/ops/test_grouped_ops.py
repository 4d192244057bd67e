"""The registered op ``torch.ops.wsgemm.grouped_mm`` without a GPU: ``opcheck`` of the four
forms and the epilogues on the CPU stand-in of the grouped core (tests/op_helpers.py), and
torch.compile (fullgraph, dynamic token counts, AOTAutograd's backward) on fake CUDA and meta
tensors. The core itself is tested in tests/api/test_grouped.py, the kernels in tests/gpu."""

import pytest
import torch
from op_helpers import capture, fake_cuda, install_grouped, ops_in
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm

BF16, F32 = torch.bfloat16, torch.float32
OP = "wsgemm.grouped_mm.default"


def ends(*sizes):
    return torch.tensor(list(torch.tensor(sizes).cumsum(0)), dtype=torch.int32)


def rand(shape, gen):
    return torch.randn(shape, generator=gen).to(BF16)


# (a, b, offs) of each form; N = 20 pads the result's rows (24), the groups leave rows (2D x 3D)
# or columns (3D x 2D) past offs[-1] and an empty group
FORMS = {
    "2d3d": ((10, 16), (3, 16, 20), ends(2, 0, 5)),
    "3d3d": ((3, 5, 16), (3, 16, 20), None),
    "2d2d": ((5, 16), (16, 20), ends(4, 0, 9)),
    "3d2d": ((3, 5, 16), (16, 20), ends(8, 0, 10)),
}


BACKWARD_FORMS = {
    "2d3d": {"2d3d", "2d2d"},
    "3d3d": {"3d3d"},
    "2d2d": {"2d2d", "3d2d", "2d3d"},
    "3d2d": {"3d2d", "2d2d"},
}


@pytest.fixture
def stub(monkeypatch):
    """The grouped core's CPU stand-in: the op's CPU kernel runs it, its fake takes CPU."""
    return install_grouped(monkeypatch)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("form", FORMS)
def test_opcheck_of_each_form(stub, form, grad):
    """torch's own checks of the registration (schema, autograd registration, the fake
    implementation against the CPU kernel's result, shape and strides included, AOTAutograd
    with dynamic shapes, the backward's gradients included where the operands need them)."""
    a_shape, b_shape, offs = FORMS[form]
    gen = torch.Generator().manual_seed(1)
    a = rand(a_shape, gen).requires_grad_(grad)
    b = rand(b_shape, gen).requires_grad_(grad)
    torch.library.opcheck(torch.ops.wsgemm.grouped_mm.default, (a, b, offs), {})
    # the CPU kernel ran the stand-in; with gradients, the backward's dA and dB too: grouped
    # products of these forms (wsgemm/grouped.py's _backward)
    assert set(stub.calls) == (BACKWARD_FORMS[form] if grad else {form})


@pytest.mark.parametrize(
    "kw",
    [
        dict(activation="silu", gated=True),
        dict(activation="relu2", row_scale="bfloat16", out_dtype=F32),
    ],
    ids=["gated", "act-row-scale-fp32-out"],
)
def test_opcheck_of_the_epilogues(stub, kw):
    """The 2D x 3D form's epilogues through the op, its own backward (the product recomputed,
    then the chain rule through the activation, gated unit and row scale) with every input
    needing a gradient, the row scale's included."""
    kw, (a_shape, b_shape, offs) = dict(kw), FORMS["2d3d"]
    gen = torch.Generator().manual_seed(2)
    a = rand(a_shape, gen).requires_grad_()
    b = rand(b_shape, gen).requires_grad_()
    if "row_scale" in kw:
        dtype = getattr(torch, kw["row_scale"])
        kw["row_scale"] = torch.rand(a_shape[0], generator=gen).to(dtype).requires_grad_()
    torch.library.opcheck(torch.ops.wsgemm.grouped_mm.default, (a, b, offs), kw)
    width = b_shape[2] // 2 if kw.get("gated") else b_shape[2]
    out = torch.ops.wsgemm.grouped_mm(a, b, offs, **kw)
    assert out.shape == (a_shape[0], width) and out.dtype == kw.get("out_dtype", BF16)


def _moe(x, w_gate_up, w_down, offs, scale, a3, b2, offs_n):
    """A mixture-of-experts layer's two grouped GEMMs (gated, then row-scaled), a batched one
    (3D x 3D), a weight gradient's (2D x 2D) and a 3D x 2D one."""
    h = wsgemm.grouped_mm(x, w_gate_up.transpose(-2, -1), offs, activation="silu", gated=True)
    y = wsgemm.grouped_mm(h, w_down.transpose(-2, -1), offs, row_scale=scale)
    z = wsgemm.grouped_mm(a3, w_gate_up.transpose(-2, -1))
    dw = wsgemm.grouped_mm(x.t(), y, offs)
    q = wsgemm.grouped_mm(a3, b2, offs_n)
    return y, z, dw, q


def test_compile_fullgraph_with_dynamic_shapes_holds_the_op():
    """Each form is one op in one graph, which a new token count reuses (the fake
    implementation keeps the dimensions symbolic: it once made them ints, which specialised
    every one of them and recompiled for each token count)."""
    torch._dynamo.reset()
    graphs = []
    fn = torch.compile(_moe, backend=capture(graphs), fullgraph=True, dynamic=True)
    groups, k, ffn, hidden = 4, 32, 24, 32
    with FakeTensorMode():
        w_gate_up = fake_cuda((groups, 2 * ffn, k), BF16)
        w_down = fake_cuda((groups, hidden, ffn), BF16)
        offs = fake_cuda((groups,), torch.int32)
        b2 = fake_cuda((k, 56), BF16)
        for m in (40, 72):
            x, scale = fake_cuda((m, k), BF16), fake_cuda((m,), F32)
            a3 = fake_cuda((groups, m, k), BF16)
            y, z, dw, q = fn(x, w_gate_up, w_down, offs, scale, a3, b2, offs)
            assert (y.shape, y.stride(), y.dtype) == ((m, hidden), (hidden, 1), BF16)
            assert z.shape == (groups, m, 2 * ffn) and dw.shape == (groups, k, hidden)
            assert q.shape == (m, 56)
    assert len(graphs) == 1, "recompiled for a new token count"
    assert len(ops_in(graphs[0], OP)) == 5


class _Experts(torch.nn.Module):
    def forward(self, x, w, offs):
        return wsgemm.grouped_mm(x, w.transpose(-2, -1), offs)


def test_torch_export_with_a_dynamic_token_count():
    """torch.export (fake CUDA inputs) keeps the token count dynamic (the int-making fake
    implementation specialised it: "Constraints violated"), and the program takes another."""
    with FakeTensorMode():
        x, w = fake_cuda((64, 32), BF16), fake_cuda((4, 48, 32), BF16)
        offs = fake_cuda((4,), torch.int32)
        tokens = torch.export.Dim("tokens", min=2, max=4096)
        ep = torch.export.export(
            _Experts(), (x, w, offs), dynamic_shapes=({0: tokens}, None, None), strict=False
        )
        assert len(ops_in(ep.graph_module, OP)) == 1
        out = ep.module()(fake_cuda((100, 32), BF16), w, offs)
    assert out.shape == (100, 48) and out.stride() == (48, 1) and out.dtype == BF16


def meta(shape, dtype=BF16):
    # autograd on fake *CUDA* leaves needs a CUDA build; meta tensors take the same op road
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=True)


@pytest.mark.parametrize("form", FORMS)
def test_aot_autograd_graphs_are_grouped_products(form):
    """Compiled with a gradient to compute: the forward graph holds one grouped product, the
    backward graph two (dA and dB), with the operands' shapes."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    torch._dynamo.reset()
    fw, bw = [], []

    def boxed(graphs):
        return lambda gm, example_inputs: make_boxed_func(capture(graphs)(gm, example_inputs))

    backend = aot_autograd(fw_compiler=boxed(fw), bw_compiler=boxed(bw))
    fn = torch.compile(wsgemm.grouped_mm, backend=backend, fullgraph=True)
    a_shape, b_shape, offs = FORMS[form]
    a, b = meta(a_shape), meta(b_shape)
    offs = None if offs is None else offs.to("meta")
    fn(a, b, offs).sum().backward()
    assert len(ops_in(fw[0], OP)) == 1 and len(ops_in(bw[0], OP)) == 2
    assert a.grad.shape == a_shape and b.grad.shape == b_shape
