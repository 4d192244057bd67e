"""From a call to a launch, and the fast path for a call signature already seen.

``call`` is ``matmul``'s body. The first call of a signature runs every check (``validate``),
asks the dispatcher for a route (backend, config and split-K count: ``auto`` asks the shape
policy here, once per signature; on Hopper with ``WSGEMM_AUTOTUNE`` the dispatcher times the
candidates through ``_run_candidate``, which launches one on the call's operands; off Hopper it
races its kernel against torch.matmul through it, unless autotuning is set off; where wsgemm
has no kernel, or torch.matmul won, a torch route, which ``fallback`` runs) and a kernel, plans
the kernel views and launches; then it keeps a launcher for the signature in the dispatcher
(unless the route says not to: a default taken under a capture or tracing until a race can
run, ``Route.keep``). A later
call with the same signature reads a handful of tensor attributes, finds the launcher and runs
it: no validation, planning or dispatch in Python: the output allocation and the kernel call at
the tensors' addresses (the kernel is bound to the signature's sizes and strides at its first
call, ``host.compiling.calls``).

The signature is everything ``validate`` and ``plan`` read except where the tensors live: types,
shapes, strides, dtypes, devices, negative-view bits, each data pointer's 16-byte alignment
class, whether grad mode meets a tensor that requires grad, the keyword arguments and the
settings in effect (``wsgemm.config``: a launcher chosen outside a block is never reused inside
it). So a signature that was valid once is valid again, and its plan is the same, but for the
one thing that depends on the pointers themselves: whether ``out`` overlaps ``a`` or ``b``. That
is checked on every call: the address ranges first (two comparisons each), the exact arithmetic
only when they meet.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from .. import host
from ..host.dispatch import TORCH, Route, current_settings
from ..host.registry import EPILOGUE_FAMILIES
from ..host.workspace import bias_launcher, split_launcher
from ..support import VECTOR_BYTES
from . import fallback
from .epilogue import (
    PLAIN,
    apply_in_torch,
    check_residual,
    check_scalar,
    combine_in_torch,
    kernel_bias,
)
from .overlap import overlaps, spans
from .plan import Launch, batched, broadcast_copy_bytes, describe, plan
from .validate import Problem, check_no_overlap, check_static, validate

# launch(a, b, out or None, a's data pointer, b's, out's or None[, bias]): the pointers ``call``
# read, and a fused epilogue's bias (the caller's tensor) when the call has one
Launcher = Callable[..., torch.Tensor]

log = logging.getLogger("wsgemm")


# A kernel's write is invisible to autograd: every out= call says `out` changed, as torch's out=
# ops do, so a graph that saved `out` refuses to backprop through stale values.
_increment_version = torch.autograd.graph.increment_version


def call_scaled(
    d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, c, alpha, beta
) -> torch.Tensor:
    """``matmul(a, b, c=c, alpha=alpha, beta=beta, ...)``: act(alpha · a @ b + beta · c + bias).

    The kernel reads C from the output it is about to write (``Epilogue.residual``): with
    ``c`` the output itself (``out=c``) nothing else moves; any other ``c`` is first copied
    (broadcast) into a new result, one pass over it, which ``explain`` says (and, with ``out``
    given, the result into ``out`` once the call succeeded: a refused or failed call leaves
    ``out`` as it was). ``beta == 0`` never reads ``c``'s values (torch.addmm's rule: its NaNs
    do not propagate) but checks it as torch does. Then ``call`` with the epilogue's flags and
    values, part of the call's signature."""
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    if c is out and out is not None and beta != 0.0:
        # the in-place residual: c's checks are out's, which the call's first validation makes
        # (its signature then keeps a launcher): nothing more per call
        scalars = (alpha, beta, True)
        return call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars)
    road = known = None  # the road's signature, and whether it was seen to read c in place
    if c is not None and beta != 0.0:
        road = _c_road(a, b, c, out, out_dtype, accumulate, backend, config)
        known = d.launchers.get(road) if road is not None else None
        if known and not _overlaps(c, out):
            # this signature's c passed every check and the kernel reads it where it lies
            scalars = (alpha, beta, True)
            return call(
                d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars,
                c,
            )  # fmt: skip
    if c is not None:  # checked as torch checks an addmm's input, beta == 0 or not
        shape = check_static(a, b, out, out_dtype, accumulate, backend, config)
        c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
        _check_c(c, a, shape, c_dtype)
    if c is None or beta == 0.0:  # alpha alone (the signature's first call validates)
        if alpha == 1.0:
            return call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation)
        scalars = (alpha, 0.0, False)
        return call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars)
    scalars = (alpha, beta, True)
    if out is not None and _same_view(c, out):
        return call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars)
    if known is None:  # the signature's first call: the road is decided once, either way
        known = _reads_c(d, a, b, c, out, out_dtype, accumulate, backend, config)
        if road is not None:  # later calls skip the checks above, or _reads_c
            d.remember(road, bool(known), provisional=known is None)
    elif known:  # a c of this signature that overlaps this call's out: the copy's way
        known = False
    if known:  # the kernel reads c itself (``Epilogue.c_tensor``): no copy into the result
        return call(
            d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars, c
        )
    return _c_copied(
        d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars, c,
        shape, c_dtype,
    )  # fmt: skip


