"""The torch route: where ``backend="auto"`` has no wsgemm kernel to run, torch.matmul runs it.

The host decides (``Dispatcher.route`` gives a ``TORCH`` route with its reason: inputs of a
dtype the kernels do not multiply, a GPU with no row in ``support.TARGETS``, or one where
``auto`` prefers torch, the tcgen05 GPUs); this module runs such a call with ``matmul``'s
meaning: the same checks (``validate`` ran first), the same ``out_dtype`` and ``out=``
semantics, products accumulated in fp32 and rounded once to the output dtype. A named backend
never comes here: it raises its own error on a GPU it does not run on.

``accumulate=torch.float16`` is refused here: it promises one fp16 running sum, which only
wsgemm's kernels give. The first call of each (device, reason) says so in one INFO line of the
``wsgemm`` logger (where torch.matmul just won a race, the race's line said it:
``Dispatcher.route``); the call's signature then keeps a launcher that calls torch directly, like
any other signature's (``dispatch.call``).
"""

from __future__ import annotations

import logging

import torch

from .epilogue import apply_in_torch, combine_in_torch, wide_dtype
from .overlap import spans
from .validate import Problem

log = logging.getLogger("wsgemm")

# torch.mm / torch.bmm with out_dtype (16-bit inputs, fp32 output; CUDA only)
_HAS_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype") and hasattr(torch.ops.aten.bmm, "dtype")


def refuse_accumulator(acc_dtype: torch.dtype, reason: str) -> None:
    """ValueError for an fp16 accumulator on torch's road (``reason``: why it runs there)."""
    if acc_dtype != torch.float32:
        raise ValueError(
            f"accumulate={acc_dtype} needs one of wsgemm's kernels, and backend='auto' runs "
            f"torch.matmul here ({reason}), which accumulates in fp32; pass "
            "accumulate=torch.float32"
        )


def first_call(
    d, key, a, b, out, p: Problem, reason: str, bias=None, provisional: bool = False
) -> torch.Tensor:
    """The first call of a signature whose route is torch.matmul, on validated operands ``p``:
    refuse an fp16 accumulator, say the reason once per (device, reason), run, and keep the
    launcher for the signature (``key``, None when it could not be formed; ``provisional``:
    until a race stores a decision, ``Dispatcher.remember``)."""
    refuse_accumulator(p.acc_dtype, reason)
    if d.say_once(("torch", a.device.index, reason)):  # the dispatcher's device (index)
        log.info("%s: backend='auto' runs torch.matmul (fallback): %s", a.device, reason)
    result = run(a, b, out, p, bias)
    if key is not None:
        launcher = lambda a, b, out, pa, pb, po, bias=None: run(a, b, out, p, bias)  # noqa: E731
        d.remember(key, (launcher, spans(out, a, b, bias)), provisional)
    return result


def run(a, b, out, p: Problem, bias=None) -> torch.Tensor:
    """``act(a @ b + bias)`` of ``p.c_dtype`` by torch (the epilogue ``p.epilogue`` applied
    after the product, ``epilogue.apply_in_torch``), into ``out`` when given (torch's out=
    bumps its version counter, as the kernels' path does). With alpha or a residual (C in
    ``out``) the fp32 product, combined in fp32 and rounded once (``combine_in_torch``)."""
    if p.epilogue.scalars:
        if out is None:  # alpha without a residual (a residual's C is always in ``out``)
            out = torch.empty(p.out_shape, dtype=p.c_dtype, device=a.device)
        # (fp32, or fp64 for fp64 operands: never narrower than they are)
        return combine_in_torch(out, product(a, b, wide_dtype(a.dtype)), bias, p)
    if out is not None and out.dtype == a.dtype:
        return apply_in_torch(torch.matmul(a, b, out=out), bias, p.epilogue)
    result = apply_in_torch(product(a, b, p.c_dtype), bias, p.epilogue)
    if out is None:
        return result
    return out.copy_(result)


def product(a, b, c_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` rounded once to ``c_dtype``. In the input dtype when that is the output's
    (cuBLAS accumulates 16-bit products in fp32; its split-K reductions follow torch's
    ``allow_fp16/bf16_reduced_precision_reduction``, as torch.matmul's do) or the output is
    narrower (one rounding of the wide result). A 16-bit product into fp32 or the other 16-bit
    dtype is computed in fp32 first: rounding to the input dtype on the way would lose
    precision and, for fp16, range."""
    if c_dtype == a.dtype:
        return torch.matmul(a, b)
    if a.dtype.itemsize > c_dtype.itemsize:
        return torch.matmul(a, b).to(c_dtype)
    wide = _fp32_product(a, b)
    return wide if c_dtype == torch.float32 else wide.to(c_dtype)


def _fp32_product(a, b) -> torch.Tensor:
    """The fp32 product of 16-bit operands: cuBLAS's fp32 output of 16-bit inputs (torch's
    ``out_dtype``; the tensor cores) where torch has it for these operands, else the inputs
    widened (every 16-bit product is exact in fp32)."""
    same_batch = a.dim() == 2 or a.shape[0] == b.shape[0]
    if _HAS_OUT_DTYPE and a.is_cuda and a.dim() == b.dim() and same_batch:
        mm = torch.mm if a.dim() == 2 else torch.bmm
        return mm(a, b, out_dtype=torch.float32)
    return torch.matmul(a.float(), b.float())


def describe_operands() -> str:
    """``explain``'s operands line for the torch route."""
    return "operands: torch.matmul's to plan (no wsgemm kernel runs)"
