"""Helpers for testing wsgemm's torch layer without a GPU: CPU stand-ins for the cores (matmul,
gated_linear, grouped_mm), fake CUDA tensors, CUDA autocast turned on without CUDA."""

import contextlib

import torch

from wsgemm import api, ops
from wsgemm import grouped as grouped_layer
from wsgemm.api import gated as gated_core
from wsgemm.api import grouped as grouped_core
from wsgemm.api.epilogue import gated_unit, torch_activation

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


def close(got, want, dtype, k) -> bool:
    """``got`` within the suite's tolerance of the float64 ``want`` for a ``dtype`` product over
    ``k`` terms (the gated and MLP tests')."""
    eps = torch.finfo(dtype).eps
    tol = (4 * eps * k**0.5 + 2 * eps) * max(want.abs().max().item(), 1.0)
    return (got.double() - want).abs().max().item() <= tol


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


class GatedCoreStub:
    """A CPU stand-in for the gated core (``wsgemm.api.gated.gated_linear``): its checks on the
    CPU, then ``act(gate) * up`` of the (rows, 2I) product in float64, rounded once, contiguous
    as the core's result. Records the (x, weight) it was handed."""

    def __init__(self, check):
        self.check, self.calls = check, []

    def __call__(self, x, weight, activation="silu", *, bias=None, dispatcher=None):
        _, _, act = self.check(x, weight, activation, ("cpu",), bias)
        self.calls.append((x, weight) if bias is None else (x, weight, bias))
        y = x.double() @ weight.double().T
        if bias is not None:
            y = y + bias.double()
        return gated_unit(act, y).to(x.dtype)


def grouped_reference(a, b, offs, form=None):
    """The grouped product of any form in float64, each group's end clamped to [previous end,
    extent] (as the kernels read them); rows (2D x 3D) or columns (3D x 2D) past the groups
    zero."""
    a, b = a.double(), b.double()
    form = form or f"{a.dim()}d{b.dim()}d"
    if form == "3d3d":
        return a @ b
    ends, prev = [], 0
    extent = {"2d3d": a.shape[0], "2d2d": a.shape[1], "3d2d": b.shape[1]}[form]
    for end in offs.tolist():
        prev = min(max(end, prev), extent)
        ends.append(prev)
    spans = list(zip([0, *ends][: len(ends)], ends, strict=True))  # (none for no group)
    if form == "2d2d":
        if not spans:
            return a.new_zeros(0, a.shape[0], b.shape[1])
        return torch.stack([a[:, lo:hi] @ b[lo:hi] for lo, hi in spans])
    if form == "2d3d":
        y = a.new_zeros(a.shape[0], b.shape[2])
        for g, (lo, hi) in enumerate(spans):
            y[lo:hi] = a[lo:hi] @ b[g]
        return y
    y = a.new_zeros(a.shape[1], b.shape[1])
    for g, (lo, hi) in enumerate(spans):
        y[:, lo:hi] = a[g] @ b[:, lo:hi]
    return y


class GroupedCoreStub:
    """A CPU stand-in for the grouped core (``wsgemm.api.grouped.grouped_mm``): its checks on
    the CPU, the product in float64 (``grouped_reference``: what the groups leave unwritten is
    zero here), the epilogue (activation or gated unit, then the row scale) in float64, rounded
    once, in the core's layout (``result_strides``) or written into ``out``. Records the forms
    it was handed."""

    def __init__(self):
        self.calls = []  # the forms

    def __call__(self, a, b, offs=None, *, out=None, out_dtype=None, backend="auto",
                 dispatcher=None, activation=None, gated=False, row_scale=None):  # fmt: skip
        p = grouped_core.check_grouped(a, b, offs, out, out_dtype, backend, ("cpu",), activation,
                                       gated, row_scale)  # fmt: skip
        self.calls.append(p.form)
        y = grouped_reference(a, b, offs, p.form)
        if p.epilogue.activation != "none":
            y = (gated_unit if gated else torch_activation)(p.epilogue.activation, y)
        if row_scale is not None:
            y = y * row_scale.double()[:, None]
        if out is None:
            strides = grouped_core.result_strides(p.shape, p.c_dtype)
            out = torch.empty_strided(p.shape, strides, dtype=p.c_dtype)
        out.copy_(y)
        return out


def grouped_meta_operands(form, m, n, groups, k, dtype=torch.bfloat16):
    """Meta operands of a grouped call of ``form`` (``a``, ``b``, ``offs``): b K-major (an
    expert weight's transpose; torch's meta kernel wants 16-byte rows), no offs for 3D x 3D."""

    def e(*shape, dtype=dtype):
        return torch.empty(shape, dtype=dtype, device="meta")

    offs = e(groups, dtype=torch.int32)
    return {
        "2d3d": (e(m, k), e(groups, n, k).mT, offs),
        "3d3d": (e(groups, m, k), e(groups, n, k).mT, None),
        "2d2d": (e(m, k), e(n, k).t(), offs),
        "3d2d": (e(groups, m, k), e(n, k).t(), offs),
    }[form]


