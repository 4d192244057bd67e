"""``wsgemm.gated_linear`` on CPU tensors: torch's ops, with or without a gradient, as
``matmul`` and ``linear`` fall back under ``backend="auto"`` (``dispatch.CPU_REASON``).
Without a gradient the core's unfused road (the fp32 product and its bias, the unit in fp32,
rounded once), with one the grad road (the product on ``matmul``, the unit in torch); both
against float64, the gradients too. Invalid input keeps its typed errors; ``explain`` names
the CPU; the fake implementation takes CPU tensors as the real one does (torch.compile) and
meta tensors as before; ``nn.GatedMLP`` on the CPU agrees."""

import pytest
import torch

import wsgemm
from wsgemm.api import Dispatcher
from wsgemm.api import gated as core
from wsgemm.api.epilogue import torch_activation
from wsgemm.host import dispatch as host_dispatch

F16, BF16 = torch.float16, torch.bfloat16
ACTS = ["silu", "gelu", "gelu_tanh", "relu", "relu2"]


@pytest.fixture(autouse=True)
def cuda_dispatcher(monkeypatch):
    """A fresh dispatcher of CUDA devices (none here, or this machine's GPU): CPU tensors are
    on the host there, as in a process on a GPU machine."""
    d = Dispatcher()
    assert d.devices.type == "cuda"
    monkeypatch.setattr(host_dispatch, "DISPATCHER", d)
    return d


def reference(x, w, act, bias=None):
    """act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up) in float64, x N-D."""
    y = x.double() @ w.double().T
    if bias is not None:
        y = y + bias.double()
    half = w.shape[0] // 2
    return torch_activation(act, y[..., :half]) * y[..., half:]


