"""Operand layouts ``TN``, ``NN``, ``NT``, ``TT`` and the randn operands the benchmark feeds.

The letters follow BLAS and the CUTLASS profiler: the first letter is A's, the second B's, for
the logical matrices of ``C[M, N] = A[M, K] @ B[K, N]``; ``T`` means that matrix is stored
row-major, ``N`` that it is stored column-major (BLAS's "not transposed" Fortran order).

====== ================================ ================================ =====================
layout A (M, K) as torch sees it        B (K, N) as torch sees it        contiguous mode
====== ================================ ================================ =====================
TN     ``(M, K)`` tensor                ``(N, K)`` tensor, ``.t()`` view K and K (cuBLAS-native)
NN     ``(K, M)`` tensor, ``.t()`` view ``(N, K)`` tensor, ``.t()`` view M and K
NT     ``(K, M)`` tensor, ``.t()`` view ``(K, N)`` tensor                M and N
TT     ``(M, K)`` tensor                ``(K, N)`` tensor                K and N (plain ``a @ b``)
====== ================================ ================================ =====================

Every operand is a view of one contiguous allocation: no layout costs a copy, so the GEMM sees
the strides above. ``TN`` is what ``x @ W.T`` of a linear layer gives.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("TN", "NN", "NT", "TT")


@dataclass(frozen=True)
class Layout:
    name: str

    def __post_init__(self) -> None:
        if self.name not in LAYOUTS:
            raise ValueError(f"unknown layout {self.name!r}; choose one of {', '.join(LAYOUTS)}")

    @property
    def a_row_major(self) -> bool:
        return self.name[0] == "T"

    @property
    def b_row_major(self) -> bool:
        return self.name[1] == "T"

    @property
    def a_major(self) -> str:
        """Which mode of A is contiguous: ``"K"`` or ``"M"``."""
        return "K" if self.a_row_major else "M"

    @property
    def b_major(self) -> str:
        """Which mode of B is contiguous: ``"N"`` or ``"K"``."""
        return "N" if self.b_row_major else "K"


def make_operands(
    layout: Layout, m: int, n: int, k: int, dtype, device, generator=None, batch: int = 1
):
    """Standard-normal A (M, K) and B (K, N) in ``layout``, each a view of a fresh allocation;
    (L, M, K) and (L, K, N) for a ``batch`` L above 1."""
    import torch

    lead = (batch,) if batch > 1 else ()

    def randn(*shape):
        return torch.randn(*lead, *shape, dtype=dtype, device=device, generator=generator)

    a = randn(m, k) if layout.a_row_major else randn(k, m).transpose(-1, -2)
    b = randn(k, n) if layout.b_row_major else randn(n, k).transpose(-1, -2)
    return a, b
