"""Modules: ``Linear``, a drop-in ``torch.nn.Linear`` on wsgemm; ``GatedMLP``, a gated MLP
(SwiGLU, GeGLU) whose gate and up projections run as one fused GEMM; ``MLP``, a plain MLP whose
up projection fuses its bias and activation; ``replace_linear``, which
turns a model's ``nn.Linear`` layers into ``Linear`` in place and reports what it did
(``ReplaceReport``); and ``restore_linear``, which undoes that."""

from __future__ import annotations

import logging
import operator
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module
from torch.nn.utils import parametrize

from .api.epilogue import _transformed, check_activation, gated_unit_with_grad, torch_activation
from .api.gated import gated_in_torch
from .api.validate import AB_DTYPES, dtype_list
from .gated import gated_linear, gated_mlp
from .mlp import mlp as _mlp_step
from .ops import autocast_dtype, linear
from .support import VECTOR_BYTES, vector_elems

__all__ = [
    "MLP", "FusedActivation", "GatedMLP", "Linear", "ReplaceReport", "fuse_gated_mlps",
    "fuse_plain_mlps", "replace_linear", "restore_linear",
]  # fmt: skip

log = logging.getLogger("wsgemm")

_HALF = tuple(AB_DTYPES)  # the torch dtypes wsgemm multiplies
#: A row of in_features or out_features elements that is not a whole number of 16-byte vectors
#: is not TMA-addressable: ``api/plan.py`` then copies the operand (or the output) into a padded
#: buffer on every call. The largest vector of the dtypes wsgemm multiplies (8 for fp16/bf16).
_VECTOR = max(vector_elems(dtype) for dtype in _HALF)
_BACKEND = "auto"  # what wsgemm.linear runs: matmul's default backend
#: Devices a model is built or loaded on before it moves to the GPU: a layer there is replaced
#: (and reported falling back) rather than skipped.
_STAGING_DEVICES = ("cpu", "meta")


def _runs_on_wsgemm(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """Does wsgemm multiply these, without a copy on every call: CUDA tensors of one half dtype
    (after CUDA autocast), in_features and out_features whole 16-byte vectors?"""
    if not (input.is_cuda and weight.is_cuda):
        return False
    if weight.shape[0] % _VECTOR or weight.shape[-1] % _VECTOR:
        return False
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        return autocast_dtype(input, dtype) == autocast_dtype(weight, dtype) in _HALF
    return input.dtype == weight.dtype in _HALF


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _misaligned(weight: torch.Tensor) -> str | None:
    """Why wsgemm would copy an operand or the output of this layer on every call, or None."""
    sizes = (("in_features", weight.shape[-1]), ("out_features", weight.shape[0]))
    bad = [f"{what}={size}" for what, size in sizes if size % _VECTOR]
    if not bad:
        return None
    said = (
        f"{bad[0]} is not a multiple" if len(bad) == 1 else f"{' and '.join(bad)} are not multiples"
    )
    return (
        f"{said} of {_VECTOR} (whole {VECTOR_BYTES}-byte rows), so wsgemm would copy an operand "
        "or the output on every call"
    )


def _fallback_reason(
    weight: torch.Tensor, input: torch.Tensor | None = None
) -> tuple[str, str] | None:
    """Why ``Linear.forward`` runs torch's ``F.linear`` for this weight (and ``input``, when
    given; without it, for an input like the weight) in the current autocast state, as (kind,
    detail) with kind "device", "dtype" or "misaligned"; None where wsgemm runs. Agrees with
    ``_runs_on_wsgemm``, which answers the same question cheaply, without words."""
    tensors = [("weight", weight)] + ([] if input is None else [("input", input)])
    for what, t in tensors:
        if not t.is_cuda:
            return "device", f"{what} on {t.device.type}"
    autocast = torch.is_autocast_enabled("cuda")
    cast = torch.get_autocast_dtype("cuda")
    got = {autocast_dtype(t, cast) if autocast else t.dtype for _, t in tensors}
    if len(got) > 1 or not got <= set(_HALF):
        said = " and ".join(f"{_name(t.dtype)} {what}" for what, t in reversed(tensors))
        if not autocast and all(_autocastable(t.dtype) for _, t in tensors):
            return "dtype", f'{said} outside torch.autocast("cuda")'
        fp64 = autocast and any(t.dtype == torch.float64 for _, t in tensors)
        leaves = " (autocast leaves float64 as it is)" if fp64 else ""
        return "dtype", f"{said}{leaves}; wsgemm multiplies {dtype_list(_HALF)}"
    misaligned = _misaligned(weight)
    return None if misaligned is None else ("misaligned", misaligned)


def _autocastable(dtype: torch.dtype) -> bool:
    """Does CUDA autocast give a tensor of this dtype its half dtype (``ops.autocast_dtype``)?"""
    return dtype.is_floating_point and dtype != torch.float64


def _hooked(module: nn.Module) -> bool:
    """Does a call of ``module`` run hooks (its own forward, forward-pre or backward hooks, or
    global module hooks)? A road that bypasses the module's call would skip them, or show them
    values the unfused model does not."""
    return _own_hooks(module) or _global_hooks()


def _own_hooks(module: nn.Module) -> bool:
    """Has ``module`` forward, forward-pre or backward hooks of its own?"""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or module._backward_pre_hooks
    )  # fmt: skip


def _global_hooks() -> bool:
    """Are global module hooks registered (``nn.modules.module.register_module_*_hook``)?"""
    return bool(
        _module._global_forward_hooks or _module._global_forward_pre_hooks
        or _module._global_backward_hooks or _module._global_backward_pre_hooks
    )  # fmt: skip


#: Layers that have logged their fallback (once per layer, not per call).
_FELL_BACK: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _note_fallback(layer: Linear, input: torch.Tensor) -> None:
    _FELL_BACK.add(layer)
    reason = _fallback_reason(layer.weight, input)
    log.info(
        "%s(in_features=%d, out_features=%d) runs torch's F.linear, not wsgemm: %s (logged "
        "once per layer)",
        type(layer).__name__,
        layer.in_features,
        layer.out_features,
        reason[1] if reason else "wsgemm does not take this call",
    )


