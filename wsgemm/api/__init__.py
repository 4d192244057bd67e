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
from .epilogue import activate_, torch_activation
from .gated import gated_linear  # (its core, ``dispatcher=`` taken: the bench's stand-in)
from .plan import batched, plan
from .tuning import TuneResult, tune
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
    "activate_",
    "available_backends",
    "batched",
    "explain",
    "gated_linear",
    "matmul",
    "plan",
    "shipped_config",
    "stand_in",
    "torch_activation",
    "tune",
    "TuneResult",
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
    c=None,
    alpha=1.0,
    beta=1.0,
):
    """``a @ b`` on the tensor cores, with torch.matmul's meaning for 2-D and 3-D operands;
    with ``bias`` or ``activation``, ``activation(a @ b + bias)`` in one kernel; with ``c``
    or ``alpha``, ``activation(alpha · a @ b + beta · c + bias)`` (torch.addmm's
    ``beta · input + alpha · mat1 @ mat2``, then the bias and activation).

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
        c: optional residual, of the output's dtype, broadcastable to the output: ``beta · c``
            is added before the bias. On the sm90 family the kernel reads C from the output
            just before it stores it: pass ``out=c`` (the same tensor) for an in-place residual
            that costs no other pass; any other ``c`` is first copied into the output.
            ``beta == 0`` never reads ``c``.
        alpha, beta: real numbers (launch arguments: a new value compiles nothing; each
            distinct pair is its own call signature, so keep them fixed in a hot loop). Without
            ``c``, ``beta`` scales nothing and is not read.

    Returns:
        the product, (M, N) or (L, M, N), of ``out_dtype`` (``out`` itself when given).

    Records no gradients: with grad mode on, an input that requires grad is an error. Safe to
    capture in a CUDA graph once the call has run outside it (the first call compiles).
    """
    d = DISPATCHER if dispatcher is None else dispatcher
    if c is None and alpha == 1.0:  # (beta scales c only; call_scaled checks both)
        return dispatch.call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation)
    return dispatch.call_scaled(
        d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, c, alpha, beta
    )


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
    cc: tuple[int, int] | None = None,
    sm_count: int | None = None,
    grouped: bool = False,
    offs=None,
    gated: bool = False,
    c=None,
    alpha=1.0,
    beta=1.0,
    row_scale=None,
) -> str:
    """Which kernel ``matmul`` with these arguments runs, and why: the backend, tile, cluster
    and split-K count, and the reason (on Hopper, the shape policy's: docs/policy.md). Checks
    the arguments as ``matmul`` does and reads the device's capability and SM count; compiles
    and launches nothing. With ``grouped=True`` (or ``offs``), the same for ``grouped_mm(a, b,
    offs, out_dtype=, backend=, activation=, gated=, row_scale=)``; an ``offs`` on the CPU
    (``offs.cpu()``) adds the grouped kernel's tile map: which tiles of which group run on which
    CTAs. With ``gated=True`` alone, the same for ``gated_linear(a, b.T, activation, bias=)``
    (``b`` the transposed ``[w_gate; w_up]`` weight; activation default "silu"); ``row_scale`` is
    grouped_mm's only (a ValueError without ``grouped``/``offs``).

    Operands of the core's ranks: 2-D and 3-D (a ValueError for others). ``wsgemm.explain``
    (``wsgemm.ops.explain``) takes every shape ``wsgemm.matmul`` does, 1-D and N-D included:
    it folds them as ``matmul`` does and explains the folded 2-D/3-D call here.

    ``cc`` and ``sm_count`` answer for another GPU (a (major, minor) capability, its SM
    count): a stand-in of it, so no GPU is needed; meta and fake tensors, or a machine without a
    GPU, get a stand-in too (default an H200: sm_90, 132 SMs).

    Returns:
        a few lines of text: the problem, the kernel, the split, why, and the operands (read
        in place, or copied on every call: into which major, how many bytes, why).
    """
    d = DISPATCHER
    stand_in_gpu = cc is not None or sm_count is not None
    if not stand_in_gpu and isinstance(a, torch.Tensor):
        fake = isinstance(a, torch._subclasses.fake_tensor.FakeTensor)
        stand_in_gpu = a.device.type == "meta" or fake or not torch.cuda.is_available()
    if stand_in_gpu:
        d = _explaining_dispatcher(a, cc, sm_count)
    if not (grouped or offs is not None):
        if row_scale is not None:
            raise ValueError("row_scale is grouped_mm's (a factor per row of a grouped "
                             "product); pass grouped=True and offs")  # fmt: skip
        if gated:  # gated_linear(a, b.T, activation): b is the [w_gate; w_up] weight's T
            from . import gated as gated_api

            others = dict(
                out=out, out_dtype=out_dtype, c=c,
                accumulate=None if accumulate is torch.float32 else accumulate,
                backend=None if backend == "auto" else backend,
                alpha=None if alpha == 1.0 else alpha, beta=None if beta == 1.0 else beta,
            )  # fmt: skip
            return gated_api.explain(d, a, b.t() if isinstance(b, torch.Tensor) else b,
                                     "silu" if activation is None else activation, bias,
                                     **others)  # fmt: skip
    if grouped or offs is not None:
        from . import grouped as grouped_api

        return grouped_api.explain(d, a, b, offs, out_dtype, backend, activation, gated,
                                   row_scale)  # fmt: skip
    return dispatch.explain(
        d, a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha, beta
    )


def _explaining_dispatcher(a, cc, sm_count) -> Dispatcher:
    """A dispatcher posing as a GPU of ``cc`` with ``sm_count`` SMs for ``explain`` (each
    default: this machine's GPU where it has one, else an H200's sm_90 with 132 SMs), taking
    tensors of ``a``'s device type (meta, fake CUDA, ...); it compiles nothing."""
    if cc is not None and not (
        isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(v, int) for v in cc)
    ):
        raise TypeError(f"cc must be a (major, minor) tuple of ints, got {cc!r}")
    if sm_count is not None and (not isinstance(sm_count, int) or sm_count < 1):
        raise ValueError(f"sm_count must be a positive int, got {sm_count!r}")
    here = torch.cuda.is_available()
    if here:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    default_cc = (props.major, props.minor) if here else (9, 0)
    default_sms = props.multi_processor_count if here else 132
    device_type = a.device.type if isinstance(a, torch.Tensor) else "meta"
    return Dispatcher(
        cache=None,
        devices=StandInDevices(
            cc or default_cc, sm_count or default_sms, device_type=device_type,
            name="a stand-in GPU",
        ),
    )  # fmt: skip


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
    compiling nothing. What ``python scripts/bench_host_overhead.py --stand-in`` times. Off
    Hopper ``auto`` runs the kernel too: no race against torch.matmul (``against_torch=False``;
    a race needs a CUDA timer)."""
    return Dispatcher(
        cache=host.CompileCache(lambda variant: _no_op),
        devices=StandInDevices(capability, sm_count),
        against_torch=False,
    )
