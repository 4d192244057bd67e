"""Every check of ``matmul``, as a pure function of its arguments: ``validate`` reads tensor
attributes (and, last, data pointers for the overlap check) and raises; it queries no device,
picks no backend and allocates nothing, so a rejected call leaves nothing behind and every check
but the device's runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import host
from ..support import ACCUMULATOR_RULE, accumulator_allowed
from .overlap import overlaps, repeats_elements

# torch dtype -> the host's name for it (host.AB_DTYPES etc. are the one list of what is allowed)
AB_DTYPES = {getattr(torch, name): name for name in host.AB_DTYPES}
C_DTYPES = {getattr(torch, name): name for name in host.C_DTYPES}
ACC_DTYPES = {getattr(torch, name): name for name in host.ACC_DTYPES}


def dtype_list(dtypes) -> str:
    """``"torch.float16, torch.bfloat16"``: the allowed dtypes in an error message."""
    return ", ".join(str(d) for d in dtypes)


@dataclass(frozen=True)
class Problem:
    """A validated call: what every backend computes."""

    batch: int | None  # L after broadcasting (may be 0); None for a 2-D @ 2-D call
    m: int
    n: int
    k: int
    ab_dtype: torch.dtype
    c_dtype: torch.dtype
    acc_dtype: torch.dtype

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m, self.n) if self.batch is None else (self.batch, self.m, self.n)

    @property
    def dtype_names(self) -> tuple[str, str, str]:
        """(A/B, C, accumulator) in the host's vocabulary."""
        return AB_DTYPES[self.ab_dtype], C_DTYPES[self.c_dtype], ACC_DTYPES[self.acc_dtype]


def _check_dense(name: str, t, *, what: str = "a torch.Tensor") -> None:
    """A strided tensor: nested and sparse tensors have no single (sizes, strides) to read."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be {what}, got {type(t).__name__}")
    if t.is_nested:
        raise TypeError(f"{name} is a nested tensor; wsgemm multiplies dense (strided) tensors")
    if t.layout != torch.strided:
        raise TypeError(
            f"{name} has layout {t.layout}; wsgemm multiplies dense (torch.strided) tensors "
            f"(convert with {name}.to_dense())"
        )


def _check_operand(name: str, t) -> None:
    _check_dense(name, t)
    if t.dim() not in (2, 3):
        raise ValueError(
            f"{name} must be 2-D (rows, cols) or 3-D (batch, rows, cols), got {t.dim()}-D "
            f"with shape {tuple(t.shape)}"
        )
    if t.dtype not in AB_DTYPES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; wsgemm multiplies {dtype_list(AB_DTYPES)} operands"
        )


def _batch_of(t: torch.Tensor) -> int | None:
    return t.shape[0] if t.dim() == 3 else None


def check_out_fits(out: torch.Tensor, expected: tuple, out_dtype) -> None:
    """``out`` has a C dtype (``out_dtype`` if given) and the product's shape ``expected``.
    Shape arithmetic only: shared with the torch op's fake checks and its N-D road."""
    if out_dtype is not None and out.dtype != out_dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype={out_dtype}")
    if out.dtype not in C_DTYPES:
        raise TypeError(f"out has dtype {out.dtype}; allowed: {dtype_list(C_DTYPES)}")
    if tuple(out.shape) != expected:
        raise ValueError(f"out has shape {tuple(out.shape)}; this product needs {expected}")


def _check_out(out, expected: tuple[int, ...], out_dtype) -> None:
    _check_dense("out", out, what="a torch.Tensor or None")
    check_out_fits(out, expected, out_dtype)
    if any(st == 0 and size > 1 for size, st in zip(out.shape, out.stride(), strict=True)):
        raise ValueError(
            f"out has stride 0 along a dimension (strides {tuple(out.stride())}): several "
            "of its elements share one memory location; pass a tensor without overlap"
        )
    if repeats_elements(out.shape, out.stride()) is not False:  # undecided counts as a repeat
        raise ValueError(
            f"out's rows overlap in memory (shape {tuple(out.shape)}, strides "
            f"{tuple(out.stride())}): several of its elements share one memory location; pass "
            "a tensor without overlap"
        )


def check_dtype_args(ab_dtype: torch.dtype, out_dtype, accumulate) -> None:
    """``out_dtype`` and ``accumulate`` against the dtype tables and the accumulator rule, for
    operands of ``ab_dtype`` (already checked). Shared with the torch op's fake checks."""
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype or None, got {type(out_dtype).__name__}")
    if out_dtype is not None and out_dtype not in C_DTYPES:
        raise TypeError(
            f"out_dtype={out_dtype}; allowed: None (the input dtype), {dtype_list(C_DTYPES)}"
        )
    if not isinstance(accumulate, torch.dtype):
        raise TypeError(
            f"accumulate must be a torch.dtype, got {type(accumulate).__name__}; "
            f"allowed: {dtype_list(ACC_DTYPES)}"
        )
    if accumulate not in ACC_DTYPES:
        raise ValueError(f"accumulate={accumulate}; allowed: {dtype_list(ACC_DTYPES)}")
    if not accumulator_allowed(ab_dtype, accumulate):
        raise ValueError(f"accumulate={accumulate} with {ab_dtype} inputs: {ACCUMULATOR_RULE}")


