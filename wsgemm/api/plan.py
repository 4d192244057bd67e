"""The torch-facing operation: validation, layout detection, dispatch.

``matmul`` means what ``torch.matmul`` means for 2-D and 3-D operands. Its job here is to turn any
valid input into what a kernel takes (see ``wsgemm.kernels``): A as (M, K, L), B as (N, K, L) and C
as (M, N, L), each with one unit-stride mode, 16-byte aligned base and 16-byte multiple strides.
Operands that already are so are passed as views, without a copy; others are copied once into an
aligned, zero-padded buffer. Every check runs before anything is allocated or launched, so a
rejected call leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass

import torch

from . import host

# torch dtype -> the host's name for it (host.AB_DTYPES etc. are the one list of what is allowed)
_AB_DTYPES = {getattr(torch, name): name for name in host.AB_DTYPES}
_C_DTYPES = {getattr(torch, name): name for name in host.C_DTYPES}
_ACC_DTYPES = {getattr(torch, name): name for name in host.ACC_DTYPES}


def _names(dtypes) -> str:
    return ", ".join(str(d) for d in dtypes)


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """A validated call: sizes, dtypes, the backend that will run it."""

    batch: int | None  # L after broadcasting (may be 0); None for a 2-D @ 2-D call
    m: int
    n: int
    k: int
    ab_dtype: torch.dtype
    c_dtype: torch.dtype
    acc_dtype: torch.dtype
    backend: str

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m, self.n) if self.batch is None else (self.batch, self.m, self.n)


def _check_operand(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in (2, 3):
        raise ValueError(
            f"{name} must be 2-D (rows, cols) or 3-D (batch, rows, cols), got {t.dim()}-D "
            f"with shape {tuple(t.shape)}"
        )
    if t.dtype not in _AB_DTYPES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; wsgemm multiplies {_names(_AB_DTYPES)} operands"
        )


@functools.cache
def _device_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def available_backends(device=None) -> list[str]:
    """The backends that run on ``device`` (default: the current CUDA device), best first."""
    if not torch.cuda.is_available():
        return []
    cc = _device_capability(
        torch.device("cuda", torch.cuda.current_device())
        if device is None
        else torch.device(device)
    )
    return [n for n in host.shipped_backends() if host.BACKENDS[n].supports(cc)]


# Cooperative tiles fewer than SMs / this leave most of the machine idle (see auto_sm90).
_IDLE_SM_FRACTION = 2


def auto_sm90(m: int, n: int, batch: int, sm_count: int, names) -> str:
    """Cooperative 128x256 tiles unless they would leave most SMs idle: then ping-pong, whose
    128x128 tiles are twice as many. Measured on the H200 (docs/perf.md, entry 5): at 128 tokens
    ping-pong wins the QKV, O and down projections (24 or 16 cooperative tiles, 0.33-0.53x ->
    0.58-0.70x of cuBLAS) and loses gate/up (112 tiles, 0.75x -> 0.60x)."""
    config = host.BACKENDS["sm90"].config()
    tiles = -(-m // config.tile_m) * -(-n // config.tile_n) * (batch or 1)
    if tiles < sm_count // _IDLE_SM_FRACTION and "sm90-pingpong" in names:
        return "sm90-pingpong"
    return names[0]


def _pick_backend(backend, device: torch.device, m: int, n: int, batch: int) -> str:
    cc = _device_capability(device)
    if cc < (8, 0):
        raise ValueError(
            f"{torch.cuda.get_device_name(device)} is sm_{cc[0]}{cc[1]}; wsgemm needs an "
            "sm_80 or newer GPU (cp.async and bf16 tensor cores)"
        )
    if backend == "auto":
        family = "sm90" if cc == (9, 0) else "sm80"
        names = host.shipped_backends(family)
        if not names:
            raise NotImplementedError(
                f"no {family} backend is built into this wsgemm for sm_{cc[0]}{cc[1]} yet"
            )
        if family == "sm90":
            return auto_sm90(m, n, batch, _sm_count(device), names)
        return names[0]
    if not host.BACKENDS[backend].supports(cc):
        raise ValueError(
            f"backend={backend!r} needs "
            + ("an sm_90 (Hopper) GPU" if host.BACKENDS[backend].family == "sm90" else "sm_80+")
            + f"; {torch.cuda.get_device_name(device)} is sm_{cc[0]}{cc[1]}"
        )
    if backend not in host.shipped_backends():
        raise NotImplementedError(f"backend {backend!r} is not built into this wsgemm yet")
    return backend


def _batch_of(t: torch.Tensor) -> int | None:
    return t.shape[0] if t.dim() == 3 else None


def validate(a, b, out, out_dtype, accumulate, backend) -> Problem:
    """Every check of ``matmul``, in the order a reader would ask them. Raises, never allocates."""
    _check_operand("a", a)
    _check_operand("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got a: {a.dtype}, b: {b.dtype}")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ValueError(
            f"inner dimensions differ: a is {tuple(a.shape)} (K={k}) and b is {tuple(b.shape)} "
            f"(K={k2}); a's last dim must equal b's second-to-last"
        )
    la, lb = _batch_of(a), _batch_of(b)
    if la is not None and lb is not None and la != lb and 1 not in (la, lb):
        raise ValueError(
            f"batch dimensions differ: a has {la}, b has {lb}; they must be equal or one of "
            "them 1 (broadcast), as in torch.matmul"
        )
    # torch.matmul's broadcast: a batch of 1 (or none) takes the other's, which may be 0
    batch = lb if la is None or la == 1 else la

    if out_dtype is not None and out_dtype not in _C_DTYPES:
        raise TypeError(
            f"out_dtype={out_dtype}; allowed: None (the input dtype), {_names(_C_DTYPES)}"
        )
    if accumulate not in _ACC_DTYPES:
        raise ValueError(f"accumulate={accumulate}; allowed: {_names(_ACC_DTYPES)}")
    if accumulate == torch.float16 and a.dtype != torch.float16:
        raise ValueError(
            f"accumulate=torch.float16 needs float16 inputs, got {a.dtype}: the tensor cores "
            "accumulate bf16 products in fp32 only"
        )
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise TypeError(f"out has dtype {out.dtype} but out_dtype={out_dtype}")
        if out.dtype not in _C_DTYPES:
            raise TypeError(f"out has dtype {out.dtype}; allowed: {_names(_C_DTYPES)}")
        expected = (m, n) if batch is None else (batch, m, n)
        if tuple(out.shape) != expected:
            raise ValueError(f"out has shape {tuple(out.shape)}; this product needs {expected}")
        if any(st == 0 and size > 1 for size, st in zip(out.shape, out.stride(), strict=True)):
            raise ValueError(
                f"out has stride 0 along a dimension (strides {tuple(out.stride())}): several "
                "of its elements share one memory location; pass a tensor without overlap"
            )
        for name, t in (("a", a), ("b", b)):
            if _overlaps(out, t):
                raise ValueError(f"out overlaps {name} in memory; pass a separate output tensor")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend not in ("auto", *host.BACKENDS):
        raise ValueError(
            f"backend={backend!r} is not a wsgemm backend; "
            f"allowed: auto, {', '.join(host.BACKENDS)}"
        )
    # Device checks last, so everything above is checkable (and tested) without a GPU.
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got a: {a.device}, b: {b.device}")
    if out is not None and out.device != a.device:
        raise ValueError(f"out is on {out.device}, the operands on {a.device}")
    c_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    chosen = _pick_backend(backend, a.device, m, n, batch)
    return Problem(batch, m, n, k, a.dtype, c_dtype, accumulate, chosen)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] that ``t`` can touch."""
    if t.numel() == 0:
        return (0, 0)
    lo = t.data_ptr()
    extent = sum((size - 1) * st for size, st in zip(t.shape, t.stride(), strict=True))
    return lo, lo + (extent + 1) * t.element_size()


