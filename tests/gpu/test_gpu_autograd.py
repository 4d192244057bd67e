"""GPU: wsgemm inside a model. Forward and backward against a float64 reference with the rule of
test_gpu_correctness.py (at most twice the error torch itself makes with the same dtypes, plus a
small eps), opcheck, torch.compile (fullgraph, dynamic, reduce-overhead), CUDA-graph capture of
the eager road, autocast, vmap, and the transformer MLP block of docs/torch.md through
replace_linear, eager and compiled."""

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from operands import assert_within_torch_error, fp32_accumulation_bound, make
from torch import nn

import wsgemm
from wsgemm import ops

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def assert_within(what, got, theirs, ref, accumulation_bound=0.0):
    """``got``'s largest error against ``ref`` is at most twice ``theirs``' (torch, same dtypes)
    plus eps (plus ``accumulation_bound``, see ``operands.fp32_accumulation_bound``)."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if ref.numel() == 0:
        return
    assert_within_torch_error(got, ref, theirs, what, slack=accumulation_bound)


def torch_fp32_out(a, b):
    """torch.matmul(a, b) by PyTorch's own half-precision GEMM with an fp32 output
    (``aten::bmm.dtype``): the same inputs, tensor cores and fp32 accumulators as ours. An fp32
    SGEMM of the same values (``a.float() @ b.float()``) sums more exactly than any tensor-core
    GEMM, so it is not "PyTorch's error for the same dtypes" (it failed K = 1000 here)."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = a2.expand(*batch, *a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
    b3 = b2.expand(*batch, *b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
    out = torch.bmm(a3, b3, out_dtype=F32).reshape(*batch, a3.shape[-2], b3.shape[-1])
    if a.dim() == 1:
        out = out.squeeze(-2)
    if b.dim() == 1:
        out = out.squeeze(-1)
    return out


def forward_backward(fn, a, b, grad):
    """``fn(a, b)`` and its gradients for ``grad``, on fresh leaves with ``a``'s and ``b``'s
    values and strides."""
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    out = fn(a, b)
    return (out, *torch.autograd.grad(out, (a, b), grad))


# ----------------------------------------------------------------------------- random cases

# (a's batch, b's batch, a is 1-D, b is 1-D)
PATTERNS = [
    ((), (), False, False),
    ((3,), (), False, False),
    ((), (3,), False, False),
    ((3,), (3,), False, False),
    ((1,), (4,), False, False),
    ((4,), (1,), False, False),
    ((2, 3), (2, 3), False, False),
    ((2, 1), (1, 3), False, False),
    ((2, 3), (), False, False),
    ((), (2, 1, 3), False, False),
    ((), (), True, False),
    ((), (), False, True),
    ((), (2, 3), True, False),
    ((), (), True, True),
    ((3,), (), False, True),
]
DIMS = [1, 7, 16, 33, 64, 100, 128, 257]
CASES = 60


def _case(index: int) -> dict:
    rng = random.Random(1000 + index)
    a_batch, b_batch, a_vec, b_vec = PATTERNS[index % len(PATTERNS)]
    m, n, k = rng.choice(DIMS), rng.choice(DIMS), rng.choice([*DIMS, 512, 1000])
    return dict(
        a_shape=(k,) if a_vec else (*a_batch, m, k),
        b_shape=(k,) if b_vec else (*b_batch, k, n),
        dtype=rng.choice([F16, BF16]),
        out_dtype=rng.choice([None, None, F32]),
        cols=(rng.random() < 0.5, rng.random() < 0.5),
        offset=rng.choice([0, 0, 8, 3]),
        pad=rng.choice([0, 0, 8, 5]),
    )


def _operand(shape, dtype, col, case, gen):
    if len(shape) == 1:  # a strided 1-D view with an offset
        off = case["offset"]
        return torch.randn(shape[0] + off, generator=gen).to(dtype).cuda()[off:]
    return make(
        shape, dtype, "cuda", col_major=col, offset=case["offset"], pad=case["pad"], gen=gen
    )


@pytest.mark.parametrize("index", range(CASES))
def test_forward_and_backward_random_case(index):
    case = _case(index)
    gen = torch.Generator().manual_seed(index)
    dtype, out_dtype = case["dtype"], case["out_dtype"]
    a = _operand(case["a_shape"], dtype, case["cols"][0], case, gen)
    b = _operand(case["b_shape"], dtype, case["cols"][1], case, gen)
    want_dtype = out_dtype or dtype
    out_shape = torch.matmul(a.detach().double(), b.detach().double()).shape
    grad = torch.randn(out_shape, generator=gen).to(want_dtype).cuda()

    torch.full((grad.numel() + 4096,), float("nan"), dtype=want_dtype, device="cuda")  # poison
    got = forward_backward(lambda x, y: wsgemm.matmul(x, y, out_dtype=out_dtype), a, b, grad)
    ref = forward_backward(torch.matmul, a.double(), b.double(), grad.double())
    # torch with the same dtypes and the documented rule: an fp32 gradient is rounded to the
    # input dtype before the backward products
    _, torch_ga, torch_gb = forward_backward(torch.matmul, a, b, grad.to(dtype))
    torch_out = torch_fp32_out(a, b) if out_dtype == F32 else torch.matmul(a, b)

    assert got[0].dtype == want_dtype and got[1].dtype == got[2].dtype == dtype
    assert not any(torch.isnan(t).any() for t in got), "unwritten (poisoned) output elements"
    bound = fp32_accumulation_bound(a, b) if out_dtype == F32 else 0.0
    for what, ours, theirs, exact in zip(
        ("out", "dA", "dB"), got, (torch_out, torch_ga, torch_gb), ref, strict=True
    ):
        assert_within(what, ours, theirs, exact, bound if what == "out" else 0.0)


def test_plain_cuda_tensors_never_reach_the_dispatcher(monkeypatch):
    def dispatcher(*args, **kwargs):
        raise AssertionError("a plain CUDA call took the dispatcher road")

    monkeypatch.setattr(ops, "_MATMUL", dispatcher)
    monkeypatch.setattr(ops, "_MATMUL_OUT", dispatcher)
    gen = torch.Generator().manual_seed(5)
    x = make((2, 3, 64, 32), F16, "cuda", gen=gen).requires_grad_()
    w = nn.Parameter(make((48, 32), F16, "cuda", gen=gen))
    grad = make((2, 3, 64, 48), F16, "cuda", gen=gen)
    y = wsgemm.linear(x, w)
    assert type(y.grad_fn).__name__ == "_MatmulBackward"
    y.backward(grad)  # the backward's products take the fast road too
    ref = forward_backward(F.linear, x.double(), w.double(), grad.double())
    theirs = forward_backward(F.linear, x, w, grad)
    for what, ours, t, r in zip(("out", "dX", "dW"), (y, x.grad, w.grad), theirs, ref, strict=True):
        assert_within(what, ours, t, r)
    assert w.grad.is_contiguous()  # computed in the weight's layout
    out = torch.empty(2, 3, 64, 48, dtype=F16, device="cuda")
    with torch.no_grad():
        assert wsgemm.matmul(x, w.t(), out=out) is out
    assert torch.equal(out, y)
    with torch.autocast("cuda", dtype=BF16):
        assert wsgemm.matmul(x.float(), w.t().float()).dtype == BF16


# ----------------------------------------------------------------------------- torch's checks


@pytest.mark.parametrize(
    "sa, sb, kw",
    [
        ((64, 32), (32, 48), {}),
        ((2, 3, 40, 32), (3, 32, 24), {"out_dtype": F32}),
        ((32,), (2, 32, 16), {}),
        ((5, 33, 17), (17,), {"backend": "auto"}),
    ],
)
def test_opcheck(sa, sb, kw):
    """torch's checks of the registration: schema, autograd registration, fake vs real output,
    AOTAutograd with dynamic shapes, gradients included (so the inputs require grad)."""
    gen = torch.Generator().manual_seed(len(sa) + len(sb))
    a = torch.randn(sa, generator=gen).to(F16).cuda().requires_grad_()
    b = torch.randn(sb, generator=gen).to(F16).cuda().requires_grad_()
    torch.library.opcheck(torch.ops.wsgemm.matmul.default, (a, b), kw)


def test_opcheck_out():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, 40, 32, generator=gen).to(BF16).cuda()
    b = torch.randn(32, 24, generator=gen).to(BF16).cuda()
    out = torch.empty(2, 3, 40, 24, dtype=F32, device="cuda")
    torch.library.opcheck(torch.ops.wsgemm.matmul_out.default, (a, b, out), {})


