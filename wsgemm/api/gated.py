"""``gated_linear``: a gated linear unit, ``act(x @ w_gate.T) * (x @ w_up.T)``, with the two
projections in one weight ``[w_gate; w_up]`` (2I, K) (a SwiGLU MLP's ``gate_up_proj``).

On the fused road one kernel computes the (M, 2I) product and writes only the (M, I) result:
B's two halves load into the two halves of each stage, and the epilogue multiplies
``act(gate)`` by ``up`` in fp32 (``kernels/sm90``, ``Epilogue.gated``), a bias ``[b_gate;
b_up]`` added to each half first (``GATED_BIAS_FAMILIES``). The unfused road, where no kernel
fuses (another GPU, CPU tensors, a weight the kernel cannot read K-major, gated kernels switched
off: ``host.fuses_epilogues(..., gated=True)``), is torch's: the (M, 2I) product, then
``act(gate) * up`` in fp32, rounded once to the result's dtype. Calls take it too where the
cost model predicts it faster (``Dispatcher.gated_unfused``): the gated kernel has two row
tiles, each spanning 256 rows a cluster and unsplit, so at a few dozen rows most of their MMA
work is empty (and on a narrow 2I few CTAs run), while ``auto``'s product has the whole menu
and the gating pass over M x 2I values is small beside reading the weights (docs/perf.md entry
73: timed at 32-16384 tokens on two models; elsewhere the model's extrapolation). At up to 32
rows an unbiased call (a biased one where ``host.runs_gated_swap_bias``) has a third tile, the
gated swap-AB decode tile (``gated_config(rows,
swap=True)``, ``host.runs_gated_swap``): the weights' gate and up rows the two 64-row bands of
a ping-pong 128-row tile, the tokens its N, the (64, tokens) result stored transposed; the cost
model prices it against the unfused road too (``choosing.gated_roads``' ``swap_tile_n``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .. import host
from ..host.dispatch import current_settings
from ..host.registry import Epilogue
from ..host.workspace import UNSPLIT_LAUNCH
from ..support import dtype_name
from . import dispatch
from .epilogue import check_activation, gated_unit_grad, kernel_bias, torch_activation
from .plan import _kernel_view
from .validate import check_operands

__all__ = [
    "GradLaunch", "check_gated", "check_gated_grad", "dgated_tile", "explain", "gated_config",
    "gated_grad", "gated_in_torch", "gated_linear", "gated_linear_preact", "grad_launch",
]  # fmt: skip

_DTYPES = (torch.float16, torch.bfloat16)


def check_gated(x, weight, activation, device_types=("cuda",), bias=None) -> tuple[int, int, str]:
    """(rows, output features I, the kernels' activation name) of ``gated_linear(x, weight,
    activation, bias=bias)`` with a 2-D ``x``; raises what is wrong and what is allowed."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    act = check_activation(activation)
    if act == "none":
        raise ValueError("a gated linear unit needs an activation: 'silu' (SwiGLU), 'gelu' or "
                         "'gelu_tanh' (GeGLU), 'relu' or 'relu2'")  # fmt: skip
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"x must be 2-D (rows, in_features) and weight 2-D (2 * out_features, in_features); "
            f"got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if weight.shape[0] % 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"weight {tuple(weight.shape)} must be (2 * out_features, {x.shape[1]}): the gate's "
            "rows, then the up projection's"
        )
    if x.dtype != weight.dtype or x.dtype not in _DTYPES:
        raise TypeError(f"x and weight must share float16 or bfloat16, got {x.dtype} and "
                        f"{weight.dtype}")  # fmt: skip
    for name, t in (("x", x), ("weight", weight)):
        if t.device.type not in device_types or t.device != x.device:
            raise ValueError(f"{name} must be a {device_types[0].upper()} tensor on x's device, "
                             f"got {t.device}")  # fmt: skip
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.layout != torch.strided:
            raise TypeError(f"bias must be a strided (dense) tensor, got {bias.layout}")
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"bias {tuple(bias.shape)} must be ({weight.shape[0]},): the gate's "
                f"{weight.shape[0] // 2} entries, then the up projection's (as the weight's rows)"
            )
        if bias.dtype != x.dtype:
            raise TypeError(f"bias must be {x.dtype} as x, got {bias.dtype}")
        if bias.device != x.device:
            raise ValueError(f"bias must be on x's device ({x.device}), got {bias.device}")
    return x.shape[0], weight.shape[0] // 2, act


