"""A plain MLP's training kernels (``down(act(x @ w_up.T + b_up))``: GPT-NeoX's, Phi's,
Falcon's, BERT's): ``act_grad``, the activation's gradient fused into the GEMM that computes it
(its backward), and ``linear_preact``, the up projection storing its pre-activation beside
``h`` (its forward). Both run where ``host.fuses_act_grad`` says so (``DACT_FAMILIES``).

The backward of ``h = act(pre)`` reads ``dh = d_out @ w_down`` and the saved pre-activation and
writes ``dpre = dh · act'(pre)``. torch runs it as a product that writes ``dh``, then an
elementwise kernel that reads ``dh`` and ``pre`` and writes ``dpre``. Fused
(``Epilogue.dact``, ``host.fuses_act_grad``), one GEMM reads each subtile of ``pre`` by TMA
into the epilogue buffer its result is then stored from (the residual's machinery,
``kernels/sm90/residual.py``) and writes only ``dpre``, in fp32 from its accumulators, rounded
once: ``dh`` never reaches memory. It runs the tile the policy picks for the product itself
where that tile is an unsplit one, swap-AB or not (elementwise in ``pre``, the epilogue is its
own transpose: ``dpre^T = (w_down^T dy^T) · act'(pre^T)``, the result and ``pre`` read M-major);
elsewhere (a split tile, another GPU, the kernels switched off, an operand the kernel cannot
address) the product runs on its own, rounded to the dtype, then torch's formula in fp32.
"""

from __future__ import annotations

import torch

from .. import host
from ..host.dispatch import TORCH
from ..host.registry import Epilogue
from ..host.workspace import UNSPLIT_LAUNCH
from . import dispatch
from .epilogue import check_activation, grad_through, kernel_bias, torch_activation
from .gated import GradLaunch
from .plan import _kernel_view
from .validate import check_operands

__all__ = [
    "act_grad", "act_grad_launch", "check_act_grad", "check_linear_preact",
    "linear_preact",
]  # fmt: skip


def check_act_grad(dy, w_down, preact, activation, device_types=("cuda",)) -> str:
    """The kernels' activation name of ``act_grad(dy, w_down, preact, activation)``; raises
    what is wrong and what is allowed."""
    check_operands((("dy", dy), ("w_down", w_down), ("preact", preact)), device_types, dim=2)
    act = check_activation(activation)
    if act == "none":
        raise ValueError("an activation's gradient needs its activation ('gelu', 'silu', ...)")
    if w_down.shape[0] != dy.shape[1] or tuple(preact.shape) != (dy.shape[0], w_down.shape[1]):
        raise ValueError(
            f"dy {tuple(dy.shape)}, w_down {tuple(w_down.shape)} and preact "
            f"{tuple(preact.shape)} must be (M, H), (H, I) (the down projection's weight) and "
            "(M, I) (the saved pre-activation)"
        )
    return act


def act_grad(dy, w_down, preact, activation="gelu", *, dispatcher=None) -> torch.Tensor:
    """``dpre = (dy @ w_down) · act'(preact)`` (M, I) in ``dy``'s dtype: the gradient of ``h =
    act(pre)`` with respect to its saved pre-activation ``preact`` (M, I), where ``dy`` (M, H)
    is the gradient of ``h @ w_down.T`` (``w_down`` (H, I) as ``nn.Linear`` holds it).

    Where a kernel fuses it (``host.fuses_act_grad``: ``Epilogue.dact``) one GEMM computes
    ``dh`` and writes only ``dpre``, in fp32 from its accumulators, rounded once; else ``dh``
    is a product of its own (rounded to the dtype), then ``dh · act'(preact)`` in fp32,
    rounded once (the module docstring)."""
    d = dispatcher or dispatch.default_dispatcher()
    act = check_act_grad(dy, w_down, preact, activation, (d.devices.type,))
    # a negated view's values are not its memory's, which the kernel reads
    dy, w_down, preact = (t.resolve_neg() for t in (dy, w_down, preact))
    m, n = preact.shape
    out = torch.empty(m, n, dtype=dy.dtype, device=dy.device)
    if m == 0 or n == 0:
        return out
    road = _road(d, dy, w_down, preact, out) if dy.shape[1] else "an empty product"
    if isinstance(road, str):
        dh = dispatch.call(d, dy, w_down, None, None, torch.float32, "auto", None)
        return out.copy_(grad_through(act, dh, preact))
    _launch(road, dy, out, act).run(d)
    return out


