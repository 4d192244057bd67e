"""Is a backend's output right? Compared against an fp32 reference before anything is timed.

Two normalized errors of ``d = out - ref`` catch different faults:

* ``rel = ||d||_F / ||ref||_F`` catches errors spread over the matrix (a wrong K loop, a swizzle
  bug, lost precision).
* ``peak = max|d| / rms(ref)`` catches a few wrong elements (a ragged edge, one bad tile), which
  vanish in a Frobenius norm of millions of elements.

The tolerance is twice cuBLAS's own error on the same inputs (the project's "2x PyTorch's error"
rule), never below a model of the rounding a correct kernel must make: the output's unit
roundoff ``u_out``, plus ``u_acc * sqrt(K)`` for an fp16 accumulator, whose rounding error
grows like a random walk over the K additions (cuBLAS accumulates in fp32 whatever we ask, so
its error says nothing about an fp16 accumulator). Outputs are poisoned with NaN before the
call so unwritten elements fail the finiteness test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Unit roundoff (half an ulp at 1.0) per dtype name.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}
# The largest of M*N normal deviates is ~sqrt(2 ln(MN)) standard deviations (about 6 for 16k^2
# elements); 8 leaves room, so a correct kernel's peak error stays under 8 u_out of rms(ref).
PEAK_OVER_RMS = 8.0
# Twice the reference library's own error, the project's tolerance rule.
CUBLAS_ERROR_FACTOR = 2.0


@dataclass(frozen=True)
class Errors:
    rel: float
    peak: float
    finite: bool

    def to_dict(self) -> dict:
        return {"rel": self.rel, "peak": self.peak, "finite": self.finite}


@dataclass(frozen=True)
class Tolerance:
    rel: float
    peak: float

    def verdict(self, errors: Errors) -> str | None:
        """None when ``errors`` pass, else why not."""
        if not errors.finite:
            return "output has NaN/Inf (unwritten elements stay NaN)"
        if not errors.rel <= self.rel:
            return f"relative error {errors.rel:.2e} > tolerance {self.rel:.2e}"
        if not errors.peak <= self.peak:
            return f"peak error {errors.peak:.2e} rms(ref) > tolerance {self.peak:.2e}"
        return None


def model_tolerance(dtype: str, accumulate: str, k: int) -> Tolerance:
    """The rounding a correct kernel may make, from the dtypes and K alone."""
    rel = UNIT_ROUNDOFF[dtype]
    if accumulate == "fp16":
        rel += UNIT_ROUNDOFF["fp16"] * math.sqrt(k)
    return Tolerance(rel=rel, peak=PEAK_OVER_RMS * rel)


def tolerance(model: Tolerance, cublas: Errors | None) -> Tolerance:
    """Twice cuBLAS's measured error, never below the rounding model."""
    if cublas is None or not cublas.finite:
        return model
    return Tolerance(
        rel=max(model.rel, CUBLAS_ERROR_FACTOR * cublas.rel),
        peak=max(model.peak, CUBLAS_ERROR_FACTOR * cublas.peak),
    )


def reference(a, b, bias=None, activation=None):
    """fp32 product of the (exactly representable) half inputs, with tf32 off; with a bias
    and an activation, ``activation(a @ b + bias)`` in fp32 (``--epilogue``)."""
    import torch

    from wsgemm import api

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        ref = torch.matmul(a.float(), b.float())
    finally:
        torch.set_float32_matmul_precision(previous)
    if bias is not None:
        ref += bias.float()
    return api.torch_activation(activation or "none", ref)


def errors(out, ref) -> Errors:
    import torch

    out32 = out.to(torch.float32, copy=True)
    finite = bool(torch.isfinite(out32).all())
    ref_norm = float(torch.linalg.vector_norm(ref))
    rms = ref_norm / math.sqrt(ref.numel())
    if not finite:
        return Errors(rel=math.inf, peak=math.inf, finite=False)
    diff = out32.sub_(ref)
    scale = ref_norm if ref_norm > 0 else 1.0
    rel = float(torch.linalg.vector_norm(diff)) / scale
    peak = float(diff.abs_().max()) / (rms if rms > 0 else 1.0)
    return Errors(rel=rel, peak=peak, finite=True)


def poison(out) -> None:
    """Fill ``out`` with NaN so elements a kernel forgets to write fail the check."""
    out.fill_(float("nan"))