def _c_copied(
    d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars, c, shape,
    c_dtype,
) -> torch.Tensor:  # fmt: skip
    """``call_scaled``'s road for a ``c`` the kernel does not read where it lies: copied
    (broadcast) into a new result (``shape``, ``c_dtype``: the checked call's) first, which
    the kernel then reads as the in-place residual; with ``out`` given, the result goes into
    it once the call has succeeded."""
    target = None  # the caller's out, written once the call has succeeded
    if out is not None:
        host = on_the_host(d, a, backend)  # (CPU tensors under auto: checked as CPU ones)
        validate(
            a, b, out, out_dtype, accumulate, backend, config,
            device_type="cpu" if host else d.devices.type, bias=bias, activation=activation,
        )  # fmt: skip
        target = out
    out = torch.empty(shape, dtype=c_dtype, device=a.device)
    out.copy_(c)
    result = call(d, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars)
    if target is None:
        return result
    target.copy_(result)
    _increment_version(target)
    return target


def _c_road(a, b, c, out, out_dtype, accumulate, backend, config) -> tuple | None:
    """The signature under which ``call_scaled`` remembers that a ``c`` passed its checks and
    ``_reads_c``: everything both read but the addresses past their 16-byte alignment (the
    overlap with ``out`` is checked on every call); None for arguments that do not hash."""
    try:
        grad = c.requires_grad and torch.is_grad_enabled()
        at = None
        if out is not None:
            at = (type(out), out.shape, out.stride(), out.dtype, out.device, out.data_ptr() & 15)
        key = (
            "c_road", type(a), a.shape, a.stride(), a.dtype, a.device, a.is_neg(),
            type(b), b.shape, b.stride(), b.dtype, b.device, b.is_neg(),
            type(c), c.shape, c.stride(), c.dtype, c.device, c.is_neg(), c.data_ptr() & 15, grad,
            at, out_dtype, accumulate, backend, config, current_settings(),
        )  # fmt: skip
        hash(key)
        return key
    except Exception:  # not tensors, unhashable arguments: the checks say what is wrong
        return None


def _overlaps(c, out) -> bool:
    """Whether ``c`` shares a byte with ``out`` (``out`` None: no; ``overlap.overlaps``)."""
    return out is not None and overlaps(c, out)


def _reads_c(d, a, b, c, out, out_dtype, accumulate, backend, config) -> bool | None:
    """Whether the route's kernel reads ``c`` (checked: the result's shape and dtype) from its
    own memory rather than from a copy in the result (``Epilogue.c_tensor``): a family that
    does (``host.reads_c_tensor``), ``c`` of the result's shape and the result both dense
    and row-major (so the kernel's view of one is the view of the other: a batch folds the
    same way), rows of whole 16-byte vectors at a 16-byte aligned address (the output's TMA
    view fits C too), and ``c`` apart from ``out`` (a partial overlap would read values a
    store already changed). False for anything else, meta tensors included; None (falsy) where
    the route is a default a race may overturn (``Route.keep`` False: torch.matmul for now)."""
    try:
        return _c_readable(d, a, b, c, out, out_dtype, accumulate, backend, config)
    except Exception:  # not this road: the call's own checks say what is wrong
        return False


def _c_readable(d, a, b, c, out, out_dtype, accumulate, backend, config) -> bool:
    if not c.is_contiguous() or (out is not None and not out.is_contiguous()):
        return False
    width = c.element_size()
    if (c.shape[-1] * width) % VECTOR_BYTES or c.data_ptr() % VECTOR_BYTES:
        return False
    if out is not None and out.data_ptr() % VECTOR_BYTES:
        return False
    if _overlaps(c, out):
        return False
    p = validate(a, b, out, out_dtype, accumulate, backend, config, device_type=d.devices.type)
    if tuple(c.shape) != tuple(p.out_shape) or c.dtype != p.c_dtype:
        return False  # a C that broadcasts goes the copy's way
    problem = (p.m, p.n, p.k, p.batch)
    route = d.route(backend, a.device.index, problem, p.dtype_names, config, quiet=True)
    if not route.keep:
        return None
    return route.backend != TORCH and host.reads_c_tensor(route.backend)


def _check_c(c, a, shape, c_dtype) -> None:
    """``c`` of a residual (``check_residual``), which the core does not differentiate."""
    check_residual(c, shape, c_dtype, a.device)
    if c.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            "wsgemm.api.matmul records no gradients and c requires grad; call wsgemm.matmul "
            "(differentiable) or run under torch.no_grad()"
        )


