"""Every check of ``matmul``, as pure functions of its arguments, in two layers:

* ``check_static``: what the arguments' metadata says alone (types, layouts, dtypes, torch.matmul's
  shapes for any number of dimensions, ``out``'s dtype and shape, the backend): it runs on fake
  and meta tensors, and the torch op (``wsgemm.ops``) checks its calls with it;
* ``validate``: the core's call (2-D and 3-D operands): ``check_static``, then ``out``'s memory,
  the split, grad mode, negative views, the devices and (last, reading data pointers) overlap.

Both read tensor attributes and raise; they query no device, pick no backend and allocate
nothing, so a rejected call leaves nothing behind and every check but the device's runs on the
CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import is_fake

from .. import host, support
from ..support import ACCUMULATOR_RULE, accumulator_allowed
from .epilogue import PLAIN, Epilogue, check_epilogue
from .overlap import overlaps, repeats_elements

# torch dtype -> its name in the host's vocabulary (support.AB_DTYPES etc. are the one list of
# what is allowed)
AB_DTYPES = {getattr(torch, name): name for name in support.AB_DTYPES}
C_DTYPES = {getattr(torch, name): name for name in support.C_DTYPES}
ACC_DTYPES = {getattr(torch, name): name for name in support.ACC_DTYPES}
#: Inputs no wsgemm kernel multiplies that ``backend="auto"`` hands to torch.matmul
#: (``api.fallback``); a named backend refuses them.
TORCH_AB_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def dtype_list(dtypes) -> str:
    """``"torch.float16, torch.bfloat16"``: the allowed dtypes in an error message."""
    return ", ".join(str(d) for d in dtypes)


@dataclass(frozen=True)
class Problem:
    """A validated call: what every backend computes."""

    batch: int | None  # L after broadcasting (may be 0); None for a 2-D @ 2-D call
    m: int
    n: int
    k: int
    ab_dtype: torch.dtype
    c_dtype: torch.dtype
    acc_dtype: torch.dtype
    # the fused epilogue in the caller's terms (a "col" bias runs along N); plain by default
    epilogue: Epilogue = PLAIN
    # ``epilogue.scale``'s alpha and ``epilogue.residual``'s beta (C is the output itself)
    alpha: float = 1.0
    beta: float = 0.0

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m, self.n) if self.batch is None else (self.batch, self.m, self.n)

    @property
    def dtype_names(self) -> tuple[str, str, str]:
        """(A/B, C, accumulator) in the host's vocabulary (``"float32"`` inputs too: the host
        routes those to torch.matmul)."""
        dtypes = (self.ab_dtype, self.c_dtype, self.acc_dtype)
        return tuple(str(d).removeprefix("torch.") for d in dtypes)


def result_shape(a_shape, b_shape) -> tuple:
    """The shape of ``torch.matmul(a, b)`` for operands of these shapes; raises ValueError where
    torch.matmul refuses. Pure shape arithmetic: symbolic sizes pass through without a guard on
    M or N."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError(
            f"both operands must be at least 1-D, got a: {tuple(a_shape)}, b: {tuple(b_shape)}"
        )
    a_mat = tuple(a_shape) if len(a_shape) > 1 else (1, *a_shape)
    b_mat = tuple(b_shape) if len(b_shape) > 1 else (*b_shape, 1)
    if a_mat[-1] != b_mat[-2]:
        raise ValueError(
            f"inner dimensions differ: a is {tuple(a_shape)} (K={a_mat[-1]}) and b is "
            f"{tuple(b_shape)} (K={b_mat[-2]}); a's last dim must equal b's "
            + ("only dim" if len(b_shape) == 1 else "second-to-last")
        )
    try:
        batch = tuple(torch.broadcast_shapes(a_mat[:-2], b_mat[:-2]))
    except RuntimeError:
        raise ValueError(
            f"batch dimensions do not broadcast: a has {a_mat[:-2]}, b has {b_mat[:-2]}; each "
            "pair (aligned from the right) must be equal or contain a 1, as in torch.matmul"
        ) from None
    rows = a_mat[-2:-1] if len(a_shape) > 1 else ()
    cols = b_mat[-1:] if len(b_shape) > 1 else ()
    return (*batch, *rows, *cols)


