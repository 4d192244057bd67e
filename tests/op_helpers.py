"""Helpers for testing wsgemm's torch layer without a GPU: a CPU stand-in for the core, fake
CUDA tensors, CUDA autocast turned on without CUDA."""

import contextlib

import torch

from wsgemm import api, ops
from wsgemm.api.epilogue import torch_activation

HALF = (torch.float16, torch.bfloat16)


class CoreStub:
    """A CPU stand-in for the core (``wsgemm.api.matmul``), so the layer above it (N-D folding,
    the two eager roads, autograd, out=, Linear) runs without a GPU. It holds the core's
    contract: 2-D or 3-D operands of one half dtype, a 3-D batch of 1 broadcast, ``out`` of
    exactly the right shape. It computes in float64, rounds once, and records what it was
    handed."""

    def __init__(self):
        self.calls = []  # (a, b, out) as handed to the core

    def __call__(
        self, a, b, *, out=None, out_dtype=None, accumulate=torch.float32, backend="auto",
        bias=None, activation=None, c=None, alpha=1.0, beta=1.0,
    ):  # fmt: skip
        assert a.dim() in (2, 3) and b.dim() in (2, 3), (a.shape, b.shape)
        assert a.dtype == b.dtype and a.dtype in HALF, (a.dtype, b.dtype)
        if a.dim() == b.dim() == 3:
            assert a.shape[0] == b.shape[0] or 1 in (a.shape[0], b.shape[0])
        self.calls.append((a, b, out))
        result = alpha * torch.matmul(a.double(), b.double())
        if c is not None and beta != 0:  # the core's c: broadcasts to its 2-D or 3-D result
            assert torch.broadcast_shapes(c.shape, result.shape) == result.shape
            result = result + beta * c.double()
        if bias is not None:  # the core's bias forms: (N,), (1, N), (), (M, 1)
            assert bias.dtype == a.dtype and bias.dim() <= 2, (bias.dtype, bias.shape)
            result = result + bias.double()
        result = torch_activation(activation or "none", result)
        if out is None:
            return result.to(out_dtype or a.dtype)
        assert out.shape == result.shape and out_dtype in (None, out.dtype)
        out.copy_(result)
        return out


def addmm_reference(a, b, c, alpha, beta, bias=None, activation=None) -> torch.Tensor:
    """``act(alpha · a @ b + beta · c + bias)`` in float64 (``beta == 0`` never reads ``c``):
    what ``matmul(..., c=, alpha=, beta=)`` computes, on every layer."""
    y = alpha * torch.matmul(a.double(), b.double())
    if c is not None and beta != 0:
        y = y + beta * c.double()
    if bias is not None:
        y = y + bias.double()
    return torch_activation(activation or "none", y)


def install(monkeypatch, *, fast=False) -> CoreStub:
    """The stub in place of the core. CPU tensors then take the registered op's road, or with
    ``fast`` the eager fast road (CPU tensors taken for plain CUDA ones)."""
    stub = CoreStub()
    monkeypatch.setattr(api, "matmul", stub)
    if fast:
        kinds = (torch.Tensor, torch.nn.Parameter)
        monkeypatch.setattr(
            ops, "_plain", lambda *ts: all(type(t) in kinds for t in ts if t is not None)
        )
    return stub


def fake_cuda(shape, dtype=torch.float16, transposed=False):
    """A fake CUDA tensor (call inside FakeTensorMode); ``transposed``: column-major view."""
    if transposed and len(shape) > 1:
        return torch.empty(*shape[:-2], shape[-1], shape[-2], device="cuda", dtype=dtype).mT
    return torch.empty(shape, device="cuda", dtype=dtype)


@contextlib.contextmanager
def cuda_autocast(dtype):
    """torch.autocast("cuda") refuses to turn on without CUDA; the dispatcher state it sets
    does not care, so set it directly."""
    was, old = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", old)