class Linear(nn.Linear):
    """``torch.nn.Linear`` whose product runs on wsgemm (``wsgemm.linear``).

    Same constructor (including ``device`` and ``dtype``), parameters, initialization and
    ``state_dict`` keys; ``isinstance(m, nn.Linear)`` holds. ``extra_repr`` adds
    ``wsgemm=auto`` and, where the layer runs torch as it stands, why.

    wsgemm runs for fp16/bf16 CUDA tensors (or under ``torch.autocast("cuda")``) whose
    in_features and out_features are multiples of 8. Elsewhere (a CPU or meta tensor, fp32/fp64
    outside CUDA autocast, sizes wsgemm would copy on every call) the layer computes what
    ``nn.Linear`` computes, with torch, so a model keeps working on any device and dtype; the
    first such call of each layer logs one INFO line on the ``"wsgemm"`` logger (in eager mode;
    under ``torch.compile`` nothing is logged).

    Pickling (``torch.save(model)``, ``copy.deepcopy``) records the torch class the layer came
    from and a function of this module that swaps it back in, so a replaced subclass of
    ``nn.Linear`` pickles although its wsgemm class is made at run time.

    ``activation`` (a keyword beyond ``nn.Linear``'s): one of ``wsgemm.matmul``'s activations,
    applied to the output, fused into the kernel's epilogue with the bias where wsgemm runs
    (``activation(x @ W.T + b)``), by torch where the layer falls back. A layer made by
    ``replace_linear`` has none.
    """

    activation: str | None = None  # the class default: a replaced nn.Linear has none
    #: The activation is a plain MLP's, moved here by ``fuse_plain_mlps``: while the layer has
    #: hooks, it returns what ``nn.Linear`` returns and its ``FusedActivation`` applies it.
    _act_from_fusion: bool = False
    #: This layer's last call returned the plain product (hooked: ``FusedActivation`` applies
    #: the activation), not the activated one.
    _returned_product: bool = False

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        activation: str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = None if check_activation(activation) == "none" else activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        activation = self.activation
        if activation is not None and self._act_from_fusion:
            # hooks see the product, as unfused: FusedActivation then applies the activation,
            # as this call decided (a hook may remove itself before FusedActivation runs)
            self._returned_product = _hooked(self)
            if self._returned_product:
                activation = None
        if _runs_on_wsgemm(input, self.weight):
            return linear(input, self.weight, self.bias, activation)
        # is_compiling() folds to True in a traced graph, so the note is eager-only and the
        # graph holds F.linear alone (no logging call to break it).
        if not torch.compiler.is_compiling() and self not in _FELL_BACK:
            _note_fallback(self, input)
        y = F.linear(input, self.weight, self.bias)
        return y if activation is None else torch_activation(activation, y)

    def extra_repr(self) -> str:
        text = f"{super().extra_repr()}, wsgemm={_BACKEND}"
        if self.activation is not None:
            text += f", activation={self.activation}"
        reason = _fallback_reason(self.weight)
        return text if reason is None else f"{text}, falls back to torch: {reason[1]}"

    def __reduce_ex__(self, protocol):
        torch_class = _TORCH_CLASS.get(type(self))
        if torch_class is None:  # a user's own subclass of Linear: importable by name
            return super().__reduce_ex__(protocol)
        return _unpickle, (torch_class,), self.__getstate__()


_SWAPPED: dict[type, type] = {nn.Linear: Linear}  # torch class -> its wsgemm class
_TORCH_CLASS: dict[type, type] = {Linear: nn.Linear}  # wsgemm class -> the torch class


def _swapped_class(cls: type) -> type:
    """``Linear`` for ``nn.Linear``; for a subclass, a subclass of both with wsgemm's forward."""
    if cls not in _SWAPPED:
        swapped = type(f"Wsgemm{cls.__name__}", (Linear, cls), {"__module__": __name__})
        _SWAPPED[cls], _TORCH_CLASS[swapped] = swapped, cls
    return _SWAPPED[cls]


def _unparametrized(layer: nn.Module) -> type:
    """The layer's class, or where ``torch.nn.utils.parametrize`` gave it a class of its own (a
    subclass holding the parametrized tensors' properties), the class that one extends."""
    cls = type(layer)
    return cls.__bases__[0] if parametrize.is_parametrized(layer) else cls


def _reclass(layer: nn.Module, make: Callable[[type], type]) -> None:
    """Give ``layer`` the class ``make`` makes of its (unparametrized) class. A parametrized
    layer gets a parametrized class of its own over that one, with the same properties: what
    ``remove_parametrizations`` deletes from the layer's class before it takes its base."""
    cls = type(layer)
    if not parametrize.is_parametrized(layer):
        layer.__class__ = make(cls)
        return
    namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    layer.__class__ = type(cls.__name__, (make(cls.__bases__[0]),), namespace)


def _unpickle(torch_class: type) -> Linear:
    """An empty wsgemm layer of ``torch_class`` for pickle to fill (``Linear.__reduce_ex__``)."""
    cls = _swapped_class(torch_class)
    return cls.__new__(cls)