def check_backend(backend, config=None) -> None:
    """``backend`` is ``"auto"`` or a registered name; ``config`` (tuning) fits it."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend not in ("auto", *host.BACKENDS):
        raise ValueError(
            f"backend={backend!r} is not a wsgemm backend; "
            f"allowed: auto, {', '.join(host.BACKENDS)}"
        )
    if config is None:
        return
    if backend == "auto":
        raise ValueError(
            "config= replaces a backend's shipped config, so it needs a named backend, "
            f"got backend='auto'; allowed: {', '.join(host.BACKENDS)}"
        )
    shipped = type(host.BACKENDS[backend].config())
    if not isinstance(config, shipped):
        raise TypeError(
            f"config for backend={backend!r} must be a {shipped.__name__}, "
            f"got {type(config).__name__}"
        )


def check_split(config, accumulate) -> None:
    """A config that splits K (an ``Sm90Config``'s ``split_k``) names a count >= 2 and runs
    with an fp32 accumulator: with ``accumulate=torch.float16`` the product is promised as one
    fp16 running sum over all of K, which partial sums added in fp32 are not."""
    split = getattr(config, "split_k", 1)
    if getattr(config, "stream_k", False):
        if accumulate != torch.float32:
            raise ValueError(
                f"config.stream_k=True needs accumulate=torch.float32 (got {accumulate}): a "
                "tile's parts are added in fp32, not one fp16 running sum over K"
            )
        return
    if split == 1:
        return
    if split == 0:
        raise ValueError(
            "config.split_k=0 names the compiled split-K kernel, whose count comes with each "
            "launch; pass the number of splits (>= 2), or 1 for none"
        )
    if accumulate != torch.float32:
        raise ValueError(
            f"config.split_k={split} needs accumulate=torch.float32 (got {accumulate}): split "
            "partial sums are added in fp32, not one fp16 running sum over K"
        )


def _check_no_grad(a, b, out) -> None:
    """The core records no gradients: a silent result without ``grad_fn`` would drop them."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.requires_grad:
            raise ValueError(
                f"{name} requires grad and grad mode is on, but wsgemm.api.matmul records no "
                f"gradients; call it under torch.no_grad() or pass {name}.detach()"
            )


def _check_devices(a, b, out, device_type: str) -> None:
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.device.type != device_type:
            raise ValueError(
                f"{name} must be a {device_type.upper()} tensor, got a tensor on {t.device}"
            )
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got a: {a.device}, b: {b.device}")
    if out is not None and out.device != a.device:
        raise ValueError(f"out is on {out.device}, the operands on {a.device}")


def check_no_overlap(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out`` shares no byte with ``a`` or ``b`` (a kernel reading what it writes would read
    garbage). Arithmetic only (``overlap.py``): exact for disjoint address ranges and for views
    of one buffer with the same strides, conservative for the rest."""
    for name, t in (("a", a), ("b", b)):
        if overlaps(out, t):
            raise ValueError(f"out overlaps {name} in memory; pass a separate output tensor")


def validate(
    a, b, out, out_dtype, accumulate, backend, config=None, *, device_type: str = "cuda"
) -> Problem:
    """Every check of ``matmul``, in the order a reader would ask them. Raises, never allocates.

    The device checks come after everything readable on any device (so the CPU tests reach
    them) and before the one check that reads data pointers (meta tensors have none).
    ``device_type`` is where the kernels run: a stand-in dispatcher (tests, the host-overhead
    benchmark) runs them on the CPU.
    """
    _check_operand("a", a)
    _check_operand("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got a: {a.dtype}, b: {b.dtype}")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ValueError(
            f"inner dimensions differ: a is {tuple(a.shape)} (K={k}) and b is {tuple(b.shape)} "
            f"(K={k2}); a's last dim must equal b's second-to-last"
        )
    la, lb = _batch_of(a), _batch_of(b)
    if la is not None and lb is not None and la != lb and 1 not in (la, lb):
        raise ValueError(
            f"batch dimensions differ: a has {la}, b has {lb}; they must be equal or one of "
            "them 1 (broadcast), as in torch.matmul"
        )
    # torch.matmul's broadcast: a batch of 1 (or none) takes the other's, which may be 0
    batch = la if lb is None else lb if (la is None or la == 1) else la

    check_dtype_args(a.dtype, out_dtype, accumulate)
    if out is not None:
        _check_out(out, (m, n) if batch is None else (batch, m, n), out_dtype)
    check_backend(backend, config)
    check_split(config, accumulate)
    _check_no_grad(a, b, out)
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.is_neg():
            raise ValueError(
                f"{name} is a negative view (is_neg()), which the kernels cannot honour; "
                f"pass {name}.resolve_neg()"
            )
    _check_devices(a, b, out, device_type)
    if out is not None:
        check_no_overlap(out, a, b)
    c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    return Problem(batch, m, n, k, a.dtype, c_dtype, accumulate)