def check_kinds(a, b, out, out_dtype, accumulate, backend) -> None:
    """The arguments' Python types: tensors, dtypes and a str, as the torch op's schema takes
    them. The op checks these before torch's dispatcher would refuse with a RuntimeError."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype or None, got {type(out_dtype).__name__}")
    check_accumulate_kind(accumulate)
    check_backend_kind(backend)


def check_accumulate_kind(accumulate) -> None:
    if not isinstance(accumulate, torch.dtype):
        raise TypeError(
            f"accumulate must be a torch.dtype, got {type(accumulate).__name__}; "
            f"allowed: {dtype_list(ACC_DTYPES)}"
        )


def check_backend_kind(backend) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")


def _check_strided(name: str, t: torch.Tensor) -> None:
    """Nested and sparse tensors have no single (sizes, strides) to read."""
    if t.is_nested:
        raise TypeError(f"{name} is a nested tensor; wsgemm multiplies dense (strided) tensors")
    if t.layout != torch.strided:
        raise TypeError(
            f"{name} has layout {t.layout}; wsgemm multiplies dense (torch.strided) tensors "
            f"(convert with {name}.to_dense())"
        )


def check_operands(named, device_types=("cuda",), dim: int | None = None) -> None:
    """Each (name, tensor) of ``named`` (a None tensor skipped: an optional operand) a dense
    ``torch.Tensor``, ``dim``-D where ``dim`` is given, all of one 16-bit dtype and on the
    first's device, a device of ``device_types``; raises what is wrong and what is allowed (the
    fused roads' entry points: ``gated_grad``, ``act_grad``, ``linear_preact``)."""
    for name, t in named:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    present = [(name, t) for name, t in named if t is not None]
    first_name, first = present[0]
    names = ", ".join(name for name, _ in named[:-1]) + f" and {named[-1][0]}"
    for name, t in present:
        _check_strided(name, t)
        if dim is not None and t.dim() != dim:
            raise ValueError(f"{name} must be {dim}-D, got {tuple(t.shape)}")
        if t.dtype != first.dtype or t.dtype not in (torch.float16, torch.bfloat16):
            got = ", ".join(f"{n} {u.dtype}" for n, u in present)
            raise TypeError(f"{names} must share float16 or bfloat16, got {got}")
        if t.device.type not in device_types or t.device != first.device:
            raise ValueError(f"{name} must be a {device_types[0].upper()} tensor on "
                             f"{first_name}'s device, got {t.device}")  # fmt: skip


def c_dtypes(ab_dtype=None) -> dict:
    """The output dtypes of a call with ``ab_dtype`` inputs: the kernels' C dtypes, and for
    inputs that go to torch.matmul (``TORCH_AB_DTYPES``) their own dtype too."""
    if ab_dtype in TORCH_AB_DTYPES:
        return {**C_DTYPES, ab_dtype: TORCH_AB_DTYPES[ab_dtype]}
    return C_DTYPES


def check_out_fits(out: torch.Tensor, expected: tuple, out_dtype, ab_dtype=None) -> None:
    """``out`` has a C dtype of ``ab_dtype`` inputs (``c_dtypes``; ``out_dtype`` if given) and
    the product's shape ``expected``. Shape arithmetic only: the torch op's N-D road checks
    ``out`` with it before folding it."""
    if out_dtype is not None and out.dtype != out_dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype={out_dtype}")
    allowed = c_dtypes(ab_dtype)
    if out.dtype not in allowed:
        raise TypeError(f"out has dtype {out.dtype}; allowed: {dtype_list(allowed)}")
    if tuple(out.shape) != expected:
        raise ValueError(f"out has shape {tuple(out.shape)}; this product needs {expected}")


def check_out_memory(out: torch.Tensor) -> None:
    """No two elements of ``out`` at one address (a kernel's stores would race)."""
    if any(st == 0 and size > 1 for size, st in zip(out.shape, out.stride(), strict=True)):
        raise ValueError(
            f"out has stride 0 along a dimension (strides {tuple(out.stride())}): several "
            "of its elements share one memory location; pass a tensor without overlap"
        )
    if repeats_elements(out.shape, out.stride()) is not False:  # undecided counts as a repeat
        raise ValueError(
            f"out's rows overlap in memory (shape {tuple(out.shape)}, strides "
            f"{tuple(out.stride())}): several of its elements share one memory location; pass "
            "a tensor without overlap"
        )