# ----------------------------------------------------------------------------- compile, graphs


def _two_layers(x, w1, w2):
    return wsgemm.linear(F.gelu(wsgemm.linear(x, w1)), w2)


def _two_layers_torch(x, w1, w2):
    return F.linear(F.gelu(F.linear(x, w1)), w2)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_dynamic(mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(11)
    w1 = (torch.randn(256, 128, generator=gen) * 0.05).to(BF16).cuda()
    w2 = (torch.randn(128, 256, generator=gen) * 0.05).to(BF16).cuda()
    compiled = torch.compile(_two_layers, fullgraph=True, dynamic=True, mode=mode)
    for m in (48, 200, 48):
        for _ in range(3):  # reduce-overhead: warm-up, record, replay
            x = torch.randn(4, m, 128, generator=gen).to(BF16).cuda()
            got = compiled(x, w1, w2)
            ref = _two_layers_torch(x.double(), w1.double(), w2.double())
            assert_within(f"M={m}", got, _two_layers_torch(x, w1, w2), ref)
    assert counters["stats"]["unique_graphs"] == 1, "recompiled for a new M"
    if mode == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0, "CUDA graphs were skipped"


def test_eager_road_captures_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(13)
    a = make((2, 3, 64, 32), F16, "cuda", gen=gen)
    b = make((32, 48), F16, "cuda", gen=gen)
    out = torch.empty(2, 3, 64, 48, dtype=F16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles) off the capture
        for _ in range(2):
            wsgemm.matmul(a, b)
            wsgemm.matmul(a, b, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = wsgemm.matmul(a, b)
        wsgemm.matmul(a, b, out=out)
    a.copy_(make((2, 3, 64, 32), F16, "cuda", gen=gen))
    graph.replay()
    torch.cuda.synchronize()
    want = wsgemm.matmul(a, b)
    assert torch.equal(y, want) and torch.equal(out, want)


# ----------------------------------------------------------------------------- autocast, vmap


@pytest.mark.parametrize("compiled", [False, True])
def test_autocast_matches_torch(compiled):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(4, 64, 128, generator=gen).cuda()  # fp32, as a model's activations
    w = torch.randn(96, 128, generator=gen).cuda() * 0.1  # fp32 parameters
    bias = torch.randn(96, generator=gen).cuda()
    grad = torch.randn(4, 64, 96, generator=gen).to(BF16).cuda()

    def run(fn, *args):
        leaves = [t.detach().requires_grad_() for t in args]
        with torch.autocast("cuda", dtype=BF16):
            out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad.to(out.dtype)))

    fn = torch.compile(wsgemm.linear, fullgraph=True) if compiled else wsgemm.linear
    got = run(fn, x, w, bias)
    theirs = run(F.linear, x, w, bias)
    ref = run(F.linear, x.double(), w.double(), bias.double())  # fp64 is never autocast
    assert got[0].dtype == theirs[0].dtype == BF16
    assert [g.dtype for g in got[1:]] == [F32, F32, F32]
    for what, ours, t, r in zip(("out", "dX", "dW", "db"), got, theirs, ref, strict=True):
        assert_within(what, ours, t, r)