def _same_view(c, out) -> bool:
    """``c`` is ``out`` itself (the same elements in the same places): an in-place residual."""
    return (
        c.data_ptr() == out.data_ptr() and c.shape == out.shape and c.stride() == out.stride()
        and c.dtype == out.dtype and c.device == out.device
    )  # fmt: skip


def call(
    d, a, b, out, out_dtype, accumulate, backend, config, bias=None, activation=None, scalars=None,
    c=None,
) -> torch.Tensor:  # fmt: skip
    """``matmul(a, b, out=..., ...)`` on dispatcher ``d``; ``scalars``: ``call_scaled``'s
    (alpha, beta, residual), C already in ``out``, or in ``c`` (``_reads_c``: the kernel reads
    it there; part of the signature, and handed to its launcher)."""
    try:
        pa, pb = a.data_ptr(), b.data_ptr()
        if out is None:
            grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
            key = (
                type(a), a.shape, a.stride(), a.dtype, a.device, a.is_neg(), pa & 15,
                type(b), b.shape, b.stride(), b.dtype, b.device, b.is_neg(), pb & 15,
                grad, out_dtype, accumulate, backend, config, current_settings(),
            )  # fmt: skip
        else:
            po = out.data_ptr()
            grad = (
                a.requires_grad or b.requires_grad or out.requires_grad
            ) and torch.is_grad_enabled()
            key = (
                type(a), a.shape, a.stride(), a.dtype, a.device, a.is_neg(), pa & 15,
                type(b), b.shape, b.stride(), b.dtype, b.device, b.is_neg(), pb & 15,
                type(out), out.shape, out.stride(), out.dtype, out.device, out.is_neg(), po & 15,
                grad, out_dtype, accumulate, backend, config, current_settings(),
            )  # fmt: skip
        if bias is not None or activation is not None:
            key += _epilogue_key(bias, activation)
        if scalars is not None:  # alpha and beta are launch arguments, fixed per signature
            key += ("scalars", *scalars)
        if c is not None:  # the kernel reads C's own memory: its layout is the signature's
            key += ("c", type(c), c.shape, c.stride(), c.dtype, c.device, c.data_ptr() & 15)
        hit = d.launchers.get(key)
    except Exception:  # not tensors, sparse or nested ones, unhashable arguments, ...
        key = hit = None  # validate says what is wrong
    if hit is None:
        return _first_call(
            d, key, a, b, out, out_dtype, accumulate, backend, config, bias, activation, scalars,
            c,
        )  # fmt: skip
    launch, ranges = hit
    if c is not None:  # its signature's launchers take C
        launch = functools.partial(launch, c=c)
    if out is None:
        return launch(a, b, None, pa, pb, None, bias)
    ext_o, ext_a, ext_b, ext_bias = ranges
    if (po < pa + ext_a and pa < po + ext_o) or (po < pb + ext_b and pb < po + ext_o):
        check_no_overlap(out, a, b)
    if bias is not None:  # a bias's range, checked as a and b's are
        pz = bias.data_ptr()
        if po < pz + ext_bias and pz < po + ext_o:
            check_no_overlap(out, a, b, bias)
    launch(a, b, out, pa, pb, po, bias)
    _increment_version(out)
    return out


def _epilogue_key(bias, activation) -> tuple:
    """What a fused epilogue adds to a call's signature: the activation and the bias's
    metadata, with whether grad mode meets it requiring grad (which the core refuses)."""
    if bias is None:
        return (activation, None)
    grad = bias.requires_grad and torch.is_grad_enabled()
    return (activation, type(bias), bias.shape, bias.stride(), bias.dtype, bias.device,
            bias.is_neg(), grad)  # fmt: skip


