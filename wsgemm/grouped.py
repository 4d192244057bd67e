"""``wsgemm.grouped_mm`` inside a model: the op ``torch.ops.wsgemm.grouped_mm`` (and
``grouped_mm_out``, its ``out=`` form, which mutates ``out``) that
torch.compile, export, autograd, autocast and fake tensors understand, over the core
(``wsgemm.api.grouped``, whose docstring says what each form computes and where it runs).

Its fake implementation does shape arithmetic only (no data, no device query). The backward is
made of grouped GEMMs of the other forms (a 2D x 3D product's dA is a 2D x 3D product on the
grouped kernel, its dB a 2D x 2D one); rows or columns past ``offs[-1]`` get a zero gradient,
as do a row scale's entries past it.
"""

from __future__ import annotations

import math

import torch

from .api import grouped as core
from .api.epilogue import activation_grad, gated_unit, gated_unit_with_grad, torch_activation
from .ops import (
    _any_autocast,
    _is_compiling,
    _no_modes,
    autocast_dtype,
    creates_graph,
    grads_by_autograd,
    refuse_forward_differentiation,
)

__all__ = ["grouped_mm"]

_FAKE_DEVICES = ("cuda", "meta")
_PLAIN = (torch.Tensor, torch.nn.Parameter)

_LIB = torch.library.Library("wsgemm", "FRAGMENT")
_LIB.define(
    "grouped_mm(Tensor a, Tensor b, Tensor? offs=None, ScalarType? out_dtype=None, "
    'str backend="auto", str? activation=None, bool gated=False, Tensor? row_scale=None) '
    "-> Tensor",
    tags=(torch.Tag.pt2_compliant_tag,),
)
_LIB.define(
    "grouped_mm_out(Tensor a, Tensor b, Tensor? offs, Tensor(a!) out, ScalarType? out_dtype=None, "
    'str backend="auto", str? activation=None, bool gated=False, Tensor? row_scale=None) -> ()',
    tags=(torch.Tag.pt2_compliant_tag,),
)
_GROUPED_MM = torch.ops.wsgemm.grouped_mm.default
_GROUPED_MM_OUT = torch.ops.wsgemm.grouped_mm_out.default


def _impl(a, b, offs=None, out_dtype=None, backend="auto", activation=None, gated=False,
          row_scale=None):  # fmt: skip
    refuse_forward_differentiation("torch.ops.wsgemm.grouped_mm", a, b, row_scale)
    return core.grouped_mm(
        a, b, offs, out_dtype=out_dtype, backend=backend, activation=activation, gated=gated,
        row_scale=row_scale,
    )  # fmt: skip


def _out_impl(a, b, offs, out, out_dtype=None, backend="auto", activation=None, gated=False,
              row_scale=None):  # fmt: skip
    refuse_forward_differentiation("torch.ops.wsgemm.grouped_mm_out", a, b, row_scale, out)
    core.grouped_mm(
        a, b, offs, out=out, out_dtype=out_dtype, backend=backend, activation=activation,
        gated=gated, row_scale=row_scale,
    )  # fmt: skip


for _key in ("CUDA", "CPU"):  # CPU too: a CPU tensor gets the core's ValueError
    _LIB.impl("grouped_mm", _impl, _key)
    _LIB.impl("grouped_mm_out", _out_impl, _key)


@torch.library.register_fake("wsgemm::grouped_mm", lib=_LIB)
def _fake(a, b, offs=None, out_dtype=None, backend="auto", activation=None, gated=False,
          row_scale=None):  # fmt: skip
    p = core.check_grouped(a, b, offs, None, out_dtype, backend, _FAKE_DEVICES, activation, gated,
                           row_scale)  # fmt: skip
    return a.new_empty_strided(p.shape, core.result_strides(p.shape, p.c_dtype), dtype=p.c_dtype)


@torch.library.register_fake("wsgemm::grouped_mm_out", lib=_LIB)
def _out_fake(a, b, offs, out, out_dtype=None, backend="auto", activation=None, gated=False,
              row_scale=None):  # fmt: skip
    # out's shape, dtype, device and own memory (sizes and strides); no overlap test with the
    # inputs: fake tensors have no data (the real implementation makes it)
    core.check_grouped(a, b, offs, out, out_dtype, backend, _FAKE_DEVICES, activation, gated,
                       row_scale)  # fmt: skip


