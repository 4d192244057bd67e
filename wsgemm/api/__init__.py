"""The torch-facing operation: ``matmul`` means what ``torch.matmul`` means for 2-D and 3-D
operands, on wsgemm's kernels.

Three steps, one module each:

* ``validate`` (``validate.py``): every check, a pure function of the arguments; a rejected call
  leaves nothing behind.
* ``plan`` (``plan.py``): kernel views of the operands, copies only where a kernel cannot address
  them.
* ``dispatch`` (``dispatch.py``): backend choice and kernel lookup through a ``Dispatcher``
  (``wsgemm.host.dispatch``: device facts, compiled kernels, the compile cache), the launch, and
  a prebuilt launcher per call signature so that a repeated call costs little more than the
  kernel call itself.

The instruments above this layer (``wsgemm.bench``) use only the names here: ``matmul`` on a
dispatcher of their own (``stand_in``: the host path without a GPU) and ``shipped_config`` (what
``config=`` replaces).
"""

from __future__ import annotations

import torch

from .. import host
from ..host.dispatch import DISPATCHER, Dispatcher, StandInDevices
from . import dispatch
from .plan import batched, plan
from .validate import (
    ACC_DTYPES,
    Problem,
    check_accumulate_kind,
    check_backend,
    check_backend_kind,
    dtype_list,
    validate,
)

__all__ = [
    "DISPATCHER",
    "Dispatcher",
    "Problem",
    "available_backends",
    "batched",
    "explain",
    "matmul",
    "plan",
    "shipped_config",
    "stand_in",
    "validate",
]


def matmul(
    a,
    b,
    *,
    out=None,
    out_dtype=None,
    accumulate=torch.float32,
    backend="auto",
    config=None,
    dispatcher=None,
    bias=None,
    activation=None,
):
    """``a @ b`` on the tensor cores, with torch.matmul's meaning for 2-D and 3-D operands;
    with ``bias`` or ``activation``, ``activation(a @ b + bias)`` in one kernel.

    Args:
        a: (M, K) or (L, M, K), float16 or bfloat16, CUDA, any strides.
        b: (K, N) or (L, K, N), same dtype and device as ``a``. A 2-D operand against a 3-D one,
            or a batch of 1 against a batch of L, broadcasts over L as in torch.
        out: optional output written in place; shape (M, N) or (L, M, N); must not overlap
            ``a`` or ``b`` nor itself.
        out_dtype: float16, bfloat16 or float32; default the input dtype (or ``out.dtype``).
        accumulate: torch.float32 (default, as cuBLAS) or torch.float16 (fp16 inputs only).
        backend: "auto" (the best kernel for the GPU and problem: on Hopper a tile and split-K
            count per shape, see ``explain`` and docs/policy.md) or one of
            ``wsgemm.host.BACKENDS`` (its shipped config, never split).
        config: with a named ``backend``, a config of that backend's kernel class to run
            instead of the shipped one (``shipped_config``; tuning: each distinct config
            compiles once).
        dispatcher: the ``Dispatcher`` whose devices, kernels and launchers the call uses;
            default the process's (``DISPATCHER``). A benchmark or test passes its own, such
            as ``stand_in()``.
        bias: optional, the inputs' dtype, added to the product: (N,), (1, N) or () one value
            per column (``nn.Linear``'s bias), (M, 1) one per row; the same for every batch.
        activation: None, "relu", "relu2" (relu squared), "gelu" (erf form), "gelu_tanh"
            (torch's ``approximate="tanh"``) or "silu", applied after the bias. On the sm90
            family both are fused: computed in fp32 on the accumulators before the output
            conversion; other backends apply them after the product (``explain`` says which).

    Returns:
        the product, (M, N) or (L, M, N), of ``out_dtype`` (``out`` itself when given).

    Records no gradients: with grad mode on, an input that requires grad is an error. Safe to
    capture in a CUDA graph once the call has run outside it (the first call compiles).
    """
    d = DISPATCHER if dispatcher is None else dispatcher
    return dispatch.call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation)


def explain(
    a,
    b,
    *,
    out=None,
    out_dtype=None,
    accumulate=torch.float32,
    backend="auto",
    bias=None,
    activation=None,
) -> str:
    """Which kernel ``matmul`` with these arguments runs, and why: the backend, tile, cluster
    and split-K count, and the reason (on Hopper, the shape policy's: docs/policy.md). Checks
    the arguments as ``matmul`` does and reads the device's capability and SM count; compiles
    and launches nothing.

    Returns:
        a few lines of text: the problem, the kernel, the split, why, and the operands (read
        in place, or copied on every call: into which major, how many bytes, why).
    """
    return dispatch.explain(DISPATCHER, a, b, out, out_dtype, accumulate, backend, bias, activation)


def available_backends(device=None) -> list[str]:
    """The backends that run on ``device`` (default: the current CUDA device), best first."""
    return DISPATCHER.available_backends(device)


def shipped_config(backend: str, accumulate=torch.float32):
    """The config ``matmul(..., backend=backend, accumulate=accumulate)`` runs, a frozen
    dataclass: the base a tuning run changes fields of and passes as ``config=``."""
    check_backend_kind(backend)
    check_backend(backend)
    check_accumulate_kind(accumulate)
    if backend == "auto":
        raise ValueError(
            "backend='auto' picks a config per shape (explain says which); "
            f"name a backend: {', '.join(host.BACKENDS)}"
        )
    if accumulate not in ACC_DTYPES:
        raise ValueError(
            f"accumulate={accumulate} is not allowed; allowed: {dtype_list(ACC_DTYPES)}"
        )
    return host.BACKENDS[backend].config(ACC_DTYPES[accumulate])


def _no_op(*args) -> None:
    """A stand-in's kernel: every variant's compiled function, doing nothing. Everything around
    it is the real cache's: the kernel call that checks the views, binds a signature's sizes and
    strides once and then passes addresses."""
    return None


def stand_in(capability: tuple[int, int] = (9, 0), sm_count: int = 132) -> Dispatcher:
    """A dispatcher on which ``matmul(..., dispatcher=...)`` takes CPU tensors for a GPU of
    ``capability`` with ``sm_count`` SMs and launches kernels that do nothing: the whole host
    path of a call (checks, choice, planning, the launcher kept per signature) without a GPU,
    compiling nothing. What ``python scripts/bench_host_overhead.py --stand-in`` times."""
    return Dispatcher(
        cache=host.CompileCache(lambda variant: _no_op),
        devices=StandInDevices(capability, sm_count),
    )
