"""``wsgemm.gated_linear`` inside a model: ``act(x @ w_gate.T) * (x @ w_up.T)`` from one weight
``[w_gate; w_up]``, as the op ``torch.ops.wsgemm.gated_linear`` (torch.compile, export, fake
tensors, autograd) over the core (``wsgemm.api.gated``: the fused kernel, or torch's road).

With a bias ``[b_gate; b_up]``, each half gets its own added first. With a gradient to compute,
``gated_linear`` runs the (rows, 2I) product and then ``act(gate) * up`` in torch, which
autograd saves (``_for_autograd``): the backward is the unit's gradient (three passes into one
(rows, 2I) tensor: ``gated_unit_with_grad``), then dx and dW, two GEMMs on wsgemm's kernels.
The op's own backward (a direct ``torch.ops.wsgemm.gated_linear`` call with a gradient)
recomputes the product with one more GEMM, then ``dgate = grad * up * act'(gate)``, ``dup =
grad * act(gate)`` in fp32.

A whole gated MLP's training step (``gated_mlp``, which ``nn.GatedMLP`` takes where its
kernels run) goes further: its forward is ``torch.ops.wsgemm.gated_linear_preact`` (one gated
kernel writing ``h`` and the pre-activation ``[gate | up]``), its backward
``torch.ops.wsgemm.gated_grad`` (the unit's gradient fused into the down projection's dh GEMM),
then dx, dW and the biases' sums (``_GatedMLP``). Both ops have fake implementations.
"""

from __future__ import annotations

import math

import torch

from . import ops as _ops
from .api import gated as core
from .api.epilogue import activation_grad, gated_unit_with_grad, torch_activation
from .ops import autocast_cast as _autocast_cast
from .ops import matmul, mlp_backward

__all__ = ["gated_linear", "gated_mlp"]

_LIB = torch.library.Library("wsgemm", "FRAGMENT")
_LIB.define(
    'gated_linear(Tensor x, Tensor weight, str activation="silu", Tensor? bias=None) -> Tensor',
    tags=(torch.Tag.pt2_compliant_tag,),
)
_GATED = torch.ops.wsgemm.gated_linear.default


