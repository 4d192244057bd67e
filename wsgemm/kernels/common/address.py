"""The address entry: a kernel's operands given as three addresses and their sizes and strides.

Every kernel class's ``by_address`` (the entry the host compiles) takes, instead of the three
operand tensors of ``__call__``, their base addresses (``cute.Pointer``, 16-byte aligned), the
problem sizes M, N, K, L and each operand's two dynamic strides (the non-unit one of its first
two modes, then the batch stride; multiples of 16 bytes), and builds here the same
(M, K, L) / (N, K, L) / (M, N, L) tensors ``__call__`` would have been given: each operand's major
mode (a compile-time argument) has the static stride 1, everything else is a run-time value,
and the strides carry the same 16-byte divisibility the fake tensors of the tensor entry
declare. So the device code is the tensor entry's; only the host's argument passing differs.

Why: a call signature the host has seen before binds the sizes and strides once, and a later
call passes three integers where it passed three tensor views (``as_strided`` each, about 1 us
apiece in torch). The compiled function still needs one tensor to find the device and its
current stream (``token``, any tensor on the device; the host passes an empty one).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from wsgemm.support import VECTOR_BYTES

#: The run-time values after the three addresses, in order (``by_address``'s parameters).
SIZE_AND_STRIDE_NAMES = (
    "m", "n", "k", "l", "a_ld", "a_batch", "b_ld", "b_batch", "c_ld", "c_batch",
)  # fmt: skip


def _operand(ptr: cute.Pointer, rows, cols, l, ld, batch, rows_major: bool):  # noqa: E741
    """(rows, cols, l) at ``ptr``: stride 1 along rows (``rows_major``) or cols, ``ld`` along the
    other, ``batch`` along l; both declared multiples of 16 bytes."""
    vector = VECTOR_BYTES * 8 // ptr.dtype.width
    ld = cute.assume(ld, divby=vector)
    batch = cute.assume(batch, divby=vector)
    stride = (1, ld, batch) if rows_major else (ld, 1, batch)
    return cute.make_tensor(ptr, cute.make_layout((rows, cols, l), stride=stride))


def operands(majors: tuple[str, str, str], a, b, c, m, n, k, l, a_ld, a_batch, b_ld, b_batch,  # noqa: E741
             c_ld, c_batch):  # fmt: skip
    """(mA, mB, mC) of ``__call__`` from ``by_address``'s run-time values; ``majors`` is
    (A's: "m" or "k", B's: "n" or "k", C's: "m" or "n")."""
    a_major, b_major, c_major = majors
    if cutlass.const_expr(
        a_major not in ("m", "k") or b_major not in ("n", "k") or c_major not in ("m", "n")
    ):
        raise ValueError(f"majors {majors}: A's is 'm' or 'k', B's 'n' or 'k', C's 'm' or 'n'")
    return (
        _operand(a, m, k, l, a_ld, a_batch, a_major == "m"),
        _operand(b, n, k, l, b_ld, b_batch, b_major == "n"),
        _operand(c, m, n, l, c_ld, c_batch, c_major == "m"),
    )