@dataclass(frozen=True, eq=False)
class ReplaceReport(Sequence):
    """What ``replace_linear`` did. It reads as the list of replaced names that
    ``replace_linear`` returned before it had a report: ``len``, iteration, indexing and
    ``report == ["up", "down"]`` see ``replaced``.

    Each reason is ``"<kind>: <detail>"``; the kinds are "filtered" (the filter declined it),
    "misaligned" (wsgemm would copy an operand or the output on every call), "dtype" (no CUDA
    autocast makes the weight fp16/bf16, e.g. float64), "device" (a weight on a device other
    than CUDA, CPU or meta) and "uninitialized" (a lazy layer before its first forward).
    """

    replaced: tuple[str, ...] = ()
    #: MLPs fused (``fuse_mlp=True``): a gated one's gate and up projections run as one gated
    #: GEMM, (the MLP's name, its gate's, its up's); a plain one's activation runs in its up
    #: projection's epilogue, (the MLP's name, its up's). Their layers are wsgemm's, never
    #: skipped.
    fused: tuple[tuple[str, ...], ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)  # name -> why it stays torch's
    #: Replaced layers that run torch as the model stands (weights on CPU or meta, fp32 outside
    #: autocast), name -> why; they run wsgemm once the model is on the GPU in fp16/bf16.
    falling_back: Mapping[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.replaced)

    def __getitem__(self, index):
        return self.replaced[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.replaced)

    def __eq__(self, other) -> bool:
        if isinstance(other, ReplaceReport):
            return (self.replaced, self.fused, dict(self.skipped), dict(self.falling_back)) == (
                other.replaced,
                other.fused,
                dict(other.skipped),
                dict(other.falling_back),
            )
        if isinstance(other, (list, tuple)):
            return list(self.replaced) == list(other)
        return NotImplemented

    def summary(self) -> str:
        """One line of counts, as ``replace_linear`` logs it."""

        def counted(what: str, reasons: Mapping[str, str]) -> str:
            kinds = Counter(reason.split(":", 1)[0] for reason in reasons.values())
            detail = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
            return f"{len(reasons)} {what}" + (f" ({detail})" if detail else "")

        return (
            f"replace_linear: {len(self.replaced)} replaced, "
            f"{counted('falling back to torch', self.falling_back)}, {len(self.fused)} fused, "
            f"{counted('skipped', self.skipped)}"
        )


def _skip_reason(layer: nn.Linear) -> str | None:
    """Why a layer the filter chose stays torch's: what no later ``.to()`` of the model
    fixes or what would make wsgemm slower than torch. None if it is replaced."""
    weight = layer.weight
    if isinstance(weight, nn.parameter.UninitializedParameter):
        return (
            f"uninitialized: {type(layer).__name__} has no weight shape before its first "
            "forward; replace after it"
        )
    misaligned = _misaligned(weight)
    if misaligned is not None:
        return f"misaligned: {misaligned}"
    if not _autocastable(weight.dtype):
        return f"dtype: {_name(weight.dtype)} weight; wsgemm multiplies {dtype_list(_HALF)}" + (
            " and CUDA autocast leaves float64 as it is" if weight.dtype == torch.float64 else ""
        )
    if not weight.is_cuda and weight.device.type not in _STAGING_DEVICES:
        return f"device: weight on {weight.device.type}; wsgemm runs on CUDA GPUs"
    return None


def replace_linear(
    module: nn.Module,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    fuse_mlp: bool = False,
) -> ReplaceReport:
    """Make the eligible ``nn.Linear`` layers of ``module`` (itself included) wsgemm layers, in
    place: each keeps its identity, its ``Parameter`` objects (so optimizer state and tied
    weights survive), buffers and hooks; only its class changes (the way
    ``torch.nn.utils.parametrize`` works). ``restore_linear`` undoes it.

    A layer is replaced when the filter chooses it and wsgemm can run it without a per-call
    copy: in_features and out_features multiples of 8 (16-byte rows for fp16/bf16; a
    vocab-32001 head is skipped, as wsgemm would copy it on every call), a weight that is
    fp16/bf16 or that CUDA autocast makes so (fp32, not fp64), on CUDA or on CPU/meta (where
    models are built before they move). Layers replaced on CPU/meta or in fp32 work and are
    listed in ``falling_back``: they run torch until the model is on the GPU in fp16/bf16 (or
    under autocast).

    Args:
        module: the model.
        filter_fn: ``filter_fn(layer, qualified_name) -> bool`` picks layers among the
            ``nn.Linear`` instances, subclasses included, in place of the default (layers whose
            type is exactly ``nn.Linear``, parametrized or not); the size, dtype and device
            rules above apply to the layers it picks, whatever it says. A chosen subclass
            keeps its other methods but its ``forward`` becomes ``Linear.forward``
            (``x @ W.T + b``), so choose only subclasses whose forward means that. A layer
            parametrized by ``torch.nn.utils.parametrize`` keeps its parametrizations above
            the wsgemm class (``remove_parametrizations`` leaves a wsgemm layer).
        fuse_mlp: also fuse gated MLPs (``fuse_gated_mlps``): a module with replaced
            ``gate_proj`` and ``up_proj`` layers, a ``down_proj`` and an ``act_fn`` (Llama's,
            Qwen's, Mistral's ``MLP``) computes ``act(gate) * up`` as one gated GEMM. Only
            pairs whose gate and up are both wsgemm layers after the replacement (replaced by
            this call, or by an earlier one) fuse: where the filter declines either, or either
            is skipped, the MLP keeps its own forward and both weights stay as they were. Also
            plain MLPs (``fuse_plain_mlps``: GPT-NeoX's, Phi's, Falcon's): the activation moves
            into the replaced up projection's epilogue, with its bias. Both find MLPs by
            module names and check the forward with ``torch.fx`` (gated: exactly
            ``down(act(gate(x)) * up(x))``; plain: ``act`` called once, on ``up``'s whole
            output and nothing else): a forward that differs or does not trace stays unfused.

    Returns:
        a ``ReplaceReport``: ``replaced`` (qualified names, "" for ``module`` itself),
        ``skipped`` and ``falling_back`` (name -> reason), and ``fused`` (the MLPs fused,
        ``fuse_mlp`` only: a gated one's (name, gate, up), a plain one's (name, up); those
        layers are in ``replaced`` or were wsgemm layers already). A layer is in
        ``replaced`` or ``skipped``, never both; ``falling_back`` names replaced layers. It
        compares equal to, and iterates as, the list of replaced names.
        Layers already on wsgemm appear nowhere (but in ``fused``). One INFO line on the
        ``"wsgemm"`` logger gives the counts.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    replaced, skipped, falling_back = [], {}, {}
    for name, layer in module.named_modules():
        if isinstance(layer, Linear) or not isinstance(layer, nn.Linear):
            continue
        if filter_fn is not None:
            why = None if filter_fn(layer, name) else "filtered: filter_fn declined it"
        elif _unparametrized(layer) is not nn.Linear:  # (a parametrized nn.Linear is one)
            why = (
                f"filtered: a subclass of nn.Linear ({type(layer).__name__}); the default "
                "takes exactly nn.Linear, filter_fn may choose subclasses"
            )
        else:
            why = None
        why = why or _skip_reason(layer)
        if why is not None:
            skipped[name] = why
            continue
        _reclass(layer, _swapped_class)
        replaced.append(name)
        fallback = _fallback_reason(layer.weight)
        if fallback is not None:
            falling_back[name] = ": ".join(fallback)
    # only pairs whose both layers are wsgemm's now (replaced above, or before this call): a
    # layer the filter declined or the rules skipped keeps torch's product, and its MLP its forward
    fused = []
    if fuse_mlp:
        fused = _fuse_gated_mlps(module, lambda layer: isinstance(layer, Linear))
        fused += fuse_plain_mlps(module)
    report = ReplaceReport(tuple(replaced), tuple(fused), skipped, falling_back)
    log.info("%s", report.summary())
    return report


def restore_linear(module: nn.Module) -> list[str]:
    """Undo ``replace_linear``: every wsgemm layer of ``module`` (itself included) whose class
    ``replace_linear`` (or ``Linear`` itself) made gets its torch class back (``nn.Linear``, or
    the subclass it was), in place, keeping its ``Parameter`` objects, buffers and hooks. A
    user's own subclass of ``Linear`` stays as it is. A plain MLP's activation that
    ``fuse_plain_mlps`` moved into its up projection goes back to its own module first (for
    the MLPs under ``module``); a layer that still has an activation of its own
    (``Linear(activation=)``, or an up projection fused from a module above ``module``) stays
    a wsgemm layer, since ``nn.Linear`` has none.

    Returns:
        the qualified names restored ("" for ``module`` itself).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    _unfuse_plain_mlps(module)
    restored = []
    for name, layer in module.named_modules():
        torch_class = _TORCH_CLASS.get(_unparametrized(layer))
        if torch_class is not None and not (isinstance(layer, Linear) and layer.activation):
            _reclass(layer, _TORCH_CLASS.__getitem__)
            _FELL_BACK.discard(layer)
            restored.append(name)
    return restored