def _first_call(
    d, key, a, b, out, out_dtype, accumulate, backend, config, bias=None, activation=None,
    scalars=None, c=None,
) -> torch.Tensor:  # fmt: skip
    host_tensors = on_the_host(d, a, backend)
    p = validate(
        a, b, out, out_dtype, accumulate, backend, config,
        device_type="cpu" if host_tensors else d.devices.type, bias=bias,
        activation=activation, scalars=scalars, c_tensor=c is not None,
    )  # fmt: skip
    if host_tensors:  # backend="auto" on CPU tensors: torch's matmul runs it (api.fallback)
        if c is not None:  # the residual's C into the result first, as a route without it
            return _c_copied(d, a, b, out, out_dtype, accumulate, backend, config, bias,
                             activation, scalars, c, p.out_shape, p.c_dtype)  # fmt: skip
        return fallback.first_call(d, key, a, b, out, p, CPU_REASON, bias)
    # a call with alpha or a residual is not raced: its candidates would read and write C
    eager = _may_tune(a)
    run = functools.partial(_run_candidate, d, a, b, p, bias) if eager and scalars is None else None
    route = d.route(
        backend, a.device.index, (p.m, p.n, p.k, p.batch), p.dtype_names, config, run=run,
        mufu=_mufu(p),
    )  # fmt: skip
    # a default taken under a capture or tracing keeps no launcher: the next eager call asks
    # again (and may race). An eager call that could not race (alpha, a residual; a race whose
    # two sides both failed) keeps a provisional one, dropped when a race of the bucket stores
    # a decision (asking again on every call would cost the whole first call every time)
    provisional = not route.keep
    if provisional and not eager:
        key = None
    if route.backend == TORCH or (c is not None and not host.reads_c_tensor(route.backend)):
        # (``_reads_c`` chose this road for the route it saw: a route decided otherwise since
        # takes the call through the copy of C, unremembered)
        if c is not None:
            return _c_copied(d, a, b, out, out_dtype, accumulate, backend, config, bias,
                             activation, scalars, c, p.out_shape, p.c_dtype)  # fmt: skip
        return fallback.first_call(d, key, a, b, out, p, route.reason, bias, provisional)
    result, planned = _launch(d, a, b, out, p, route, bias, c)
    if planned is None and log.isEnabledFor(logging.INFO):
        # once per signature: a copy on every call is a cost the caller can often remove
        said = _operands(d, a, b, out, p, route)
        if "copied" in said or "one launch per batch" in said:
            log.info("M=%d N=%d K=%d: %s", p.m, p.n, p.k, said)
    if out is not None:
        _increment_version(out)
    if key is not None:
        direct = (
            _direct_launcher(d, planned, p, a.device, out is None, (a, b, result), bias, c)
            if planned
            else None
        )
        fuses = host.fuses_epilogues(route.backend, scalars=p.epilogue.scalars)
        if direct is not None and not p.epilogue.plain and not fuses:
            direct = _then_epilogue(direct, p)
        d.remember(key, (direct or _general_launcher(d, p, route), spans(out, a, b, bias)))
    return result


#: Why ``backend="auto"`` runs torch's matmul on CPU tensors (``explain`` and the INFO line)
CPU_REASON = "CPU tensors (wsgemm's kernels run on CUDA GPUs)"


def on_the_host(d, a, backend) -> bool:
    """Whether this call is ``backend="auto"`` on CPU tensors where the dispatcher's devices are
    CUDA GPUs: torch's matmul runs it (issue #27: a device wsgemm does not take falls back
    under ``auto``; a named backend raises)."""
    return (
        backend == "auto" and isinstance(a, torch.Tensor) and a.device.type == "cpu"
        and d.devices.type == "cuda"
    )  # fmt: skip


def _mufu(p: Problem) -> int:
    """The MUFU instructions per element of ``p``'s fused activation, which the policy prices
    (``choosing.with_epilogue``)."""
    return host.EPILOGUE_MUFU.get(p.epilogue.activation, 0)


def _may_tune(t: torch.Tensor) -> bool:
    """Not while a CUDA graph is captured (timing synchronizes and allocates), under
    torch.compile's tracing, or on fake tensors."""
    if isinstance(t, torch._subclasses.fake_tensor.FakeTensor) or torch.compiler.is_compiling():
        return False
    return t.device.type != "cuda" or not torch.cuda.is_current_stream_capturing()


def _run_candidate(d, a, b, p: Problem, bias, route: Route) -> Callable[[], object]:
    """The dispatcher's ``run`` for its tuner and its race (``host.dispatch.Runner``): launch
    ``route`` once on this call's operands, into a scratch output (never the caller's), which
    compiles and plans it; return what is timed, what a later call of the signature runs: its
    kernel alone on the planned views when the call was one launch on views (then torch's
    epilogue where the kernel does not fuse it), else the whole planned call. A torch route
    (raced against a kernel no table measured): the torch route's call, epilogue included."""
    if route.backend == TORCH:
        fallback.run(a, b, None, p, bias)
        return functools.partial(fallback.run, a, b, None, p, bias)
    scratch = torch.empty(p.out_shape, dtype=p.c_dtype, device=a.device)
    _, planned = _launch(d, a, b, scratch, p, route, bias)
    if planned is None:
        return functools.partial(_launch, d, a, b, scratch, p, route, bias)
    launch, fn, clusters, _, late = planned
    kernel = functools.partial(fn, launch.a, launch.b, launch.c, clusters, *late)
    if p.epilogue.plain or host.fuses_epilogues(route.backend, scalars=p.epilogue.scalars):
        return kernel

    def kernel_then_epilogue():
        kernel()
        return apply_in_torch(scratch, bias, p.epilogue)  # in place, as a later call's

    return kernel_then_epilogue