def _out_autograd(a, b, offs, out, out_dtype=None, backend="auto", activation=None, gated=False,
                  row_scale=None):  # fmt: skip
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (a, b, out, row_scale)
    ):  # (the core's own words)
        raise RuntimeError("grouped_mm(): out= does not support automatic differentiation; "
                           "call it without out=, or under torch.no_grad()")  # fmt: skip
    with torch._C._AutoDispatchBelowAutograd():
        _GROUPED_MM_OUT(a, b, offs, out, out_dtype, backend, activation, gated, row_scale)


_LIB.impl("grouped_mm_out", _out_autograd, "Autograd")
# out= calls are not autocast (torch's rule, and the eager out= road's): the fallthrough


def _zero_past_end(t: torch.Tensor, offs: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` with its rows (``dim`` 0) or columns (1) from ``offs[-1]`` on set to zero (what
    the grouped product leaves unwritten: their gradient is zero), on the device."""
    if offs.numel() == 0:
        return torch.zeros_like(t)
    idx = torch.arange(t.shape[dim], device=t.device)
    keep = idx < offs[-1].to(idx.dtype)
    keep = keep[:, None] if dim == 0 else keep[None, :]
    return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _setup_context(ctx, inputs, output):
    a, b, offs, out_dtype, backend, *epilogue = inputs
    ctx.activation, ctx.gated, row_scale = (*epilogue, None, False, None)[:3]
    ctx.save_for_backward(a, b, offs, row_scale)
    ctx.backend, ctx.out_dtype = backend, out_dtype


def _row_scale_grads(ctx, pre, offs, row_scale, grad):
    """Through a row scale ``y = e * s[:, None]`` (``e`` the epilogue's value before it, from
    the recomputed product ``pre``): the gradient at ``e`` (``grad * s``) and, where asked,
    ``s``'s (each row's ``sum(grad * e)``; zero past ``offs[-1]``)."""
    g = grad.float()
    gs = None
    if ctx.needs_input_grad[7]:
        e = pre
        if ctx.activation not in (None, "none"):
            e = (gated_unit if ctx.gated else torch_activation)(ctx.activation, pre)
        gs = _zero_past_end((g * e).sum(-1, keepdim=True), offs, 0)[:, 0].to(row_scale.dtype)
    return (g * row_scale.float()[:, None]).to(grad.dtype), gs


def _through_epilogue(ctx, pre, a, b, offs, grad):
    """The gradient at the product ``pre`` (recomputed, fp32), through an activation or a
    gated unit: the chain rule in fp32."""
    act, g = ctx.activation, grad.float()
    if ctx.gated:
        half = pre.shape[-1] // 2
        gate, up = pre[..., :half], pre[..., half:]
        d = torch.cat([g * up * activation_grad(act, gate), g * torch_activation(act, gate)], -1)
    else:
        d = g * activation_grad(act, pre)
    if offs is not None and pre.dim() == 2 and a.dim() == 2 and b.dim() == 3:
        d = _zero_past_end(d, offs, 0)  # the rows past the groups: unwritten, no gradient
    return d.to(grad.dtype)


def _backward(ctx, grad):
    """dA and dB of each form as grouped products of the others (module docstring); the
    gradient is taken in the inputs' dtype, as ``matmul``'s backward does."""
    a, b, offs, row_scale = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    activation = ctx.activation not in (None, "none")
    if (activation or row_scale is not None) and creates_graph(a, b, row_scale):
        # a double backward: the product recomputed under no_grad below would drop every
        # second derivative through it, silently; autograd through the public road's pieces
        # (the grouped product, then the epilogue in torch). Without an epilogue the
        # backward's grouped products are differentiable as they are.
        need = ctx.needs_input_grad
        ga, gb, gs = grads_by_autograd(
            lambda: _for_autograd(a, b, offs, ctx.out_dtype, ctx.backend, ctx.activation,
                                  ctx.gated, row_scale),
            (a, b, row_scale), (need[0], need[1], len(need) > 7 and need[7]), grad,
        )  # fmt: skip
        return ga, gb, None, None, None, None, None, gs
    pre = g_scale = None
    if activation or (row_scale is not None and ctx.needs_input_grad[7]):
        with torch.no_grad():  # the product, recomputed once: one more grouped GEMM
            pre = _GROUPED_MM(a, b, offs).float()
    if row_scale is not None:
        grad, g_scale = _row_scale_grads(ctx, pre, offs, row_scale, grad)
    if activation:
        grad = _through_epilogue(ctx, pre, a, b, offs, grad)
    g = grad.to(a.dtype)
    form = core.result_shape(a.shape, b.shape, None if offs is None else offs.shape[0])[0]
    mm = _GROUPED_MM
    ga = gb = None
    if form == "2d3d":
        if need_a:
            ga = _zero_past_end(mm(g, b.transpose(-2, -1), offs), offs, 0)
        if need_b:
            gb = mm(a.t(), g, offs)
    elif form == "3d3d":
        if need_a:
            ga = mm(g, b.transpose(-2, -1))
        if need_b:
            gb = mm(a.transpose(-2, -1), g)
    elif form == "2d2d":
        if need_a:
            ga = _zero_past_end(mm(g, b.t(), offs), offs, 1)
        if need_b:
            gb = _zero_past_end(mm(a.t(), g, offs), offs, 0)
    else:  # 3d2d
        if need_a:
            ga = mm(g, b.t(), offs)
        if need_b:
            gb = _zero_past_end(mm(a.transpose(-2, -1), g, offs), offs, 1)
    return ga, gb, None, None, None, None, None, g_scale


torch.library.register_autograd(
    "wsgemm::grouped_mm", _backward, setup_context=_setup_context, lib=_LIB
)


def _autocast(a, b, offs=None, out_dtype=None, backend="auto", activation=None, gated=False,
              row_scale=None):  # fmt: skip
    dtype = torch.get_autocast_dtype("cuda")
    a, b = a.to(autocast_dtype(a, dtype)), b.to(autocast_dtype(b, dtype))
    if row_scale is not None and row_scale.dtype not in (torch.float32, a.dtype):
        row_scale = row_scale.float()  # (a float32 row scale is taken as it is)
    with torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
    ):
        return _GROUPED_MM(a, b, offs, out_dtype, backend, activation, gated, row_scale)


_LIB.impl("grouped_mm", _autocast, "AutocastCUDA")


def _flops(a_shape, b_shape, offs_shape=None, *args, out_shape=None, **kwargs) -> int:
    """Multiply-adds twice, over every row (the groups' sizes are data): the count if every
    row and column belongs to a group. A 2D x 2D product splits K: each K belongs to one
    group's product."""
    offs_len = None if offs_shape is None else offs_shape[0]
    _, _, shape = core.result_shape(a_shape, b_shape, offs_len)
    k = a_shape[-1]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * shape[1] * shape[2] * k
    return 2 * math.prod(shape) * k


def _register_flops() -> None:
    from torch.utils.flop_counter import register_flop_formula

    register_flop_formula([torch.ops.wsgemm.grouped_mm, torch.ops.wsgemm.grouped_mm_out])(_flops)


_register_flops()


def grouped_mm(
    a, b, offs=None, *, out=None, out_dtype=None, backend="auto", activation=None, gated=False,
    row_scale=None, check_offs=False,
):  # fmt: skip
    """A grouped GEMM with ``torch._grouped_mm``'s meaning: one product per group (a
    mixture-of-experts layer's experts), the groups given by ``offs`` on the GPU.

    Args:
        a: (M, K) tokens sorted by group (2D x 3D, 2D x 2D) or (G, M, K) (3D x 3D, 3D x 2D);
            float16 or bfloat16 (float32 runs on torch), CUDA, any strides.
        b: (G, K, N) (2D x 3D, 3D x 3D) or (K, N) (2D x 2D, 3D x 2D), a's dtype and device.
            For ``x @ w.T`` with expert weights ``w`` (G, N, K), pass ``w.transpose(-2, -1)``
            (a view; the kernel reads either major).
        offs: int32 (G,) cumulative *end* offsets of the groups along the jagged dimension (a's
            rows for 2D x 3D, K for 2D x 2D, b's columns for 3D x 2D); None for 3D x 3D. Groups
            may be empty; entries must be non-decreasing and at most that dimension. Never
            read on the host on the kernel's road (no sync; capturable in a CUDA graph).
        out: optional result written in place, of the result's shape; rows (columns) past
            ``offs[-1]`` keep their values. Not with autograd. Off the eager road (compiling,
            meta or fake tensors) the op ``torch.ops.wsgemm.grouped_mm_out``.
        out_dtype: a's dtype (default) or torch.float32.
        backend: "auto", or "sm90" / "sm90-pingpong" (the grouped kernel's schedule).
        activation: None, or one of ``matmul``'s activations, applied to the product.
        gated: with an activation, a gated unit (2D x 3D): ``act(gate) * up`` of the product's
            column halves (b's first N / 2 columns the gate's, e.g. ``w_gate_up.transpose(-2,
            -1)`` of experts' (G, 2I, K) weights), an (M, N / 2) result: a mixture-of-experts
            SwiGLU's first GEMM. Fused into the grouped kernel where fused epilogues run.
        row_scale: None, or (M,) float32 or a's dtype (2D x 3D): result row ``r`` multiplied
            by ``row_scale[r]`` last, after the activation or gated unit, in fp32 before the
            one rounding (a mixture-of-experts down projection's router weights, each row
            a (token, expert) pair's). Differentiable, as a and b are. Fused into the grouped
            kernel where ``host.scales_rows`` says so, else one more pass in torch.
        check_offs: read ``offs`` on the host first (one sync) and raise ValueError where an
            entry is negative, decreases or passes the jagged dimension. Off by default: the
            kernels never read it on the host; on the grouped kernel's road offsets out of
            order or range give a defined result (each group's end clamped between the
            previous end and the rows: empty groups), never a read or write out of bounds.

    Returns:
        (M, N) for 2D x 3D and 3D x 2D, (G, M, N) for the others: row-major, rows padded to
        whole 16 bytes (torch's layout), ``out`` when given. Rows (columns) past ``offs[-1]``
        of a fresh result are unspecified, as torch's.

    On Hopper a float16/bfloat16 2D x 3D call runs wsgemm's grouped kernel, 3D x 3D its
    batched GEMM, 3D x 2D the grouped kernel transposed and 2D x 2D the ragged-K grouped
    kernel where torch has no fused kernel (float16, or a float32 result); the other GPUs run
    torch (``wsgemm.api.grouped``).
    Differentiable (``torch.ops.wsgemm.grouped_mm``), traceable by torch.compile.
    """
    if check_offs is not False:
        if not isinstance(check_offs, bool):
            raise TypeError(f"check_offs must be a bool, got {type(check_offs).__name__}")
        _check_offs_values(a, b, offs)
    kw = dict(out_dtype=out_dtype, backend=backend, activation=activation, gated=gated,
              row_scale=row_scale)  # fmt: skip
    eager = _eager(a, b, out, row_scale)
    if out is not None:
        if not _is_compiling():  # (the op's formula is reverse-mode: a tangent is dropped)
            refuse_forward_differentiation("wsgemm.grouped_mm", a, b, row_scale, out)
        if eager:
            return core.grouped_mm(a, b, offs, out=out, **kw)
        if not _all_tensors(a, b, offs, out, row_scale):  # the TypeError
            core.check_grouped(a, b, offs, out, out_dtype, backend, _FAKE_DEVICES, activation,
                               gated, row_scale)  # fmt: skip
        _GROUPED_MM_OUT(a, b, offs, out, out_dtype, backend, activation, gated, row_scale)
        return out
    wants_grad = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (a, b, row_scale)
    )  # fmt: skip
    fast = eager and not (_any_autocast() and torch.is_autocast_enabled("cuda")) and not wants_grad
    if fast:
        return core.grouped_mm(a, b, offs, **kw)
    if not _is_compiling():  # (as above)
        refuse_forward_differentiation("wsgemm.grouped_mm", a, b, row_scale)
    if not _all_tensors(a, b, offs, row_scale):  # the TypeError
        device = (a.device.type,) if isinstance(a, torch.Tensor) else ("cuda",)
        core.check_grouped(a, b, offs, None, out_dtype, backend, device, activation, gated,
                           row_scale)  # fmt: skip
    if (activation is not None or row_scale is not None) and wants_grad and not _is_compiling():
        # (compiling: the op and its own backward, which recomputes the product; dynamo
        # cannot trace _for_autograd's checks, which read is_neg(): a graph break)
        return _for_autograd(a, b, offs, out_dtype, backend, activation, gated, row_scale)
    return _GROUPED_MM(a, b, offs, out_dtype, backend, activation, gated, row_scale)


def _eager(a, b, out=None, row_scale=None) -> bool:
    """The eager road to the core: plain CUDA tensors (``out`` and ``row_scale`` may be None),
    not compiling, no dispatch or ``__torch_function__`` mode. Anything else (meta, fake or CPU
    tensors, subclasses, torch.compile) goes through the ops (``grouped_mm``, and
    ``grouped_mm_out`` for ``out=``), as ``matmul``'s calls do."""
    return (
        not _is_compiling()
        and type(a) in _PLAIN and a.is_cuda and type(b) in _PLAIN and b.is_cuda
        and (out is None or (type(out) in _PLAIN and out.is_cuda))
        and (row_scale is None or (type(row_scale) in _PLAIN and row_scale.is_cuda))
        and _no_modes()
    )  # fmt: skip


def _all_tensors(a, b, *optional) -> bool:
    """a and b tensors, and each of ``optional`` a tensor or None: what the op's schema takes
    (else the checks' TypeError says what is wrong, not the dispatcher's parser)."""
    return all(isinstance(t, torch.Tensor) for t in (a, b)) and all(
        t is None or isinstance(t, torch.Tensor) for t in optional
    )


def _check_offs_values(a, b, offs) -> None:
    """``grouped_mm(check_offs=True)``: ``offs``'s values against the jagged dimension (a's
    rows for 2D x 3D, K for 2D x 2D, b's columns for 3D x 2D), read on the host."""
    if offs is None or not isinstance(offs, torch.Tensor):
        return  # the call's own checks say what is wrong
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return
    if a.dim() == 2 and b.dim() == 3:
        what, size = "a's rows", a.shape[0]
    elif a.dim() == 2 and b.dim() == 2:
        what, size = "K", a.shape[1]
    elif a.dim() == 3 and b.dim() == 2:
        what, size = "b's columns", b.shape[1]
    else:
        return
    ends = offs.detach().to("cpu", torch.int64).reshape(-1).tolist()  # the one sync
    prev = 0
    for g, end in enumerate(ends):
        if end < prev:
            raise ValueError(
                f"offs[{g}] = {end} is below offs[{g - 1}] = {prev}" if g
                else f"offs[0] = {end} is negative"
            )  # fmt: skip
        if end > size:
            raise ValueError(f"offs[{g}] = {end} passes {what} ({size})")
        prev = end


def _for_autograd(a, b, offs, out_dtype, backend, activation, gated, row_scale=None):
    """With a gradient to compute, an epilogue runs as torch's own ops on the grouped product,
    which autograd saves (torch's unfused path): the backward is the grouped dA and dB and
    recomputes nothing. (The op's own backward, for a direct ``torch.ops.wsgemm.grouped_mm``
    call, recomputes the product.) Checked first as the op checks it, on the result's device
    type. A row scale multiplies in fp32, rounded once to the result's dtype; the rows past
    ``offs[-1]`` (unwritten) are zeroed before it, so its gradient there is zero. Under CUDA
    autocast the operands (and a row scale neither float32 nor their new dtype) are cast first,
    as the op's autocast kernel casts them, so the result's dtype is the op's."""
    if _any_autocast() and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        a, b = a.to(autocast_dtype(a, dtype)), b.to(autocast_dtype(b, dtype))
        if row_scale is not None and row_scale.dtype not in (torch.float32, a.dtype):
            row_scale = row_scale.float()
    p = core.check_grouped(a, b, offs, None, out_dtype, backend, (a.device.type,), activation,
                           gated, row_scale)  # fmt: skip
    pre = _GROUPED_MM(a, b, offs, out_dtype, backend, None, False)
    y = (gated_unit_with_grad if gated else torch_activation)(p.epilogue.activation, pre)
    if row_scale is None:
        return y.to(p.c_dtype)  # (autocast may run an activation's op in float32)
    y = _zero_past_end(y, offs, 0).float() * row_scale.float()[:, None]
    return y.to(p.c_dtype)