def _launch(road, dy, out, act: str) -> GradLaunch:
    (a_view, a_major), (b_view, b_major), (c_view, c_in), (backend, config), index = road
    dtypes = (str(dy.dtype)[6:], str(dy.dtype)[6:], "float32")
    return GradLaunch(backend, config, index, dtypes, a_major, b_major,
                         Epilogue(activation=act, dact=True).name, a_view, b_view, c_view, c_in,
                         out)  # fmt: skip


def act_grad_launch(d, dy, w_down, preact, activation="gelu") -> GradLaunch:
    """``act_grad(dy, w_down, preact, activation)``'s dact kernel launch, checked and planned as
    the call plans it, not run (into a new result), for a tool that launches it itself. A
    ValueError where the call runs no dact kernel (the unfused road: it says why)."""
    act = check_act_grad(dy, w_down, preact, activation, (d.devices.type,))
    dy, w_down, preact = (t.resolve_neg() for t in (dy, w_down, preact))
    out = torch.empty(preact.shape, dtype=dy.dtype, device=dy.device)
    road = "an empty problem"
    if preact.numel() and dy.shape[1]:
        road = _road(d, dy, w_down, preact, out)
    if isinstance(road, str):
        raise ValueError(f"this act_grad call runs no dact kernel: {road}")
    return _launch(road, dy, out, act)


def _road(d, dy, w_down, preact, out):
    """(A's view and major, B's view and major, the views of C (``out``) and of the
    pre-activation, (backend, config), device index) where the dact kernel runs ``act_grad``
    into ``out``, else why not (a str)."""
    index = dispatch.device_index(d, dy)
    m, k = dy.shape
    n = w_down.shape[1]
    dtype = str(dy.dtype)[6:]
    route = d.route("auto", index, (m, n, k, None), (dtype, dtype, "float32"), quiet=True)
    config = _config_of(route.backend, route.config)
    why = _refusal(route, config)
    if why is not None:
        return why
    swap = config.swap_ab
    x = _kernel_view(dy.unsqueeze(-1), False, (1, 0))
    if x is None:  # (e.g. a broadcast gradient, out.sum()'s) a copy the kernel reads: M x H
        x = _kernel_view(dy.contiguous().unsqueeze(-1), False, (1, 0))
    w = _kernel_view(w_down.t().unsqueeze(-1), False, (0, 1))  # (I, H): w_down's rows are K
    c, c_in = _c_view(out, swap), _c_view(preact, swap)
    if x is None or w is None or c is None or c_in is None:
        return "an operand is not addressable by the kernel (unit stride, 16-byte strides)"
    # swap-AB: dpre^T = w_down^T dy^T, the weight the kernel's A (I, H), dy its B (M, H)
    (a_view, a_side), (b_view, b_side) = (w, x) if swap else (x, w)
    a_major = "k" if a_side == "cols" else "m"
    b_major = "n" if b_side == "rows" else "k"
    return (a_view, a_major), (b_view, b_major), (c, c_in), (route.backend, route.config), index


def _config_of(backend: str, config):
    """A route's config (None in a route: its backend's shipped one; None for torch's)."""
    if config is not None or backend == TORCH:
        return config
    return host.BACKENDS[backend].config()


def _c_view(t: torch.Tensor, swap: bool) -> torch.Tensor | None:
    """An (M, I) tensor as the kernel's C (the result, or the pre-activation it reads) is laid
    out: (M, I, 1) N-major, or under swap-AB its transpose (I, M, 1) M-major; None where the
    kernel cannot address it."""
    found = _kernel_view((t.t() if swap else t).unsqueeze(-1), False, (0,) if swap else (1,))
    return None if found is None else found[0]


def _refusal(route, config) -> str | None:
    """Why no dact kernel runs on the product's ``route`` (``config`` its config, resolved),
    or None where one does."""
    if route.backend == TORCH:
        return f"the product runs torch.matmul here ({route.reason})"
    if not host.fuses_act_grad(route.backend):
        return "the dact kernels are switched off here (host.registry.DACT_FAMILIES)"
    if route.k_parts != 1 or config.splits_in_kernel:  # a workspace or a cluster split
        return "the product's tile is a split one (a dact epilogue's is unsplit)"
    return None