def _fold(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _impl(x, weight, activation="silu", bias=None):
    _ops.refuse_forward_differentiation("torch.ops.wsgemm.gated_linear", x, weight, bias)
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        core.check_gated(x, weight, activation, bias=bias)  # the TypeError / ValueError
    y = core.gated_linear(_fold(x), weight, activation, bias=bias)
    return y.reshape(*x.shape[:-1], y.shape[-1])


for _key in ("CUDA", "CPU"):
    _LIB.impl("gated_linear", _impl, _key)


@torch.library.register_fake("wsgemm::gated_linear", lib=_LIB)
def _fake(x, weight, activation="silu", bias=None):
    # CPU tensors too: the real implementation runs them in torch (as matmul's fake takes
    # them); x's own type first, which a mixed-device error names
    types = ("cuda", "meta", "cpu")
    if isinstance(x, torch.Tensor) and x.device.type in types:
        types = (x.device.type, *(t for t in types if t != x.device.type))
    core.check_gated(_fold(x), weight, activation, types, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


def _setup_context(ctx, inputs, output):
    x, weight, activation, *rest = inputs  # (the bias when the call gave one)
    ctx.save_for_backward(x, weight, *rest)
    ctx.activation = activation


def _backward(ctx, grad):
    x, weight, *rest = ctx.saved_tensors
    bias = rest[0] if rest else None
    if _ops.creates_graph(x, weight, bias):  # a double backward: differentiable gradients
        # (the recomputation under no_grad below would drop every second derivative through
        # the pre-activation, silently): autograd through the public road's pieces
        need = ctx.needs_input_grad
        return _ops.grads_by_autograd(lambda: _for_autograd(x, weight, ctx.activation, bias),
                                      (x, weight, None, bias)[: len(need)], need, grad)  # fmt: skip
    x2 = _fold(x)
    with torch.no_grad():  # the pre-activations, recomputed in fp32 as the forward had them
        y = matmul(x2, weight.t(), out_dtype=torch.float32)
        if bias is not None:
            y = y + bias.float()
    half = weight.shape[0] // 2
    g, u = y[:, :half], y[:, half:]
    dy_out = _fold(grad).float()
    dy = torch.cat(
        [
            dy_out * u * activation_grad(ctx.activation, g),
            dy_out * torch_activation(ctx.activation, g),
        ],
        dim=1,
    ).to(x.dtype)
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:
        gx = matmul(dy, weight).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        gw = matmul(dy.t(), x2)
    if bias is not None and ctx.needs_input_grad[3]:
        gb = dy.float().sum(0).to(bias.dtype)  # the rows' sum in fp32 (torch's: one fixed order)
    return (gx, gw, None, gb)[: len(ctx.needs_input_grad)]  # one per input the call gave


torch.library.register_autograd(
    "wsgemm::gated_linear", _backward, setup_context=_setup_context, lib=_LIB
)


def _autocast(x, weight, activation="silu", bias=None):
    dtype = torch.get_autocast_dtype("cuda")
    x, weight = x.to(dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
    ):
        return _GATED(x, weight, activation, bias)


_LIB.impl("gated_linear", _autocast, "AutocastCUDA")


def gated_linear(input, weight, activation="silu", exact=False, *, bias=None):
    """A gated linear unit: ``act(input @ weight[:I].T + bias[:I]) * (input @ weight[I:].T +
    bias[I:])`` (without a bias, those terms are 0).

    Args:
        input: (..., in_features), float16 or bfloat16, CUDA (CPU tensors run in torch, with
            or without a gradient, as ``matmul``'s and ``linear``'s do).
        weight: (2 * I, in_features): the gate projection's I rows, then the up projection's
            (a SwiGLU MLP's ``gate_up_proj``; two separate weights: ``torch.cat([w_gate,
            w_up])``, once).
        activation: "silu" (SwiGLU), "gelu" or "gelu_tanh" (GeGLU), "relu" or "relu2".
        exact: ``act(gate) * up`` as torch's own ops on the rounded (..., 2I) product: bit for
            bit ``act(y[..., :I]) * y[..., I:]`` of ``y = wsgemm.linear(input, weight, bias)``
            (the product reaches memory: one more pass).
        bias: None or (2 * I,), input's dtype: the gate's I entries, then the up projection's
            (``torch.cat([b_gate, b_up])``), added to the products before the unit.

    Returns:
        (..., I), input's dtype. On Hopper with fused epilogues on, one kernel (the (rows, 2I)
        product never reaches memory); elsewhere (CPU tensors included) torch's road
        (``wsgemm.api.gated``: the fp32 product, then the unit in fp32, rounded once).
        Differentiable (the bias too), traceable by torch.compile
        (``torch.ops.wsgemm.gated_linear``).
    """
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, torch.Tensor):  # (the op's dispatcher would say RuntimeError)
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if not isinstance(activation, str):  # the core's error (the op's schema: RuntimeError)
        folded = _fold(input) if input.dim() >= 1 else input
        core.check_gated(folded, weight, activation, (input.device.type,), bias)
    if exact is not False and not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {type(exact).__name__}")
    needs_grad = input.requires_grad or weight.requires_grad
    needs_grad = needs_grad or (bias is not None and bias.requires_grad)
    if exact or (torch.is_grad_enabled() and needs_grad):
        return _for_autograd(input, weight, activation, bias)
    if not _ops._is_compiling() and _ops.forward_differentiated(input, weight, bias):
        # forward-mode AD, torch.func.grad / jvp: the product on matmul (torch's own ops
        # there), the unit in torch, so every transform has its formulas
        return _for_autograd(input, weight, activation, bias)
    return _GATED(input, weight, activation, bias)


def _for_autograd(x, weight, activation, bias=None):
    """With a gradient to compute: the (..., 2I) product (plus its bias) on wsgemm, then
    ``act(gate) * up`` as torch's own ops, which autograd saves as torch's unfused SwiGLU does:
    the backward is dx and dW (two products; the bias's gradient a sum over the rows) and
    recomputes nothing. The op's own backward (a direct ``torch.ops.wsgemm.gated_linear``
    call) recomputes the product."""
    x, weight, bias = _autocast_cast(x, weight, bias)  # the op's autocast does not see this road
    folded = _fold(x) if x.dim() >= 1 else x
    act = core.check_gated(folded, weight, activation, (x.device.type,), bias)[2]
    return gated_unit_with_grad(act, matmul(x, weight.t(), bias=bias))


# ------------------------------------------------------------------ a gated MLP's training step

_LIB.define(
    'gated_grad(Tensor dy, Tensor w_down, Tensor preact, str activation="silu") -> Tensor',
    tags=(torch.Tag.pt2_compliant_tag,),
)


def _gated_grad_impl(dy, w_down, preact, activation="silu"):
    return core.gated_grad(dy, w_down, preact, activation)


for _key in ("CUDA", "CPU"):
    _LIB.impl("gated_grad", _gated_grad_impl, _key)


_LIB.define(
    'gated_linear_preact(Tensor x, Tensor weight, str activation="silu", Tensor? bias=None) '
    "-> (Tensor, Tensor)",
    tags=(torch.Tag.pt2_compliant_tag,),
)


def _gated_linear_preact_impl(x, weight, activation="silu", bias=None):
    return core.gated_linear_preact(x, weight, activation, bias=bias)


for _key in ("CUDA", "CPU"):
    _LIB.impl("gated_linear_preact", _gated_linear_preact_impl, _key)


@torch.library.register_fake("wsgemm::gated_linear_preact", lib=_LIB)
def _gated_linear_preact_fake(x, weight, activation="silu", bias=None):
    m, half, _ = core.check_gated(x, weight, activation, _ops._FAKE_DEVICES, bias)
    return x.new_empty((m, half)), x.new_empty((m, 2 * half))


@torch.library.register_fake("wsgemm::gated_grad", lib=_LIB)
def _gated_grad_fake(dy, w_down, preact, activation="silu"):
    core.check_gated_grad(dy, w_down, preact, activation, _ops._FAKE_DEVICES)
    return preact.new_empty(preact.shape)


class _GatedMLP(torch.autograd.Function):
    """``down(act(gate) * up)`` of ``[gate | up] = x @ w_gate_up.T + b_gate_up`` (the gated
    kernel writing ``h`` and ``[gate | up]`` where it runs: ``gated_linear_preact``), whose backward
    fuses the unit's gradient into the down projection's input-gradient GEMM
    (``torch.ops.wsgemm.gated_grad``: ``d[gate | up]`` from ``d_out @ w_down`` and the saved
    pre-activation in one kernel; ``dh`` never reaches memory), then dx, dW and the biases'
    sums. The forward saves what torch's unfused MLP saves: x, the pre-activation and ``h``."""

    @staticmethod
    def forward(ctx, x, w_gu, b_gu, w_d, b_d, activation):
        x2 = x.reshape(-1, x.shape[-1])
        # h and its pre-activation y = [gate | up]: one gated kernel writes both where it runs,
        # else the product, then the unit in torch (in fp32, rounded once)
        h, y = torch.ops.wsgemm.gated_linear_preact(x2, w_gu, activation, b_gu)
        out = matmul(h, w_d.t(), bias=b_d)
        ctx.activation = activation
        ctx.has_bias = (b_gu is not None, b_d is not None)
        # the inputs themselves (a double backward differentiates through them), then y and h
        ctx.save_for_backward(x, w_gu, b_gu, w_d, b_d, y, h)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        return mlp_backward(ctx, grad, torch.ops.wsgemm.gated_grad, _gated_unit)


def _gated_unit(activation: str, y: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up`` of ``y = [gate | up]`` in torch's own ops (a double backward's)."""
    half = y.shape[-1] // 2
    return torch_activation(activation, y[..., :half]) * y[..., half:]


def gated_mlp(x, gate_up_weight, gate_up_bias, down_weight, down_bias, activation="silu"):
    """A gated MLP's forward for training: ``down(act(gate) * up)`` with ``[gate | up] = x @
    gate_up_weight.T + gate_up_bias`` and ``down(h) = h @ down_weight.T + down_bias`` (biases
    may be None), whose backward fuses the unit's gradient into the down projection's
    input-gradient GEMM (``_GatedMLP``; ``nn.GatedMLP`` calls it where that kernel runs). Under
    CUDA autocast the tensors are cast as ``matmul`` casts them."""
    tensors = _autocast_cast(x, gate_up_weight, gate_up_bias, down_weight, down_bias)
    return _GatedMLP.apply(*tensors, activation)