def gated_config(rows: int, swap: bool = False, small: bool = False) -> tuple[str, object | None]:
    """(backend, config) of the tile a gated call of ``rows`` rows runs: the menu entry
    ``choosing.gated_kernel_entry`` names (the rule the cost model prices), its backend and,
    where the entry is not that backend's shipped tile, its config (None: the shipped one).
    ``swap``: the call may take the gated swap-AB decode tile (``gated_linear`` outside
    batch-invariant mode, unbiased unless ``host.runs_gated_swap_bias``), which it does at up
    to ``GATED_SWAP_MAX_ROWS`` rows where ``host.runs_gated_swap`` says so. ``small``: the
    call may take the small row tile (``gated_linear``'s product alone: not the preact
    forward, not the dgated backward), which it does at up to ``GATED_SMALL_MAX_ROWS`` rows
    where ``host.runs_gated_small`` says so (``small_tile_on``)."""
    width = host.choosing.gated_swap_tile_n(rows) if swap else None
    if width is not None and host.runs_gated_swap(GATED_SWAP_BACKEND):
        base = host.BACKENDS[GATED_SWAP_BACKEND].config()
        tile = dict(tile_m=128, tile_n=width, tile_k=64, cluster_m=1, cluster_n=1)
        return GATED_SWAP_BACKEND, dataclasses.replace(base, **tile, swap_ab=True)
    e = host.choosing.menu.entry(host.choosing.gated_kernel_entry(rows, small and small_tile_on()))
    return e.backend, e.variant_config()


def dgated_tile(d, dy: torch.Tensor, half: int, index: int) -> tuple[str, object | None]:
    """(backend, config) of the tile the dgated GEMM of a ``gated_grad`` call (``dy`` (M, H),
    ``dh`` (M, ``half``)) runs on device ``index``: the menu entry ``choosing.dgated_entry``
    names (the ping-pong or the cooperative row tile, by how well each fills its waves, or the
    plain product's cooperative tile where it fills them better still); the kernel loads the
    pre-activation in its schedule's form (the ping-pong tile's whole tile buffered, the
    cooperative one's by a loader warp: ``kernels/sm90/dgated.py``)."""
    rows, k = dy.shape
    ab = dtype_name(dy.dtype)
    sms, cc = d.devices.sm_count(index), d.devices.capability(index)
    e = host.choosing.menu.entry(host.choosing.dgated_entry(rows, half, k, ab, sms, cc))
    return e.backend, e.variant_config()


def _is_small(config) -> bool:
    """Whether ``config`` (``gated_config``'s) is the small row tile's: what the road is priced
    on, derived from the tile that runs (as the swap tile's width is)."""
    return (
        config is not None
        and config == host.choosing.menu.entry(host.choosing.GATED_SMALL_TILE).variant_config()
    )


def small_tile_on() -> bool:
    """Whether the gated kernel's small row tile is switched on (``host.runs_gated_small``)."""
    return host.runs_gated_small(host.choosing.menu.entry(host.choosing.GATED_SMALL_TILE).backend)


#: The backend of the gated swap-AB decode tile (a ping-pong 128-row tile:
#: ``kernels/sm90/kernel.gated_swap_refusal``).
GATED_SWAP_BACKEND = "sm90-pingpong"


def gated_in_torch(y: torch.Tensor, activation: str, out_dtype) -> torch.Tensor:
    """``act(y[:, :I]) * y[:, I:]`` in fp32, rounded once: the unfused road's epilogue. Two
    kernels on an fp32 ``y`` (three for relu2; the activation, then the product written in
    ``out_dtype``: the same bits as ``(act(g) * u).to(out_dtype)``, one pass fewer)."""
    y = y.float()
    half = y.shape[-1] // 2
    gate = torch_activation(activation, y[..., :half])
    out = torch.empty(gate.shape, dtype=out_dtype, device=y.device)
    return torch.mul(gate, y[..., half:], out=out)