# Above this many bytes of shared span, an exact overlap test would cost more memory than it is
# worth: such views are reported as overlapping (what torch's own conservative check does).
_EXACT_OVERLAP_LIMIT_BYTES = 1 << 28


def _overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Do ``x`` and ``y`` share a byte? Exact: interleaved views of one buffer (column blocks
    of a fused QKV output, say) do not overlap, though their address ranges do."""
    (x0, x1), (y0, y1) = _span(x), _span(y)
    if not (x0 < y1 and y0 < x1):
        return False
    lo, hi = min(x0, y0), max(x1, y1)
    if hi - lo > _EXACT_OVERLAP_LIMIT_BYTES:
        return True
    # Mark every byte of x in a scratch array over the union of the spans, then look under y.
    marks = torch.zeros(hi - lo, dtype=torch.uint8, device=x.device)

    def bytes_of(t: torch.Tensor) -> torch.Tensor:
        es = t.element_size()
        shape = (*t.shape, es)
        stride = (*(st * es for st in t.stride()), 1)
        return marks.as_strided(shape, stride, t.data_ptr() - lo)

    bytes_of(x).fill_(1)
    return bool(bytes_of(y).any())


# ----------------------------------------------------------------------------- layouts


def _vector(dtype: torch.dtype) -> int:
    return host.VECTOR_BYTES // dtype.itemsize


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _kernel_view(t: torch.Tensor, need_extent: bool) -> tuple[torch.Tensor, str] | None:
    """``t`` is (rows, cols, L). Return a view of the same memory with one unit-stride mode
    ("rows" or "cols" major) and 16-byte multiple other strides, or None if there is none.

    Strides of size-1 modes are meaningless, so they are chosen to fit; a broadcast batch
    (stride 0) is not TMA-addressable and returns None.
    """
    vec = _vector(t.dtype)
    if t.data_ptr() % host.VECTOR_BYTES:
        return None
    rows, cols, batch = t.shape
    for major in (1, 0):  # prefer the K-major / row-major reading when both fit
        minor = 1 - major
        if t.shape[major] != 1 and t.stride(major) != 1:
            continue
        ld = t.stride(minor) if t.shape[minor] != 1 else _round_up(max(t.shape[major], 1), vec)
        if ld % vec or ld == 0:
            continue
        if need_extent and t.shape[major] % vec:
            continue
        if batch == 1:
            bs = _round_up(ld * t.shape[minor], vec)
        else:
            bs = t.stride(2)
            if bs == 0 or bs % vec:
                continue
        stride = [0, 0, bs]
        stride[major], stride[minor] = 1, ld
        view = t if tuple(stride) == t.stride() else t.as_strided(t.shape, stride)
        return view, ("rows" if major == 0 else "cols")
    return None


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Copy (R, C, L) into a zeroed buffer with ``rows`` x ``cols`` per batch, cols the unit-stride
    mode and the row stride a vector multiple. Returns the (rows, cols, L) view; the padding
    (rows past R, cols past C) is zero, which adds nothing to a product."""
    r, c, batch = t.shape
    width = _round_up(max(cols, 1), _vector(t.dtype))
    buf = torch.zeros((batch, rows, width), dtype=t.dtype, device=t.device)
    buf[:, :r, :c].copy_(t.permute(2, 0, 1))
    return buf[:, :, :cols].permute(1, 2, 0)