def test_vmap_matches_torch():
    gen = torch.Generator().manual_seed(19)
    a = make((5, 64, 32), F16, "cuda", gen=gen)
    b = make((5, 32), F16, "cuda", gen=gen)
    got = torch.vmap(wsgemm.matmul)(a, b)
    assert_within(
        "vmap",
        got,
        torch.vmap(torch.matmul)(a, b),
        torch.matmul(a.double(), b.double().unsqueeze(-1)).squeeze(-1),
    )


# ----------------------------------------------------------------------------- the MLP block


class MLPBlock(nn.Module):
    """A pre-norm transformer MLP block (SwiGLU): x + down(silu(gate(x')) * up(x')), x' = norm(x).
    The same as docs/torch.md's worked example."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        gate, up = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


@pytest.mark.parametrize("compiled", [False, True])
def test_mlp_block_through_replace_linear(compiled):
    torch._dynamo.reset()
    torch.manual_seed(23)
    block = MLPBlock(256, 512).cuda()
    ref, theirs, ours = (copy.deepcopy(block).to(dtype) for dtype in (torch.float64, BF16, BF16))
    assert wsgemm.nn.replace_linear(ours) == ["gate_up", "down"]
    x = torch.randn(4, 100, 256, device="cuda")
    grad = torch.randn(4, 100, 256, device="cuda")

    def run(model, dtype):
        inp = x.to(dtype).requires_grad_()
        out = model(inp)
        out.backward(grad.to(dtype))
        return [("out", out), ("dx", inp.grad)] + [
            (name, p.grad) for name, p in model.named_parameters()
        ]

    got = run(torch.compile(ours, fullgraph=True) if compiled else ours, BF16)
    for (what, g), (_, t), (_, r) in zip(
        got, run(theirs, BF16), run(ref, torch.float64), strict=True
    ):
        assert g.dtype == BF16, what
        assert_within(what, g, t, r)