def gated_linear(x, weight, activation="silu", *, bias=None, dispatcher=None) -> torch.Tensor:
    """(rows, I): ``act(x @ weight[:I].T + bias[:I]) * (x @ weight[I:].T + bias[I:])`` (module
    docstring; no bias: those terms are 0); ``x`` 2-D."""
    d = dispatcher or dispatch.default_dispatcher()
    key = _signature(x, weight, activation, bias)
    hit = d.launchers.get(key) if key is not None else None
    if hit is not None:  # a signature seen before: checked, its road decided, its kernel bound
        return hit(x, weight, bias)
    m, half, act = check_gated(x, weight, activation, _device_types(d, x), bias)
    if x.is_neg() or weight.is_neg() or (bias is not None and bias.is_neg()):
        # the kernel reads their memory, not a negated view's (nor does matmul take one)
        x, weight, bias = _resolved(x, weight, bias)
        return gated_linear(x, weight, activation, bias=bias, dispatcher=d)
    out = torch.empty(m, half, dtype=x.dtype, device=x.device)
    if m == 0 or half == 0:
        return out
    if x.shape[1] == 0:  # both projections are 0: act(b_gate) * b_up, or act(0) * 0 = 0
        if bias is None:
            return out.zero_()
        return gated_in_torch(bias.float().expand(m, 2 * half), act, x.dtype)
    fused = dispatch.CPU_REASON if _on_the_host(d, x) else _road(d, x, weight, act, bias)
    if isinstance(fused, str):  # the fp32 product, gated in fp32, rounded once
        out = _unfused(d, act, x, weight, bias)
        if key is not None:
            d.remember(key, functools.partial(_unfused, d, act))
        return out
    (a_view, _), (b_view, _), (_, config), index = fused
    swapped = config is not None and config.swap_ab
    # the (rows, I) result, or under swap-AB its transpose (I, rows), M-major
    c_view = _kernel_view(out.t().unsqueeze(-1), False, (0,))[0] if swapped else out.unsqueeze(-1)
    fn, clusters = _launch(d, fused, x, act, bias, c_view)
    bind = getattr(fn, "bind", None)
    if key is not None and bind is not None:
        if bias is None:
            at = bind(a_view, b_view, c_view, clusters, *UNSPLIT_LAUNCH, None)
        else:  # the bias, alpha, beta and C late: the bias given per call
            at = bind(a_view, b_view, c_view, clusters, *UNSPLIT_LAUNCH, late=4)
        x_view, w_view = (b_view, a_view) if swapped else (a_view, b_view)
        shifts = (x_view.data_ptr() - x.data_ptr(), w_view.data_ptr() - weight.data_ptr())
        launch = _launcher(d, at, shifts, (m, half), x.dtype, x.device, index, swapped)
        d.remember(key, launch)
    return out


def gated_linear_preact(x, weight, activation="silu", *, bias=None, dispatcher=None):
    """(h, preact): ``gated_linear``'s (rows, I) result and its pre-activation ``[gate | up]``
    (rows, 2I) in ``x``'s dtype, for a backward that reads it (``gated_grad``). Where the
    gated kernel runs this call and the gated training kernels are on
    (``host.fuses_gated_grad``), one kernel writes both (``Epilogue.preact``: the product's
    halves stored from the same accumulators, plus the bias); else ``gated_linear``'s unfused
    road (the fp32 product, ``act(gate) * up`` on it in fp32, rounded once: the same ``h``)
    and the product rounded to ``x``'s dtype."""
    d = dispatcher or dispatch.default_dispatcher()
    m, half, act = check_gated(x, weight, activation, (d.devices.type,), bias)
    x, weight, bias = _resolved(x, weight, bias)  # the kernel reads their memory
    fused = (
        _road(d, x, weight, act, bias, swap_ok=False)
        if m and half and x.shape[1]
        else "an empty problem"
    )  # (the swap-AB decode tile stores no preact)
    if not isinstance(fused, str) and not host.fuses_gated_grad(fused[2][0]):
        fused = "the gated training kernels are switched off (host.registry.DGATED_FAMILIES)"
    if isinstance(fused, str):  # gated_linear's unfused road: the unit on the fp32 product
        y = _product32(d, x, weight, bias)
        return gated_in_torch(y, act, x.dtype), y.to(x.dtype)
    out = torch.empty(m, half, dtype=x.dtype, device=x.device)
    preact = torch.empty(m, 2 * half, dtype=x.dtype, device=x.device)
    p_view = _kernel_view(preact[:, :half].unsqueeze(-1), False, (1,))[0]
    _launch(d, fused, x, act, bias, out.unsqueeze(-1), p_view)
    return out, preact