def tile_map_tiles(lines: list[str]) -> int:
    """The tiles a grouped tile map's group lines name (``host.grouped.tile_map``: each group's
    m-tiles x n-tiles and its clusters' surplus), to check against its head's count."""
    tiles = 0
    for line in lines[1:]:
        if " tiles" in line and "no tiles" not in line:
            m_tiles, n_tiles = line.split(": ")[2].split(" tiles")[0].split(" x ")
            tiles += int(m_tiles) * int(n_tiles)
            if "(+" in line:  # the cluster's surplus, computed too
                tiles += int(line.split("(+")[1].split(" ")[0])
    return tiles


def install_gated(monkeypatch) -> GatedCoreStub:
    """The gated stub in place of the gated core (``torch.ops.wsgemm.gated_linear``'s CPU kernel
    runs it), and the op's fake implementation taking CPU tensors too (as ``opcheck`` hands it
    them). The op's backward multiplies with ``wsgemm.matmul``: ``install`` that core too."""
    real = gated_core.check_gated
    stub = GatedCoreStub(real)
    monkeypatch.setattr(gated_core, "gated_linear", stub)
    monkeypatch.setattr(
        gated_core, "check_gated",
        lambda x, w, act, devices=("cuda",), bias=None: real(x, w, act, (*devices, "cpu"), bias),
    )  # fmt: skip
    return stub


def install_grouped(monkeypatch) -> GroupedCoreStub:
    """The grouped stub in place of the grouped core (``torch.ops.wsgemm.grouped_mm``'s CPU
    kernel and the eager fast road run it), and the op's fake implementation taking CPU
    tensors too (as ``opcheck`` hands it them)."""
    stub = GroupedCoreStub()
    monkeypatch.setattr(grouped_core, "grouped_mm", stub)
    monkeypatch.setattr(grouped_layer, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    return stub


def ops_in(gm, name="wsgemm.matmul.default"):
    """The calls of op ``name`` in a captured graph module."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target) == name]


def capture(graphs):
    """A torch.compile backend that keeps each graph module it is handed in ``graphs``."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


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


def install_gated_training(monkeypatch) -> list:
    """The gated training kernels (``DGATED_FAMILIES``) on, run on the CPU by the float64
    stand-ins of their contracts (``stand_ins.GatedKernels``) behind ``api.gated``'s
    ``gated_grad`` and ``gated_linear_preact`` (so behind their ops), and the ops' fakes taking
    CPU tensors. Returns the variants the stand-in was asked for."""
    import functools

    from stand_ins import GatedKernels

    from wsgemm.api import Dispatcher
    from wsgemm.host import registry
    from wsgemm.host.dispatch import StandInDevices

    monkeypatch.setattr(registry, "DGATED_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    kernels = GatedKernels()
    d = Dispatcher(kernels, StandInDevices((9, 0), 132))
    for name in ("gated_grad", "gated_linear_preact"):
        real = getattr(gated_core, name)
        monkeypatch.setattr(gated_core, name, functools.partial(real, dispatcher=d))
    return kernels.variants


def install_act_grad(monkeypatch) -> list:
    """The plain MLP's training kernels (``DACT_FAMILIES``: dact and the plain preact) on, run
    on the CPU by the float64 stand-ins of their contracts (``stand_ins.GatedKernels``) behind
    ``api.act_grad``'s ``act_grad`` and ``linear_preact`` (so behind their ops), and the ops'
    fakes taking CPU tensors. Returns the variants the stand-in was asked for."""
    import functools

    from stand_ins import GatedKernels

    from wsgemm.api import Dispatcher
    from wsgemm.api import act_grad as act_grad_core
    from wsgemm.host import registry
    from wsgemm.host.dispatch import StandInDevices

    monkeypatch.setattr(registry, "DACT_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    kernels = GatedKernels()
    d = Dispatcher(kernels, StandInDevices((9, 0), 132))
    for name in ("act_grad", "linear_preact"):
        real = getattr(act_grad_core, name)
        monkeypatch.setattr(act_grad_core, name, functools.partial(real, dispatcher=d))
    return kernels.variants


def float64_mlp_step(mlp, x, grad, up: str, unit):
    """An MLP's step in float64 (torch's formula): ``down(unit(x @ W_up^T + b_up))`` with
    ``up`` the name of its up (or gate/up) projection and ``unit`` the hidden activation of its
    pre-activation; backward with ``grad``. Returns the output and every gradient (``x`` and
    each parameter by name)."""
    x64 = x.detach().double().requires_grad_()
    p = {n: q.detach().double().requires_grad_() for n, q in mlp.named_parameters()}
    pre = x64 @ p[f"{up}.weight"].T
    if f"{up}.bias" in p:
        pre = pre + p[f"{up}.bias"]
    out = unit(pre) @ p["down_proj.weight"].T
    if "down_proj.bias" in p:
        out = out + p["down_proj.bias"]
    out.backward(grad.double())
    return out, {"x": x64.grad, **{n: q.grad for n, q in p.items()}}