def explain(
    d, a, b, out, out_dtype, accumulate, backend, bias=None, activation=None, c=None, alpha=1.0,
    beta=1.0,
) -> str:  # fmt: skip
    """``wsgemm.api.explain``'s body: validate as ``call`` does, then the dispatcher's account
    of the route, the epilogue and what the call does with each operand (``plan.describe``).
    Compiles, allocates and launches nothing."""
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    residual = c is not None and beta != 0.0
    scalars = (alpha, beta if residual else 0.0, residual) if residual or alpha != 1.0 else None
    where = None
    if c is not None:
        shape = check_static(a, b, out, out_dtype, accumulate, backend)
        _check_c(c, a, shape, out.dtype if out is not None else (out_dtype or a.dtype))
    if residual:
        same = out is not None and _same_view(c, out)
        if same:
            where = "c: out itself (an in-place residual: read by the kernel, no other pass)\n"
        elif _reads_c(d, a, b, c, out, out_dtype, accumulate, backend, None):
            where = "c: read by the kernel where it lies (no copy, no other pass)\n"
        else:
            where = ("c: copied into a new result first (one pass over it; then the result "
                     "into out, if given); pass out=c for an in-place residual, or a dense "
                     "row-major c of the result's shape on a family that reads it "
                     "(host.registry.C_TENSOR_FAMILIES)\n")  # fmt: skip
    host_tensors = on_the_host(d, a, backend)
    p = validate(
        a, b, out, out_dtype, accumulate, backend, None,
        device_type="cpu" if host_tensors else d.devices.type, bias=bias,
        activation=activation, scalars=scalars,
    )  # fmt: skip
    if host_tensors:
        return (f"M={p.m} N={p.n} K={p.k} batch={p.batch} on the CPU\nbackend: torch.matmul "
                f"(fallback): {CPU_REASON}\n{fallback.describe_operands()}")  # fmt: skip
    problem = (p.m, p.n, p.k, p.batch)
    mufu = _mufu(p)  # (its own tuned bucket and race, and the policy's move for it)
    text = d.explain(backend, a.device.index, problem, p.dtype_names, mufu)
    route = d.route(backend, a.device.index, problem, p.dtype_names, quiet=True, mufu=mufu)
    epilogue = _epilogue_line(p, route) + (where or "")
    fused = route.backend != TORCH and host.fuses_epilogues(route.backend,
                                                            scalars=p.epilogue.scalars)  # fmt: skip
    if route.for_epilogue(p.epilogue if fused else PLAIN) is not route:
        epilogue += (f"split: with this epilogue the {route.k_parts} parts go through the "
                     "workspace, not over a cluster (its cluster split form does not exist, "
                     "or host.registry.CLUSTER_SPLIT_EPILOGUE_FAMILIES is off)\n")  # fmt: skip
    if route.backend == TORCH:
        return f"{text}\n{epilogue}{fallback.describe_operands()}"
    return f"{text}\n{epilogue}{_operands(d, a, b, out, p, route)}"


def _epilogue_line(p: Problem, route: Route) -> str:
    """``explain``'s epilogue line ("" for a plain call)."""
    e = p.epilogue
    if e.plain:
        return ""
    what = " then ".join(
        part
        for part in (
            f"alpha = {p.alpha:g} times the product" if e.scale else None,
            f"plus beta = {p.beta:g} times C" if e.residual else None,
            {"col": "a bias per column", "row": "a bias per row"}.get(e.bias),
            None if e.activation == "none" else e.activation,
        )
        if part
    )
    if route.backend != TORCH and host.fuses_epilogues(route.backend, scalars=e.scalars):
        swap = bool(getattr(route.config, "swap_ab", False))
        how = "fused: computed in fp32 on the accumulators before the output conversion"
        if e.residual:
            how += " (C read by the kernel, subtile by subtile, before it stores the subtile)"
        if swap and e.bias != "none":
            how += " (swap-AB: the kernel's row bias)"
    else:
        gate = "RESIDUAL_FAMILIES" if e.scalars else "FUSING_FAMILIES"
        why = (
            "'s fused kernels are built but not yet switched on (they await their first GPU "
            f"check: host.registry.{gate})"
            if route.backend != TORCH and host.BACKENDS[route.backend].family in EPILOGUE_FAMILIES
            else " has no fused epilogue"
        )
        how = f"not fused: {route.backend}{why}; " + (
            "torch combines the product with it in fp32 and rounds once (more passes over "
            "the output)"
            if e.scalars
            else "torch applies it after the product, in the output's dtype (its unfused "
            "path: one more pass over the output)"
        )
    return f"epilogue: {what}, {how}\n"


