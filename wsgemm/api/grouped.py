"""``grouped_mm``: a grouped GEMM with ``torch._grouped_mm``'s meaning (a mixture-of-experts
layer's one GEMM per expert), on wsgemm's kernels where it has them.

Four forms, told by the operands' dimensions (``offs``: int32 cumulative *end* offsets of the
groups along the jagged dimension, no leading 0; a group may be empty):

========  =================  =================  ==========  ===================================
form      a                  b                  offs        result
========  =================  =================  ==========  ===================================
2D x 3D   (M, K) by group    (G, K, N)          (G,) on M   (M, N): rows of group g times b[g]
3D x 3D   (G, M, K)          (G, K, N)          None        (G, M, N): a batched product
2D x 2D   (M, K) by group    (K, N) by group    (G,) on K   (G, M, N): group g's K slice each
3D x 2D   (G, M, K)          (K, N) by group    (G,) on N   (M, N): column group g from a[g]
========  =================  =================  ==========  ===================================

Rows (2D x 3D) or columns (3D x 2D) past ``offs[-1]`` are not written: ``out`` keeps them, a
fresh result holds whatever its memory held (as torch's). A 2D x 2D group with an empty K slice
is zero. The offsets stay on the GPU: nothing here reads them on the host (no sync, capturable
in a CUDA graph), so nothing here can check them either: they must be non-decreasing and at
most the jagged dimension; others give unspecified values in the groups they garble, never an
access outside the operands (the ragged-M kernel and torch's loop clamp each end to [previous
end, extent]; the ragged-K kernel reads each group's two ends on their own, each clamped into
[0, K]: bad offsets garble the two differently).

Routes (``route``): 2D x 3D on the grouped kernel (``host.grouped``) on a GPU that has one,
for float16/bfloat16 inputs; 3D x 2D on the same kernel, transposed (``_run_kernel_3d2d``);
2D x 2D on the ragged-K grouped kernel (``_run_kernel_2d2d``; ``host.RAGGED_K_FAMILIES``),
under ``auto`` where torch has no fused kernel for its dtypes, or where that kernel would need
aligned groups (``_torch_needs_aligned_groups``), or where the groups are large;
3D x 3D on ``matmul`` (the batched kernels, with their own fallbacks); the rest on torch
(``torch._grouped_mm``, or a loop over the groups that reads the offsets on the host where
torch has none: a sync, refused inside a CUDA-graph capture).

Results are row-major with each row padded to a whole 16 bytes (torch's layout for its grouped
GEMM, which its kernels' TMA stores need): ``result_strides``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from .. import host
from ..host.dispatch import current_settings
from ..host.registry import PLAIN, Epilogue
from ..host.workspace import NO_EPILOGUE_LAUNCH, UNSPLIT_LAUNCH
from ..support import VECTOR_BYTES
from . import dispatch
from .epilogue import check_activation, gated_unit, torch_activation
from .overlap import overlaps, tensor_extent
from .plan import _copy_unit, _kernel_view, _padded
from .validate import check_out_memory

__all__ = ["GroupedProblem", "check_grouped", "grouped_mm", "result_shape", "result_strides"]

FORMS = ("2d3d", "3d3d", "2d2d", "3d2d")
#: Where a form's jagged dimension is (the operand and its dimension), and so what ``offs``
#: splits; None: no ``offs``.
_JAGGED = {"2d3d": ("a", 0), "3d3d": None, "2d2d": ("a", 1), "3d2d": ("b", 1)}
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)
#: Route names (``GroupedProblem.route``).
KERNEL, BATCHED, TORCH = "kernel", "batched", "torch"


@dataclass(frozen=True)
class GroupedProblem:
    form: str
    groups: int
    shape: tuple[int, ...]  # the result's
    c_dtype: torch.dtype
    epilogue: Epilogue = PLAIN  # an activation on the product, or a gated unit (half the width)

    def plain(self) -> GroupedProblem:
        """The product before its epilogue (a gated unit's: twice the result's width)."""
        width = self.shape[-1] * (2 if self.epilogue.gated else 1)
        return GroupedProblem(self.form, self.groups, (*self.shape[:-1], width), self.c_dtype)


def _form(a_dim: int, b_dim: int) -> str:
    if a_dim not in (2, 3) or b_dim not in (2, 3):
        raise ValueError(
            f"grouped_mm takes 2-D or 3-D operands (2D x 3D, 3D x 3D, 2D x 2D, 3D x 2D), got "
            f"a {a_dim}-D and b {b_dim}-D"
        )
    return f"{a_dim}d{b_dim}d"


def result_shape(a_shape, b_shape, offs_len: int | None) -> tuple[GroupedProblem, tuple]:
    """(form, groups) and the result's shape, from the shapes alone (the fake implementation's
    arithmetic); ValueError for operands that do not fit."""
    form = _form(len(a_shape), len(b_shape))
    if (_JAGGED[form] is None) != (offs_len is None):
        raise ValueError(
            f"grouped_mm's {form[:2].upper()} x {form[2:].upper()} form "
            + (
                "takes no offs (its first dimension is the group)"
                if offs_len is not None
                else "needs offs: the groups' int32 end offsets"
            )  # fmt: skip
        )
    k_a = a_shape[-1]
    k_b = b_shape[-2]
    if k_a != k_b:
        raise ValueError(
            f"a {tuple(a_shape)} and b {tuple(b_shape)}: a's last dimension ({k_a}) must equal "
            f"b's {'second' if len(b_shape) == 3 else 'first'} ({k_b})"
        )
    if form == "2d3d":
        groups, shape = b_shape[0], (a_shape[0], b_shape[2])
    elif form == "3d3d":
        if a_shape[0] != b_shape[0]:
            raise ValueError(f"a has {a_shape[0]} groups and b {b_shape[0]}; they must match")
        groups, shape = a_shape[0], (a_shape[0], a_shape[1], b_shape[2])
    elif form == "2d2d":
        groups, shape = offs_len, (offs_len, a_shape[0], b_shape[1])
    else:  # 3d2d
        groups, shape = a_shape[0], (a_shape[1], b_shape[1])
    if offs_len is not None and offs_len != groups:
        raise ValueError(f"offs has {offs_len} entries; the {form} form has {groups} groups")
    return form, groups, tuple(shape)  # (not int(): a traced size would be specialised)


def result_strides(shape: tuple, dtype: torch.dtype) -> tuple[int, ...]:
    """Row-major strides of a result of ``shape``, each row padded to whole 16 bytes: torch's
    own (``create_grouped_gemm_output_tensor``, and so ``torch._grouped_mm``'s meta result),
    empty results included (N = 0: a row stride of 0; M = 0: a group stride of 0)."""
    vec = VECTOR_BYTES // dtype.itemsize
    ld = (shape[-1] + vec - 1) // vec * vec  # (no max(): a symbolic size would be guarded)
    strides = [ld, 1]
    for size in reversed(shape[1:-1]):  # each outer stride spans the dimension after it
        strides.insert(0, strides[0] * size)
    return tuple(strides)


def check_grouped(
    a, b, offs, out, out_dtype, backend, device_types=("cuda",), activation=None, gated=False,
    row_scale=None,
) -> GroupedProblem:  # fmt: skip
    """Every check of ``grouped_mm`` that reads no data (what the fake implementation runs too;
    ``device_types``' first is where the kernels run). Raises, never allocates."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if offs is not None:
        if not isinstance(offs, torch.Tensor):
            raise TypeError(f"offs must be a torch.Tensor or None, got {type(offs).__name__}")
        if offs.dtype != torch.int32 or offs.dim() != 1:
            raise ValueError(
                f"offs must be a 1-D int32 tensor of the groups' end offsets, got a "
                f"{offs.dim()}-D {offs.dtype} tensor"
            )
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend != "auto" and backend not in host.BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose 'auto' or one of "
                         f"{', '.join(host.BACKENDS)}")  # fmt: skip
    form, groups, shape = result_shape(a.shape, b.shape, None if offs is None else offs.shape[0])
    act = check_activation(activation)
    if not isinstance(gated, bool):
        raise TypeError(f"gated must be a bool, got {type(gated).__name__}")
    if gated:
        if act == "none" or form != "2d3d" or shape[-1] % 2:
            raise ValueError(
                "gated=True (act(gate) * up, the gate's columns then the up projection's) needs "
                "an activation, the 2D x 3D form and an even N; got activation="
                f"{activation!r}, a {form} call of N={shape[-1]}"
            )
        shape = (*shape[:-1], shape[-1] // 2)
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b {b.dtype}; grouped_mm multiplies equal dtypes")
    if a.dtype not in (*_KERNEL_DTYPES, torch.float32):
        raise TypeError(f"grouped_mm takes float16, bfloat16 or float32 operands, got {a.dtype}")
    allowed = {a.dtype, torch.float32}
    c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype or None, got {type(out_dtype).__name__}")
    if c_dtype not in allowed or (out is not None and out_dtype not in (None, out.dtype)):
        raise TypeError(
            f"the result of {a.dtype} operands is {' or '.join(map(str, sorted(allowed, key=str)))}"
            f"; got out_dtype={out_dtype}" + (f", out of {out.dtype}" if out is not None else "")
        )
    if backend != "auto" and a.dtype not in _KERNEL_DTYPES:
        # (matmul's rule, and known from the dtypes: so the fake implementation refuses it too)
        raise TypeError(
            f"backend {backend!r} runs float16 and bfloat16 only, got {a.dtype}; backend='auto' "
            "also takes float32 (on torch)"
        )
    if out is not None and tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}; the result's is {shape}")
    if out is not None:
        # matmul's rule, before anything is written: no two of out's elements at one address
        # (a stride 0, or rows that overlap: the kernels' stores would race, torch's copy_
        # fails); sizes and strides only, so meta and fake tensors are checked too
        check_out_memory(out)
    for name, t in (("a", a), ("b", b), ("offs", offs), ("out", out)):
        if t is not None and t.device.type not in device_types:
            raise ValueError(
                f"{name} must be a {device_types[0].upper()} tensor, got one on {t.device}"
            )
        if t is not None and t.device != a.device:
            raise ValueError(f"{name} is on {t.device}, a on {a.device}; one device for all")
    if backend != "auto" and form != "3d3d" and not host.BACKENDS[backend].grouped_cls:
        raise ValueError(
            f"backend {backend!r} has no grouped kernel; these have: "
            f"{', '.join(host.GROUPED_BACKENDS)} (or say backend='auto')"
        )
    scale = _check_row_scale(row_scale, form, a)
    for name, t in (("a", a), ("b", b), ("out", out), ("row_scale", row_scale)):
        if t is not None and t.is_neg():  # (a kernel reads the memory, not the view's sign)
            raise ValueError(
                f"{name} is a negative view (is_neg()), which the kernels cannot honour; "
                f"pass {name}.resolve_neg()"
            )
    if (
        torch.is_grad_enabled()
        and out is not None
        and any(t is not None and t.requires_grad for t in (a, b, out, row_scale))
    ):
        raise RuntimeError("grouped_mm(): out= does not support automatic differentiation; "
                           "call it without out=, or under torch.no_grad()")  # fmt: skip
    epilogue = Epilogue(activation=act, gated=gated, row_scale=scale)
    return GroupedProblem(form, groups, shape, c_dtype, epilogue)


def _check_row_scale(row_scale, form: str, a: torch.Tensor) -> str:
    """``row_scale``'s ``Epilogue.row_scale`` ("none", "fp32" or "input"), or the error: a
    1-D vector of a's rows (2D x 3D only), float32 or a's dtype, on a's device."""
    if row_scale is None:
        return "none"
    if not isinstance(row_scale, torch.Tensor):
        raise TypeError(f"row_scale must be a torch.Tensor or None, got {type(row_scale).__name__}")
    if form != "2d3d":
        raise ValueError(
            "row_scale (a factor per row of the result, e.g. a router weight) is for the 2D x 3D "
            f"form; got a {form[:2].upper()} x {form[2:].upper()} call"
        )
    if row_scale.shape != (a.shape[0],):
        raise ValueError(
            f"row_scale must have shape ({a.shape[0]},), one factor per row of a; got "
            f"{tuple(row_scale.shape)}"
        )
    if row_scale.dtype not in (torch.float32, a.dtype):
        raise TypeError(
            f"row_scale must be float32 or a's dtype ({a.dtype}), got {row_scale.dtype}"
        )
    if row_scale.device != a.device:
        raise ValueError(f"row_scale is on {row_scale.device}, a on {a.device}; one device for all")
    return "fp32" if row_scale.dtype == torch.float32 else "input"


def route(d, p: GroupedProblem, a: torch.Tensor, b: torch.Tensor, backend: str) -> str:
    """Where a checked problem runs (module docstring): ``KERNEL``, ``BATCHED`` or ``TORCH``.
    A 2D x 2D call under ``auto`` takes torch's fused kernel (bfloat16 in and out) only where
    that needs no aligned groups (``_torch_needs_aligned_groups``: ``a`` column-major, ``b``
    row-major) and each group's result is small enough that the ragged-K kernel did not beat
    it (``host.ragged_k_beats_torch``); a 3D x 2D call always would need aligned groups, so it
    takes the kernel in every dtype."""
    if p.form == "3d3d":
        return BATCHED
    if p.form == "2d2d" and backend == "auto" and _torch_fuses(a.dtype, p.c_dtype):
        # (never where torch's fused kernel needs aligned groups, which offs on the GPU cannot
        # promise: _torch_needs_aligned_groups; a 3D x 2D call always would, so it takes the
        # kernel below, as float16's does)
        aligned = _torch_needs_aligned_groups(p.form, a, b)
        if not aligned and not host.ragged_k_beats_torch(p.shape[1], p.shape[2]):
            return TORCH
    if p.form == "2d2d" and not host.routes_ragged_k(backend):
        return TORCH  # (a family not in ``host.RAGGED_K_FAMILIES``)
    if p.form == "3d3d" or a.dtype not in _KERNEL_DTYPES:
        if backend != "auto":
            raise ValueError(f"backend {backend!r} runs float16 and bfloat16 only, got {a.dtype}")
        return TORCH
    cc = d.devices.capability(d.device_index(a.device))
    named = backend if backend != "auto" else None
    candidates = [named] if named else list(host.GROUPED_BACKENDS)
    if any(host.supports_grouped(name, cc) for name in candidates):
        return KERNEL
    if named:
        raise ValueError(f"backend {backend!r} does not run on a GPU of capability {cc}")
    return TORCH


def _torch_needs_aligned_groups(form: str, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm``'s fused kernel asserts, on the GPU, that each group but
    the last spans a whole multiple of 16 bytes along ``offs``'s dimension (torch 2.8 on,
    ``GroupMMCommon.cuh``: its TMA addresses must be 16-byte aligned) for these operands: 3D x
    2D always (its result's column groups), 2D x 2D unless ``a`` is column-major and ``b``
    row-major (K then is the strided dimension of both), 2D x 3D unless ``a`` is row-major. A
    failed device assert ends the process's CUDA context, and the group sizes are on the GPU:
    such calls never take that kernel (``route``, ``_torch_grouped``)."""
    if form == "3d2d":
        return True
    if form == "2d2d":
        return not (a.stride(0) == 1 and b.stride(-1) == 1)
    if form == "2d3d":
        return a.stride(-1) != 1
    return False


def _torch_fuses(ab_dtype: torch.dtype, c_dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` has a fused kernel for these dtypes (bfloat16 in and out
    on the torch versions wsgemm supports; ``_torch_grouped`` falls back to a loop otherwise)."""
    return hasattr(torch, "_grouped_mm") and ab_dtype == c_dtype == torch.bfloat16


def grouped_mm(a, b, offs=None, *, out=None, out_dtype=None, backend="auto", dispatcher=None,
               activation=None, gated=False, row_scale=None):  # fmt: skip
    """The grouped GEMM (module docstring) on dispatcher ``dispatcher`` (default: the
    process's), with ``activation`` applied to it, or (``gated``) ``act(gate) * up`` of its
    two column halves, then each row times ``row_scale``'s entry. Returns the result (``out``
    itself when given)."""
    d = dispatcher or host_dispatcher()
    key = _signature(a, b, offs, out, out_dtype, backend, activation, gated, row_scale)
    hit = d.launchers.get(key) if key is not None else None
    if hit is not None:  # a signature seen before: its checks passed, its kernel is bound
        return hit(a, b, offs, out, row_scale)
    p = check_grouped(a, b, offs, out, out_dtype, backend, (d.devices.type,), activation, gated,
                      row_scale)  # fmt: skip
    where = route(d, p, a, b, backend)
    if out is not None and where != BATCHED:
        _check_no_overlap(out, a, b, offs, row_scale)
    strides = result_strides(p.shape, p.c_dtype)
    result = out
    if result is None and (where != TORCH or math.prod(p.shape) == 0 or p.groups == 0):
        # (torch's road allocates its own result, which is returned where it has this layout)
        result = torch.empty_strided(p.shape, strides, dtype=p.c_dtype, device=a.device)
    if math.prod(p.shape) == 0 or p.groups == 0:  # nothing to compute, no group to write
        return result
    if where == BATCHED:  # api.matmul's body (this module is below the package's __init__)
        act = None if p.epilogue.activation == "none" else p.epilogue.activation
        return dispatch.call(d, a, b, result, None, torch.float32, backend, None, None, act)
    if where == KERNEL:  # (kernels launch on the current device: the operands' here)
        with d.on_device(d.device_index(a.device)):
            if p.form == "3d2d":
                _run_kernel_3d2d(d, a, b, offs, result, backend, p)
            elif p.form == "2d2d":
                _run_kernel_2d2d(d, a, b, offs, result, backend, p)
            else:
                kept = _run_kernel(d, a, b, offs, result, backend, p.epilogue, row_scale,
                                   keep=key is not None)  # fmt: skip
                if kept is not None:
                    d.remember(key, _launcher(d, kept, (a, b, offs, row_scale), result, p,
                                              allocate=out is None))  # fmt: skip
    else:
        product = epilogue_in_torch(_torch_grouped(p.plain(), a, b, offs), p.epilogue, p.c_dtype,
                                    row_scale)  # fmt: skip
        fresh = product.shape == p.shape and product.stride() == strides
        if out is None and fresh and product.dtype == p.c_dtype:
            # torch's own fresh result in the result's layout: no second pass over, e.g., a
            # weight gradient's (G, M, N) (docs/perf.md entry 58: 0.48x torch._grouped_mm)
            return product
        if result is None:
            result = torch.empty_strided(p.shape, strides, dtype=p.c_dtype, device=a.device)
        _write(result, product, p, offs)
    if out is not None:
        torch.autograd.graph.increment_version(out)
    return result


def host_dispatcher():
    from ..host.dispatch import DISPATCHER

    return DISPATCHER


def _check_no_overlap(out: torch.Tensor, *inputs) -> None:
    """``out`` shares no byte with any of ``inputs`` (the operands, offsets and row scale that
    the kernel reads while it writes ``out``; None for one not given)."""
    for t in inputs:
        if t is not None and overlaps(out, t):
            raise ValueError("out overlaps an input in memory; pass a separate output")


# ----------------------------------------------------------------------------- the kernel route


def epilogue_in_torch(product: torch.Tensor, epilogue: Epilogue, dtype, row_scale=None
                      ) -> torch.Tensor:  # fmt: skip
    """The epilogue on a product torch or a plain kernel computed: in fp32, rounded once; a
    row scale (2D x 3D) last, each row times its entry."""
    if epilogue.plain:
        return product
    y = product.float()
    y = (gated_unit if epilogue.gated else torch_activation)(epilogue.activation, y)
    if row_scale is not None:
        y = y * row_scale.float()[:, None]
    return y.to(dtype)


def _run_kernel(d, a, b, offs, out, backend: str, epilogue: Epilogue = PLAIN, row_scale=None,
                keep: bool = False) -> _Bound | None:  # fmt: skip
    """2D x 3D on the grouped kernel: A (M, K, G) and C (M, N, G) as views with batch stride 0,
    B (N, K, G); copies only where a kernel cannot address an operand (``api.plan``'s rules).
    An epilogue runs in the kernel where its family fuses them (a gated one reads a K-major B:
    its view the gate's rows, the up rows after them; a row scale where ``host.scales_rows``,
    read contiguous), else in torch after a plain kernel. With ``keep``, returns the kernel
    bound to this call's views where the call was that one launch on views of a, b and out
    (what a later call of the signature runs: ``_launcher``), else None."""
    m, k = a.shape
    groups, n = b.shape[0], out.shape[1]  # a gated unit's out is half of b's columns
    p = GroupedProblem("2d3d", groups, (m, n), out.dtype, epilogue)
    if k == 0:  # every group's product is zero: rows before offs[-1] become act(0) (* 0)
        zero = torch.zeros((), dtype=out.dtype, device=out.device).expand(m, n)
        unit = replace(epilogue, gated=False, activation="none") if epilogue.gated else epilogue
        _write(out, epilogue_in_torch(zero, unit, out.dtype, row_scale), p, offs)
        return None
    name, config = host.grouped_config(backend, m, groups)
    b_nkg = b.permute(2, 1, 0)
    fused = not epilogue.plain and host.fuses_epilogues(name)
    if fused and epilogue.gated:
        gate = _kernel_view(b_nkg[:n], False, (1,))  # K-major only
        fused = gate is not None and n % 8 == 0
    if fused and epilogue.row_scale != "none":
        fused = host.scales_rows(name)
    if not epilogue.plain and not fused:  # the plain kernel, then the epilogue in torch
        plain = torch.empty_strided(p.plain().shape, result_strides(p.plain().shape, out.dtype),
                                    dtype=out.dtype, device=out.device)  # fmt: skip
        _run_kernel(d, a, b, offs, plain, backend)
        _write(out, epilogue_in_torch(plain, epilogue, out.dtype, row_scale), p, offs)
        return None
    ops = _operands(a, b_nkg, out, groups, gate[0] if epilogue.gated else None)
    a_mkl, b_view, c_mnl, c_found, a_major, b_major = ops
    dtypes = (_name(a.dtype), _name(out.dtype), "float32")
    fn, clusters = d.kernel(
        name, d.device_index(a.device), dtypes, a_major, b_major, config, epilogue.name, "m"
    )
    scale = row_scale.contiguous() if epilogue.row_scale != "none" else None
    fn(a_mkl, b_view, c_mnl, clusters, *UNSPLIT_LAUNCH, *NO_EPILOGUE_LAUNCH, scale,
       offs.contiguous())  # fmt: skip
    if c_found is None:  # the caller's out is not addressable: the written rows copied in
        _write(out, c_mnl[:, :, 0], p, offs)
        return None
    bind = getattr(fn, "bind", None)
    views = ((a_mkl, a), (b_view, b), (c_mnl, out))
    if not keep or bind is None or not all(_same_storage(v, t) for v, t in views):
        return None  # (a stand-in kernel without ``bind``, or an operand copied)
    at = bind(a_mkl, b_view, c_mnl, clusters, *UNSPLIT_LAUNCH, *NO_EPILOGUE_LAUNCH, late=2)
    return _Bound(at, tuple(v.data_ptr() - t.data_ptr() for v, t in views), scale is not None)


def _operands(a, b_nkg, out, groups: int, gate=None) -> tuple:
    """The 2D x 3D kernel's operands: A (M, K, G) and C (M, N, G) with batch stride 0, B
    (N, K, G) (``gate``: a gated unit's K-major gate-rows view of it), C's found view or None
    where ``out`` is not addressable (then C is a scratch tensor, its rows copied in after),
    and A's and B's majors."""
    (m, k), n = a.shape, out.shape[1]
    # K-major only: a group's first row is any row, and TMA takes a box whose start in the
    # contiguous dimension is not 16-byte aligned as an illegal instruction (an M-major A's
    # rows; measured on the H200, 2026-12-05): an M-major A is copied
    a_view, a_unit = _operand(a.unsqueeze(-1), (1,))
    if gate is not None:
        b_view, b_unit = gate, 1
    else:
        b_view, b_unit = _operand(b_nkg, (1, 0))
    c_found = _kernel_view(out.unsqueeze(-1), False, (1,))
    c_view = c_found[0] if c_found else torch.empty_strided(
        (m, n, 1), (*result_strides((m, n), out.dtype), 0), dtype=out.dtype, device=out.device
    )  # fmt: skip
    a_mkl = a_view.as_strided((m, k, groups), (*a_view.stride()[:2], 0))
    c_mnl = c_view.as_strided((m, n, groups), (*c_view.stride()[:2], 0))
    a_major = "k" if a_unit == 1 else "m"
    b_major = "k" if b_unit == 1 else "n"
    return a_mkl, b_view, c_mnl, c_found, a_major, b_major


@dataclass(frozen=True)
class KernelLaunch:
    """A 2D x 3D call's plain grouped kernel as ``grouped_mm`` launches it (``kernel_launch``):
    its backend and config (None: the shipped one), dtypes (A's, C's, the accumulator's),
    majors and views, for a tool that launches another build of that kernel (``wsgemm.trace``).
    ``out`` is the result the views write (the caller's rows)."""

    backend: str
    config: Any
    dtypes: tuple[str, str, str]
    a_major: str
    b_major: str
    a: torch.Tensor  # (M, K, G), batch stride 0
    b: torch.Tensor  # (N, K, G)
    c: torch.Tensor  # (M, N, G), batch stride 0
    out: torch.Tensor  # (M, N)


def kernel_launch(d, a, b, offs, backend: str = "auto", out_dtype=None, out=None) -> KernelLaunch:
    """``grouped_mm(a, b, offs, out=out, out_dtype=out_dtype, backend=backend)``'s 2D x 3D
    call, checked as the call checks it, planned as ``_run_kernel`` plans its plain kernel (no
    epilogue), not run (``out`` None: a new result). Raises what ``grouped_mm`` raises, and a
    ValueError where the call would not run one grouped kernel (another form, torch's route,
    K = 0, an empty problem, a result the kernel cannot address)."""
    p = check_grouped(a, b, offs, out, out_dtype, backend, (d.devices.type,), None, False,
                      None)  # fmt: skip
    if p.form != "2d3d":
        raise ValueError(f"the {p.form} form runs no ragged-M grouped kernel: give a 2-D a, a "
                         "3-D b and offs")  # fmt: skip
    where = route(d, p, a, b, backend)
    if where != KERNEL or a.shape[1] == 0 or math.prod(p.shape) == 0 or p.groups == 0:
        raise ValueError(f"this call runs no grouped kernel (its route: {where}, shape "
                         f"{tuple(p.shape)}, K={a.shape[1]}, {p.groups} groups)")  # fmt: skip
    if out is None:
        out = torch.empty_strided(p.shape, result_strides(p.shape, p.c_dtype), dtype=p.c_dtype,
                                  device=a.device)  # fmt: skip
    else:
        _check_no_overlap(out, a, b, offs)
    name, config = host.grouped_config(backend, a.shape[0], p.groups)
    ops = _operands(a, b.permute(2, 1, 0), out, p.groups)
    a_mkl, b_view, c_mnl, c_found, a_major, b_major = ops
    if c_found is None:
        raise ValueError("the result is not addressable by the kernel")
    dtypes = (_name(a.dtype), _name(p.c_dtype), "float32")
    return KernelLaunch(name, config, dtypes, a_major, b_major, a_mkl, b_view, c_mnl, out)


@dataclass(frozen=True)
class _Bound:
    """A grouped kernel bound to a call's views (``KernelCall.bind``): ``at(pa, pb, pc, scale,
    offs)``; ``shifts``: each view's address less its tensor's (a, b, out)."""

    at: Any
    shifts: tuple[int, int, int]
    scaled: bool


def _same_storage(view: torch.Tensor, t: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def _signature(a, b, offs, out, out_dtype, backend, activation, gated, row_scale):
    """The key of a call's launcher among the dispatcher's (``Dispatcher.launchers``): all that
    the checks, the route and the views read, none of the data; None where the arguments are
    not tensors of the kinds a launcher is kept for (the checks then say what is wrong)."""
    try:
        kept = [a, b, offs, out, row_scale]
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in kept)
        key = ["grouped", grad, current_settings()]
        for arg in (out_dtype, backend, activation, gated):  # (True and 1 are one key)
            key += (type(arg), arg)
        for t in kept:
            key += dispatch.tensor_signature(t)
        key = tuple(key)
        hash(key)
        return key
    except Exception:  # not tensors, unhashable arguments, ...
        return None


def _launcher(d, bound: _Bound, inputs: tuple, out, p: GroupedProblem, allocate: bool):
    """A later call of the signature of ``inputs`` (a, b, offs, row_scale) and ``out``:
    ``launch(a, b, offs, out, row_scale)`` runs ``bound`` at the call's addresses (the views'
    sizes and strides are the first call's): into a new result (``allocate``) or into ``out``,
    whose overlap with the inputs is checked as the first call's was, by address ranges
    first."""
    at, (da, db, dc), scaled = bound.at, bound.shifts, bound.scaled
    shape, strides, dtype, device = p.shape, out.stride(), p.c_dtype, inputs[0].device
    ext_o = tensor_extent(out)
    extents = tuple(0 if t is None else tensor_extent(t) for t in inputs)

    def launch(a, b, offs, out, row_scale):
        pa, pb = a.data_ptr(), b.data_ptr()
        if allocate:
            out = torch.empty_strided(shape, strides, dtype=dtype, device=device)
            po = out.data_ptr()
        else:
            po = out.data_ptr()
            for t, ext in zip((a, b, offs, row_scale), extents, strict=True):
                pt = 0 if t is None else t.data_ptr()
                if t is not None and po < pt + ext and pt < po + ext_o:
                    _check_no_overlap(out, a, b, offs, row_scale)
                    break
        at(pa + da, pb + db, po + dc, row_scale.contiguous() if scaled else None,
           offs.contiguous())  # fmt: skip
        if not allocate:
            torch.autograd.graph.increment_version(out)
        return out

    return dispatch.on_its_device(d, d.device_index(device), launch)


def _run_kernel_3d2d(d, a, b, offs, out, backend: str, p: GroupedProblem) -> None:
    """3D x 2D on the grouped kernel, transposed: column group g of the result is
    ``a[g] @ b[:, cols of g]``, so its transpose is ``b[:, cols of g]^T @ a[g]^T``, a 2D x 3D
    problem whose rows are the result's columns (``_run_kernel`` with ``b^T`` as its A and
    ``a[g]^T`` as its B per group). The kernel writes rows, the result's columns: into an
    (N, M) buffer, whose written rows are then copied into the result's columns (one pass
    over the output, no sync). An activation runs in torch on the buffer."""
    n, m = b.shape[1], a.shape[1]
    rows = torch.empty_strided((n, m), result_strides((n, m), out.dtype), dtype=out.dtype,
                               device=out.device)  # fmt: skip
    _run_kernel(d, b.t(), a.transpose(1, 2), offs, rows, backend)
    _write(out, epilogue_in_torch(rows.t(), p.epilogue, out.dtype), p, offs)


def _run_kernel_2d2d(d, a, b, offs, out, backend: str, p: GroupedProblem) -> None:
    """2D x 2D on the ragged-K grouped kernel (``host.ragged_k_config``): A (M, K, G) and B
    (N, K, G) views with batch stride 0, M-major and N-major (a group starts at any k, which
    must be a strided dimension: others are copied, transposed), C the result's (M, N, G)
    view, and a workspace for each CTA's TMA descriptors. The kernel writes every group's
    product, an empty group's as zeros; an activation runs in the kernel where its family
    fuses epilogues, else in torch after it."""
    m, k = a.shape
    n, groups = b.shape[1], p.groups
    epilogue = p.epilogue
    if k == 0:  # every group's product is zero
        out.copy_(epilogue_in_torch(torch.zeros_like(out), epilogue, out.dtype))
        return
    name, config = host.ragged_k_config(backend)
    fused = epilogue.plain or host.fuses_epilogues(name)
    a_view, b_view = (_operand(t, (0,))[0] for t in _2d2d_operands(a, b))
    a_mkg = a_view.as_strided((m, k, groups), (*a_view.stride()[:2], 0))
    b_nkg = b_view.as_strided((n, k, groups), (*b_view.stride()[:2], 0))
    c_found = _kernel_view(out.permute(1, 2, 0), False, (1,))
    c_mng = c_found[0] if c_found else torch.empty_strided(
        p.shape, result_strides(p.shape, out.dtype), dtype=out.dtype, device=out.device
    ).permute(1, 2, 0)  # fmt: skip
    dtypes = (_name(a.dtype), _name(out.dtype), "float32")
    fn, clusters = d.kernel(name, d.device_index(a.device), dtypes, "m", "n", config,
                            epilogue.name if fused else "none", "k")  # fmt: skip
    words = host.ragged_k_workspace_words(name, config, clusters)
    workspace = torch.empty(words, dtype=torch.float32, device=a.device)
    raster, split, _, _ = UNSPLIT_LAUNCH  # the workspace holds the descriptors
    fn(a_mkg, b_nkg, c_mng, clusters, raster, split, workspace, None, *NO_EPILOGUE_LAUNCH, None,
       offs.contiguous())  # fmt: skip
    result = c_mng.permute(2, 0, 1)
    if not fused:
        out.copy_(epilogue_in_torch(result, epilogue, out.dtype))
    elif c_found is None:
        out.copy_(result)


def _operand(t: torch.Tensor, majors) -> tuple[torch.Tensor, int]:
    """``t`` (rows, cols, L) as a kernel addresses it: (view, unit-stride mode), a padded copy
    where no view fits."""
    found = _kernel_view(t, False, majors)
    if found is not None:
        view, unit = found
        return view, (0 if unit == "rows" else 1)
    unit = majors[0] if len(majors) == 1 else _copy_unit(t, False)
    return _padded(t, t.shape[0], t.shape[1], unit), unit


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------- the torch route


def _torch_grouped(p: GroupedProblem, a, b, offs) -> torch.Tensor:
    """The grouped product on torch: ``torch._grouped_mm`` where torch has it for these dtypes,
    else a loop over the groups (which reads ``offs`` on the host)."""
    fused = getattr(torch, "_grouped_mm", None)
    if fused is not None and p.c_dtype == a.dtype and not _torch_fused_asserts(p, a, b, offs):
        try:
            # torch's fused kernel reads the ends at offs's data pointer as a contiguous
            # vector (it checks neither strides nor offset): a strided offs would garble the
            # groups, silently (the grouped kernels read ``offs.contiguous()`` too)
            return fused(a, b, None if offs is None else offs.contiguous())
        except (RuntimeError, NotImplementedError):
            pass  # this torch or GPU has no kernel for it: the loop
    return _loop(p, a, b, offs)


def _torch_fused_asserts(p: GroupedProblem, a, b, offs) -> bool:
    """Whether torch's fused kernel could fail its device assert on this call: its groups must
    be aligned (``_torch_needs_aligned_groups``) and there is more than one group (the last is
    never checked). Those calls take the loop."""
    return offs is not None and offs.numel() > 1 and _torch_needs_aligned_groups(p.form, a, b)


def _loop(p: GroupedProblem, a, b, offs) -> torch.Tensor:
    if a.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"grouped_mm's {p.form} form on {a.dtype} runs a loop over the groups here, which "
            "reads offs on the host: not possible inside a CUDA-graph capture (float16 and "
            "bfloat16 2D x 3D calls on Hopper run a kernel that is)"
        )
    ends = [0, *offs.tolist()]  # a sync
    acc = torch.float32 if a.dtype != torch.float64 else a.dtype
    result = torch.zeros(p.shape, dtype=p.c_dtype, device=a.device)
    jagged = {"2d3d": a.shape[0], "2d2d": a.shape[1], "3d2d": b.shape[1]}[p.form]

    def mm(x, y):
        return (x.to(acc) @ y.to(acc)).to(p.c_dtype)

    hi = 0
    for g in range(p.groups):
        # the kernel's reading of the ends: each clamped to [previous end, extent]
        lo, hi = hi, min(max(ends[g + 1], hi), jagged)
        if p.form == "2d3d":
            result[lo:hi] = mm(a[lo:hi], b[g])
        elif p.form == "2d2d":
            result[g] = mm(a[:, lo:hi], b[lo:hi])
        else:  # 3d2d
            result[:, lo:hi] = mm(a[g], b[:, lo:hi])
    return result


def _write(out: torch.Tensor, result: torch.Tensor, p: GroupedProblem, offs) -> None:
    """``result`` into ``out`` where the groups write (rows or columns before ``offs[-1]``),
    ``out`` kept elsewhere: a masked copy on the device (no sync)."""
    if p.form in ("2d3d", "3d2d") and offs is not None and offs.numel() > 0:
        dim = 0 if p.form == "2d3d" else 1
        idx = torch.arange(p.shape[dim], device=out.device)
        written = idx < offs[-1].to(idx.dtype)
        mask = written[:, None] if dim == 0 else written[None, :]
        out.copy_(torch.where(mask, result.to(out.dtype), out))
    elif p.form in ("2d3d", "3d2d"):
        return  # no groups: nothing is written
    else:
        out.copy_(result)


# ----------------------------------------------------------------------------- explain


def explain(d, a, b, offs=None, out_dtype=None, backend="auto", activation=None,
            gated=False, row_scale=None) -> str:  # fmt: skip
    """What ``grouped_mm`` with these arguments runs on dispatcher ``d``, and why (checks the
    arguments as the call does; compiles and launches nothing, reads no data on the GPU). An
    ``offs`` on the CPU (``offs.cpu()``: the host holds the groups' ends, no sync) is read,
    and a 2D x 3D call on the grouped kernel gets its tile map: which tiles of which group run
    on which CTAs (``host.tile_map``)."""
    host_ends = None
    if isinstance(offs, torch.Tensor) and offs.device.type == "cpu" and offs.dtype == torch.int32:
        host_ends = [int(e) for e in offs.reshape(-1).tolist()] if offs.dim() == 1 else None
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            offs = a.new_empty(offs.shape, dtype=offs.dtype)  # for the checks (fake tensors too)
    p = check_grouped(a, b, offs, None, out_dtype, backend, (d.devices.type,), activation, gated,
                      row_scale)  # fmt: skip
    where = route(d, p, a, b, backend)
    form = f"{p.form[:2].upper()} x {p.form[2:].upper()}"
    lines = [f"problem: grouped {form}, {p.groups} groups, a {tuple(a.shape)} x b "
             f"{tuple(b.shape)} -> {p.shape}, {_name(a.dtype)} -> {_name(p.c_dtype)}"]  # fmt: skip
    epi = p.epilogue
    if where == BATCHED:
        lines.append("kernel: wsgemm.matmul's batched GEMM (one batch per group): "
                     "wsgemm.explain(a, b) says which")  # fmt: skip
    elif where == TORCH:
        why = _torch_reason(p, a.dtype)
        fused = getattr(torch, "_grouped_mm", None) is not None and p.c_dtype == a.dtype
        how = "torch._grouped_mm" if fused else "a loop over the groups, reading offs: a sync"
        if fused and _torch_fused_asserts(p, a, b, offs):
            how = ("a loop over the groups, reading offs: a sync (torch._grouped_mm would "
                   "assert on the GPU unless every group but the last spans a multiple of 16 "
                   "bytes along offs's dimension)")  # fmt: skip
        lines.append(f"kernel: torch ({how}): {why}")
    elif p.form == "2d2d":
        name, config = host.ragged_k_config(backend)
        lines.append(
            _kernel_words("ragged K", name, config) + f": the dense schedule over {p.groups} x "
            f"{p.shape[1]}x{p.shape[2]} outputs; each tile sums its group's K slice, found from "
            "offs on the GPU (no sync), through its CTA's own TMA descriptors (zeros past the "
            "slice)"
        )
        for what, t in zip("AB", _2d2d_operands(a, b), strict=True):
            found = _kernel_view(t, False, (0,))
            how = "read in place" if found else "copied on every call (K must be strided)"
            lines.append(f"{what}: {how}")
        if not epi.plain:
            where_epi = ("in the kernel, on the accumulators" if host.fuses_epilogues(name)
                         else "in torch after the product")  # fmt: skip
            lines.append(f"epilogue: {epi.name}: {where_epi}")
    elif p.form == "3d2d":
        lines.append(_kernel_line(backend, b.shape[1], p.groups, "columns") + "; on the "
                     "transposed problem (the result's columns are its rows), written through an "
                     "(N, M) buffer")  # fmt: skip
        if not epi.plain:
            lines.append(f"epilogue: {epi.name}: in torch after the product")
    else:
        name = host.grouped_config(backend, a.shape[0], p.groups)[0]
        lines.append(_kernel_line(backend, a.shape[0], p.groups, "rows") + "; a group's last "
                     "tile stored under a row predicate")  # fmt: skip
        b_nkg = b.permute(2, 1, 0)
        fake = torch._subclasses.fake_tensor.FakeTensor
        if isinstance(a, fake) or isinstance(b, fake):  # (their addresses are not known)
            a_found = b_found = True
            lines.append("A, B: not known for fake tensors (a copy depends on the address)")
        else:
            a_found = _kernel_view(a.unsqueeze(-1), False, (1,))
            b_found = _kernel_view(b_nkg[: p.shape[1]] if epi.gated else b_nkg, False,
                                   (1,) if epi.gated else (1, 0))  # fmt: skip
            for what, found in (("A", a_found), ("B", b_found)):
                how = "read in place" if found else "copied on every call (no TMA-addressable view)"
                lines.append(f"{what}: {how}")
        if host_ends:
            sms = d.devices.sm_count(d.device_index(a.device))
            lines += host.tile_map(backend, host_ends, a.shape[0], p.plain().shape[1], sms)
        if not epi.plain:
            fuses = host.fuses_epilogues(name) and (not epi.gated or b_found is not None)
            if epi.row_scale != "none" and fuses and not host.scales_rows(name):
                where_epi = ("in torch after the product (this family's row scale is not "
                             "switched on: host.registry.ROW_SCALE_FAMILIES)")  # fmt: skip
            elif fuses:
                where_epi = "in the kernel, on the accumulators"
            else:
                where_epi = (
                    "in torch after the product (fused epilogues are off, or B is not K-major)"
                )
            lines.append(f"epilogue: {epi.name}: {where_epi}")
    return "\n".join(lines)


def _torch_reason(p: GroupedProblem, ab_dtype: torch.dtype) -> str:
    """explain's reason for a call on the torch route."""
    if ab_dtype not in _KERNEL_DTYPES:
        return f"{_name(ab_dtype)} operands"
    if p.form == "2d2d" and _torch_fuses(ab_dtype, p.c_dtype):
        if host.routes_ragged_k("auto") and not host.ragged_k_beats_torch(*p.shape[1:]):
            return (
                f"torch's fused grouped kernel runs bfloat16, and each group's {p.shape[1]}x"
                f"{p.shape[2]} result is below the size where the ragged-K kernel beat it "
                "(host.ragged_k_beats_torch; backend='sm90' runs it)"
            )
    if p.form == "2d2d" and not host.routes_ragged_k("auto"):
        return "the ragged-K kernel is off (host.RAGGED_K_FAMILIES)"
    return "no grouped kernel runs on this GPU"


def _kernel_line(backend: str, rows: int, groups: int, what: str) -> str:
    """explain's line for the grouped kernel: its backend and tile for ``rows`` ragged rows
    (the result's ``what``) in ``groups`` groups (``host.grouped_config``)."""
    return (
        _kernel_words("ragged M", *host.grouped_config(backend, rows, groups))
        + f": mean {rows / max(groups, 1):.0f} {what} per group (host.grouped_config); the "
        "groups are found from offs on the GPU (no sync)"
    )


def _kernel_words(kind: str, name: str, config) -> str:
    """ "kernel: <backend> grouped (<kind>), tile MxN, cluster MxN" (None: the shipped config)."""
    cfg = config or host.BACKENDS[name].config()
    return (f"kernel: {name} grouped ({kind}), tile {cfg.tile_m}x{cfg.tile_n}, cluster "
            f"{cfg.cluster_m}x{cfg.cluster_n}")  # fmt: skip


def _2d2d_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K, 1) and B (N, K, 1) of a 2D x 2D call, as the ragged-K kernel reads them once
    viewed M-major and N-major (``_operand``/``_kernel_view`` with majors ``(0,)``)."""
    return a.unsqueeze(-1), b.t().unsqueeze(-1)