# ------------------------------------------------------------------------------ the forward


def check_linear_preact(x, weight, activation, device_types=("cuda",), bias=None) -> str:
    """The kernels' activation name of ``linear_preact(x, weight, activation, bias=bias)``;
    raises what is wrong and what is allowed."""
    check_operands((("x", x), ("weight", weight), ("bias", bias)), device_types)
    act = check_activation(activation)
    if act == "none":
        raise ValueError("linear_preact needs an activation ('gelu', 'silu', ...)")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must be (M, K) and "
                         "(I, K) (nn.Linear's weight)")  # fmt: skip
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be ({weight.shape[0]},)")
    return act


def linear_preact(x, weight, activation="gelu", *, bias=None, dispatcher=None):
    """(h, pre): ``pre = x @ weight.T + bias`` and ``h = act(pre)``, both (M, I) in ``x``'s
    dtype, for a backward that reads ``pre`` (``act_grad``). Where the policy's tile for the
    product is a cooperative row tile, unsplit, and the plain MLP's training kernels are on
    (``host.fuses_act_grad``), one kernel writes both from the same accumulators
    (``Epilogue.preact``: ``h`` from the fp32 value, ``pre`` rounded beside it); else the
    product with its bias, then torch's activation on it (torch's MLP)."""
    d = dispatcher or dispatch.default_dispatcher()
    act = check_linear_preact(x, weight, activation, (d.devices.type,), bias)
    x, weight = x.resolve_neg(), weight.resolve_neg()  # the kernel reads their memory
    bias = None if bias is None else bias.resolve_neg()
    m, n = x.shape[0], weight.shape[0]
    h = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pre = torch.empty(m, n, dtype=x.dtype, device=x.device)
    road = "an empty problem"
    if m and n and x.shape[1]:
        road = _preact_road(d, x, weight, h, pre)
    if isinstance(road, str):
        if m and n:
            pre = dispatch.call(d, x, weight.t(), None, None, torch.float32, "auto", None, bias)
        return torch_activation(act, pre), pre
    (a_view, b_view, h_view, pre_view), (backend, config), index = road
    epilogue = Epilogue(bias="none" if bias is None else "col", activation=act, preact=True)
    dtypes = (str(x.dtype)[6:], str(x.dtype)[6:], "float32")
    fn, clusters = d.kernel(backend, index, dtypes, "k", "k", config, epilogue.name)
    vector = None if bias is None else kernel_bias(bias, "col", n, n)
    with d.on_device(index):
        fn(a_view, b_view, h_view, clusters, *UNSPLIT_LAUNCH, vector, None, None, pre_view)
    return h, pre


def _preact_road(d, x, weight, h, pre):
    """((A, B, C and the pre-activation's views), (backend, config), device index) where one
    kernel writes ``linear_preact``'s two results, else why not (a str)."""
    index = dispatch.device_index(d, x)
    dtype = str(x.dtype)[6:]
    m, k = x.shape
    route = d.route("auto", index, (m, weight.shape[0], k, None), (dtype, dtype, "float32"),
                    quiet=True)  # fmt: skip
    config = _config_of(route.backend, route.config)
    why = _refusal(route, config)
    if why is not None:
        return why
    if host.choosing.batch_invariant_requested(d.batch_invariant):
        # the two roads round h differently (from fp32, or from the rounded pre-activation),
        # and which one runs follows the tile, so the rows a call has: a row's bits must not
        return "batch-invariant mode (h's rounding would depend on the call's rows)"
    if config.swap_ab or config.pingpong:
        return "the product's tile is a swap-AB or ping-pong one (a preact output's is cooperative)"
    a = _kernel_view(x.unsqueeze(-1), False, (1,))  # K-major
    b = _kernel_view(weight.unsqueeze(-1), False, (1,))  # (I, K), K-major
    c, p = _c_view(h, False), _c_view(pre, False)
    if a is None or b is None or c is None or p is None:
        return "an operand is not addressable by the kernel (K-major, 16-byte strides)"
    return (a[0], b[0], c, p), (route.backend, route.config), index