def _launch(d, fused, x, act, bias, c_view, preact=None):
    """Launch the gated kernel ``fused`` (``_road``'s) on ``x`` into ``c_view`` (and, with
    ``preact``, the pre-activation's gate-half view: ``Epilogue.preact``); returns the
    compiled kernel and its cluster count."""
    (a_view, a_major), (b_view, b_major), (backend, config), index = fused
    # the bias runs along the product's columns, or on the swap-AB tile its rows (the weights')
    along = "row" if config is not None and config.swap_ab else "col"
    epilogue = Epilogue(bias="none" if bias is None else along, activation=act, gated=True,
                        preact=preact is not None)  # fmt: skip
    dtypes = (str(x.dtype)[6:], str(x.dtype)[6:], "float32")
    fn, clusters = d.kernel(backend, index, dtypes, a_major, b_major, config, epilogue.name)
    vector = None if bias is None else _bias_vector(bias)
    extras = (vector,) if preact is None else (vector, None, None, preact)
    with d.on_device(index):
        fn(a_view, b_view, c_view, clusters, *UNSPLIT_LAUNCH, *extras)
    return fn, clusters


def _on_the_host(d, x) -> bool:
    """Whether ``x`` is a CPU tensor where ``d``'s devices are CUDA GPUs: the unfused road runs
    the call in torch (the product on ``matmul``'s CPU fallback: ``dispatch.CPU_REASON``), as
    ``matmul`` and ``linear`` run CPU tensors under ``backend="auto"``."""
    return dispatch.on_the_host(d, x, "auto")


def _device_types(d, x) -> tuple[str, ...]:
    """The device types a gated call on ``d`` takes for ``x``: the CPU's where ``x`` is on it
    and ``d``'s devices are CUDA GPUs (``_on_the_host``), else ``d``'s devices' (the first
    names the device the checks' error asks for)."""
    return ("cpu",) if _on_the_host(d, x) else (d.devices.type,)


def _resolved(x, weight, bias):
    """The tensors with any negated view resolved (a copy of its values; others as they are)."""
    return x.resolve_neg(), weight.resolve_neg(), None if bias is None else bias.resolve_neg()


def _product32(d, x, weight, bias=None) -> torch.Tensor:
    """The (M, 2I) product in fp32, plus the bias in its epilogue (``matmul``'s own launcher
    kept per signature)."""
    return dispatch.call(d, x, weight.t(), None, torch.float32, torch.float32, "auto", None, bias)


def _bias_vector(bias: torch.Tensor) -> torch.Tensor:
    """The kernel's bias: ``bias`` where it is a flat unit-stride vector, else a copy that is
    (a negated view never comes here: ``_resolved`` first, and no launcher is kept for one)."""
    return kernel_bias(bias, "col", bias.shape[0], bias.shape[0])


def _unfused(d, act: str, x, weight, bias=None) -> torch.Tensor:
    """The unfused road: the (M, 2I) product in fp32 (plus the bias, in its epilogue;
    ``matmul``'s own launcher kept per signature), then ``act(gate) * up`` in fp32, rounded
    once."""
    return gated_in_torch(_product32(d, x, weight, bias), act, x.dtype)


def _signature(x, weight, activation, bias=None):
    """The key of a fused call's launcher among the dispatcher's: all that the checks, the road
    and the views read, none of the data; None where the arguments are not tensors of the kinds
    a launcher is kept for (the checks then say what is wrong)."""
    try:
        grads = (x.requires_grad, weight.requires_grad)
        if bias is not None:
            grads += (bias.requires_grad,)
        grad = torch.is_grad_enabled() and any(grads)
        key = ("gated", type(activation), activation, grad, current_settings())
        key += dispatch.tensor_signature(x) + dispatch.tensor_signature(weight)
        key += ("no bias",) if bias is None else dispatch.tensor_signature(bias)
        hash(key)
        return key
    except Exception:  # not tensors, unhashable arguments, ...
        return None