def operands(dtype, x_shape=(2, 5, 32), half=24, biased=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = x_shape[-1]
    x = torch.randn(x_shape, generator=gen).to(dtype)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(dtype)
    b = (torch.randn(2 * half, generator=gen) / 4).to(dtype) if biased else None
    return x, w, b


def tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == BF16 else dict(rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("biased", [False, True])
def test_without_a_gradient_cpu_tensors_run_in_torch(act, dtype, biased):
    x, w, b = operands(dtype, biased=biased)
    got = wsgemm.gated_linear(x, w, act, bias=b)
    assert got.shape == (2, 5, 24) and got.dtype == dtype and got.device.type == "cpu"
    torch.testing.assert_close(got.double(), reference(x, w, act, b), **tol(dtype))
    # the unfused road exactly: the fp32 product (and bias), the unit in fp32, rounded once
    y = x.reshape(-1, 32).float() @ w.float().T + (0 if b is None else b.float())
    want = (torch_activation(act, y[:, :24]) * y[:, 24:]).to(dtype).reshape(2, 5, 24)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the op itself, and a second call (the signature's launcher)
    torch.testing.assert_close(torch.ops.wsgemm.gated_linear(x, w, act, b), got, rtol=0, atol=0)
    torch.testing.assert_close(wsgemm.gated_linear(x, w, act, bias=b), got, rtol=0, atol=0)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("biased", [False, True])
def test_with_a_gradient_cpu_tensors_run_in_torch(act, dtype, biased):
    x, w, b = operands(dtype, biased=biased, seed=1)
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    xg, wg, bg = (*leaves, None)[:3]
    got = wsgemm.gated_linear(xg, wg, act, bias=bg)
    assert got.requires_grad and got.dtype == dtype
    torch.testing.assert_close(got.detach().double(), reference(x, w, act, b), **tol(dtype))
    # with and without a gradient: the same values up to the product's rounding
    plain = wsgemm.gated_linear(x, w, act, bias=b)
    torch.testing.assert_close(got.detach().double(), plain.double(), **tol(dtype))
    gen = torch.Generator().manual_seed(2)
    dy = torch.randn(got.shape, generator=gen).to(dtype)
    got.backward(dy)
    ref = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    reference(*ref[:2], act, ref[2] if biased else None).backward(dy.double())
    for mine, want in zip(leaves, ref, strict=True):
        assert mine.grad.dtype == dtype
        scale = want.grad.abs().max().item() or 1.0  # dW and db sum over the 10 rows
        torch.testing.assert_close(mine.grad.double() / scale, want.grad / scale, **tol(dtype))


@pytest.mark.parametrize("biased", [False, True])
def test_a_direct_op_call_with_a_gradient_on_cpu(biased):
    """The op's own backward (the product recomputed on matmul's CPU fallback)."""
    x, w, b = operands(F16, x_shape=(7, 16), half=8, biased=biased, seed=3)
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    got = torch.ops.wsgemm.gated_linear(*leaves[:2], "silu", *leaves[2:])
    torch.testing.assert_close(got.detach().double(), reference(x, w, "silu", b), **tol(F16))
    got.sum().backward()
    ref = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    reference(*ref[:2], "silu", ref[2] if biased else None).sum().backward()
    for mine, want in zip(leaves, ref, strict=True):
        torch.testing.assert_close(mine.grad.double(), want.grad, rtol=2e-2, atol=2e-2)


def test_exact_and_empty_calls_on_cpu():
    x, w, b = operands(BF16, x_shape=(4, 16), half=8)
    got = wsgemm.gated_linear(x, w, "gelu", exact=True, bias=b)
    y = wsgemm.linear(x, w, b)  # exact: torch's unit on the rounded product, bit for bit
    torch.testing.assert_close(got, torch_activation("gelu", y[:, :8]) * y[:, 8:], rtol=0, atol=0)
    assert wsgemm.gated_linear(x[:0], w, "silu").shape == (0, 8)
    empty_k = wsgemm.gated_linear(x[:, :0], w[:, :0], "silu", bias=b)
    want = torch_activation("silu", b[:8].double()) * b[8:].double()
    torch.testing.assert_close(empty_k.double(), want.expand(4, 8), **tol(BF16))


META = torch.device("meta")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "change, exc, words",
    [
        ({"x": torch.float32, "w": torch.float32}, TypeError, "share float16 or bfloat16"),
        ({"w": BF16}, TypeError, "share float16 or bfloat16"),
        ({"b": torch.float32}, TypeError, "bias must be torch.float16"),
        ({"w": META}, ValueError, "weight must be a CPU tensor on x's device, got meta"),
        ({"x": META}, ValueError, "must be a META tensor on x's device, got cpu"),
        ({"b": META}, ValueError, "bias must be on x's device (cpu), got meta"),
        ({"w_rows": 23}, ValueError, "must be (2 * out_features, 16)"),
        ({"w_cols": 15}, ValueError, "must be (2 * out_features, 16)"),
        ({"b_len": 8}, ValueError, "bias (8,) must be (24,)"),
        ({"act": "tanh"}, ValueError, "is not one of"),
        ({"act": 3}, TypeError, "activation must be a str"),
    ],
)  # fmt: skip
def test_invalid_input_raises_typed_errors_on_cpu(grad, change, exc, words):
    x, w, b = operands(F16, x_shape=(3, 16), half=12)
    x, w, b = (t.to(change.get(k, t.dtype)) for k, t in (("x", x), ("w", w), ("b", b)))
    w = w[: change.get("w_rows", w.shape[0]), : change.get("w_cols", w.shape[1])]
    b = b[: change.get("b_len", b.shape[0])]
    x = x.requires_grad_(grad)
    with pytest.raises(exc) as info:
        wsgemm.gated_linear(x, w, change.get("act", "silu"), bias=b)
    assert words in str(info.value), str(info.value)


def test_explain_names_the_cpu(cuda_dispatcher):
    x, w, b = operands(F16, x_shape=(4, 16), half=8)
    text = core.explain(cuda_dispatcher, x, w, "silu", bias=b)
    assert "unfused: the (M, 2I) fp32 product + its bias" in text
    assert "(CPU tensors (wsgemm's kernels run on CUDA GPUs))" in text
    assert "torch.matmul (fallback): CPU tensors" in text
    with pytest.raises(ValueError, match="weight must be a CPU tensor"):
        core.explain(cuda_dispatcher, x, w.to("meta"), "silu")


def test_the_fake_takes_cpu_and_meta_tensors():
    """torch.compile on CPU tensors traces the op through its fake (the real one runs torch);
    meta tensors keep their shapes."""
    torch._dynamo.reset()
    x, w, b = operands(BF16, x_shape=(2, 3, 16), half=8)
    fn = torch.compile(lambda x, w, b: wsgemm.gated_linear(x, w, "silu", bias=b),
                       backend="eager", fullgraph=True)  # fmt: skip
    got = fn(x, w, b)
    torch.testing.assert_close(got, wsgemm.gated_linear(x, w, "silu", bias=b), rtol=0, atol=0)
    meta = torch.ops.wsgemm.gated_linear(x.to("meta"), w.to("meta"), "relu", b.to("meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 3, 8) and meta.dtype == BF16
    with pytest.raises(TypeError, match="x and weight must share"):
        torch.ops.wsgemm.gated_linear(x.to("meta").float(), w.to("meta").float(), "relu")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_on_cpu_agrees_with_gated_linear(grad, bias):
    torch.manual_seed(4)
    mlp = wsgemm.nn.GatedMLP(32, 16, activation="silu", bias=bias, dtype=BF16)
    mlp.requires_grad_(grad)
    x = torch.randn(2, 3, 32).to(BF16)
    got = mlp(x)
    up, down = mlp.gate_up_proj, mlp.down_proj
    h = wsgemm.gated_linear(x, up.weight, "silu", bias=up.bias)
    want = wsgemm.linear(h, down.weight, down.bias)
    torch.testing.assert_close(got.detach().double(), want.detach().double(), **tol(BF16))
    h64 = reference(x, up.weight.detach(), "silu", None if up.bias is None else up.bias.detach())
    ref = h64 @ down.weight.detach().double().T
    if down.bias is not None:
        ref = ref + down.bias.detach().double()
    torch.testing.assert_close(got.detach().double(), ref, rtol=3e-2, atol=3e-2)
    if grad:
        got.sum().backward()
        assert up.weight.grad is not None and down.weight.grad is not None