def _operands(d, a, b, out, p: Problem, route: Route) -> str:
    """``explain``'s operands line: as ``_launch`` and ``kernel_views`` would plan the call (on
    the route's kernel: a tuned or raced first call may time others and run one)."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    if any(isinstance(t, fake) for t in (a, b, out)):
        return "operands: not known for fake tensors (whether one is copied depends on its address)"
    if out is None:  # as _launch allocates it (its address aligned, as the allocator's)
        out = torch.empty(p.out_shape, dtype=p.c_dtype, device="meta")
    if out.numel() == 0:
        return "operands: none (the result is empty)"
    if p.k == 0:
        return "operands: none read (K = 0: the result is zeros)"
    a3, b3, out3 = batched(a, b, out)
    if broadcast_copy_bytes(a3, b3, out3) > d.max_broadcast_copy_bytes:
        return (
            "operands: a broadcast operand would take more than "
            f"{d.max_broadcast_copy_bytes >> 20} MiB of copies: one launch per batch"
        )
    a3, b3, out3, need_extent, swap = _kernel_problem(a3, b3, out3, route)
    return describe(a3, b3, out3, need_extent, c_major="m" if swap else "n", swap=swap)


def run(
    d, a, b, out, problem: Problem, backend: str, config: Any = None, split: int = 1, bias=None
) -> torch.Tensor:
    """Launch a validated call on a chosen backend (and split), planning it from scratch: what
    every call of a signature does when its operands need copies (and what the CPU tests
    drive)."""
    return _launch(d, a, b, out, problem, Route(backend, config, split), bias)[0]


def _general_launcher(d, p: Problem, route: Route) -> Launcher:
    return lambda a, b, out, pa, pb, po, bias=None, c=None: _launch(
        d, a, b, out, p, route, bias, c
    )[0]


def _launch(d, a, b, out, p: Problem, route: Route, bias=None, c=None):
    """Plan and launch one call; returns (the result, (the ``Launch``, kernel, clusters, swap,
    the kernel's late launch arguments) when it was one launch on views of the caller's
    tensors, else None). A split route's kernel is the split variant with its workspace and
    semaphores bound (``host.workspace.split_launcher``): it writes C itself, as any kernel.
    A fused epilogue (``p.epilogue``) runs in the kernel where the route's family fuses, its
    bias the kernel's last launch argument; elsewhere torch applies it afterwards. ``c``: a
    residual's C where the kernel reads it (``Epilogue.c_tensor``; copied into ``out`` first
    wherever this call cannot)."""
    if out is None:
        out = torch.empty(p.out_shape, dtype=p.c_dtype, device=a.device)
    if out.numel() == 0:
        return out, None
    epi = p.epilogue
    if c is not None and (p.k == 0 or not host.fuses_epilogues(route.backend, scalars=True)):
        out, p, c = _c_into_out(out, p, c)
        epi = p.epilogue
    if p.k == 0:
        if epi.scalars:
            return combine_in_torch(out, None, bias, p), None
        return apply_in_torch(out.zero_(), bias, epi), None
    fused = not epi.plain and host.fuses_epilogues(route.backend, scalars=epi.scalars)
    if epi.scalars and not fused:  # the product, then alpha, C and the rest in torch
        # in fp32 (unless the product accumulates in fp16): a product rounded to a 16-bit
        # output first could overflow where alpha scales it back into range
        wide = torch.float32 if p.acc_dtype == torch.float32 else p.c_dtype
        plain = dataclasses.replace(p, epilogue=PLAIN, alpha=1.0, beta=0.0, c_dtype=wide)
        return combine_in_torch(out, _launch(d, a, b, None, plain, route)[0], bias, p), None
    a3, b3, out3 = batched(a, b, out)
    if c is not None and broadcast_copy_bytes(a3, b3, out3) > d.max_broadcast_copy_bytes:
        out, p, c = _c_into_out(out, p, c)  # one launch per batch below: C through out
        epi = p.epilogue
        a3, b3, out3 = batched(a, b, out)
    if broadcast_copy_bytes(a3, b3, out3) > d.max_broadcast_copy_bytes:
        one = dataclasses.replace(p, batch=None)
        for l_ in range(out3.shape[0]):
            _launch(d, a3[l_ % a3.shape[0]], b3[l_ % b3.shape[0]], out3[l_], one, route, bias)
        return out, None
    rows = out3.shape[1]  # the caller's rows per launch (a batch folded into M: L * M)
    launch, swap = kernel_views(a3, b3, out3, route)
    c_view = None
    if c is not None:
        c_view = _c_view(c, out, launch)
        if c_view is None:  # C's kernel view is not out's: C goes through out
            out, p, c = _c_into_out(out, p, c)
            epi = p.epilogue
    index = a.device.index
    kernel_epi = (epi.swapped() if swap else epi) if fused else PLAIN
    route = route.for_epilogue(kernel_epi)  # (a cluster split's ways may go the workspace's way)
    fn, clusters = d.kernel(
        route.backend, index, p.dtype_names, launch.a_major, launch.b_major, route.config,
        kernel_epi.name,
    )  # fmt: skip
    late = ()
    if kernel_epi.bias != "none" or kernel_epi.scalars:  # (bias, alpha, beta, C): Sm90Gemm's
        vector = None
        if kernel_epi.bias != "none":
            vector = kernel_bias(bias, epi.bias, p.m if epi.bias == "row" else p.n, rows)
        late = (vector, *((p.alpha, p.beta) if kernel_epi.scalars else (None, None)), c_view)
    if kernel_epi.residual and launch.copy_back is not None:
        # the kernel writes a temporary C: it must hold C's values, which it reads first
        launch.c[:, : launch.copy_back.shape[1]].copy_(launch.copy_back)
    if getattr(route.config, "splits_in_kernel", False):  # split-K or stream-K: its buffers
        fn = split_launcher(fn, route.config, route.split, d.semaphores)
    elif late:
        fn = bias_launcher(fn)
    L = launch.c.shape[2]
    with d.on_device(index):
        if L <= d.max_batch_per_launch:
            fn(launch.a, launch.b, launch.c, clusters, *late)
        else:
            for l0 in range(0, L, d.max_batch_per_launch):
                batch = slice(l0, l0 + d.max_batch_per_launch)
                part = late if c_view is None else (*late[:3], c_view[:, :, batch])
                fn(launch.a[:, :, batch], launch.b[:, :, batch], launch.c[:, :, batch], clusters,
                   *part)  # fmt: skip
        launch.finish()
    if not epi.plain and not fused:
        apply_in_torch(out, bias, epi)  # the launcher kept for the signature does it too
    single = launch.direct and L <= d.max_batch_per_launch
    return out, (launch, fn, clusters, swap, late) if single else None


def _c_into_out(out, p: Problem, c):
    """``_launch``'s way back for a ``c`` the kernel cannot read where it lies: its values
    into ``out`` (which the in-place residual then reads), the problem without ``c_tensor``."""
    out.copy_(c)
    epilogue = dataclasses.replace(p.epilogue, c_tensor=False)
    return out, dataclasses.replace(p, epilogue=epilogue), None


def _c_view(c, out, launch: Launch):
    """``c``'s view as the kernel's C, the one ``launch`` made of ``out`` (the same shape and
    strides: ``_reads_c`` took both dense and row-major), or None where the kernel's C is not a
    view of ``out`` itself (a temporary) or has a batch mode of more than one (tokens x weight
    calls fold theirs into M; the kernel's own batch mode awaits its first GPU run with C)."""
    k = launch.c
    same = launch.copy_back is None and k.untyped_storage().data_ptr() == (
        out.untyped_storage().data_ptr()
    )
    if not same or k.storage_offset() != out.storage_offset():
        return None
    if k.shape[2] != 1:  # a batch the kernel walks (not folded into M): not GPU-tested yet
        return None
    return c.as_strided(k.shape, k.stride(), c.storage_offset())


def kernel_views(a3, b3, out3, route: Route) -> tuple[Launch, bool]:
    """(the kernel's views of ``batched`` operands for ``route``, whether A and B swapped)."""
    a3, b3, out3, need_extent, swap = _kernel_problem(a3, b3, out3, route)
    return plan(a3, b3, out3, need_extent, c_major="m" if swap else "n"), swap


def _kernel_problem(a3, b3, out3, route: Route):
    """The (A, B, C) views the route's kernel takes, whether its loads need whole vectors
    (cp.async), and whether A and B swapped: under swap-AB (``config.swap_ab``) the kernel runs
    the transposed problem C^T (N, M) = B^T A^T and writes the caller's C M-major."""
    swap = bool(getattr(route.config, "swap_ab", False))
    if swap:
        a3, b3, out3 = b3.transpose(1, 2), a3.transpose(1, 2), out3.transpose(1, 2)
    return a3, b3, out3, host.needs_vector_extent(route.backend), swap


def _direct_launcher(
    d,
    planned: tuple[Launch, Callable, int, bool, tuple],
    p: Problem,
    device: torch.device,
    allocate: bool,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    bias=None,
    c=None,
) -> Launcher | None:
    """A launcher that runs the kernel of ``planned`` (a ``Launch`` made for this signature) on
    a later call's tensors: views of the same sizes and strides at their addresses, so the
    kernel (a ``KernelCall`` or the split launcher) is bound to the views once and then
    given the addresses ``call`` read. Under swap-AB the kernel's A is the caller's B and
    its B the caller's A. None where the kernel has no ``bind`` (the tests' stand-ins) or the
    views do not sit at the caller's tensors' addresses: the signature then re-plans. ``c``:
    the call's residual C where its kernel reads it (the launcher then takes one per call)."""
    launch, fn, clusters, swap, late = planned
    bind = getattr(fn, "bind", None)
    views = (launch.b, launch.a) if swap else (launch.a, launch.b)
    at_callers = tuple(v.data_ptr() for v in (*views, launch.c)) == tuple(
        t.data_ptr() for t in tensors
    )
    if bind is None or not at_callers:
        return None
    at = bind(launch.a, launch.b, launch.c, clusters, late=len(late))
    if at is None:
        return None
    index = device.index
    shape, dtype = p.out_shape, p.c_dtype
    if late:
        if (late[3] is None) != (c is None):  # C went through out after all: re-plan
            return None
        return _fused_launcher(d, at, p, device, swap, bias, late)
    if allocate:

        def launcher(a, b, out, pa, pb, po, bias=None):
            # sizes as arguments, not a tuple: torch parses them faster (perf.md, entry 12)
            out = torch.empty(*shape, dtype=dtype, device=device)  # the allocator aligns it
            if swap:  # the kernel's A is the caller's B, its B the caller's A
                pa, pb = pb, pa
            at(pa, pb, out.data_ptr())
            return out

    else:

        def launcher(a, b, out, pa, pb, po, bias=None):
            if swap:
                pa, pb = pb, pa
            at(pa, pb, po)
            return out

    return on_its_device(d, index, launcher)


def _then_epilogue(launcher: Launcher, p: Problem) -> Launcher:
    """``launcher`` (the plain kernel's) followed by torch's epilogue (``apply_in_torch``): a
    signature whose epilogue the route's kernel does not fuse keeps the direct launch."""
    epi = p.epilogue

    def launch_then_epilogue(a, b, out, pa, pb, po, bias=None):
        return apply_in_torch(launcher(a, b, out, pa, pb, po), bias, epi)

    return launch_then_epilogue


def on_its_device(d, index, launcher: Callable) -> Callable:
    """``launcher`` (any kept launcher: ``matmul``'s, ``grouped_mm``'s, ``gated_linear``'s),
    run with ``index`` the current device where the machine has several."""
    if d.devices.count() == 1:
        return launcher

    def on_its_device(*args, **kwargs):
        with d.on_device(index):
            return launcher(*args, **kwargs)

    return on_its_device


def tensor_signature(t) -> tuple:
    """What a kept launcher's key holds of tensor ``t`` (None: ``(None,)``): everything the
    checks and the views read, none of the data (the address only to its 16-byte phase).
    ``call`` spells the same out inline for ``matmul``'s two or three operands."""
    if t is None:
        return (None,)
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.is_neg(), t.data_ptr() & 15)