# A broadcast operand that cannot be folded is copied once per batch (TMA cannot address a
# stride-0 batch). Past this many bytes of copies, one launch per batch is cheaper.
_MAX_BROADCAST_COPY_BYTES = 64 << 20


def _broadcast_copy_bytes(a3: torch.Tensor, b3: torch.Tensor, out3: torch.Tensor) -> int:
    """Bytes ``plan`` would spend expanding the broadcast operands of batched (folded) views."""
    L = out3.shape[0]
    return sum(L * t[0].numel() * t.element_size() for t in (a3, b3) if t.shape[0] < L)


def batched(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """(L, M, K), (L or 1, K, N), (L, M, N) views of a call, with a broadcast B folded away
    where the rows allow it (see ``_fold_broadcast``)."""
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    out3 = out if out.dim() == 3 else out.unsqueeze(0)
    a3, out3 = _fold_broadcast(a3, b3, out3)
    return a3, b3, out3


def _fold_broadcast(a3: torch.Tensor, b3: torch.Tensor, out3: torch.Tensor):
    """(L, M, K) @ (1, K, N) is one (L*M, K) @ (K, N) product when a's and out's rows are evenly
    spaced across the batch: no broadcast (which TMA cannot address) and a larger M."""
    L, m, k = a3.shape
    if b3.shape[0] != 1 or L == 1:
        return a3, out3
    if a3.stride(0) != m * a3.stride(1) or out3.stride(0) != m * out3.stride(1):
        return a3, out3
    a3 = a3.as_strided((1, L * m, k), (L * m * a3.stride(1), a3.stride(1), a3.stride(2)))
    n = out3.shape[2]
    out3 = out3.as_strided((1, L * m, n), (L * m * out3.stride(1), out3.stride(1), out3.stride(2)))
    return a3, out3


@dataclass
class Launch:
    """What one kernel call takes, and where a temporary C goes afterwards."""

    a: torch.Tensor  # (M, K, L)
    b: torch.Tensor  # (N, K, L)
    c: torch.Tensor  # (M, N, L), N-major
    a_major: str
    b_major: str
    copy_back: torch.Tensor | None  # (M, N, L) destination when ``c`` is a temporary

    def finish(self) -> None:
        if self.copy_back is not None:
            n = self.copy_back.shape[1]
            self.copy_back.copy_(self.c[:, :n])


def plan(a3: torch.Tensor, b3: torch.Tensor, out3: torch.Tensor, need_extent: bool) -> Launch:
    """Kernel views of a validated call's ``batched`` views; copies only what the kernel cannot
    address."""
    L = out3.shape[0]
    a_mkl = a3.expand(L, -1, -1).permute(1, 2, 0)
    b_nkl = b3.expand(L, -1, -1).permute(2, 1, 0)
    c_mnl = out3.permute(1, 2, 0)
    m, k, _ = a_mkl.shape
    n = b_nkl.shape[0]
    vec = _vector(a3.dtype)
    # cp.async kernels move whole 16-byte vectors along each unit-stride mode.
    k_kernel = _round_up(k, vec) if need_extent else k
    n_kernel = _round_up(n, vec) if need_extent else n

    view = _kernel_view(a_mkl, need_extent) if k_kernel == k else None
    a_v, a_major = (
        (view[0], "k" if view[1] == "cols" else "m") if view else (_padded(a_mkl, m, k_kernel), "k")
    )
    view = _kernel_view(b_nkl, need_extent) if (k_kernel, n_kernel) == (k, n) else None
    b_v, b_major = (
        (view[0], "k" if view[1] == "cols" else "n")
        if view
        else (_padded(b_nkl, n_kernel, k_kernel), "k")
    )
    view = _kernel_view(c_mnl, need_extent) if n_kernel == n else None
    if view is not None and view[1] == "cols":
        return Launch(a_v, b_v, view[0], a_major, b_major, None)
    c_tmp = torch.empty(
        (L, m, _round_up(n_kernel, _vector(out3.dtype))), dtype=out3.dtype, device=out3.device
    )[:, :, :n_kernel].permute(1, 2, 0)
    return Launch(a_v, b_v, c_tmp, a_major, b_major, c_mnl)


# ----------------------------------------------------------------------------- entry point

MAX_BATCH_PER_LAUNCH = 65535


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def matmul(a, b, *, out=None, out_dtype=None, accumulate=torch.float32, backend="auto"):
    """``a @ b`` on the tensor cores, with torch.matmul's meaning for 2-D and 3-D operands.

    Args:
        a: (M, K) or (L, M, K), float16 or bfloat16, CUDA, any strides.
        b: (K, N) or (L, K, N), same dtype and device as ``a``. A 2-D operand against a 3-D one,
            or a batch of 1 against a batch of L, broadcasts over L as in torch.
        out: optional output written in place; shape (M, N) or (L, M, N); must not overlap
            ``a`` or ``b``.
        out_dtype: float16, bfloat16 or float32; default the input dtype (or ``out.dtype``).
        accumulate: torch.float32 (default, as cuBLAS) or torch.float16 (fp16 inputs only).
        backend: "auto" (the best kernel for the GPU) or one of ``wsgemm.host.BACKENDS``.

    Returns:
        the product, (M, N) or (L, M, N), of ``out_dtype`` (``out`` itself when given).
    """
    p = validate(a, b, out, out_dtype, accumulate, backend)
    return _run(a, b, out, p)


_KERNELS: dict[tuple, tuple] = {}


def _current_device() -> int:
    return torch.cuda.current_device()


def _kernel_for(p: Problem, device: torch.device, a_major: str, b_major: str, config):
    """(compiled kernel, clusters to launch) for a call, memoized off the per-call path."""
    key = (p.backend, device, p.ab_dtype, p.c_dtype, p.acc_dtype, a_major, b_major, config)
    hit = _KERNELS.get(key)
    if hit is None:
        arch = host.arch_for_capability(_device_capability(device))
        dtypes = (_AB_DTYPES[p.ab_dtype], _C_DTYPES[p.c_dtype], _ACC_DTYPES[p.acc_dtype])
        variant = host.Variant(p.backend, arch, *dtypes, a_major, b_major, config)
        clusters = _sm_count(device) // host.cluster_size(variant.kernel_config())
        hit = _KERNELS[key] = (host.COMPILE_CACHE.get(variant), clusters)
    return hit


def _run(a, b, out, p: Problem, config=None):
    """Launch a validated call; ``config`` overrides the backend's shipped config (tuning)."""
    if out is None:
        out = torch.empty(p.out_shape, dtype=p.c_dtype, device=a.device)
    if out.numel() == 0:
        return out
    if p.k == 0:
        return out.zero_()
    a3, b3, out3 = batched(a, b, out)
    if _broadcast_copy_bytes(a3, b3, out3) > _MAX_BROADCAST_COPY_BYTES:
        one = dataclasses.replace(p, batch=None)
        for l_ in range(out3.shape[0]):
            _run(a3[l_ % a3.shape[0]], b3[l_ % b3.shape[0]], out3[l_], one, config)
        return out
    launch = plan(a3, b3, out3, host.needs_vector_extent(p.backend))
    fn, clusters = _kernel_for(p, a.device, launch.a_major, launch.b_major, config)
    L = launch.c.shape[2]
    with (
        contextlib.nullcontext()
        if a.device.index == _current_device()
        else torch.cuda.device(a.device)
    ):
        if L <= MAX_BATCH_PER_LAUNCH:
            fn(launch.a, launch.b, launch.c, clusters)
        else:  # non-persistent kernels put the batch on the grid's z, which holds 65535
            for l0 in range(0, L, MAX_BATCH_PER_LAUNCH):
                batch = slice(l0, l0 + MAX_BATCH_PER_LAUNCH)
                fn(launch.a[:, :, batch], launch.b[:, :, batch], launch.c[:, :, batch], clusters)
        launch.finish()
    return out