def _launcher(d, at, shifts: tuple[int, int], shape, dtype, device, index, swapped=False):
    """A later fused call of the signature: ``launch(x, weight, bias)`` runs the kernel bound
    at the first call's views (``at``) at this call's addresses, into a new result (with a
    bias, its vector given per call). ``shifts``: x's view's and the weight's from their
    tensors' addresses; ``swapped``: the kernel's A is the weight and its B is x (the gated
    swap-AB tile)."""
    dx, dw = shifts

    def launch(x, weight, bias=None):
        out = torch.empty(*shape, dtype=dtype, device=device)
        a, b = x.data_ptr() + dx, weight.data_ptr() + dw
        if swapped:
            a, b = b, a
        if bias is None:
            at(a, b, out.data_ptr())
        else:
            at(a, b, out.data_ptr(), _bias_vector(bias), None, None, None)
        return out

    return dispatch.on_its_device(d, index, launch)


def explain(d, x, weight, activation, bias=None, **others) -> str:
    """Where ``gated_linear(x, weight, activation, bias=bias)`` runs on dispatcher ``d`` (``x``
    N-D, its rows folded): the gated kernel and its tile, or the unfused road and why, with the
    (M, 2I) product's own explanation there. Checks as the call does; runs nothing. ``others``:
    the arguments of ``explain`` that ``gated_linear`` does not take, which must be at their
    defaults (a ValueError names those that are not)."""
    given = [name for name, value in others.items() if value is not None]
    if given:
        raise ValueError(f"gated=True explains gated_linear(x, weight, activation, bias=), "
                         f"which takes no {', '.join(given)}")  # fmt: skip
    if isinstance(x, torch.Tensor) and x.dim() > 2:
        x = x.reshape(-1, x.shape[-1])
    m, half, act = check_gated(x, weight, activation, _device_types(d, x), bias)
    with_bias = "" if bias is None else " + its bias"
    head = f"gated_linear: act(gate) * up{with_bias} with {act}, {m} rows, {half} output features"
    road = "an empty problem"
    if m and half and x.shape[1]:
        road = dispatch.CPU_REASON if _on_the_host(d, x) else _road(d, x, weight, act, bias)
    if not isinstance(road, str):
        (backend, config), index = road[2], road[3]
        tile = config or host.BACKENDS[backend].config("float32")
        which = "its shipped" if config is None else "the"
        width = tile.tile_n if tile.swap_ab else None
        shape = f"{which} {tile.tile_m}x{tile.tile_n} tile, {tile.tile_n // 2} output features"
        if width is not None:
            shape = (f"the swap-AB {tile.tile_m}x{width} decode tile: the weights' gate and up "
                     f"rows its two 64-row bands, {tile.tile_m // 2} output features and "
                     f"{width} rows")  # fmt: skip
        kernel = (
            f"kernel: the gated kernel on {backend} ({shape} a tile): act(gate) * up{with_bias} "
            "in its epilogue, one GEMM, the half-width result written once"
        )
        name = str(x.dtype).removeprefix("torch.")
        verdict = d.gated_verdict(index, m, 2 * half, x.shape[1], name, act, width,
                                  _is_small(config))  # fmt: skip
        why = f"\nwhy: {verdict}" if verdict else ""
        return f"{head}\n{kernel}{why}\n{_training_line(d, x, weight, act, bias)}"
    product = dispatch.explain(d, x, weight.t(), None, torch.float32, torch.float32, "auto", bias)
    unfused = (f"unfused: the (M, 2I) fp32 product{with_bias}, then act(gate) * up in fp32 in "
               f"torch ({road})")  # fmt: skip
    training = _training_line(d, x, weight, act, bias)
    return f"{head}\n{unfused}\n{training}\nthe product: {product}"


