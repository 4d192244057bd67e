"""wsgemm inside a model: ``matmul`` with torch.matmul's full meaning, ``linear``, and the ops
``torch.ops.wsgemm.matmul`` / ``torch.ops.wsgemm.matmul_out`` that torch.compile, autograd,
autocast, fake tensors and other tensor subclasses understand.

This layer sits on the core (``wsgemm.api.matmul``: 2-D and 3-D operands, a 3-D batch of 1
broadcast). It adds any number of batch dimensions with broadcasting and 1-D operands, folding
batches into the core's one batch mode as views wherever the strides allow, and a backward made of
the same kernels.

Two roads lead to the same work (``_forward``), and a third to torch's:

- the eager fast path: plain CUDA tensors (exactly ``torch.Tensor`` or ``nn.Parameter``), no
  ``__torch_function__`` or dispatch mode, no functorch transform, no forward-mode AD. It calls the
  core directly, through a ``torch.autograd.Function`` when a gradient is needed, because torch's
  dispatcher costs 5-15 us a call (docs/perf.md, entry 13);
- torch's own ops, in fp32, for a call that forward-mode AD or functorch's grad / jvp
  differentiates (``forward_differentiated``): the ops' autograd formulas are reverse-mode
  only, and torch would drop the tangent silently;
- the registered ops, for everything else: torch.compile and export, make_fx, FakeTensorMode,
  FlopCounterMode, vmap, DTensor and other subclasses, autocast-traced graphs. Their fake
  implementation only does shape arithmetic; the backend and shape policy runs in the real one.
"""

from __future__ import annotations

import math

import torch
import torch.autograd.forward_ad as _forward_ad
from torch._C._functorch import TransformType as _TransformType
from torch._functorch.pyfunctorch import (
    retrieve_all_functorch_interpreters as _functorch_interpreters,
)
from torch._subclasses.fake_tensor import is_fake
from torch.utils._device import DeviceContext

from . import api
from .api.dispatch import CPU_REASON
from .api.epilogue import (
    activation_backward,
    bias_mode,
    check_activation,
    check_epilogue,
    check_residual,
    check_scalar,
    grad_through,
    torch_activation,
    wide_dtype,
)
from .api.fallback import refuse_accumulator
from .api.validate import (
    AB_DTYPES,
    TORCH_AB_DTYPES,
    check_devices,
    check_kinds,
    check_out_fits,
    check_static,
    dtype_list,
    result_shape,
)

# Devices the fake implementation takes: CUDA, and meta for shapes alone.
_FAKE_DEVICES = ("cuda", "meta")


def _check_fake(
    a, b, out, out_dtype, accumulate, backend, bias=None, activation=None, c=None, alpha=1.0,
    beta=1.0,
) -> tuple:  # fmt: skip
    """The fake implementations' checks: ``api.validate``'s that need no GPU (types, dtypes,
    shapes, the backend's name; ``check_static``; the epilogue's) and the devices. Returns the
    result's shape. Never reads data or asks the device anything."""
    shape = check_static(a, b, out, out_dtype, accumulate, backend)
    # backend "auto" takes CPU tensors too (torch's matmul runs them: api.dispatch)
    check_devices(a, b, out, (*_FAKE_DEVICES, "cpu") if backend == "auto" else _FAKE_DEVICES)
    if a.device.type == "cpu":  # torch's road, as the real implementation refuses it
        refuse_accumulator(accumulate, CPU_REASON)
    check_epilogue(bias, activation, a.dtype, shape, a.device)
    check_scalar("alpha", alpha), check_scalar("beta", beta)
    if c is not None:
        c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
        check_residual(c, shape, c_dtype, a.device)
    return shape


# ----------------------------------------------------------------------------- the work

_unsafe_view = torch.ops.aten._unsafe_view.default


def _scaled(c, alpha, beta) -> dict | None:
    """The core's keywords of a call with ``c`` or ``alpha`` (``_forward``'s ``scaled``);
    None for a call without them."""
    return None if c is None and alpha == 1.0 else dict(c=c, alpha=alpha, beta=beta)


def _combined(y, act: str, alpha=1.0, c=None, beta=1.0, bias=None) -> torch.Tensor:
    """``act(alpha · y + beta · c + bias)`` as torch's own ops in ``y``'s precision (a wide
    product's), which autograd and every transform differentiate: the torch roads of a call
    with a gradient, under vmap and under forward-mode AD."""
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + c.to(y.dtype) * beta
    if bias is not None:  # as in a @ b + bias: broadcast against the result
        y = y + bias.to(y.dtype)
    return torch_activation(act, y)


def _forward(
    a, b, out, out_dtype, accumulate, backend, bias=None, activation=None, scaled=None
):  # fmt: skip
    """``activation(a @ b + bias)`` with torch.matmul's meaning on the core; with ``scaled``
    (``_scaled``'s), ``activation(alpha · a @ b + beta · c + bias)``. 2-D and 3-D operands go
    straight to it; others are brought to (L, M, K) @ (L or 1, K, N) first."""
    # with out=, the core bumps out's version counter (a view's bump is its base's)
    if scaled is not None and scaled["c"] is not None and scaled["c"] is not out:
        # against torch.matmul's result, before any folding
        c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
        check_residual(scaled["c"], result_shape(a.shape, b.shape), c_dtype, a.device)
    if 2 <= a.dim() <= 3 and 2 <= b.dim() <= 3:
        return api.matmul(
            a, b, out=out, out_dtype=out_dtype, accumulate=accumulate, backend=backend,
            bias=bias, activation=activation, **(scaled or {}),
        )  # fmt: skip
    return _forward_nd(a, b, out, out_dtype, accumulate, backend, bias, activation, scaled)


def _core_bias(bias, a, b, shape):
    """A bias of the N-D product (broadcast against its ``shape``) as the core's 2-D/3-D product
    takes it: a 1-D ``b`` makes the result's last dimension the core's rows (M, 1); otherwise
    the bias keeps its last two dimensions (any leading ones are 1: ``bias_mode``)."""
    if bias is None:
        return None
    bias_mode(bias.shape, shape)
    if b.dim() == 1 and bias.numel() > 1:
        return bias.reshape(-1, 1)
    return bias.reshape(bias.shape[-2:]) if bias.dim() > 2 else bias


