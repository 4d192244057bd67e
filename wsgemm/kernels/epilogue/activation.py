"""The activations of a fused epilogue, on one fp32 value, for the special-function unit.

Plain Python functions called while a kernel is traced: the activation's name is a Python
string, so each kernel compiles exactly its own formula. The logistic forms use
``ex2.approx`` and ``rcp.approx`` (relative error about 2^-22, far below the bf16/fp16 output
rounding) and avoid the IEEE division that compiles to a subroutine call:

* ``silu(x) = x · 1/(1 + 2^(-x·log2 e))``
* ``gelu_tanh(x) = x · 1/(1 + 2^(-2u·log2 e))``, u = √(2/π)·(x + 0.044715x³): the identity
  ½(1 + tanh u) = 1/(1 + e^(-2u)), which keeps its relative accuracy for large negative x,
  where the tanh form cancels
* ``gelu(x) = ½x(1 + erf(x/√2))`` (torch's formula), with erf from Abramowitz and Stegun's
  7.1.26: 1 - erf(z) = t(a1 + t(a2 + ... + t a5)) e^(-z²), t = 1/(1 + p z), z >= 0, absolute
  error below 1.5e-7: one ``rcp.approx`` and one ``ex2.approx``; for x < 0 the product is
  ½x times that tail itself, so it keeps its relative accuracy where 1 + erf cancels.
  (libdevice's ``erff`` is branchy and, unrolled over a subtile, took local memory.)

At the extremes the logistic forms stay finite: 2^(+large) is +inf, its reciprocal 0, so the
result is -0.0 where torch gives -0.0 or a denormal.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2E = math.log2(math.e)
# Abramowitz & Stegun 7.1.26
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SQRT_HALF = math.sqrt(0.5)
GELU_CUBIC = 0.044715


def _logistic(u: Float32) -> Float32:
    """sigmoid(u) = 1 / (1 + e^(-u)), without a division."""
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(u * Float32(-LOG2E), fastmath=True))


def _logistic_times(x: Float32, u: Float32) -> Float32:
    """x · sigmoid(u) = x / (1 + e^(-u))."""
    return x * _logistic(u)


def _gelu_two_cdf(x: Float32) -> tuple[Float32, Float32]:
    """(2Φ(x) = 1 + erf(x/√2), e^(-x²/2)) by Abramowitz and Stegun's 7.1.26 (module
    docstring): the tail 1 - erf(z), z = |x|/√2, for x < 0, so it keeps its relative accuracy;
    the exponential is the tail's own."""
    z = cute.arch.fmax(x, -x) * Float32(SQRT_HALF)
    t = cute.arch.rcp_approx(Float32(1.0) + Float32(ERF_P) * z)
    poly = Float32(ERF_A[4])
    for a in reversed(ERF_A[:4]):
        poly = poly * t + Float32(a)
    poly_t = poly * t  # before the exponential (the order the GPU-tested SASS has)
    gauss = cute.math.exp2(z * z * Float32(-LOG2E), fastmath=True)
    tail = poly_t * gauss  # 1 - erf(z)
    return cutlass.select_(x >= Float32(0.0), Float32(2.0) - tail, tail), gauss


def apply(name: str, x: Float32) -> Float32:
    """``name``'s activation of ``x`` (``support.ACTIVATIONS``; "none" returns ``x``)."""
    if name == "none":
        return x
    if name == "relu":
        return cute.arch.fmax(x, Float32(0.0))
    if name == "relu2":
        r = cute.arch.fmax(x, Float32(0.0))
        return r * r
    if name == "silu":
        return _logistic_times(x, x)
    if name == "gelu_tanh":
        u = Float32(2.0 * SQRT_2_OVER_PI) * (x + Float32(GELU_CUBIC) * x * x * x)
        return _logistic_times(x, u)
    if name == "gelu":
        two_cdf = _gelu_two_cdf(x)[0]
        return Float32(0.5) * x * two_cdf
    raise ValueError(f"no activation {name!r} (support.ACTIVATIONS)")


def value_and_grad(name: str, x: Float32) -> tuple[Float32, Float32]:
    """(act(x), act'(x)) of ``name``'s activation (a gated unit's backward, ``Epilogue.dgated``),
    sharing their exponential; the derivatives are autograd's formulas for torch's forms:

    * silu: s + silu(x) · (1 - s), s = sigmoid(x) (= s · (1 + x (1 - s)))
    * gelu_tanh: σ + 2x · σ(1 - σ) · u'(x), σ = sigmoid(2u) = ½(1 + tanh u),
      u' = √(2/π)(1 + 3 · 0.044715 x²)
    * gelu: Φ(x) + x · φ(x), φ(x) = e^(-x²/2) / √(2π) (the exponential erf's tail already has)
    * relu: 1 where x > 0, else 0; relu2: 2 relu(x)
    """
    zero, one = Float32(0.0), Float32(1.0)
    if name == "relu":
        return cute.arch.fmax(x, zero), cutlass.select_(x > zero, one, zero)
    if name == "relu2":
        r = cute.arch.fmax(x, zero)
        return r * r, Float32(2.0) * r
    if name == "silu":
        s = _logistic(x)
        act = x * s  # _logistic_times(x, x)
        return act, s + act * (one - s)
    if name == "gelu_tanh":
        x2 = x * x
        u2 = Float32(2.0 * SQRT_2_OVER_PI) * (x + Float32(GELU_CUBIC) * x2 * x)
        sig = _logistic(u2)
        du = Float32(SQRT_2_OVER_PI) * (one + Float32(3.0 * GELU_CUBIC) * x2)
        return x * sig, sig + Float32(2.0) * x * sig * (one - sig) * du
    if name == "gelu":
        two_cdf, gauss = _gelu_two_cdf(x)
        cdf = Float32(0.5) * two_cdf
        return x * cdf, cdf + x * gauss * Float32(1.0 / math.sqrt(2.0 * math.pi))
    raise ValueError(f"no activation gradient {name!r} (support.ACTIVATIONS)")


def grad_through(name: str, g: Float32, x: Float32) -> Float32:
    """``g · act'(x)`` of ``name``'s activation (a plain MLP's backward, ``Epilogue.dact``;
    ``value_and_grad``'s derivative, whose activation value the compiler drops where the
    derivative does not use it), 0 where the derivative is (relu, relu2: torch's
    ``threshold_backward``, whatever ``g`` holds there)."""
    y = g * value_and_grad(name, x)[1]
    if name in ("relu", "relu2"):
        y = cutlass.select_(x > Float32(0.0), y, Float32(0.0))
    return y