def _training_line(d, x, weight, act: str, bias) -> str:
    """``explain``'s line on a ``GatedMLP`` training step of these rows: fused (the gated
    kernel storing the pre-activation, the unit's gradient in the dh GEMM) or not, and why.
    Its forward is ``gated_linear_preact``'s road, which never takes the swap-AB tile."""
    head = "training (GatedMLP with a gradient to compute):"
    if _on_the_host(d, x):
        return (f"{head} the (M, 2I) product saved, act(gate) * up in torch, its gradient in "
                f"three elementwise passes ({dispatch.CPU_REASON})")  # fmt: skip
    half = weight.shape[0] // 2
    index = dispatch.device_index(d, x)
    backend = dgated_tile(d, x, half, index)[0]
    why = _dgated_refusal(d, backend, half, index)
    road = "an empty problem"
    if why is None and x.shape[0] and half and x.shape[1]:
        road = _road(d, x, weight, act, bias, swap_ok=False)
    if why is not None:
        return (f"{head} the (M, 2I) product saved, act(gate) * up in torch, its gradient in "
                f"three elementwise passes ({why})")  # fmt: skip
    forward = "the (M, 2I) product, then act(gate) * up"
    if not isinstance(road, str):
        forward = "the gated kernel storing h and [gate | up] from one GEMM"
    return (
        f"{head} {forward}; the backward fuses the unit's gradient into the down "
        "projection's dh GEMM (dgated: dh never reaches memory)"
    )


# ----------------------------------------------------------------- the gated unit's gradient


def check_gated_grad(dy, w_down, preact, activation, device_types=("cuda",)) -> tuple[int, str]:
    """(I, the kernels' activation name) of ``gated_grad(dy, w_down, preact, activation)``;
    raises what is wrong and what is allowed."""
    check_operands((("dy", dy), ("w_down", w_down), ("preact", preact)), device_types, dim=2)
    act = check_activation(activation)
    if act == "none":
        raise ValueError("the gated unit's gradient needs its activation ('silu', 'gelu', ...)")
    half = w_down.shape[1]
    if w_down.shape[0] != dy.shape[1] or tuple(preact.shape) != (dy.shape[0], 2 * half):
        raise ValueError(
            f"dy {tuple(dy.shape)}, w_down {tuple(w_down.shape)} and preact "
            f"{tuple(preact.shape)} must be (M, H), (H, I) (the down projection's weight) and "
            "(M, 2I) (the saved [gate | up])"
        )
    return half, act


def gated_grad(dy, w_down, preact, activation="silu", *, dispatcher=None) -> torch.Tensor:
    """``d[gate | up]`` (M, 2I), the gradient of ``h = act(gate) * up`` with respect to its
    pre-activation ``preact = [gate | up]`` (M, 2I), where ``dh = dy @ w_down`` (a gated MLP's
    down projection, ``w_down`` (H, I) as ``nn.Linear`` holds it):
    ``dgate = dh * up * act'(gate)``, ``dup = dh * act(gate)``. In ``dy``'s dtype.

    Where a kernel fuses it (``host.fuses_gated_grad``: ``Epilogue.dgated``) one GEMM computes
    ``dh`` and writes only ``d[gate | up]``, in fp32 from its accumulators, rounded once; else
    ``dh`` is a product of its own (rounded to the dtype), then torch's backward kernels in
    three passes, as ``api.epilogue.gated_unit_with_grad``'s backward."""
    d = dispatcher or dispatch.default_dispatcher()
    half, act = check_gated_grad(dy, w_down, preact, activation, (d.devices.type,))
    # a negated view's values are not its memory's, which the kernel reads
    dy, w_down, preact = (t.resolve_neg() for t in (dy, w_down, preact))
    m = dy.shape[0]
    out = torch.empty(m, 2 * half, dtype=dy.dtype, device=dy.device)
    if m == 0 or half == 0:
        return out
    road = _grad_road(d, dy, w_down, preact) if dy.shape[1] else "an empty product"
    if isinstance(road, str):
        dh = dispatch.call(d, dy, w_down, None, None, torch.float32, "auto", None)
        return gated_unit_grad(act, dh, preact, out)
    _grad_launch(road, dy, out, act).run(d)
    return out