def _forward_nd(a, b, out, out_dtype, accumulate, backend, bias=None, activation=None,
                scaled=None):  # fmt: skip
    c = scaled["c"] if scaled else None  # checked by _forward
    shape, _, _, a3, b3, bias3, out3, c3 = _folded(a, b, out, out_dtype, bias, c)
    kw = dict(accumulate=accumulate, backend=backend)
    if bias is not None or activation is not None:
        kw.update(bias=bias3, activation=activation)
    if scaled:
        kw.update(alpha=scaled["alpha"], beta=scaled["beta"])
        if c is not None:
            kw.update(c=c3)
    if out is None:
        result = api.matmul(a3, b3, out_dtype=out_dtype, **kw)
        # not a view: autograd forbids in-place changes of views made inside a custom Function
        return _unsafe_view(result, shape)
    if out3 is None:  # out's batch dimensions do not collapse into one: write, then copy
        out.copy_(api.matmul(a3, b3, out_dtype=out.dtype, **kw).view(shape))
        return out
    api.matmul(a3, b3, out=out3, **kw)
    return out


def _folded(a, b, out, out_dtype, bias=None, c=None) -> tuple:
    """An N-D call (torch.matmul's shapes: 1-D operands, any batch dimensions, broadcast) as the
    core's 2-D/3-D problem, which ``_forward_nd`` runs and ``explain`` describes: ``(shape,
    batch, core_shape, a3, b3, bias3, out3, c3)``, torch.matmul's result shape, its batch
    dimensions, the core's result shape, and the core's views (``_fold``: copies where the batch
    dimensions broadcast or do not collapse) of the operands, the bias, ``out`` (None without
    one, or where its batch dimensions do not collapse: the result is then written to a new
    tensor and copied into ``out``) and ``c`` (None without one; ``out``'s view where ``c`` is
    ``out``, the in-place residual)."""
    # torch.matmul's shapes and out's before folding (the folded views would hide a wrong
    # shape of out); the core checks the rest of the call on the folded views
    shape = result_shape(a.shape, b.shape)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    batch = shape[: len(shape) - (a.dim() > 1) - (b.dim() > 1)]  # the rows and columns follow
    count = math.prod(batch)
    a3, b3 = _fold(a2, batch, count), _fold(b2, batch, count)
    m, n = a2.shape[-2], b2.shape[-1]
    core_shape = (m, n) if a3.dim() == b3.dim() == 2 else (count, m, n)
    bias3 = _core_bias(bias, a, b, shape)
    out3 = None
    if out is not None:
        check_out_fits(out, shape, out_dtype, a.dtype)
        try:
            out3 = out.view(core_shape)
        except RuntimeError:  # out's batch dimensions do not collapse into one
            pass
    c3 = None
    if c is not None:  # out itself: the in-place residual; another c broadcast to the result,
        # then folded as out is (the core sees a fold that lands on out's elements as out
        # itself: dispatch._same_view)
        c3 = out3 if c is out and out3 is not None else c.expand(shape).reshape(core_shape)
    return shape, batch, core_shape, a3, b3, bias3, out3, c3


def _fold(t: torch.Tensor, batch: tuple, count: int) -> torch.Tensor:
    """``t`` (..., R, C) as the core takes it: (R, C) when it has no batch to speak of, else
    (count, R, C): a view when its batch dimensions collapse, a copy when they do not or when
    it broadcasts along some of them (what torch.matmul does too)."""
    own = t.shape[:-2]
    if math.prod(own) == 1:
        return t.reshape(t.shape[-2:])
    if tuple(own) != tuple(batch):
        t = t.expand(*batch, *t.shape[-2:])
    return t.reshape(count, *t.shape[-2:])


# ----------------------------------------------------------------------------- explain


def explain(
    a, b, *, out=None, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None,
    activation=None, cc: tuple[int, int] | None = None, sm_count: int | None = None,
    grouped: bool = False, offs=None, gated: bool = False, c=None, alpha=1.0, beta=1.0,
    row_scale=None,
) -> str:  # fmt: skip
    """Which kernel ``matmul`` with these arguments runs, and why (``wsgemm.api.explain``'s
    account: the problem, the kernel, the split, why, and the operands), for every operand
    shape ``matmul`` takes: 2-D and 3-D operands as the core takes them (the core's text,
    unchanged); 1-D operands and any number of batch dimensions (broadcast as in torch.matmul)
    folded into the core's 2-D/3-D problem exactly as ``matmul`` folds them (``_folded``), then
    explained there, after a first line that says how the call was folded: into one product
    or a batch of L, and which of ``a``, ``b``, ``c`` is copied first (its batch dimensions
    broadcast, or do not collapse into one) and whether ``out`` is written in place or the
    result copied into it. Shapes ``matmul`` refuses raise its ValueError. ``grouped``,
    ``offs``, ``gated`` and ``row_scale`` are ``wsgemm.api.explain``'s, unchanged.

    Compiles, launches and allocates nothing on the device: where the fold of CUDA tensors
    would copy one, the call is explained on meta stand-ins of its tensors, for a GPU of
    their device's capability and SM count (``cc`` and ``sm_count`` default to them; choices
    tuned on this GPU are then not seen, and out's overlap with ``a`` or ``b`` not checked).
    Meta and fake tensors fold as they are; CPU tensors too (a host copy where the fold
    copies, as ``matmul`` makes it), except where they are explained on a stand-in GPU anyway
    (``cc`` or ``sm_count`` given, or no GPU here), which meta stand-ins answer the same.
    """
    others = dict(out_dtype=out_dtype, accumulate=accumulate, backend=backend,
                  activation=activation, alpha=alpha, beta=beta, row_scale=row_scale)  # fmt: skip
    nd = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    nd = nd and not (2 <= a.dim() <= 3 and 2 <= b.dim() <= 3)
    if not nd or grouped or offs is not None or gated or row_scale is not None:
        return api.explain(a, b, out=out, bias=bias, c=c, cc=cc, sm_count=sm_count,
                           grouped=grouped, offs=offs, gated=gated, **others)  # fmt: skip
    # matmul's checks of the N-D call (its fake implementation's, on the unfolded shapes),
    # before anything is folded; the core checks the rest on the folded views
    shape = check_static(a, b, out, out_dtype, accumulate, backend)
    check_devices(a, b, out, (a.device.type,))  # one device (the core says which type)
    check_epilogue(bias, activation, a.dtype, shape, a.device)
    if c is not None and c is not out:
        check_residual(c, shape, out.dtype if out is not None else (out_dtype or a.dtype),
                       a.device)  # fmt: skip
    tensors = (a, b, out, bias, c)
    stand_ins = False  # or (with CUDA tensors) "cuda"
    if a.device.type == "meta" or is_fake(a):
        fold = _folded(a, b, out, out_dtype, bias, c)
    else:  # real tensors: fold meta stand-ins first, which show what the fold would copy
        ta, tb, tout, tbias, tc = _meta_twins(tensors)
        fold = _folded(ta, tb, tout, out_dtype, tbias, tc)
        elsewhere = cc is not None or sm_count is not None or not torch.cuda.is_available()
        stand_ins = bool(_fold_copies(fold, c)) and (a.device.type == "cuda" or elsewhere)
        if stand_ins and a.device.type == "cuda":  # the same GPU's capability and SMs
            stand_ins = "cuda"
            props = torch.cuda.get_device_properties(a.device)
            cc = (props.major, props.minor) if cc is None else cc
            sm_count = props.multi_processor_count if sm_count is None else sm_count
        if not stand_ins:  # views only (or a CPU tensor's host copy, as matmul's)
            fold = _folded(a, b, out, out_dtype, bias, c)
    _, _, _, a3, b3, bias3, out3, c3 = fold
    text = api.explain(a3, b3, out=out3, bias=bias3, c=c3, cc=cc, sm_count=sm_count, **others)
    return f"{_fold_line(a, b, out, c, fold, stand_ins)}\n{text}"