def _check_dtype_args(ab_dtype: torch.dtype, out_dtype, accumulate) -> None:
    """``out_dtype`` and ``accumulate`` (dtypes or None, ``check_kinds``) against the dtype
    tables and the accumulator rule, for operands of ``ab_dtype`` (inputs that go to
    torch.matmul accumulate in fp32, as it does)."""
    allowed = c_dtypes(ab_dtype)
    if out_dtype is not None and out_dtype not in allowed:
        raise TypeError(
            f"out_dtype={out_dtype}; allowed: None (the input dtype), {dtype_list(allowed)}"
        )
    if accumulate not in ACC_DTYPES:
        raise ValueError(f"accumulate={accumulate}; allowed: {dtype_list(ACC_DTYPES)}")
    if ab_dtype in TORCH_AB_DTYPES and accumulate != torch.float32:
        raise ValueError(
            f"accumulate={accumulate} with {ab_dtype} inputs: no wsgemm kernel multiplies "
            "those, and backend='auto' hands them to torch.matmul, which accumulates in fp32; "
            "pass accumulate=torch.float32"
        )
    if not accumulator_allowed(ab_dtype, accumulate):
        raise ValueError(f"accumulate={accumulate} with {ab_dtype} inputs: {ACCUMULATOR_RULE}")


def check_backend(backend: str, config=None) -> None:
    """``backend`` (a str, ``check_kinds``) is ``"auto"`` or a registered name; ``config``
    (tuning) fits it."""
    if backend not in ("auto", *host.BACKENDS):
        raise ValueError(
            f"backend={backend!r} is not a wsgemm backend; "
            f"allowed: auto, {', '.join(host.BACKENDS)}"
        )
    if config is None:
        return
    if backend == "auto":
        raise ValueError(
            "config= replaces a backend's shipped config, so it needs a named backend, "
            f"got backend='auto'; allowed: {', '.join(host.BACKENDS)}"
        )
    shipped = type(host.BACKENDS[backend].config())
    if not isinstance(config, shipped):
        raise TypeError(
            f"config for backend={backend!r} must be a {shipped.__name__}, "
            f"got {type(config).__name__}"
        )


def check_static(a, b, out, out_dtype, accumulate, backend, config=None) -> tuple:
    """Every check that reads only what a fake or meta tensor has too: the arguments' types,
    dense layouts, the dtypes and the accumulator rule, torch.matmul's shapes (any number of
    dimensions, 1-D operands, broadcast batches), ``out``'s dtype and shape, the backend and
    ``config``. Returns the result's shape (``result_shape``). Reads no strides, devices or
    data."""
    check_kinds(a, b, out, out_dtype, accumulate, backend)
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None:
            _check_strided(name, t)
    # backend="auto" takes fp32 and fp64 inputs too, for torch.matmul (``api.fallback``)
    takes = {**AB_DTYPES, **TORCH_AB_DTYPES} if backend == "auto" else AB_DTYPES
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in takes:
            also = (
                f"; backend='auto' also takes {dtype_list(TORCH_AB_DTYPES)} (for torch.matmul)"
                if t.dtype in TORCH_AB_DTYPES
                else ""
            )
            raise TypeError(
                f"{name} has dtype {t.dtype}; wsgemm multiplies {dtype_list(takes)} operands" + also
            )
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got a: {a.dtype}, b: {b.dtype}")
    shape = result_shape(a.shape, b.shape)
    _check_dtype_args(a.dtype, out_dtype, accumulate)
    if out is not None:
        check_out_fits(out, shape, out_dtype, a.dtype)
    check_backend(backend, config)
    return shape


def check_split(config, accumulate) -> None:
    """A config that splits K (an ``Sm90Config``'s ``split_k``) names a count >= 2 and runs
    with an fp32 accumulator: with ``accumulate=torch.float16`` the product is promised as one
    fp16 running sum over all of K, which partial sums added in fp32 are not."""
    split = getattr(config, "split_k", 1)
    ways = getattr(config, "cluster_split", 1)
    if ways > 1 and accumulate != torch.float32:
        raise ValueError(
            f"config.cluster_split={ways} needs accumulate=torch.float32 (got {accumulate}): "
            "the CTAs' partial sums are added in fp32, not one fp16 running sum over K"
        )
    if getattr(config, "stream_k", False):
        if accumulate != torch.float32:
            raise ValueError(
                f"config.stream_k=True needs accumulate=torch.float32 (got {accumulate}): a "
                "tile's parts are added in fp32, not one fp16 running sum over K"
            )
        return
    if split == 1:
        return
    if split == 0:
        raise ValueError(
            "config.split_k=0 names the compiled split-K kernel, whose count comes with each "
            "launch; pass the number of splits (>= 2), or 1 for none"
        )
    if accumulate != torch.float32:
        raise ValueError(
            f"config.split_k={split} needs accumulate=torch.float32 (got {accumulate}): split "
            "partial sums are added in fp32, not one fp16 running sum over K"
        )