@dataclasses.dataclass(frozen=True)
class GradLaunch:
    """A training kernel's launch that reads a saved pre-activation (``c_in``) in its epilogue:
    the dgated kernel's of a ``gated_grad`` call (``grad_launch``) and the dact kernel's of an
    ``act_grad`` call (``api.act_grad.act_grad_launch``). Its backend, config, device index,
    dtypes, majors, epilogue name and views: A (dy), B (w_down as (I, H)), C (dgated: the
    result's gate half, (M, I, 1), the up half I columns on; dact: the result), ``c_in`` (the
    pre-activation's view the kernel reads) and the result ``out``."""

    backend: str
    config: object
    index: int
    dtypes: tuple[str, str, str]
    a_major: str
    b_major: str
    epilogue: str
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    c_in: torch.Tensor
    out: torch.Tensor

    def run(self, d) -> None:
        """Launch it on dispatcher ``d`` (unsplit, no bias or scalars; C's input ``c_in``)."""
        fn, clusters = d.kernel(self.backend, self.index, self.dtypes, self.a_major,
                                self.b_major, self.config, self.epilogue)  # fmt: skip
        with d.on_device(self.index):
            fn(self.a, self.b, self.c, clusters, *UNSPLIT_LAUNCH, None, None, None, self.c_in)


def _grad_launch(road, dy, out, act: str) -> GradLaunch:
    (a_view, a_major), (b_view, b_major), c_in, (backend, config), index = road
    dtypes = (str(dy.dtype)[6:], str(dy.dtype)[6:], "float32")
    half = out.shape[1] // 2
    c_view = _kernel_view(out[:, :half].unsqueeze(-1), False, (1,))[0]
    return GradLaunch(backend, config, index, dtypes, a_major, b_major,
                      Epilogue(activation=act, dgated=True).name, a_view, b_view, c_view, c_in,
                      out)  # fmt: skip


def grad_launch(d, dy, w_down, preact, activation="silu", out=None) -> GradLaunch:
    """``gated_grad(dy, w_down, preact, activation)``'s dgated kernel launch, checked and
    planned as the call plans it, not run, into ``out`` (an (M, 2I) tensor of dy's dtype,
    contiguous; None: a new one), for a tool that launches another build of that kernel
    (``wsgemm.trace``). A ValueError where the call runs no dgated kernel (the unfused road:
    it says why) or ``out`` is not such a tensor."""
    half, act = check_gated_grad(dy, w_down, preact, activation, (d.devices.type,))
    dy, w_down, preact = (t.resolve_neg() for t in (dy, w_down, preact))
    m = dy.shape[0]
    road = "an empty problem"
    if m and half and dy.shape[1]:
        road = _grad_road(d, dy, w_down, preact)
    if isinstance(road, str):
        raise ValueError(f"this gated_grad call runs no dgated kernel: {road}")
    if out is None:
        out = torch.empty(m, 2 * half, dtype=dy.dtype, device=dy.device)
    elif not (
        isinstance(out, torch.Tensor)
        and tuple(out.shape) == (m, 2 * half)
        and out.dtype == dy.dtype
        and out.device == dy.device
        and out.is_contiguous()
    ):
        raise ValueError(f"out must be a contiguous ({m}, {2 * half}) tensor of {dy.dtype} on "
                         f"{dy.device}")  # fmt: skip
    return _grad_launch(road, dy, out, act)


def _grad_road(d, dy, w_down, preact):
    """(A's view and major, B's view and major, C's (the pre-activation's gate half) view,
    (backend, config), device index) where the dgated kernel runs ``gated_grad``, else why
    not (a str)."""
    index = dispatch.device_index(d, dy)
    half = w_down.shape[1]
    backend, config = dgated_tile(d, dy, half, index)
    why = _dgated_refusal(d, backend, half, index)
    if why is not None:
        return why
    a = _kernel_view(dy.unsqueeze(-1), False, (1, 0))
    if a is None:  # (e.g. a broadcast gradient, out.sum()'s) a copy the kernel reads: M x H
        a = _kernel_view(dy.contiguous().unsqueeze(-1), False, (1, 0))
    b = _kernel_view(w_down.t().unsqueeze(-1), False, (0, 1))  # (I, H): w_down's rows are K
    c = _kernel_view(preact[:, :half].unsqueeze(-1), False, (1,))
    # (one row's stride is made up by _kernel_view: unused, so any)
    if a is None or b is None or c is None or (dy.shape[0] > 1 and c[0].stride(0) < 2 * half):
        return "an operand is not addressable by the kernel (unit stride, 16-byte strides)"
    (a_view, a_side), (b_view, b_side) = a, b
    a_major = "k" if a_side == "cols" else "m"
    b_major = "n" if b_side == "rows" else "k"
    return (a_view, a_major), (b_view, b_major), c[0], (backend, config), index