def _meta_twins(tensors) -> tuple:
    """Meta tensors of ``tensors``' shapes, strides, dtypes, negative bits and requires_grad
    (None stays None; one tensor given twice gets one twin, as ``c`` that is ``out``)."""
    twins: dict[int, torch.Tensor] = {}
    for t in tensors:
        if t is not None and id(t) not in twins:
            twin = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            twin = twin._neg_view() if t.is_neg() else twin
            twins[id(t)] = twin.requires_grad_(t.requires_grad)
    return tuple(None if t is None else twins[id(t)] for t in tensors)


def _fold_copies(fold: tuple, c) -> list[str]:
    """Which of ``_folded``'s views are copies (not views of what was passed): "a", "b", "c"."""
    _, _, _, a3, b3, _, _, c3 = fold
    views = (("a", a3), ("b", b3), ("c", c3 if c is not None else None))
    return [name for name, t in views if t is not None and not t._is_view()]


def _fold_line(a, b, out, c, fold: tuple, stand_ins) -> str:
    """``explain``'s first line for an N-D call: how ``_folded`` brought it to the core."""
    shape, batch, core_shape, a3, b3, _, out3, c3 = fold
    product = f"{tuple(a3.shape)} @ {tuple(b3.shape)}"
    how = (f"one {product} product" if len(core_shape) == 2
           else f"a batch of {core_shape[0]}: {product}")  # fmt: skip
    parts = [f"N-D: a {tuple(a.shape)} @ b {tuple(b.shape)} runs as {how}"]
    for name in _fold_copies(fold, c):
        t, folded = {"a": (a, a3), "b": (b, b3), "c": (c, c3)}[name]
        own, wanted = (tuple(t.shape), tuple(shape)) if name == "c" else (
            tuple(t.shape[:-2]), tuple(batch))  # fmt: skip
        why = (f"{'it' if name == 'c' else 'its batch'} {own} broadcasts to {wanted}"
               if own != wanted else "its batch dimensions do not collapse into one (strides "
               f"{tuple(t.stride())})")  # fmt: skip
        parts.append(f"{name} copied into a {tuple(folded.shape)} tensor first: {why}")
    if out is not None:
        parts.append(
            f"out written in place as {tuple(out3.shape)}" if out3 is not None else
            "out's batch dimensions do not collapse into one: the result is written to a new "
            f"{tuple(core_shape)} tensor, then copied into out"
        )  # fmt: skip
    if stand_ins:
        parts.append("explained on meta stand-ins of the tensors (explain copies nothing)"
                     + (", for their GPU's capability and SM count" if stand_ins == "cuda"
                        else ""))  # fmt: skip
    return "; ".join(parts)


def _product(x, y, like: torch.Tensor, backend: str) -> torch.Tensor:
    """``x @ y`` laid out like ``like``: column-major (as the transposed product's transpose)
    when ``like`` is a column-major view, such as the ``weight.t()`` of a linear layer."""
    if like.stride(-2) == 1 and like.stride(-1) != 1:
        return matmul(y.mT, x.mT, backend=backend).mT
    return matmul(x, y, backend=backend)


def _grads(a, b, grad, need_a: bool, need_b: bool, backend: str):
    """dA = dC·Bᵀ and dB = Aᵀ·dC on wsgemm's kernels, summed over broadcast batch dimensions.

    Transposes are views (the kernels read either major). An operand that serves every batch
    (2-D, or a batch of ones) gets its gradient from one GEMM over all batches, as torch's folded
    matmul does: one rounding, no (batch, rows, cols) intermediate. Otherwise the batched
    product is summed over the broadcast dimensions, as torch does. Each gradient is computed
    in its input's layout (a column-major weight view gets a column-major gradient), so
    autograd's accumulation takes it without a copy.

    A gradient of another dtype than the inputs (the fp32 gradient of an
    ``out_dtype=torch.float32`` product) is rounded to the input dtype first: the kernels multiply
    equal dtypes, and the gradients come out in the inputs' dtype. Backward always accumulates
    in fp32, whatever ``accumulate`` the forward used: dB sums over every row of the batch.
    """
    g = grad.to(a.dtype)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])  # checked by the forward
    count = math.prod(batch)
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    g = g.reshape(*batch, m, n)
    ga = gb = None
    if need_a:
        if math.prod(a2.shape[:-2]) == 1:  # explicit sizes, not -1: any of them may be 0
            g_cols = g.movedim(-2, 0).reshape(m, count * n)
            ga = _product(g_cols, b2.mT.reshape(count * n, k), a2, backend)
        else:
            ga = _product(g, b2.mT, a2, backend).sum_to_size(a2.shape)
        ga = ga.reshape(a.shape)
    if need_b:
        if math.prod(b2.shape[:-2]) == 1:
            rows = count * m
            gb = _product(a2.reshape(rows, k).mT, g.reshape(rows, n), b2, backend)
        else:
            gb = _product(a2.mT, g, b2, backend).sum_to_size(b2.shape)
        gb = gb.reshape(b.shape)
    return ga, gb


# ----------------------------------------------------------------------------- registration

_LIB = torch.library.Library("wsgemm", "DEF")
_LIB.define(
    "matmul(Tensor a, Tensor b, ScalarType? out_dtype=None, ScalarType accumulate=float, "
    'str backend="auto", Tensor? bias=None, str? activation=None, Tensor? c=None, '
    "float alpha=1.0, float beta=1.0) -> Tensor",
    tags=(torch.Tag.pt2_compliant_tag,),
)
_LIB.define(
    "matmul_out(Tensor a, Tensor b, Tensor(a!) out, ScalarType? out_dtype=None, "
    'ScalarType accumulate=float, str backend="auto", Tensor? bias=None, '
    "str? activation=None, Tensor? c=None, float alpha=1.0, float beta=1.0) -> ()",
    tags=(torch.Tag.pt2_compliant_tag,),
)
_MATMUL = torch.ops.wsgemm.matmul.default
_MATMUL_OUT = torch.ops.wsgemm.matmul_out.default


