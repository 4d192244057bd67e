"""Calling a compiled kernel: with its three kernel views (``KernelCall.__call__``), or bound
once to a call signature's sizes and strides and then given three addresses per call
(``KernelCall.bind``).

The compiled function is a kernel's address entry (``by_address``, ``kernels.common.address``):
an empty tensor on the device (``token``: it names the device, and so the current stream, to
the compiled function), the three operands' addresses, M, N, K, L, and each operand's two
dynamic strides, then the tensor entry's launch arguments. ``KernelCall`` reads those from the
(M, K, L) / (N, K, L) / (M, N, L) views the host plans, after the checks the compiled tensor
entry made (dtypes, device, unit strides, 16-byte strides and alignment), so every caller that
holds views calls a kernel as before. A launcher kept for a signature binds the sizes and
strides of its first call's views and passes only the addresses after that: a later call of the
signature has views of the same sizes and strides at its own addresses, and building them
(``as_strided``, about 1 us each in torch) was most of what a call cost beyond torch.mm's own
(docs/perf.md entry 23).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from ...support import VECTOR_BYTES

__all__ = ["KernelCall", "addresses", "token"]

_tokens: dict[tuple[str, int | None], torch.Tensor] = {}
_tokens_lock = threading.Lock()


def token(device: torch.device) -> torch.Tensor:
    """An empty int32 tensor on ``device`` (no memory: nothing is allocated, under capture or
    not), made once per device."""
    key = (device.type, device.index)
    t = _tokens.get(key)
    if t is None:
        import torch

        with _tokens_lock:
            t = _tokens.setdefault(key, torch.empty(0, dtype=torch.int32, device=device))
    return t


class KernelCall:
    """A compiled address entry ``fn`` of a variant whose operands have majors ``majors``
    ((A's, B's, C's): ``compile.operand_majors``) and dtypes ``dtypes`` ((A/B, C) torch
    dtypes), called as the tensor entry was: ``call(a_mkl, b_nkl, c_mnl, max_active_clusters,
    *launch_args)``; ``bind`` gives the per-signature launcher."""

    __slots__ = ("fn", "majors", "dtypes")

    def __init__(self, fn: Callable, majors: tuple[str, str, str], dtypes: tuple[Any, Any]):
        self.fn, self.majors, self.dtypes = fn, majors, dtypes

    def __call__(self, a, b, c, max_active_clusters: int, *launch_args):
        ints = self.sizes_and_strides(a, b, c)
        return self.fn(token(c.device), *addresses(a, b, c), *ints, max_active_clusters,
                       *launch_args)  # fmt: skip

    def bind(
        self,
        a,
        b,
        c,
        max_active_clusters: int,
        *launch_args,
        per_call: Callable | None = None,
        per_call_count: int = 0,
        late: int = 0,
    ) -> Callable:
        """``launch(pa, pb, pc, *late_values)``: this kernel on views with ``a``, ``b`` and
        ``c``'s sizes and strides at the addresses ``pa``, ``pb``, ``pc`` (ints), the launch
        arguments fixed; ``per_call()``, if given, returns the launch arguments after them
        afresh for each launch (split-K's buffers, ``per_call_count`` of them; the defaults of
        any after them are passed); the last ``late`` launch arguments are the launch's own (a
        fused epilogue's bias). The caller vouches that its addresses are of tensors like these
        (same dtypes and device, 16-byte aligned): nothing is checked per call."""
        if per_call is not None and per_call_count < 1:
            raise ValueError("bind: per_call needs per_call_count, how many arguments it returns")
        fn, void_p = self.fn, ctypes.c_void_p
        defaults = getattr(fn, "launch_defaults", None)
        if defaults is not None:  # a loaded kernel: every argument given, no keyword wrapper
            fn = fn.__wrapped__  # so the omitted arguments are given their defaults here
            given = len(launch_args) + (per_call_count if per_call is not None else 0)
            tail = defaults[given : len(defaults) - late]
        else:
            tail = ()
        args = (*self.sizes_and_strides(a, b, c), max_active_clusters, *launch_args)
        tok = token(c.device)
        addresses(a, b, c)  # the alignment of the views it binds
        if per_call is None:

            def launch(pa: int, pb: int, pc: int, *late_values) -> None:
                fn(tok, void_p(pa), void_p(pb), void_p(pc), *args, *tail, *late_values)

        else:

            def launch(pa: int, pb: int, pc: int, *late_values) -> None:
                fn(tok, void_p(pa), void_p(pb), void_p(pc), *args, *per_call(), *tail, *late_values)

        return launch

    def sizes_and_strides(self, a, b, c) -> tuple[int, ...]:
        """(M, N, K, L, then each operand's non-unit stride and batch stride) of the views,
        checked as the compiled tensor entry checked its arguments."""
        ab_dtype, c_dtype = self.dtypes
        for t, name, dtype in ((a, "A", ab_dtype), (b, "B", ab_dtype), (c, "C", c_dtype)):
            if t.dim() != 3 or t.dtype != dtype or t.device != c.device:
                raise ValueError(
                    f"kernel operand {name}: {t.dim()}-D {t.dtype} on {t.device}; the kernel "
                    f"takes 3-D {dtype} views on one device"
                )
        m, k, l_ = a.shape
        n = b.shape[0]
        if tuple(b.shape) != (n, k, l_) or tuple(c.shape) != (m, n, l_):
            raise ValueError(
                f"kernel views of shapes A {tuple(a.shape)}, B {tuple(b.shape)}, C "
                f"{tuple(c.shape)}: they must be (M, K, L), (N, K, L) and (M, N, L)"
            )
        a_major, b_major, c_major = self.majors
        return (m, n, k, l_, *_strides(a, "A", a_major == "m"),
                *_strides(b, "B", b_major == "n"), *_strides(c, "C", c_major == "m"))  # fmt: skip


def _strides(t: torch.Tensor, name: str, rows_major: bool) -> tuple[int, int]:
    """(the non-unit stride of the first two modes, the batch stride) of ``t``, whose unit
    stride must be where its major mode is and the others multiples of 16 bytes."""
    unit, ld = (0, 1) if rows_major else (1, 0)
    vector = VECTOR_BYTES // t.element_size()
    strides = t.stride()
    batch = strides[2] if t.shape[2] > 1 else 0
    if strides[unit] != 1 or strides[ld] % vector or batch % vector:
        raise ValueError(
            f"kernel operand {name} has strides {strides}: mode {unit} must have stride 1 and "
            f"the others be multiples of {vector} elements"
        )
    return strides[ld], batch


def addresses(*tensors: torch.Tensor) -> tuple[ctypes.c_void_p, ...]:
    """The tensors' data pointers as the compiled function takes them; each must be 16-byte
    aligned."""
    out = []
    for t in tensors:
        p = t.data_ptr()
        if p % VECTOR_BYTES:
            raise ValueError(f"a kernel operand at {p:#x} is not {VECTOR_BYTES}-byte aligned")
        out.append(ctypes.c_void_p(p))
    return tuple(out)