def _gated_kernel_takes_bias() -> bool:
    """Whether the gated kernel (both its tiles are the sm90 family's) takes a bias in calls
    (``host.fuses_epilogues``: ``GATED_BIAS_FAMILIES``)."""
    from .host import fuses_epilogues

    return fuses_epilogues("sm90", gated=True, bias=True)


def _fuses_gated_grad(x: torch.Tensor) -> bool:
    """Whether a kernel on ``x``'s GPU fuses the gated unit's gradient into the down
    projection's input-gradient GEMM (``host.fuses_gated_grad``: ``DGATED_FAMILIES``)."""
    return x.is_cuda and _gpu_fuses(x.device, "gated")


def _fuses_act_grad(x: torch.Tensor) -> bool:
    """Whether a kernel on ``x``'s GPU fuses an activation's gradient into the down
    projection's input-gradient GEMM (``host.fuses_act_grad``: ``DACT_FAMILIES``)."""
    return x.is_cuda and _gpu_fuses(x.device, "plain")


@torch.compiler.assume_constant_result
def _gpu_fuses(device: torch.device, mlp: str) -> bool:
    """Whether the sm90 kernels of an MLP's fused training step (``mlp``: "gated" or "plain")
    run on a CUDA device: a constant of the device and the registry, so torch.compile asks it
    once while tracing (no graph break on the capability query)."""
    from .host import BACKENDS, fuses_act_grad, fuses_gated_grad
    from .host.dispatch import DISPATCHER

    if not {"gated": fuses_gated_grad, "plain": fuses_act_grad}[mlp]("sm90"):
        return False
    return BACKENDS["sm90"].supports(DISPATCHER.devices.capability(DISPATCHER.device_index(device)))


def _fused_step_runs(x: torch.Tensor, up: nn.Module, down: nn.Module, fuses) -> bool:
    """Whether an MLP's fused training step runs this forward: a gradient to compute (asked
    first: an inference forward asks nothing else), a kernel that fuses the unit's gradient on
    ``x``'s GPU (``fuses``), no torch.func transform, and both projections the module's own
    plain layers (``_plain_layer``: the step bypasses their forward) on wsgemm in one half
    dtype (after CUDA autocast)."""
    params = (up.weight, down.weight, up.bias, down.bias)
    if not (torch.is_grad_enabled() and (x.requires_grad or any(
            p is not None and p.requires_grad for p in params))):  # fmt: skip
        return False
    if not fuses(x) or _transformed() or not (_plain_layer(up) and _plain_layer(down)):
        return False
    if not (_runs_on_wsgemm(x, up.weight) and _runs_on_wsgemm(x, down.weight)):
        return False
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    kinds = {autocast_dtype(p, dtype) if dtype else p.dtype for p in params if p is not None}
    return len(kinds) == 1


def _plain_layer(layer: nn.Module) -> bool:
    """A ``Linear`` itself (not a subclass, not restored to ``nn.Linear``) without an
    activation of its own or hooks (``_hooked``): a road that bypasses its forward computes
    what it would."""
    return type(layer) is Linear and layer.activation is None and not _hooked(layer)