def _matmul_impl(
    a, b, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None, activation=None,
    c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    refuse_forward_differentiation("torch.ops.wsgemm.matmul", a, b, bias, c)
    scaled = _scaled(c, alpha, beta)
    return _forward(a, b, None, out_dtype, accumulate, backend, bias, activation, scaled)


def _matmul_out_impl(
    a, b, out, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None,
    activation=None, c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    refuse_forward_differentiation("torch.ops.wsgemm.matmul_out", a, b, bias, c)
    _forward(a, b, out, out_dtype, accumulate, backend, bias, activation, _scaled(c, alpha, beta))


# CPU too, so a CPU tensor gets the core's ValueError rather than the dispatcher's
for _key in ("CUDA", "CPU"):
    _LIB.impl("matmul", _matmul_impl, _key)
    _LIB.impl("matmul_out", _matmul_out_impl, _key)


@torch.library.register_fake("wsgemm::matmul", lib=_LIB)
def _matmul_fake(
    a, b, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None, activation=None,
    c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    shape = _check_fake(
        a, b, None, out_dtype, accumulate, backend, bias, activation, c, alpha, beta
    )
    return a.new_empty(shape, dtype=out_dtype or a.dtype)  # contiguous, as torch.matmul's


@torch.library.register_fake("wsgemm::matmul_out", lib=_LIB)
def _matmul_out_fake(
    a, b, out, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None,
    activation=None, c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    # no overlap test: fake tensors have no data
    _check_fake(a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha, beta)


def _setup_context(ctx, inputs, output):
    a, b, out_dtype, accumulate, backend, *epilogue = inputs
    defaults = (None, None, None, 1.0, 1.0)  # bias, activation, c, alpha, beta
    bias, activation, c, alpha, beta = (*epilogue, *defaults[len(epilogue) :])
    ctx.save_for_backward(a, b, bias, c)
    ctx.backend, ctx.activation, ctx.alpha, ctx.beta = backend, activation, alpha, beta
    ctx.pre = (out_dtype, accumulate)  # what recomputing the pre-activation needs


def _backward(ctx, grad):
    """The product's gradients; with an activation, the gradient through it first, at the
    pre-activation ``a @ b + bias`` recomputed by one more (bias-fused) product (the fused
    backward that reads a saved pre-activation is the next step of issue #25); the bias's is the
    gradient summed over every dimension the bias broadcasts along, in fp32."""
    a, b, bias, c = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    need_bias = bias is not None and ctx.needs_input_grad[5]
    need_c = c is not None and len(ctx.needs_input_grad) > 7 and ctx.needs_input_grad[7]
    alpha, beta = ctx.alpha, ctx.beta
    if ctx.activation is not None and ctx.activation != "none":
        out_dtype, accumulate = ctx.pre
        # (the op, not the core: a traced backward holds its node); with create_graph (a
        # double backward) the pre-activation stays differentiable, and the gradient through
        # the activation is torch's formula, differentiable again (computed under no_grad,
        # the second derivative through the activation and the pre-activation was dropped)
        create_graph = torch.is_grad_enabled()
        with torch.set_grad_enabled(create_graph):
            pre = _MATMUL(a, b, out_dtype, accumulate, ctx.backend, bias, None, c, alpha, beta)
        if create_graph:
            grad = _grad_through_graph(ctx.activation, grad, pre)
        elif pre.dtype == torch.float64:  # torch's backward ops in fp64 (not rounded to fp32)
            grad = activation_backward(ctx.activation, grad.to(pre.dtype), pre).to(grad.dtype)
        else:
            grad = grad_through(ctx.activation, grad, pre).to(grad.dtype)
    g_product = grad if alpha == 1.0 else (_wide(grad) * alpha).to(grad.dtype)
    ga, gb = _grads(a, b, g_product, need_a, need_b, ctx.backend)
    gbias = gc = None
    if need_bias:  # the bias broadcasts against the result from the right, as in torch's add
        gbias = _wide(grad).sum_to_size(bias.shape).to(bias.dtype)
    if need_c:  # so does c
        gc = (_wide(grad) * beta).sum_to_size(c.shape).to(c.dtype)
    return ga, gb, None, None, None, gbias, None, gc, None, None


def _grad_through_graph(act: str, grad, pre) -> torch.Tensor:
    """``grad · act'(pre)`` (in fp32, or fp64 for fp64) by autograd through torch's form of the
    activation with ``create_graph``: differentiable in ``grad`` and ``pre`` (a double
    backward's)."""
    p = _wide(pre)
    if not p.requires_grad:
        p = p.detach().requires_grad_()
    with torch.enable_grad():
        (g,) = torch.autograd.grad(torch_activation(act, p), p, _wide(grad), create_graph=True)
    return g.to(grad.dtype)


def creates_graph(*saved) -> bool:
    """Whether an op's backward runs with ``create_graph`` (a double backward) for saved inputs
    that need a graph: grad mode is on inside a backward only then."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in saved)


def grads_by_autograd(forward, inputs, needs, grad) -> tuple:
    """An op's gradients under ``create_graph``: autograd through ``forward()`` (the op's
    forward written in differentiable pieces) with respect to each input that ``needs`` one,
    so that they are differentiable again; None where not needed, zeros where unused."""
    wrt = [t for t, needed in zip(inputs, needs, strict=True) if needed and t is not None]
    with torch.enable_grad():
        found = iter(torch.autograd.grad(forward(), wrt, grad, create_graph=True,
                                         allow_unused=True))  # fmt: skip
    out = []
    for t, needed in zip(inputs, needs, strict=True):
        g = next(found) if needed and t is not None else None
        out.append(torch.zeros_like(t) if g is None and needed and t is not None else g)
    return tuple(out)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32, or in its own dtype where that is wider (fp64 is not rounded to fp32):
    the precision of the backward's sums and scalings."""
    return t.to(wide_dtype(t.dtype))


torch.library.register_autograd("wsgemm::matmul", _backward, setup_context=_setup_context, lib=_LIB)


def _matmul_vmap(
    info, in_dims, a, b, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None,
    activation=None, c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    """vmap's batching rule: the vmapped dimension becomes a leading batch dimension of one
    product (matmul broadcasts batches), not a loop of per-sample calls. A per-sample vector
    becomes a one-row (``a``) or one-column (``b``) matrix, squeezed out of the result again, and
    the per-sample batch dimensions of a vmapped operand are padded with ones to the other's
    count, so that the vmapped dimension lines up with the other's (or broadcasts)."""
    a_dim, b_dim = in_dims[0], in_dims[1]
    c_dim = in_dims[7] if len(in_dims) > 7 else None
    bias_dim = in_dims[5] if len(in_dims) > 5 else None
    sample = result_shape(_sample_shape(a, a_dim), _sample_shape(b, b_dim))
    if bias is not None:  # against a sample's result, as the unbatched call checks it
        bias_mode(_sample_shape(bias, bias_dim), sample)
    # (a vector result's bias too: its batched product is a column the bias does not fit)
    if c is not None or alpha != 1.0 or bias_dim is not None or (
            bias is not None and len(sample) < 2):  # fmt: skip
        # alpha, a residual or a per-sample bias: the product batched (in fp32; fp64
        # operands' in fp64, not rounded to fp32), then the rest in torch, rounded once
        wide = wide_dtype(a.dtype)
        wide = wide if accumulate == torch.float32 else out_dtype
        out, dim = _matmul_vmap(info, in_dims[:5], a, b, wide, accumulate, backend)
        rank = out.dim() - (dim is not None)  # a sample's result
        c = None if c is None else _per_sample(c, c_dim, rank)
        bias = None if bias is None else _per_sample(bias, bias_dim, rank)
        mapped = dim is not None or (c is not None and c_dim is not None) or bias_dim is not None
        y = _combined(_wide(out), check_activation(activation), alpha, c, beta, bias)
        return y.to(out_dtype or a.dtype), 0 if mapped else None
    if a_dim is None and b_dim is None:
        return _MATMUL(a, b, out_dtype, accumulate, backend, bias, activation), None
    a = a if a_dim is None else a.movedim(a_dim, 0)
    b = b if b_dim is None else b.movedim(b_dim, 0)
    a_lead, b_lead = int(a_dim is not None), int(b_dim is not None)  # the mapped dimension
    a_vec, b_vec = a.dim() - a_lead == 1, b.dim() - b_lead == 1
    a = a.unsqueeze(-2) if a_vec else a
    b = b.unsqueeze(-1) if b_vec else b
    # each operand's per-sample batch dimensions, the mapped ones padded to the same count
    a_batch, b_batch = a.dim() - 2 - a_lead, b.dim() - 2 - b_lead
    rank = max(a_batch, b_batch)
    if a_lead:
        a = a.reshape(a.shape[0], *(1,) * (rank - a_batch), *a.shape[1:])
    if b_lead:
        b = b.reshape(b.shape[0], *(1,) * (rank - b_batch), *b.shape[1:])
    out = _MATMUL(a, b, out_dtype, accumulate, backend, bias, activation)  # (vmapped, *batch, M, N)
    if b_vec:
        out = out.squeeze(-1)
    if a_vec:
        out = out.squeeze(-1 if b_vec else -2)
    return out, 0


def _sample_shape(t, dim) -> tuple:
    """A vmapped tensor's shape for one sample (``dim`` the mapped dimension, or None)."""
    return tuple(t.shape) if dim is None else tuple(s for i, s in enumerate(t.shape) if i != dim)


def _per_sample(t, dim, rank: int):
    """``t`` (a bias or residual, vmapped along ``dim`` or not) against a batch of results of
    ``rank`` dimensions each, the vmapped dimension first: a sample's tensor broadcasts against
    its result from the right, as torch's add does (an unmapped one does so by itself)."""
    if dim is None:
        return t
    t = t.movedim(dim, 0)
    return t.reshape(t.shape[0], *(1,) * (rank - (t.dim() - 1)), *t.shape[1:])


if hasattr(torch.library, "register_vmap"):  # torch 2.4+; before it, torch's per-sample loop
    torch.library.register_vmap("wsgemm::matmul", _matmul_vmap, lib=_LIB)


def _refuse_grad(a, b, out, bias=None, c=None) -> None:
    wants = a.requires_grad or b.requires_grad or out.requires_grad
    wants = wants or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and (wants or (isinstance(c, torch.Tensor) and c.requires_grad)):
        raise RuntimeError(
            "wsgemm.matmul(): out= does not support automatic differentiation, but an argument "
            "requires grad (as torch.matmul); call it without out=, or under torch.no_grad()"
        )


def _matmul_out_autograd(
    a, b, out, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None,
    activation=None, c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    _refuse_grad(a, b, out, bias, c)
    with torch._C._AutoDispatchBelowAutograd():
        _MATMUL_OUT(a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha, beta)


_LIB.impl("matmul_out", _matmul_out_autograd, "Autograd")


def autocast_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype CUDA autocast gives ``t`` in a lower-precision op such as torch.matmul:
    floating CUDA tensors other than float64 take ``dtype``."""
    if t.is_cuda and t.is_floating_point() and t.dtype != torch.float64:
        return dtype
    return t.dtype


def mlp_backward(ctx, grad, unit_grad, unit):
    """The backward of an MLP's fused training step ``down(unit(x @ w_up.T + b_up) @ ...)``
    (``gated.gated_mlp``, ``mlp.mlp``), whose forward saved ``(x, w_up, b_up, w_down, b_down,
    pre, h)`` and set ``ctx.activation`` and ``ctx.has_bias``: ``dpre = unit_grad(d_out,
    w_down, pre, activation)`` (the unit's gradient fused into the down projection's dh GEMM),
    then dx, both weights' gradients (products on wsgemm) and the biases' sums in fp32; with
    ``create_graph`` (a double backward), autograd through torch's own ops on the saved inputs
    (``unit(activation, pre)`` torch's form of the unit), so that the gradients are
    differentiable again. One gradient per forward input (the activation's None)."""
    need = ctx.needs_input_grad
    x, w_up, b_up, w_d, b_d, pre, h = ctx.saved_tensors
    if torch.is_grad_enabled():
        inputs = (x, w_up, b_up, w_d, b_d)
        with torch.enable_grad():
            y = torch.nn.functional.linear(x, w_up, b_up)
            out = torch.nn.functional.linear(unit(ctx.activation, y), w_d, b_d)
            wrt = [t for t, needed in zip(inputs, need, strict=False) if needed]
            found = iter(torch.autograd.grad(out, wrt, grad, create_graph=True))
        return (*(next(found) if needed else None for needed in need[:5]), None)
    x2 = x.reshape(-1, x.shape[-1])
    d2 = grad.reshape(-1, grad.shape[-1])
    dpre = unit_grad(d2, w_d, pre, ctx.activation) if any(need[:3]) else None
    gx = matmul(dpre, w_up).reshape(*grad.shape[:-1], x2.shape[-1]) if need[0] else None
    gw_up = matmul(dpre.t(), x2) if need[1] else None
    gb_up = dpre.float().sum(0).to(dpre.dtype) if ctx.has_bias[0] and need[2] else None
    gw_d = matmul(d2.t(), h) if need[3] else None
    gb_d = d2.float().sum(0).to(d2.dtype) if ctx.has_bias[1] and need[4] else None
    return gx, gw_up, gb_up, gw_d, gb_d, None


def autocast_cast(*tensors):
    """``tensors`` (None allowed) as CUDA autocast casts a matmul's operands, where it is on
    (``autocast_dtype``); as they are otherwise."""
    if not torch.is_autocast_enabled("cuda"):
        return tensors
    dtype = torch.get_autocast_dtype("cuda")
    return tuple(None if t is None else t.to(autocast_dtype(t, dtype)) for t in tensors)


def _autocast(a, b, bias=None, c=None, out_dtype=None):
    dtype = torch.get_autocast_dtype("cuda")
    a, b = a.to(autocast_dtype(a, dtype)), b.to(autocast_dtype(b, dtype))
    if bias is not None:  # the epilogue adds a bias of the inputs' dtype
        bias = bias.to(a.dtype) if bias.is_floating_point() else bias
    if isinstance(c, torch.Tensor) and c.is_floating_point():  # a residual: the result's
        c = c.to(out_dtype or a.dtype)
    return a, b, bias, c


def _matmul_autocast(
    a, b, out_dtype=None, accumulate=torch.float32, backend="auto", bias=None, activation=None,
    c=None, alpha=1.0, beta=1.0,
):  # fmt: skip
    a, b, bias, c = _autocast(a, b, bias, c, out_dtype)
    with torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
    ):
        return _MATMUL(a, b, out_dtype, accumulate, backend, bias, activation, c, alpha, beta)


# out= calls are not autocast (torch's rule), so matmul_out keeps the fallthrough
_LIB.impl("matmul", _matmul_autocast, "AutocastCUDA")


def _flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(result_shape(a_shape, b_shape)) * a_shape[-1]


def _register_flops() -> None:
    from torch.utils.flop_counter import register_flop_formula

    register_flop_formula([torch.ops.wsgemm.matmul, torch.ops.wsgemm.matmul_out])(_flops)


_register_flops()


# ----------------------------------------------------------------------------- eager fast path


class _Matmul(torch.autograd.Function):
    """The eager autograd road: cheaper than the registered op's (docs/perf.md, entry 13), with
    the same backward. ``forward(ctx, ...)`` rather than ``setup_context``: that form skips
    binding default arguments on every ``apply``."""

    @staticmethod
    def forward(ctx, a, b, out_dtype, accumulate, backend, bias, activation):
        _setup_context(ctx, (a, b, out_dtype, accumulate, backend, bias, activation), None)
        return _forward(a, b, None, out_dtype, accumulate, backend, bias, activation)

    @staticmethod
    def backward(ctx, grad):  # the registered op's, for this Function's seven inputs
        return _backward(ctx, grad)[:7]


# Bound once: every name lookup is on the per-call path (docs/perf.md, entry 13).
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_is_compiling = torch.compiler.is_compiling  # dynamo knows the function, whatever its name
_grad_enabled = torch.is_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_function_mode_enabled = torch._C._is_torch_function_mode_enabled


def _plain(a, b, out=None) -> bool:
    """CUDA tensors with no subclass behaviour (``nn.Parameter`` disables
    ``__torch_function__``); ``out`` may be None."""
    ta, tb = type(a), type(b)
    return (
        (ta is _Tensor or ta is _Parameter)
        and (tb is _Tensor or tb is _Parameter)
        and a.is_cuda
        and b.is_cuda
        and (out is None or ((type(out) is _Tensor or type(out) is _Parameter) and out.is_cuda))
    )


def _only_device_contexts() -> bool:
    # torch.set_default_device and `with torch.device(...)` push a DeviceContext, which only
    # fills in factory functions' device; the core passes devices explicitly
    return all(
        type(torch._C._get_function_stack_at(i)) is DeviceContext
        for i in range(torch._C._len_torch_function_stack())
    )


def _no_modes() -> bool:
    """Nothing that must see the op: no dispatch mode (FakeTensorMode, FlopCounterMode, make_fx,
    user modes), no __torch_function__ mode, no functorch transform (vmap, grad, functionalize),
    no forward-mode AD level."""
    return (
        _dispatch_modes() == 0
        and not _functorch_active()
        and _forward_ad._current_level < 0
        and (not _function_mode_enabled() or _only_device_contexts())
    )


def forward_differentiated(*tensors) -> str | None:
    """What differentiates this call in a way the registered ops' formulas do not cover: a
    tangent on one of ``tensors`` at ``torch.autograd.forward_ad``'s current level
    ("forward-mode AD"), or functorch's grad or jvp transform ("torch.func.grad",
    "torch.func.jvp"; their autograd.Function support needs formulas the ops lack). None
    otherwise, in a few hundred nanoseconds where neither is active. (vmap has a batching
    rule; functionalize needs none.)"""
    if _functorch_active():  # (first: torch.func.jvp sets a dual level too)
        for interpreter in _functorch_interpreters():
            if interpreter.key() == _TransformType.Grad:
                return "torch.func.grad"
            if interpreter.key() == _TransformType.Jvp:
                return "torch.func.jvp"
        if _forward_ad._current_level >= 0:
            # vmap inside a dual level: a batched tensor's tangent cannot be read (no batching
            # rule for it); torch's ops are right whether it has one or not
            return "forward-mode AD"
        return None
    if _forward_ad._current_level >= 0:
        for t in tensors:
            if isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
                return "forward-mode AD"
    return None


def refuse_forward_differentiation(op: str, *tensors) -> None:
    """NotImplementedError where ``forward_differentiated`` names something: the registered
    op's autograd formula is reverse-mode only, and torch would drop the tangent silently."""
    how = forward_differentiated(*tensors)
    if how is not None:
        raise NotImplementedError(
            f"{op} has no {how} formula (its autograd formula is reverse-mode only); "
            "differentiate wsgemm.matmul or wsgemm.linear, which run torch's own ops there, "
            "or use reverse-mode autograd (loss.backward(), torch.autograd.grad)"
        )


def _shadow(t):
    """A meta tensor of ``t``'s shape and dtype (a functorch wrapper has no strides to copy):
    what the fake implementation's checks read."""
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def _composite(a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha, beta):
    """``matmul``'s whole formula as torch's own differentiable ops, for a call that forward-mode
    AD or functorch's grad / jvp differentiates (``forward_differentiated``): every transform
    then has torch's formulas. Checked as the op checks it (the fake implementation's checks,
    on the operands' shapes and dtypes, and the devices; CUDA autocast casts as on the other
    roads), then the product of the operands widened to fp32 (fp64 ones stay fp64;
    ``accumulate`` fp16 too: the exact sum), ``alpha``, ``beta · c``, the bias and the
    activation in that precision, rounded once to the result's dtype."""
    check_kinds(a, b, out, out_dtype, accumulate, backend)
    if _any_autocast() and torch.is_autocast_enabled("cuda") and out is None:
        a, b, bias, c = _autocast(a, b, bias, c, out_dtype)  # as the op's autocast casts
    check_devices(a, b, out, ("cuda", "cpu") if backend == "auto" else ("cuda",))
    _check_fake(_shadow(a), _shadow(b), _shadow(out), out_dtype, accumulate, backend,
                _shadow(bias), activation, _shadow(c), alpha, beta)  # fmt: skip
    act = check_activation(activation)
    wide = wide_dtype(a.dtype)  # (fp64 stays fp64, as torch's)
    with torch.autocast("cuda", enabled=False):  # the product in ``wide``, not recast
        y = _combined(torch.matmul(a.to(wide), b.to(wide)), act, alpha, c, beta, bias)
    if out is None:
        return y.to(out_dtype or a.dtype)
    _refuse_grad(a, b, out, bias, c)
    return out.copy_(y)


def matmul(
    a,
    b,
    *,
    bias=None,
    activation=None,
    out=None,
    out_dtype=None,
    accumulate=torch.float32,
    backend="auto",
    c=None,
    alpha=1.0,
    beta=1.0,
    exact=False,
):
    """``a @ b`` on the tensor cores, with ``torch.matmul``'s meaning; with ``bias`` or
    ``activation``, ``activation(a @ b + bias)`` with the epilogue fused into the kernel; with
    ``c`` or ``alpha``, ``activation(alpha · a @ b + beta · c + bias)`` (torch.addmm's
    ``beta · input + alpha · (mat1 @ mat2)``, then the bias and the activation).

    Args:
        a: (..., M, K) or (K,), float16 or bfloat16, CUDA, any strides.
        b: (..., K, N) or (K,), same dtype and device as ``a``. Batch dimensions broadcast as in
            torch.matmul; a 1-D operand is a row (``a``) or column (``b``) dropped from the
            result. Batches are folded into one kernel batch as views where the strides allow.
        out: optional output written in place, of exactly the result's shape; must not overlap
            ``a`` or ``b``. Refused (RuntimeError) when autograd would need it, as in torch.
        out_dtype: float16, bfloat16 or float32; default the input dtype (or ``out.dtype``).
        accumulate: torch.float32 (default, as cuBLAS) or torch.float16 (fp16 inputs only).
        backend: "auto" (the best kernel for the GPU and shape) or one of ``wsgemm.host.BACKENDS``.
        bias: optional, the inputs' dtype, added to the product: it broadcasts against the
            result as in ``a @ b + bias`` but varies along one dimension only, the same for
            every batch: one value per column ((N,), (1, N), ()) or per row ((M, 1)).
        activation: None, "relu", "relu2" (relu squared), "gelu" (erf form, torch's default),
            "gelu_tanh" (torch's ``approximate="tanh"``) or "silu", applied after the bias.
            On Hopper both are fused: computed in fp32 on the accumulators before the output
            conversion (``explain`` says where they run). When autograd needs the result's
            gradient, the activation runs as torch's own op on the bias-fused product instead
            (autograd keeps that product, so the backward recomputes nothing).
        c: optional residual of the result's dtype that broadcasts to the result, ``beta · c``
            added before the bias: ``out=c`` (the same tensor) updates it in place, and the
            kernel reads each element of C just before it writes it (no other pass); any other
            ``c`` is copied into the result first. ``beta == 0`` never reads ``c``.
        alpha, beta: real numbers (launch arguments: another value compiles nothing; each
            distinct pair is its own call signature, so keep them fixed in a hot loop).
        exact: with an activation, apply it as torch's own op to the rounded product (the
            call without the activation, on the same route and split): the result equals,
            bit for bit, ``torch_activation(matmul(a, b, bias=..., ...))``, one more pass over
            the output (the fused activation computes in fp32 before one rounding, and its
            SFU forms differ from torch's in the last bits).

    Differentiable (the backward runs on wsgemm's kernels; see docs/torch.md), traceable by
    torch.compile (as ``torch.ops.wsgemm.matmul``), and cast by CUDA autocast like torch.matmul.

    Returns:
        the result, of ``out_dtype`` (``out`` itself when given).
    """
    if exact is not False and not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {type(exact).__name__}")
    if exact and activation is not None:
        act = check_activation(activation)
        kw = dict(bias=bias, out=out, out_dtype=out_dtype, accumulate=accumulate,
                  backend=backend, c=c, alpha=alpha, beta=beta)  # fmt: skip
        if out is None:
            return torch_activation(act, matmul(a, b, **kw))
        return out.copy_(torch_activation(act, matmul(a, b, **kw)))
    if c is not None or alpha != 1.0:  # (beta scales c only: _matmul_scaled checks both)
        return _matmul_scaled(
            a, b, bias, activation, out, out_dtype, accumulate, backend, c, alpha, beta
        )
    # _is_compiling first: dynamo must not trace the other checks
    if (
        not _is_compiling()
        and _plain(a, b, out)
        and (bias is None or ((type(bias) is _Tensor or type(bias) is _Parameter) and bias.is_cuda))
        and _no_modes()
    ):
        if out is not None:
            _refuse_grad(a, b, out, bias)
            return _forward(a, b, out, out_dtype, accumulate, backend, bias, activation)
        if _any_autocast() and torch.is_autocast_enabled("cuda"):
            a, b, bias, _ = _autocast(a, b, bias)
        if _grad_enabled() and (
            a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
        ):
            if activation is None:
                return _Matmul.apply(a, b, out_dtype, accumulate, backend, bias, None)
            pre = _Matmul.apply(a, b, out_dtype, accumulate, backend, bias, None)  # _activated
            return torch_activation(check_activation(activation), pre)
        return _forward(a, b, None, out_dtype, accumulate, backend, bias, activation)
    if not _is_compiling() and forward_differentiated(a, b, bias) is not None:
        return _composite(a, b, out, out_dtype, accumulate, backend, bias, activation, None,
                          1.0, 1.0)  # fmt: skip
    # what torch's dispatcher would refuse with a RuntimeError, refused with our TypeError
    check_kinds(a, b, out, out_dtype, accumulate, backend)
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    check_activation(activation)
    if out is None:
        if _activated(activation, a, b, bias):
            return torch_activation(activation, _MATMUL(a, b, out_dtype, accumulate, backend, bias))
        return _MATMUL(a, b, out_dtype, accumulate, backend, bias, activation)
    _refuse_grad(a, b, out, bias)
    _MATMUL_OUT(a, b, out, out_dtype, accumulate, backend, bias, activation)
    return out


def _matmul_scaled(a, b, bias, activation, out, out_dtype, accumulate, backend, c, alpha, beta):
    """``matmul`` with ``c`` or ``alpha``: the core's fused residual where no gradient is
    needed; with one, the product (``_Matmul``, its own backward) then alpha, ``c``, the bias
    and the activation as torch's ops in fp32, which autograd differentiates (torch's unfused
    path: nothing recomputed)."""
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    if c is not None and not isinstance(c, torch.Tensor):
        raise TypeError(f"c must be a torch.Tensor or None, got {type(c).__name__}")
    plain = all(_plain(t, t) for t in (bias, c) if t is not None)  # as a and b must be
    if not _is_compiling() and _plain(a, b, out) and plain and _no_modes():
        if out is not None:
            _refuse_grad(a, b, out, bias, c)
            return _forward(a, b, out, out_dtype, accumulate, backend, bias, activation,
                            dict(c=c, alpha=alpha, beta=beta))  # fmt: skip
        if _any_autocast() and torch.is_autocast_enabled("cuda"):
            a, b, bias, c = _autocast(a, b, bias, c, out_dtype)
        wants = a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
        if _grad_enabled() and (wants or (c is not None and c.requires_grad)):
            shape = result_shape(a.shape, b.shape)
            dtype = out_dtype or a.dtype
            act = check_epilogue(bias, activation, a.dtype, shape, a.device).activation
            if c is not None:
                check_residual(c, shape, dtype, a.device)
            # the product in fp32 (a 16-bit one could overflow where alpha scales it back;
            # fp64 operands: fp64, not rounded to fp32)
            wide = wide_dtype(a.dtype)
            wide = wide if accumulate == torch.float32 else out_dtype
            product = _Matmul.apply(a, b, wide, accumulate, backend, None, None)
            return _combined(_wide(product), act, alpha, c, beta, bias).to(dtype)
        return _forward(a, b, None, out_dtype, accumulate, backend, bias, activation,
                        dict(c=c, alpha=alpha, beta=beta))  # fmt: skip
    if not _is_compiling() and forward_differentiated(a, b, bias, c) is not None:
        return _composite(a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha,
                          beta)  # fmt: skip
    check_kinds(a, b, out, out_dtype, accumulate, backend)
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    check_activation(activation)
    if out is None:  # the registered op's backward differentiates c and alpha too
        return _MATMUL(a, b, out_dtype, accumulate, backend, bias, activation, c, alpha, beta)
    _refuse_grad(a, b, out, bias, c)
    _MATMUL_OUT(a, b, out, out_dtype, accumulate, backend, bias, activation, c, alpha, beta)
    return out


def _activated(activation, a, b, bias) -> bool:
    """Whether a call with an activation runs it as torch's own op after the (bias-fused)
    product: when autograd will need the pre-activation. Autograd then saves it, as torch's
    unfused path does, and the backward multiplies by the activation's derivative there: no
    product recomputed (the registered op's own backward, for a direct
    ``torch.ops.wsgemm.matmul`` call with an activation, recomputes it). Without a gradient
    (inference) the activation stays fused in the kernel's epilogue."""
    if activation is None or not _grad_enabled():
        return False
    return a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)


def linear(input, weight, bias=None, activation=None, exact=False):
    """``torch.nn.functional.linear`` on wsgemm: ``activation(input @ weight.T + bias)``, the
    bias and activation fused into the kernel's epilogue (``matmul``).

    Args:
        input: (..., in_features), float16 or bfloat16 (or cast by CUDA autocast), CUDA.
        weight: (out_features, in_features) or (in_features,), input's dtype and device.
        bias: optional (out_features,) or 0-D, weight's dtype.
        activation: None or one of ``matmul``'s activations.
        exact: the activation as torch's own op on the rounded product (``matmul``'s).

    Differentiable and traceable like ``matmul``.
    """
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() not in (1, 2):
        raise ValueError(
            f"weight must be 2-D (out_features, in_features) or 1-D, got shape "
            f"{tuple(weight.shape)}"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype != weight.dtype:
            raise TypeError(f"bias has dtype {bias.dtype}, weight {weight.dtype}; they must match")
        if tuple(bias.shape) not in (tuple(weight.shape[:-1]), ()):
            raise ValueError(
                f"bias has shape {tuple(bias.shape)}; weight {tuple(weight.shape)} needs "
                f"{tuple(weight.shape[:-1])} or ()"
            )
    try:
        return matmul(input, weight.t(), bias=bias, activation=activation, exact=exact)
    except (TypeError, ValueError) as error:
        # the product's checks speak of a, b and K: where the input is at fault, say it in
        # linear's words (asked only on failure: nothing added to a call that runs)
        fault = _input_fault(input, weight, str(error))
        if fault is None:
            raise
    raise fault


def _input_fault(input, weight, refusal: str = "") -> Exception | None:
    """What is wrong with ``linear``'s input against ``weight``, in linear's words, if that is
    what the product refused (``refusal``: its words; a device is blamed only where they
    speak of one); None otherwise."""
    if not isinstance(input, torch.Tensor):
        return TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() == 0:  # the product's own words ("at least 1-D") say it
        return None
    if input.shape[-1] != weight.shape[-1]:
        return ValueError(
            f"input has {input.shape[-1]} features (its last dimension, shape "
            f"{tuple(input.shape)}); weight {tuple(weight.shape)} takes in_features="
            f"{weight.shape[-1]}"
        )
    takes = {**AB_DTYPES, **TORCH_AB_DTYPES}  # backend "auto": fp32 and fp64 run torch's
    for name, t in (("input", input), ("weight", weight)):
        if t.dtype not in takes:
            return TypeError(
                f"{name} has dtype {t.dtype}; linear takes {dtype_list(AB_DTYPES)} (and "
                f"{dtype_list(TORCH_AB_DTYPES)}, which run torch's F.linear)"
            )
    if input.dtype != weight.dtype:
        return TypeError(
            f"input is {input.dtype} and weight {weight.dtype}; they must match (or run under "
            "torch.autocast)"
        )
    if "device" not in refusal and "CUDA tensor" not in refusal:
        return None
    if input.device != weight.device:
        return ValueError(
            f"input is on {input.device} and weight on {weight.device}; they must be on one device"
        )
    if input.device.type not in _FAKE_DEVICES:
        return ValueError(
            f"input and weight must be CUDA tensors, got tensors on {input.device} "
            "(wsgemm.nn.Linear runs torch's F.linear there)"
        )
    return None
