"""Modules: ``Linear``, a drop-in ``torch.nn.Linear`` on wsgemm, and ``replace_linear``, which turns
a model's ``nn.Linear`` layers into it in place."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .api.validate import AB_DTYPES
from .ops import autocast_dtype, linear

__all__ = ["Linear", "replace_linear"]

_HALF = tuple(AB_DTYPES)  # the torch dtypes wsgemm multiplies


def _runs_on_wsgemm(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """Does wsgemm multiply these: CUDA tensors of one half dtype, after CUDA autocast?"""
    if not (input.is_cuda and weight.is_cuda):
        return False
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        return autocast_dtype(input, dtype) == autocast_dtype(weight, dtype) in _HALF
    return input.dtype == weight.dtype in _HALF


class Linear(nn.Linear):
    """``torch.nn.Linear`` whose product runs on wsgemm (``wsgemm.linear``).

    Same constructor (including ``device`` and ``dtype``), parameters, initialization,
    ``state_dict`` keys and ``extra_repr``; ``isinstance(m, nn.Linear)`` holds. Where wsgemm
    cannot multiply (a CPU or meta input, fp32/fp64 tensors outside CUDA autocast) the layer
    computes what ``nn.Linear`` computes, with torch, so a model keeps working on any device
    and dtype; wsgemm runs for fp16/bf16 CUDA tensors and under ``torch.autocast("cuda")``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if _runs_on_wsgemm(input, self.weight):
            return linear(input, self.weight, self.bias)
        return F.linear(input, self.weight, self.bias)


_SWAPPED: dict[type, type] = {nn.Linear: Linear}


def _swapped_class(cls: type) -> type:
    """``Linear`` for ``nn.Linear``; for a subclass, a subclass of both with wsgemm's forward."""
    if cls not in _SWAPPED:
        _SWAPPED[cls] = type(f"Wsgemm{cls.__name__}", (Linear, cls), {"__module__": __name__})
    return _SWAPPED[cls]


def replace_linear(
    module: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None
) -> list[str]:
    """Make the eligible ``nn.Linear`` layers of ``module`` (itself included) wsgemm layers, in
    place: each keeps its identity, its ``Parameter`` objects (so optimizer state and tied
    weights survive), buffers and hooks; only its class changes (the way
    ``torch.nn.utils.parametrize`` works).

    Args:
        module: the model.
        filter_fn: ``filter_fn(layer, qualified_name) -> bool`` picks layers among the
            ``nn.Linear`` instances, subclasses included; a chosen subclass keeps its other
            methods but its ``forward`` becomes ``Linear.forward`` (``x @ W.T + b``), so choose
            only subclasses whose forward means that. Default: layers whose type is exactly
            ``nn.Linear``.

    Returns:
        the qualified names of the layers replaced ("" for ``module`` itself); layers already on
        wsgemm and everything else stay as they are.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    replaced = []
    for name, layer in module.named_modules():
        if isinstance(layer, Linear) or not isinstance(layer, nn.Linear):
            continue
        if filter_fn(layer, name) if filter_fn is not None else type(layer) is nn.Linear:
            layer.__class__ = _swapped_class(type(layer))
            replaced.append(name)
    return replaced