class GatedMLP(nn.Module):
    """A gated MLP: ``down_proj(act(x @ w_gate.T) * (x @ w_up.T))`` (Llama's, Qwen's, Mistral's
    SwiGLU with ``activation="silu"``; Gemma's GeGLU with "gelu_tanh").

    ``gate_up_proj`` holds both projections in one weight, the gate's ``ffn`` rows then the up
    projection's (2 * ffn, hidden): its product runs as one GEMM whose epilogue writes only
    ``act(gate) * up`` (``wsgemm.gated_linear``); ``down_proj`` is a ``Linear``. A model with
    separate gate and up weights loads into it with ``torch.cat([w_gate, w_up])``. With
    ``bias=True`` the projections have biases (``gate_up_proj.bias`` is ``[b_gate; b_up]``),
    which ``gated_linear`` adds before the unit where its gated kernel takes a bias
    (``GATED_BIAS_FAMILIES``: Hopper); elsewhere torch's road runs them. The gated kernel reads
    ``gate_up_proj``'s weight in place of calling it, so it runs only while that is this
    module's own plain ``Linear`` without hooks; else ``gate_up_proj(x)``, then the unit
    (in fp32, rounded once; in float64 for a float64 product)."""

    def __init__(self, hidden: int, ffn: int, activation: str = "silu", bias: bool = False,
                 device=None, dtype=None):  # fmt: skip
        super().__init__()
        if check_activation(activation) == "none":
            raise ValueError("GatedMLP needs an activation ('silu', 'gelu_tanh', ...)")
        self.activation = activation
        self.gate_up_proj = Linear(hidden, 2 * ffn, bias=bias, device=device, dtype=dtype)
        self.down_proj = Linear(ffn, hidden, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        proj = self._modules["gate_up_proj"]  # (read once: a module attribute costs ~1 us)
        w, b = proj.weight, proj.bias
        if self._trains_fused(x):
            down = self.down_proj
            return gated_mlp(x, w, b, down.weight, down.bias, self.activation)
        # with a bias, gated_linear while its gated kernel is off takes an fp32 product: torch's
        # road below reads and writes half the bytes (the product in the inputs' dtype). It
        # bypasses gate_up_proj's call: only for the module's own plain layer, without hooks.
        if (
            _runs_on_wsgemm(x, w) and _plain_layer(proj)
            and (b is None or (_gated_kernel_takes_bias() and b.dtype == w.dtype))
        ):  # fmt: skip
            h = gated_linear(x, w, self.activation, bias=b)
        else:  # torch's road: the product, then act(gate) * up in fp32 (fp64 kept), rounded once
            y = proj(x)
            if y.dtype == torch.float64:  # float64 throughout, as torch's modules compute it
                h = gated_unit_with_grad(self.activation, y)
            elif torch.is_grad_enabled() and y.requires_grad:  # the gradient in three passes
                h = gated_unit_with_grad(self.activation, y.float()).to(y.dtype)
            else:  # two passes after the cast (api.gated.gated_in_torch: the same bits)
                h = gated_in_torch(y, self.activation, y.dtype)
        return self.down_proj(h)

    def _trains_fused(self, x: torch.Tensor) -> bool:
        """Whether this step takes ``wsgemm.gated.gated_mlp`` (the unit's gradient fused into
        the down projection's input-gradient GEMM): ``_fused_step_runs``, and I a multiple of 8
        (the up half's offset)."""
        up, down = self.gate_up_proj, self.down_proj
        return (
            _fused_step_runs(x, up, down, _fuses_gated_grad)
            and not (up.weight.shape[0] // 2) % _VECTOR
        )

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class MLP(nn.Module):
    """A plain MLP: ``down_proj(act(up_proj(x)))`` (GPT-NeoX's, Phi's, Falcon's, BERT's with
    "gelu" or "gelu_tanh"; Nemotron's with "relu2").

    The module holds the activation; ``up_proj`` and ``down_proj`` are plain ``Linear``s (the
    same Parameters and ``state_dict`` keys as two ``nn.Linear``). An inference forward runs
    the up projection with its bias and activation fused into one GEMM's epilogue
    (``wsgemm.linear(..., activation=)``) where wsgemm runs it and ``up_proj`` is this
    module's own plain layer without hooks; else ``act(up_proj(x))`` (after
    ``restore_linear`` too). A training step where the plain MLP's kernels run
    (``wsgemm.mlp.mlp``, ``DACT_FAMILIES``) writes ``h`` and the pre-activation from one
    up-projection kernel and fuses the activation's gradient into the down projection's
    input-gradient GEMM (``torch.ops.wsgemm.linear_preact``, ``act_grad``); elsewhere a
    training step is torch's MLP on wsgemm's products (the product, then torch's activation,
    which autograd saves: nothing recomputed)."""

    def __init__(self, hidden: int, ffn: int, activation: str = "gelu", bias: bool = True,
                 device=None, dtype=None):  # fmt: skip
        super().__init__()
        if check_activation(activation) == "none":
            raise ValueError("MLP needs an activation ('gelu', 'gelu_tanh', 'relu', ...)")
        self.activation = activation
        self.up_proj = Linear(hidden, ffn, bias=bias, device=device, dtype=dtype)
        self.down_proj = Linear(ffn, hidden, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, down = self.up_proj, self.down_proj
        if self._trains_fused(x):
            return _mlp_step(x, up.weight, up.bias, down.weight, down.bias, self.activation)
        if _plain_layer(up) and _runs_on_wsgemm(x, up.weight):
            # bias and activation in the GEMM's epilogue (with a gradient to compute: the
            # product, then torch's activation, which autograd saves)
            return down(linear(x, up.weight, up.bias, self.activation))
        return down(torch_activation(self.activation, up(x)))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def _trains_fused(self, x: torch.Tensor) -> bool:
        """Whether this step takes ``wsgemm.mlp.mlp`` (the activation's gradient fused into
        the down projection's input-gradient GEMM): ``_fused_step_runs``."""
        return _fused_step_runs(x, self.up_proj, self.down_proj, _fuses_act_grad)


# ----------------------------------------------------------------------------- gated MLP fusion

#: An MLP's ``act_fn`` -> the activation's name, by class name (transformers' activation
#: classes too, without importing transformers); nn.GELU by its ``approximate``.
_ACT_CLASSES = {
    "SiLU": "silu", "SiLUActivation": "silu", "ReLU": "relu",
    "GELUTanh": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh",
    "GELUActivation": "gelu", "ReLUSquaredActivation": "relu2",
}  # fmt: skip


def _activation_of(act_fn) -> str | None:
    if isinstance(act_fn, nn.GELU):
        return "gelu_tanh" if act_fn.approximate == "tanh" else "gelu"
    return _ACT_CLASSES.get(type(act_fn).__name__)


def _adjacent(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """The up weight's rows (a bias's entries) follow the gate's in memory, both row-major
    (unit-stride): one [gate; up]."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        return False
    if gate.stride() != up.stride() or gate.stride(-1) != 1:
        return False
    return up.data_ptr() == gate.data_ptr() + gate.shape[0] * gate.stride(0) * gate.element_size()


def _side_by_side(gate: torch.Tensor, up: torch.Tensor) -> None:
    """Point ``gate`` and ``up`` (parameters of one shape) at the two halves of one new buffer
    holding their values, ``[gate; up]`` (a meta tensor's values are none: only the buffer)."""
    with torch.no_grad():
        both = torch.empty((2 * gate.shape[0], *gate.shape[1:]), dtype=gate.dtype,
                           device=gate.device)  # fmt: skip
        if gate.device.type != "meta":
            both[: gate.shape[0]].copy_(gate)
            both[gate.shape[0] :].copy_(up)
    gate.data, up.data = both[: gate.shape[0]], both[gate.shape[0] :]


# ------------------------------------------------------------------ what a fusion may rely on

#: The forwards that compute ``x @ W.T + b`` and nothing else.
_LINEAR_FORWARDS = (nn.Linear.forward, Linear.forward)


def _gemm_layer(layer: nn.Module) -> bool:
    """A layer whose call is ``x @ W.T + b`` and nothing else (``nn.Linear``'s or ``Linear``'s
    forward, no activation of its own, no hooks): a road that reads its weight and bias in
    place of calling it computes what calling it would, and skips nothing."""
    return _unhooked_gemm_layer(layer) and not _global_hooks()


def _unhooked_gemm_layer(layer) -> bool:
    """``_gemm_layer`` but for global hooks (the caller asks about those once)."""
    return (
        isinstance(layer, nn.Linear) and type(layer).forward in _LINEAR_FORWARDS
        and getattr(layer, "activation", None) is None and not _own_hooks(layer)
    )  # fmt: skip


class _Leaves(torch.fx.Tracer):
    """Traces a module's own forward, every submodule call a leaf (a ``call_module`` node)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _traced(owner: nn.Module) -> list[torch.fx.Node] | None:
    """The nodes of ``owner``'s forward traced by ``torch.fx`` (submodule calls as leaves), or
    None where it has no forward of its own or does not trace (control flow on values, ...)."""
    if type(owner).forward is nn.Module.forward:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(_Leaves().trace(owner).nodes)
    except Exception:  # whatever keeps fx from tracing it: the form is not verified
        return None


def _calls_of(owner: nn.Module, nodes: list[torch.fx.Node], module: nn.Module):
    """The nodes that call ``module`` (by identity, whatever name fx gave it)."""
    return [
        n for n in nodes
        if n.op == "call_module" and owner.get_submodule(n.target) is module
    ]  # fmt: skip


_MULS = (operator.mul, torch.mul, torch.Tensor.mul)


def _gated_form(mlp: nn.Module, gate, up, act, down) -> bool:
    """Whether ``mlp``'s own forward is ``down(act(gate(x)) * up(x))`` and nothing else (what
    the fused forward computes in its place), as ``torch.fx`` traces it."""
    nodes = _traced(mlp)
    if nodes is None:
        return False
    inputs = [n for n in nodes if n.op == "placeholder"]
    work = [n for n in nodes if n.op not in ("placeholder", "output")]
    calls = [_calls_of(mlp, nodes, m) for m in (gate, up, act, down)]
    if not inputs or len(work) != 5 or any(len(c) != 1 for c in calls):
        return False
    (g,), (u,), (a,), (d,) = calls
    x, (out,) = inputs[0], [n for n in nodes if n.op == "output"]
    (m,) = [n for n in work if n not in (g, u, a, d)]
    is_mul = (m.op == "call_function" and m.target in _MULS) or (
        m.op == "call_method" and m.target == "mul"
    )
    return (
        is_mul and not m.kwargs and m.args in ((a, u), (u, a))
        and g.args == (x,) and u.args == (x,) and a.args == (g,) and d.args == (m,)
        and not (g.kwargs or u.kwargs or a.kwargs or d.kwargs) and out.args == (d,)
        and not any(n.users for n in inputs[1:])
    )  # fmt: skip


def _plain_form(owner: nn.Module, up: nn.Module, act: nn.Module) -> bool:
    """Whether ``owner``'s forward (the MLP's, or the module's above it that calls its layers)
    calls ``up`` once and ``act`` once, on ``up``'s whole output and nothing else (what moving
    the activation into ``up`` keeps), as ``torch.fx`` traces it."""
    nodes = _traced(owner)
    if nodes is None:
        return False
    ups, acts = _calls_of(owner, nodes, up), _calls_of(owner, nodes, act)
    if len(ups) != 1 or len(acts) != 1:
        return False
    (u,), (a,) = ups, acts
    return a.args == (u,) and not a.kwargs and set(u.users) == {a}


def _owner(modules: Mapping[str, nn.Module], name: str) -> nn.Module | None:
    """The module whose forward runs the MLP ``name``'s layers: the MLP's, or where it has no
    forward of its own (a container), the nearest one above it that has one."""
    while (module := modules.get(name)) is not None:
        if type(module).forward is not nn.Module.forward:
            return module
        if not name:
            return None
        name = name.rpartition(".")[0]
    return None


class _FusedMLP:
    """The forward a fused gated MLP gets (mixed into its own class): ``down_proj(act(gate)
    * up)`` with ``act(gate) * up`` one ``gated_linear`` of the two weights read as one,
    while they stay adjacent in memory, wsgemm runs the call and the layers are still what
    was fused (``_fusion_holds``); the model's own forward otherwise (a CPU tensor, a hook
    on the gate, up or activation, a layer swapped for another). A ``.to()`` (any
    ``Module._apply``) puts the two weights side by side again."""

    def _fusion_holds(self) -> bool:
        """The gate and up projections still plain products without hooks (``_gemm_layer``)
        and ``act_fn`` the activation fused, without hooks: reading the weights computes what
        the model's forward would, and skips no hook."""
        # (every call asks: the module dict read directly, global hooks once)
        modules = self._modules
        act_fn = modules.get("act_fn")
        return (
            _activation_of(act_fn) == self._wsgemm_activation and not _own_hooks(act_fn)
            and _unhooked_gemm_layer(modules.get("gate_proj"))
            and _unhooked_gemm_layer(modules.get("up_proj")) and not _global_hooks()
        )  # fmt: skip

    def _apply(self, fn, recurse=True):
        # .to(), .half(), .cuda(), to_empty(): each Parameter gets its own new tensor; join the
        # two halves again (one copy) so the fused forward still runs after the move
        super()._apply(fn, recurse)
        gate, up = self.gate_proj, self.up_proj
        if isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and gate is not up:
            for g, u in ((gate.weight, up.weight), (gate.bias, up.bias)):
                if _joinable(g, u) and not _adjacent(g, u):
                    _side_by_side(g, u)
        return self

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        gate, up = self.gate_proj.weight, self.up_proj.weight
        b_gate, b_up = self.gate_proj.bias, self.up_proj.bias
        usable_biases = b_gate is None and b_up is None
        if not usable_biases and b_gate is not None and b_up is not None:
            usable_biases = b_gate.dtype == gate.dtype and _adjacent(b_gate, b_up)
        if (
            not args and not kwargs and usable_biases and _adjacent(gate, up)
            and _runs_on_wsgemm(x, gate) and self._fusion_holds()
        ):  # fmt: skip
            params = (gate, up) if b_gate is None else (gate, up, b_gate, b_up)
            if torch.is_grad_enabled() and any(p.requires_grad for p in params):
                # a view through the gate's Parameter would give the up projection's halves
                # no gradient: the two joined by a copy, whose backward splits it to both
                both = torch.cat([gate, up])
                bias = None if b_gate is None else torch.cat([b_gate, b_up])
            else:  # the two read as one where they lie
                both = gate.as_strided((2 * gate.shape[0], gate.shape[1]), gate.stride())
                bias = None if b_gate is None else b_gate.as_strided((2 * b_gate.shape[0],), (1,))
            return self.down_proj(gated_linear(x, both, self._wsgemm_activation, bias=bias))
        return _TORCH_CLASS[type(self)].forward(self, x, *args, **kwargs)

    def __reduce_ex__(self, protocol):
        # its class is made at run time: pickle the torch class, swap the fused one back in
        return _unpickle_fused, (_TORCH_CLASS[type(self)],), self.__getstate__()


def _joinable(g, u) -> bool:
    """Two Parameters ``_side_by_side`` can put in one buffer: distinct, initialized, of one
    shape, dtype and device."""
    return (
        isinstance(g, nn.Parameter) and isinstance(u, nn.Parameter) and g is not u
        and type(g.data) is torch.Tensor and type(u.data) is torch.Tensor  # (no DTensor, ...)
        and not (nn.parameter.is_lazy(g) or nn.parameter.is_lazy(u))
        and g.shape == u.shape and g.dtype == u.dtype and g.device == u.device
    )  # fmt: skip


def _unpickle_fused(torch_class: type) -> nn.Module:
    cls = _fused_class(torch_class)
    return cls.__new__(cls)


def _fused_class(cls: type) -> type:
    if cls not in _SWAPPED:
        fused = type(f"WsgemmFused{cls.__name__}", (_FusedMLP, cls), {"__module__": __name__})
        _SWAPPED[cls], _TORCH_CLASS[fused] = fused, cls
    return _SWAPPED[cls]


def fuse_gated_mlps(module: nn.Module) -> list[tuple[str, str, str]]:
    """Fuse the gated MLPs of ``module`` in place: a submodule with ``gate_proj`` and
    ``up_proj`` (``nn.Linear`` of equal shape, both with a bias or neither, one dtype and
    device, initialized, no
    ``activation`` of their own), ``down_proj`` and an ``act_fn`` wsgemm knows (SiLU, GELU in
    either form, ReLU; transformers' classes too) computes ``act_fn(gate_proj(x)) * up_proj(x)``
    as one ``gated_linear``. It asks no filter: ``replace_linear(fuse_mlp=True)`` fuses only
    the pairs it made (or found) wsgemm layers.

    The fused forward replaces the module's own, so the module must be that form: its forward,
    traced by ``torch.fx`` (submodule calls as leaves), must be exactly
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; a forward that does anything else (a
    scale, a dropout, the activation on the other half) or does not trace stays unfused. Nor
    are MLPs fused whose gate or up projection has a forward of its own (an ``nn.Linear``
    subclass's), hooks (as has the activation), or a second parent. At each eager call the
    fused forward checks that this still holds (no hook added since, no layer swapped for
    another) and runs the model's own forward where it does not; under torch.compile, as of
    the trace (dynamo does not guard on hooks: a hook added after compiling is not seen, as
    for torch's own modules).

    The two weights are copied once into one buffer, ``[gate; up]``, and each ``Parameter``
    is pointed at its half (``param.data``): the same ``Parameter`` objects and ``state_dict``
    keys, no copy per call; the two biases likewise, ``[b_gate; b_up]``. A later ``.to()``
    (``.half()``, ``.cuda()``, ``to_empty()``) joins the moved halves again. The module's
    class gets the fused forward (its own is kept for what the fusion does not cover);
    ``restore_linear`` gives the class back.

    Returns:
        (the MLP's name, its gate's, its up's) for each fused MLP.
    """
    return _fuse_gated_mlps(module, lambda layer: isinstance(layer, nn.Linear))


def _fuse_gated_mlps(
    module: nn.Module, takes: Callable[[nn.Module], bool]
) -> list[tuple[str, str, str]]:
    """``fuse_gated_mlps``, fusing only MLPs whose gate and up layers both pass ``takes``."""
    fused = []
    # a layer under two parents (shared by two MLPs) cannot lie beside both up projections
    parents = Counter(id(child) for parent in module.modules() for child in parent.children())
    for name, mlp in list(module.named_modules()):
        if isinstance(mlp, _FusedMLP):
            continue
        gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
        act_fn, down = getattr(mlp, "act_fn", None), getattr(mlp, "down_proj", None)
        act = _activation_of(act_fn)
        if not (isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and act is not None):
            continue
        if gate is up or not (takes(gate) and takes(up)):
            continue
        # a wsgemm Linear's own activation (the gated product would drop it), a forward of a
        # subclass's own, hooks (the fused forward skips their calls): the model's forward
        if not (_gemm_layer(gate) and _gemm_layer(up)) or _hooked(act_fn):
            continue
        if parents[id(gate)] != 1 or parents[id(up)] != 1:
            continue
        if not isinstance(down, nn.Module):
            continue
        g, u = gate.weight, up.weight
        if not _joinable(g, u) or _misaligned(g) is not None:
            continue  # lazy (no shape before the first forward), shapes, dtypes, devices
        bg, bu = gate.bias, up.bias
        if (bg is None) != (bu is None):
            continue  # one bias and not the other: the model's own forward
        if bg is not None and not (_joinable(bg, bu) and bg.dtype == g.dtype
                                   and bg.device == g.device):  # fmt: skip
            continue
        if not _gated_form(mlp, gate, up, act_fn, down):
            continue  # its forward is not down(act(gate(x)) * up(x)) (or does not trace)
        if not _adjacent(g, u):
            _side_by_side(g, u)
        if bg is not None and not _adjacent(bg, bu):
            _side_by_side(bg, bu)
        mlp._wsgemm_activation = act
        mlp.__class__ = _fused_class(type(mlp))
        prefix = f"{name}." if name else ""
        fused.append((name, f"{prefix}gate_proj", f"{prefix}up_proj"))
    return fused


# ----------------------------------------------------------------------------- plain MLP fusion

#: A plain MLP's (up projection, activation, down projection) attribute names, as models name
#: them: GPT-NeoX's and Falcon's, Phi's and CLIP's, StarCoder2's and GPTBigCode's, Nemotron's.
#: Their forwards apply the activation to the up projection's output and to nothing else.
_PLAIN_MLP_NAMES = (
    ("dense_h_to_4h", "act", "dense_4h_to_h"),
    ("fc1", "activation_fn", "fc2"),
    ("c_fc", "act", "c_proj"),
    ("up_proj", "act_fn", "down_proj"),
)


class FusedActivation(nn.Module):
    """Where a plain MLP's activation was (``fuse_plain_mlps``): the identity, its activation
    now in the up projection's epilogue (``Linear.activation``). ``restore_linear`` puts the
    model's own module back."""

    def __init__(self, original: nn.Module, up: Linear, name: str):
        super().__init__()
        # not submodules: the model's state_dict and named_modules stay as they were
        self.__dict__["_original"], self.__dict__["_up"] = original, up
        self.activation = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self._up
        if isinstance(up, Linear) and up.activation == self.activation:
            if not (up._act_from_fusion and up._returned_product):  # (its call's decision)
                return x  # the up projection applied it
        return self._original(x)  # (its layer restored or changed since: the model's own)

    def extra_repr(self) -> str:
        return f"{self.activation!r}, fused into the up projection's epilogue"


def fuse_plain_mlps(module: nn.Module) -> list[tuple[str, str]]:
    """Fuse the plain MLPs of ``module`` in place: a submodule with an up projection, an
    activation wsgemm knows and a down projection under one of ``_PLAIN_MLP_NAMES`` (GPT-NeoX's
    ``dense_h_to_4h``/``act``/``dense_4h_to_h``, Phi's ``fc1``/``activation_fn``/``fc2``, ...),
    no ``gate_proj`` (a gated MLP: ``fuse_gated_mlps``), whose up projection is a plain wsgemm
    ``Linear`` without an activation, gets the activation in that layer's epilogue
    (``Linear.activation``: with its bias, one GEMM) and a ``FusedActivation`` (the identity) in
    the activation's place. The Parameters and ``state_dict`` are untouched; ``restore_linear``
    undoes it. ``replace_linear(fuse_mlp=True)`` calls it after replacing the layers.

    It finds MLPs by module names and keeps only those whose forward (the MLP's, or for a
    container without one, the nearest module's above it), traced by ``torch.fx`` with
    submodule calls as leaves, calls the up projection once and the activation once, on the
    up projection's whole output, which goes nowhere else: moving the activation into the
    up projection then changes nothing. A forward that puts anything between them (a scale, a
    dropout before the activation), uses the up projection's output elsewhere (a residual),
    calls the activation again, or does not trace stays unfused. Calls from outside that
    forward (another module calling the layers directly) are not seen. A hook added to the
    fused up projection later makes it return the product again (``FusedActivation`` then
    applies the activation), so the hook sees what it would unfused.

    Returns:
        (the MLP's name, its up projection's) for each fused MLP.
    """
    fused = []
    # a layer under two parents (shared by two MLPs) would take both MLPs' activations
    parents = Counter(id(child) for parent in module.modules() for child in parent.children())
    modules = dict(module.named_modules())
    for name, mlp in list(modules.items()):
        if isinstance(getattr(mlp, "gate_proj", None), nn.Module):
            continue
        for up_name, act_name, down_name in _PLAIN_MLP_NAMES:
            up, act = getattr(mlp, up_name, None), getattr(mlp, act_name, None)
            down = getattr(mlp, down_name, None)
            if not _fusable_up(up, parents) or not isinstance(act, nn.Module):
                continue
            if _hooked(act):
                continue  # they would never fire again
            # the whole up output goes through the activation into the down projection (not a
            # gated unit's halves: Moshi's fc1 is twice fc2's input)
            if not isinstance(down, nn.Linear) or down.in_features != up.out_features:
                continue
            activation = _activation_of(act)
            if activation is None:
                continue
            owner = _owner(modules, name)
            if owner is None or not _plain_form(owner, up, act):
                continue  # up's output goes elsewhere too, act runs on more (or no trace)
            up.activation, up._act_from_fusion = activation, True
            setattr(mlp, act_name, FusedActivation(act, up, activation))
            prefix = f"{name}." if name else ""
            fused.append((name, f"{prefix}{up_name}"))
            break
    return fused


def _fusable_up(up, parents: Counter) -> bool:
    """A replaced layer (``Linear``, or the wsgemm class of an ``nn.Linear`` subclass: its
    forward is ``Linear.forward``) without an activation of its own or hooks, under one parent."""
    return (
        isinstance(up, Linear) and type(up) in _TORCH_CLASS and up.activation is None
        and parents[id(up)] == 1 and not _hooked(up)
    )  # fmt: skip


def _unfuse_plain_mlps(module: nn.Module) -> None:
    """``restore_linear``'s first step: each ``FusedActivation`` gives its place back to the
    model's own activation module, and its up projection loses the activation."""
    for mlp in list(module.modules()):
        for attr, child in list(mlp.named_children()):
            if isinstance(child, FusedActivation):
                child._up.activation = None
                child._up.__dict__.pop("_act_from_fusion", None)
                child._up.__dict__.pop("_returned_product", None)
                setattr(mlp, attr, child._original)