def _dgated_refusal(d, backend: str, half: int, index: int) -> str | None:
    """Why no dgated kernel on ``backend`` (``dgated_tile``'s) runs a gradient of ``half``
    (I) on device ``index``, or None where one does (views aside: ``_grad_road``)."""
    if not host.BACKENDS[backend].supports(d.devices.capability(index)):
        return "no dgated kernel runs on this GPU"
    if not host.fuses_gated_grad(backend):
        return "the dgated kernels are switched off (host.registry.DGATED_FAMILIES)"
    if half % 8:
        return "I is not a multiple of 8 (the up half's offset must be 16 bytes)"
    return None


def _road(d, x, weight, act, bias=None, swap_ok=True):
    """((A's view, its major), (B's view, its major), (backend, config), device index) where a
    gated kernel runs this call, else why not (a str: the unfused road's reason, ``explain``'s
    words). A is x and B the weight's gate half, or on the gated swap-AB decode tile the other
    way round (``swap_ok``: that tile, or the small row tile, may run it, ``gated_linear``'s
    product alone; the swap tile takes a bias only where ``host.runs_gated_swap_bias`` says so,
    and in batch-invariant mode a row's bits must not depend on the call's rows: neither runs
    there)."""
    index = dispatch.device_index(d, x)
    invariant = host.choosing.batch_invariant_requested(d.batch_invariant)
    biased_ok = bias is None or host.runs_gated_swap_bias(GATED_SWAP_BACKEND)
    swap = swap_ok and biased_ok and not invariant
    backend, config = gated_config(x.shape[0], swap, swap_ok and not invariant)
    swapped = config is not None and config.swap_ab
    if not host.BACKENDS[backend].supports(d.devices.capability(index)):
        return "no gated kernel runs on this GPU"
    if not host.fuses_epilogues(backend, gated=True):
        return "the gated kernels are switched off (host.registry.GATED_FAMILIES)"
    if bias is not None and not host.fuses_epilogues(backend, gated=True, bias=True):
        return ("the gated kernel with a bias is switched off "
                "(host.registry.GATED_BIAS_FAMILIES)")  # fmt: skip
    if weight.shape[0] // 2 % 8:  # the up rows' TMA coordinate is free; C's rows are 16 bytes
        return "I is not a multiple of 8 (the up rows' TMA coordinate, C's 16-byte rows)"
    a = _kernel_view(x.unsqueeze(-1), False, (1, 0))
    # K-major only; the kernel's B view is the gate's rows, the up rows follow them
    b = _kernel_view(weight[: weight.shape[0] // 2].unsqueeze(-1), False, (1,))
    if a is None:
        return "x is not addressable by the kernel (no unit stride, or strides not 16-byte)"
    if b is None:
        return "the weight is not row-major (2I, K) with 16-byte rows (the kernel reads it K-major)"
    name = str(x.dtype).removeprefix("torch.")
    width = config.tile_n if swapped else None
    small = _is_small(config)  # the tile the road is priced on is the tile that runs
    why = d.gated_unfused(index, x.shape[0], weight.shape[0], x.shape[1], name, act, width, small)
    if why is not None:
        return why
    x_view, unit = a
    if swapped:  # C^T = W x^T: the weight's rows fill the tile's M, the tokens its N
        return (b[0], "k"), (x_view, "k" if unit == "cols" else "n"), (backend, config), index
    return (x_view, "k" if unit == "cols" else "m"), (b[0], "k"), (backend, config), index
