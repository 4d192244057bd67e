"""A plain MLP's training step, ``down(act(x @ w_up.T + b_up))`` (GPT-2's, Phi's, Falcon's,
BERT's), with the activation's gradient fused into the down projection's input-gradient GEMM.

``mlp`` (which ``nn.MLP`` takes where the fused kernels run) computes ``pre = x @ w_up.T + b_up``
and ``h = act(pre)`` with ``torch.ops.wsgemm.linear_preact`` (one GEMM writing both where it
runs, ``Epilogue.preact``; else the product, then torch's activation), then the down
projection; it saves what torch saves (x, ``pre`` and ``h``). Its backward runs
``torch.ops.wsgemm.act_grad``: ``dpre = (d_out @ w_down) · act'(pre)`` in one GEMM whose
epilogue reads ``pre`` (the ``Epilogue.dact`` kernel, ``wsgemm.api.act_grad``), where torch
writes ``dh`` and reads it back with ``pre`` in an elementwise kernel; then dx, dW and the
biases' sums (``_MLP``). Both ops have fake implementations (torch.compile, export).
"""

from __future__ import annotations

import math

import torch

from . import ops as _ops
from .api import act_grad as core
from .api.epilogue import check_activation, torch_activation
from .ops import autocast_cast, matmul, mlp_backward

__all__ = ["mlp"]

_LIB = torch.library.Library("wsgemm", "FRAGMENT")
_LIB.define(
    'act_grad(Tensor dy, Tensor w_down, Tensor preact, str activation="gelu") -> Tensor',
    tags=(torch.Tag.pt2_compliant_tag,),
)


def _act_grad_impl(dy, w_down, preact, activation="gelu"):
    return core.act_grad(dy, w_down, preact, activation)


for _key in ("CUDA", "CPU"):
    _LIB.impl("act_grad", _act_grad_impl, _key)


@torch.library.register_fake("wsgemm::act_grad", lib=_LIB)
def _act_grad_fake(dy, w_down, preact, activation="gelu"):
    core.check_act_grad(dy, w_down, preact, activation, _ops._FAKE_DEVICES)
    return preact.new_empty(preact.shape)


_LIB.define(
    'linear_preact(Tensor x, Tensor weight, str activation="gelu", Tensor? bias=None) '
    "-> (Tensor, Tensor)",
    tags=(torch.Tag.pt2_compliant_tag,),
)


def _linear_preact_impl(x, weight, activation="gelu", bias=None):
    return core.linear_preact(x, weight, activation, bias=bias)


for _key in ("CUDA", "CPU"):
    _LIB.impl("linear_preact", _linear_preact_impl, _key)


@torch.library.register_fake("wsgemm::linear_preact", lib=_LIB)
def _linear_preact_fake(x, weight, activation="gelu", bias=None):
    core.check_linear_preact(x, weight, activation, _ops._FAKE_DEVICES, bias)
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty((x.shape[0], weight.shape[0]))


def _fold(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


class _MLP(torch.autograd.Function):
    """``down(act(x @ w_up.T + b_up))``, whose backward fuses the activation's gradient into
    the down projection's input-gradient GEMM (``torch.ops.wsgemm.act_grad``: ``dpre`` from
    ``d_out @ w_down`` and the saved pre-activation in one kernel; ``dh`` never reaches memory),
    then dx, dW and the biases' sums. The forward saves what torch's unfused MLP saves: x,
    the pre-activation and ``h``."""

    @staticmethod
    def forward(ctx, x, w_up, b_up, w_d, b_d, activation):
        x2 = _fold(x)
        # h and its pre-activation: one kernel writes both where it runs, else the product,
        # then torch's activation
        h, pre = torch.ops.wsgemm.linear_preact(x2, w_up, activation, b_up)
        out = matmul(h, w_d.t(), bias=b_d)
        ctx.activation = activation
        ctx.has_bias = (b_up is not None, b_d is not None)
        # the inputs themselves (a double backward differentiates through them), then pre and h
        ctx.save_for_backward(x, w_up, b_up, w_d, b_d, pre, h)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        return mlp_backward(ctx, grad, torch.ops.wsgemm.act_grad, torch_activation)


def mlp(x, up_weight, up_bias, down_weight, down_bias, activation="gelu"):
    """A plain MLP's forward for training: ``down(act(x @ up_weight.T + up_bias))`` with
    ``down(h) = h @ down_weight.T + down_bias`` (biases may be None), whose backward fuses the
    activation's gradient into the down projection's input-gradient GEMM (``_MLP``;
    ``nn.MLP`` calls it where that kernel runs). Under CUDA autocast the tensors are cast as
    ``matmul`` casts them. Tensors not all on a CUDA GPU take torch's formula."""
    if check_activation(activation) == "none":
        raise ValueError("mlp needs an activation ('gelu', 'gelu_tanh', 'relu', ...)")
    tensors = autocast_cast(x, up_weight, up_bias, down_weight, down_bias)
    if any(t is not None and t.device.type not in _ops._FAKE_DEVICES for t in tensors):
        # wsgemm's kernels run on CUDA GPUs (the op takes meta tensors too): elsewhere torch's
        # formula, autograd through its own ops
        x, up_weight, up_bias, down_weight, down_bias = tensors
        h = torch_activation(activation, torch.nn.functional.linear(x, up_weight, up_bias))
        return torch.nn.functional.linear(h, down_weight, down_bias)
    return _MLP.apply(*tensors, activation)