def _fused_launcher(d, at, p: Problem, device, swap: bool, bias, late):
    """The direct launcher of a call with a fused bias, alpha or residual: ``at`` (bound with
    the epilogue's four launch arguments late: bias, alpha, beta, C) given, per call, the
    kernel's view of the call's C where the kernel reads its own (``late[3]``, the first
    call's, fixing the view's shape and strides), and the
    kernel's vector of the call's bias (the bias itself when the first call's already was one:
    a flat contiguous vector, the signature fixing its strides; else a vector made as the
    first call's was, ``kernel_bias``) and the signature's alpha and beta (``late``'s)."""
    epi = p.epilogue
    length = p.m if epi.bias == "row" else p.n
    first_vector, scalars, first_c = late[0], late[1:3], late[3]
    if first_c is not None:  # the kernel's view of each call's C: the first call's shape
        c_shape, c_stride = first_c.shape, first_c.stride()
    if first_vector is not None:
        rows = first_vector.numel()  # a row bias of a batch folded into M: repeated per batch
        as_is = bias.dim() == 1 and bias.stride(0) == 1 and bias.numel() == rows
    shape, dtype = p.out_shape, p.c_dtype

    def launcher(a, b, out, pa, pb, po, bias=None, c=None):
        vector = c_view = None
        if first_vector is not None:
            vector = bias if as_is else kernel_bias(bias, epi.bias, length, rows)
        if first_c is not None:
            c_view = c.as_strided(c_shape, c_stride, c.storage_offset())
        if out is None:
            out = torch.empty(*shape, dtype=dtype, device=device)  # the allocator aligns it
            po = out.data_ptr()
        if swap:  # the kernel's A is the caller's B, its B the caller's A
            pa, pb = pb, pa
        at(pa, pb, po, vector, *scalars, c_view)
        return out

    return on_its_device(d, device.index, launcher)


def default_dispatcher():
    """The process's dispatcher (``host.dispatch.DISPATCHER``, read at each call: a stand-in
    put there is the one used), for the entry points that take ``dispatcher=None``."""
    from ..host import dispatch as host_dispatch

    return host_dispatch.DISPATCHER


def device_index(d, t: torch.Tensor) -> int:
    """Dispatcher ``d``'s index of ``t``'s device (a device without one: the current)."""
    return d.device_index(t.device) or 0