def _check_no_grad(a, b, out, bias=None) -> None:
    """The core records no gradients: a silent result without ``grad_fn`` would drop them."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("a", a), ("b", b), ("out", out), ("bias", bias)):
        if t is not None and t.requires_grad:
            raise ValueError(
                f"{name} requires grad and grad mode is on, but wsgemm.api.matmul records no "
                f"gradients; call it under torch.no_grad() or pass {name}.detach()"
            )


def check_devices(a, b, out, device_types: tuple[str, ...] = ("cuda",)) -> None:
    """``a``, ``b`` and ``out`` on one device, of a type in ``device_types`` (the first is the
    kernels': the torch op's fake road takes "meta" too, tensors that are shapes alone)."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.device.type not in device_types:
            raise ValueError(
                f"{name} must be a {device_types[0].upper()} tensor, got a tensor on {t.device}"
            )
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got a: {a.device}, b: {b.device}")
    if out is not None and out.device != a.device:
        raise ValueError(f"out is on {out.device}, the operands on {a.device}")


def check_no_overlap(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias=None) -> None:
    """``out`` shares no byte with ``a``, ``b`` or ``bias`` (a kernel reading what it writes
    would read garbage). Arithmetic only (``overlap.py``): exact for disjoint address ranges and
    for views of one buffer with the same strides, conservative for the rest."""
    if out.device.type == "meta" or is_fake(out):
        return  # no memory to share (``explain`` on meta or fake tensors)
    for name, t in (("a", a), ("b", b), ("bias", bias)):
        if t is not None and overlaps(out, t):
            raise ValueError(f"out overlaps {name} in memory; pass a separate output tensor")


def validate(
    a,
    b,
    out,
    out_dtype,
    accumulate,
    backend,
    config=None,
    *,
    device_type: str = "cuda",
    bias=None,
    activation=None,
    scalars=None,
    c_tensor: bool = False,
) -> Problem:
    """Every check of ``matmul``, in the order a reader would ask them. Raises, never allocates.
    ``scalars``: (alpha, beta, residual) of a call with ``alpha != 1`` or a residual (its C in
    ``out`` by the time it runs, or with ``c_tensor`` a tensor of its own that the kernel
    reads: ``dispatch.call_scaled``), else None.

    The core's one rule beyond ``check_static``'s first: 2-D or 3-D operands. The device checks
    come after everything readable on any device (so the CPU tests reach them) and before the
    one check that reads data pointers (meta tensors have none). ``device_type`` is where the
    kernels run: a stand-in dispatcher (tests, the host-overhead benchmark) runs them on the
    CPU.
    """
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, torch.Tensor) and t.dim() not in (2, 3):
            raise ValueError(
                f"{name} must be 2-D (rows, cols) or 3-D (batch, rows, cols), got {t.dim()}-D "
                f"with shape {tuple(t.shape)}"
            )
    shape = check_static(a, b, out, out_dtype, accumulate, backend, config)
    if out is not None:
        check_out_memory(out)
    check_split(config, accumulate)
    _check_no_grad(a, b, out, bias if isinstance(bias, torch.Tensor) else None)
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.is_neg():
            raise ValueError(
                f"{name} is a negative view (is_neg()), which the kernels cannot honour; "
                f"pass {name}.resolve_neg()"
            )
    check_devices(a, b, out, (device_type,))
    epilogue = check_epilogue(bias, activation, a.dtype, shape, a.device)
    alpha, beta = 1.0, 0.0
    if scalars is not None:
        alpha, beta, residual = scalars
        epilogue = dataclasses.replace(
            epilogue, scale=alpha != 1.0, residual=residual, c_tensor=residual and c_tensor
        )
    if bias is not None and bias.is_neg():
        raise ValueError("bias is a negative view (is_neg()); pass bias.resolve_neg()")
    if out is not None:
        check_no_overlap(out, a, b, bias)
    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = shape[0] if len(shape) == 3 else None  # torch.matmul's broadcast of L (may be 0)
    c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    return Problem(batch, m, n, k, a.dtype, c_dtype, accumulate, epilogue, alpha, beta)
