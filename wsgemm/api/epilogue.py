"""A call's fused epilogue, ``act(a @ b + bias)``, on the API side: its checks, the kernel's
bias vector, and the same formula in torch (where no kernel fuses it, and for autograd).

The kernels compute it in fp32 on the accumulators before the output conversion
(``wsgemm.kernels.epilogue``). Where the route's kernel does not fuse epilogues (the sm80
family, and the sm90 family's until its fused kernels are switched on), ``apply_in_torch``
adds the bias and applies the activation after the product as torch's unfused path does, in the
output's dtype: the same formula, rounded between the steps, with more passes over the output
(``explain`` says so).
"""

from __future__ import annotations

import math

import torch

from ..host.registry import ACTIVATIONS, PLAIN, Epilogue

__all__ = ["ACTIVATIONS", "PLAIN", "Epilogue", "activate_", "activation_backward",
           "activation_grad", "apply_in_torch", "check_epilogue", "check_residual",
           "check_scalar", "combine_in_torch", "gated_unit", "gated_unit_grad",
           "gated_unit_with_grad", "kernel_bias", "torch_activation"]  # fmt: skip

#: The public activation names (``matmul(..., activation=...)``): None and the kernels' own.
PUBLIC_ACTIVATIONS = tuple(a for a in ACTIVATIONS if a != "none")


def check_activation(activation) -> str:
    """The kernels' name for ``activation`` (None: "none"); TypeError/ValueError otherwise."""
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a str or None, got {type(activation).__name__}")
    if activation not in PUBLIC_ACTIVATIONS:
        raise ValueError(
            f"activation={activation!r} is not one of {', '.join(PUBLIC_ACTIVATIONS)} (or None); "
            "'gelu' is the erf form (torch's default), 'gelu_tanh' torch's approximate='tanh', "
            "'relu2' is relu(x)**2"
        )
    return activation


def bias_mode(bias_shape, out_shape) -> str:
    """Which way a bias of ``bias_shape`` runs along an output of ``out_shape`` (a 0-D or 1-D
    output counts as one row): "col" (one value per column, broadcast down the rows: (N,),
    (1, N), (), ...) or "row" (one per row: (M, 1), ...). ValueError for any other shape: a
    bias varies along one output dimension, the same for every batch, and has no more
    dimensions than the output (more would widen the result, as ``a @ b + bias`` does)."""
    shape = tuple(bias_shape)
    given = tuple(out_shape)
    rank = len(given)  # (a bias of more dimensions would widen the result, as in torch)
    out_shape = (1,) * (2 - min(len(out_shape), 2)) + tuple(out_shape)  # a 1-D result: one row
    rows, cols = out_shape[-2], out_shape[-1]
    allowed = f"({cols},), (1, {cols}) or () for a column bias, ({rows}, 1) for a row bias"
    if rank < 2:
        allowed = f"({cols},), (1,) or ()" if rank == 1 else "()"
    if len(shape) > rank or any(s != 1 for s in shape[:-2]):
        raise ValueError(
            f"bias has shape {shape}; for an output of shape {given} it must be {allowed} "
            "(the same for every batch)"
        )
    full = (1,) * (2 - min(len(shape), 2)) + shape[-2:] if shape else (1, 1)
    r, c = full
    if r == 1 and c in (1, cols):
        return "col"
    if c == 1 and r == rows:
        return "row"
    raise ValueError(f"bias has shape {shape}; for an output of shape {given} it "
                     f"must be {allowed}")  # fmt: skip


def check_epilogue(bias, activation, ab_dtype: torch.dtype, out_shape, device) -> Epilogue:
    """The epilogue of a call whose output has ``out_shape``; checks ``bias`` (a tensor of the
    inputs' dtype on their device, broadcast as ``bias_mode`` says) and ``activation``."""
    act = check_activation(activation)
    if bias is None:
        return Epilogue("none", act)
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.dtype != ab_dtype:
        raise TypeError(
            f"bias has dtype {bias.dtype}; it must be the inputs' dtype {ab_dtype} (as in "
            "torch.nn.functional.linear)"
        )
    if bias.layout != torch.strided:
        raise TypeError(f"bias must be a dense (strided) tensor, got layout {bias.layout}")
    if device is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device}, the operands on {device}")
    return Epilogue(bias_mode(bias.shape, out_shape), act)


def kernel_bias(bias: torch.Tensor, mode: str, length: int, rows: int) -> torch.Tensor:
    """The flat vector a kernel reads for ``bias``: ``length`` entries along the output's
    columns ("col") or rows ("row"), contiguous; ``rows`` > ``length`` (a row bias of a batch
    folded into M) repeats it once per batch. A view when the bias already is one."""
    flat = bias.reshape(-1) if bias.numel() != 1 else bias.reshape(1).expand(length)
    if flat.numel() != length:
        raise AssertionError(f"a {mode} bias of {flat.numel()} entries for {length}")
    if mode == "row" and rows != length:
        flat = flat.repeat(rows // length)
    return flat if flat.stride(0) == 1 else flat.contiguous()


def torch_activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """torch's own form of an activation (``support.ACTIVATIONS``)."""
    if name == "none":
        return x
    if name == "relu":
        return torch.relu(x)
    if name == "relu2":
        return torch.relu(x).square()
    if name == "gelu":
        return torch.nn.functional.gelu(x)
    if name == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if name == "silu":
        return torch.nn.functional.silu(x)
    raise ValueError(f"no activation {name!r}")


def gated_unit(name: str, y: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up`` of a product whose last dimension is ``[gate; up]`` (half each), in
    ``y``'s dtype: torch's own form (``.float()`` it first for fp32 arithmetic)."""
    half = y.shape[-1] // 2
    return torch_activation(name, y[..., :half]) * y[..., half:]


class _GatedUnit(torch.autograd.Function):
    """``gated_unit`` for a product that needs its gradient: the same forward ops (so the same
    bits), and a backward that writes ``d[gate; up]`` into one tensor of the product's shape
    with torch's own kernels: ``dup = dh * act(gate)``, ``dgate = act'(gate) * (dh * up)``
    (``*_backward`` with ``grad_input=``): three passes, where autograd through the two slices
    runs five more (each slice's gradient a zero-filled product-sized tensor, then their sum,
    which also turns a -0.0 gradient into +0.0: the values are autograd's, zeros' signs not)."""

    @staticmethod
    def forward(ctx, name: str, y: torch.Tensor) -> torch.Tensor:
        half = y.shape[-1] // 2
        act = torch_activation(name, y[..., :half])
        ctx.name = name
        ctx.save_for_backward(y, act)
        return act * y[..., half:]

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        y, act = ctx.saved_tensors
        half = y.shape[-1] // 2
        gate, up = y[..., :half], y[..., half:]
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # create_graph (a double backward): torch's formula, differentiable again
            with torch.enable_grad():
                return None, torch.autograd.grad(gated_unit(ctx.name, y), y, dh,
                                                 create_graph=True)[0]  # fmt: skip
        if torch.compiler.is_compiling():  # functional ops for the compiler, which fuses them
            dgate = activation_backward(ctx.name, dh * up, gate)
            return None, torch.cat([dgate, dh * act], dim=-1)
        return None, gated_unit_grad(ctx.name, dh, y, act=act)


def activation_backward(name: str, grad: torch.Tensor, pre: torch.Tensor, out=None):
    """``grad * act'(pre)`` by torch's own backward kernels (autograd's formulas), into ``out``
    where given."""
    aten = torch.ops.aten
    if name == "relu2":  # d relu(x)^2 = 2 relu(x), zero where relu is (autograd's order)
        grad, name = grad * (torch.relu(pre) * 2), "relu"
    if name == "silu":
        op, extra, kw = aten.silu_backward, (), {}
    elif name in ("gelu", "gelu_tanh"):
        op, extra = aten.gelu_backward, ()
        kw = {"approximate": "tanh" if name == "gelu_tanh" else "none"}
    elif name == "relu":
        op, extra, kw = aten.threshold_backward, (0,), {}
    else:
        raise ValueError(f"no gated activation {name!r}")
    if out is None:
        return op.default(grad, pre, *extra, **kw)
    return op.grad_input(grad, pre, *extra, **kw, grad_input=out)


def gated_unit_grad(name: str, dh, preact, out=None, act=None) -> torch.Tensor:
    """``d[gate | up]`` of ``act(gate) * up`` from ``dh`` and ``preact = [gate | up]`` by
    torch's own kernels, three passes into one tensor (``out`` where given; ``act``: the
    forward's ``act(gate)`` where it was kept): ``dup = dh * act(gate)``, ``dgate = act'(gate)
    * (dh * up)`` with torch's backward formulas."""
    half = preact.shape[-1] // 2
    gate, up = preact[..., :half], preact[..., half:]
    if out is None:
        out = torch.empty_like(preact)
    torch.mul(dh, torch_activation(name, gate) if act is None else act, out=out[..., half:])
    activation_backward(name, dh * up, gate, out[..., :half])
    return out


def gated_unit_with_grad(name: str, y: torch.Tensor) -> torch.Tensor:
    """``gated_unit(name, y)`` (the same bits) whose backward writes the product's gradient in
    three passes (``_GatedUnit``; a double backward differentiates torch's formula);
    ``gated_unit`` itself where ``y`` needs no gradient or a torch.func transform or forward-
    mode AD is active (the Function has no vmap or jvp rule)."""
    if not (torch.is_grad_enabled() and y.requires_grad) or _transformed():
        return gated_unit(name, y)
    return _GatedUnit.apply(name, y)


def _transformed() -> bool:
    """Whether a functorch transform (vmap, grad, ...) or a forward-mode AD level is active."""
    from torch.autograd import forward_ad

    return torch._C._are_functorch_transforms_active() or forward_ad._current_level >= 0


def activation_grad(name: str, pre: torch.Tensor) -> torch.Tensor:
    """d act(x) / dx at ``pre`` (fp32), for the backward."""
    x = pre.float()
    if name == "none":
        return torch.ones_like(x)
    if name == "relu":
        return (x > 0).to(x.dtype)
    if name == "relu2":
        return 2.0 * torch.relu(x)
    if name == "silu":
        s = torch.sigmoid(x)
        return s * (1.0 + x * (1.0 - s))
    if name == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(x * math.sqrt(0.5)))
        return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    if name == "gelu_tanh":
        k = math.sqrt(2.0 / math.pi)
        u = k * (x + 0.044715 * x**3)
        t = torch.tanh(u)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x)
    raise ValueError(f"no activation {name!r}")


def grad_through(name: str, dh: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``dh · act'(pre)`` in fp32 (a gradient through the activation at its pre-activation),
    0 where the derivative is (relu, relu2: torch's ``threshold_backward``, whatever ``dh``
    holds there, an inf included)."""
    g = dh.float() * activation_grad(name, pre)
    return torch.where(pre > 0, g, 0.0) if name in ("relu", "relu2") else g


def check_residual(c, shape, c_dtype: torch.dtype, device) -> None:
    """A residual ``c``: a dense tensor of the result's dtype on the operands' device that
    broadcasts to the result's ``shape`` (any number of dimensions)."""
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"c must be a torch.Tensor or None, got {type(c).__name__}")
    if c.layout != torch.strided:
        raise TypeError(f"c must be a dense (strided) tensor, got layout {c.layout}")
    if c.dtype != c_dtype:
        raise TypeError(
            f"c has dtype {c.dtype}; it must be the output's dtype {c_dtype} (as torch.addmm's "
            "input is the result's)"
        )
    if c.device != device:
        raise ValueError(f"c is on {c.device}, the operands on {device}")
    try:
        fits = tuple(torch.broadcast_shapes(c.shape, shape)) == tuple(shape)
    except RuntimeError:
        fits = False
    if not fits:
        shape = tuple(shape)
        raise ValueError(f"c has shape {tuple(c.shape)}, which does not broadcast to {shape}")


def check_scalar(name: str, value) -> float:
    """``alpha`` or ``beta`` as a Python float: a real number (int or float; not a bool or a
    tensor, which would synchronize to be read), as torch.addmm's."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__}")
    return float(value)


def wide_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype an epilogue computed in torch works in for tensors of ``dtypes``: fp32, or
    wider where one of them is (float64 is never rounded to fp32 on the way)."""
    wide = torch.float32
    for dtype in dtypes:
        wide = torch.promote_types(wide, dtype)
    return wide


def combine_in_torch(out: torch.Tensor, product, bias, p) -> torch.Tensor:
    """``out`` := act(alpha · product + beta · out + bias) in place for a call with alpha or a
    residual on a route whose kernel does not fuse them (``p``: its ``Problem``; ``product``
    the plain product, None for K = 0): computed in fp32 from the rounded product and C, then
    rounded once to ``out``'s dtype (in fp64 where the product or ``out`` is fp64: float64
    operands are not rounded to fp32 on the way)."""
    e = p.epilogue
    wide = wide_dtype(out.dtype) if product is None else wide_dtype(out.dtype, product.dtype)
    if product is None:
        y = torch.zeros(out.shape, dtype=wide, device=out.device)
    else:
        y = product.to(wide) * p.alpha
    if e.residual:
        y.add_(out.to(wide), alpha=p.beta)
    if bias is not None:
        y.add_(_addend(bias, e.bias).to(wide))
    return out.copy_(torch_activation(e.activation, y))


def _addend(bias: torch.Tensor, mode: str) -> torch.Tensor:
    """A bias of ``mode`` ("col" or "row") as it broadcasts against a 2-D/3-D result."""
    return bias if mode == "col" else bias.reshape(-1, 1)


def apply_in_torch(out: torch.Tensor, bias, epilogue: Epilogue) -> torch.Tensor:
    """``out`` := act(out + bias) in place, as torch's unfused path computes it (a route whose
    kernel does not fuse): the bias added in ``out``'s dtype, then the activation (in place
    where torch has the in-place form)."""
    if epilogue.plain:
        return out
    if bias is not None:
        out.add_(_addend(bias, epilogue.bias))
    return activate_(out, epilogue.activation)


def activate_(out: torch.Tensor, name: str | None) -> torch.Tensor:
    """``out`` := ``name``'s activation of it (None or "none": unchanged), in place where torch
    has the in-place form, else computed and copied back: the pass torch's unfused path makes."""
    if name == "relu":
        out.relu_()
    elif name == "relu2":
        out.relu_().square_()
    elif name == "silu":
        torch.nn.functional.silu(out, inplace=True)
    elif name not in (None, "none"):
        out.copy_(torch_activation(name, out))
    return out
