"""From validated torch tensors to what a kernel takes (see ``wsgemm.kernels``): A as (M, K, L),
B as (N, K, L) and C as (M, N, L), each with one unit-stride mode, 16-byte aligned base and 16-byte
multiple strides. Operands that already are so are passed as views, without a copy; others are
copied once into an aligned, zero-padded buffer; a C the kernel cannot write in place is written
to a temporary and copied back. Split-K needs nothing different: it runs inside the kernel
(``wsgemm.host.workspace``), which writes C as it always does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..support import VECTOR_BYTES


def _vector(dtype: torch.dtype) -> int:
    return VECTOR_BYTES // dtype.itemsize


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _kernel_view(
    t: torch.Tensor, need_extent: bool, majors: tuple[int, ...] = (1, 0)
) -> tuple[torch.Tensor, str] | None:
    """``t`` is (rows, cols, L). Return a view of the same memory with one unit-stride mode
    ("rows" or "cols" major, tried in the order of ``majors``: 0 rows, 1 cols) and 16-byte
    multiple other strides, or None if there is none (``_view_or_refusal`` says why).

    Strides of size-1 modes are meaningless, so they are chosen to fit; a broadcast batch
    (stride 0) is not TMA-addressable and returns None.
    """
    found = _view_or_refusal(t, need_extent, majors)
    return None if isinstance(found, str) else found


def _view_or_refusal(
    t: torch.Tensor, need_extent: bool, majors: tuple[int, ...]
) -> tuple[torch.Tensor, str] | str:
    """``_kernel_view``'s search: the view, or why there is none, from the first mode with
    unit stride that failed (``{0}``/``{1}`` stand for the rows' and columns' names)."""
    vec = _vector(t.dtype)
    if t.data_ptr() % VECTOR_BYTES:
        return f"its address is not {VECTOR_BYTES}-byte aligned"
    rows, cols, batch = t.shape
    refusal = None
    for major in majors:  # by default the K-major / row-major reading when both fit
        minor = 1 - major
        if t.shape[major] != 1 and t.stride(major) != 1:
            continue
        ld = t.stride(minor) if t.shape[minor] != 1 else _round_up(max(t.shape[major], 1), vec)
        if ld == 0:
            refusal = refusal or f"its {{{minor}}} mode is broadcast (stride 0)"
            continue
        if ld % vec:
            refusal = refusal or f"its leading dimension, {ld} elements, is not a multiple of {vec}"
            continue
        if need_extent and t.shape[major] % vec:
            refusal = refusal or (
                f"cp.async kernels need its unit-stride mode in whole {VECTOR_BYTES}-byte vectors"
            )
            continue
        if batch == 1:
            bs = _round_up(ld * t.shape[minor], vec)
        else:
            bs = t.stride(2)
            if bs == 0 or bs % vec:
                refusal = refusal or (
                    "its batch is broadcast (stride 0)"
                    if bs == 0
                    else f"its batch stride, {bs} elements, is not a multiple of {vec}"
                )
                continue
        stride = [0, 0, bs]
        stride[major], stride[minor] = 1, ld
        view = t if tuple(stride) == t.stride() else t.as_strided(t.shape, stride)
        return view, ("rows" if major == 0 else "cols")
    if refusal:
        return refusal
    if len(majors) == 1:
        return f"its {{{majors[0]}}} mode does not have unit stride"
    return "neither its {0} nor its {1} mode has unit stride"


def _padded(t: torch.Tensor, rows: int, cols: int, unit: int = 1) -> torch.Tensor:
    """Copy (R, C, L) into a buffer with ``rows`` x ``cols`` per batch whose ``unit`` mode (0
    rows, 1 cols) is the unit-stride one, its leading dimension a vector multiple. Returns the
    (rows, cols, L) view; the padding (rows past R, cols past C) is zero, which adds nothing to
    a product. With ``unit`` the source's own contiguous mode the copy reads and writes along
    the same mode, at memory speed; a transposing copy costs several times as much."""
    r, c, _ = t.shape
    ext, have = (rows, cols), (r, c)
    other = 1 - unit
    shape = _padded_shape(t, rows, cols, unit)
    buf = torch.empty(shape, dtype=t.dtype, device=t.device)
    if have[other] < shape[1]:  # rows past R (cp.async's padded N): zero
        buf[:, have[other] :, :].zero_()
    if have[unit] < shape[2]:  # the leading dimension's padding: zero
        buf[:, : have[other], have[unit] :].zero_()
    buf[:, : have[other], : have[unit]].copy_(t.permute(2, other, unit))
    view = buf[:, :, : ext[unit]]
    return view.permute(1, 2, 0) if unit == 1 else view.permute(2, 1, 0)


def _padded_shape(t: torch.Tensor, rows: int, cols: int, unit: int) -> tuple[int, int, int]:
    """The (L, other mode, unit mode padded to whole vectors) buffer ``_padded`` copies into."""
    ext = (rows, cols)
    return t.shape[2], ext[1 - unit], _round_up(max(ext[unit], 1), _vector(t.dtype))


def _copy_unit(t: torch.Tensor, need_extent: bool) -> int:
    """The mode ``_padded`` makes contiguous: the source's own for TMA kernels, which take
    either major (0 when its rows have unit stride and its columns do not, or it has one column;
    else 1); always 1 (K) for cp.async kernels, whose padded K extent must be whole vectors."""
    if need_extent:
        return 1
    rows_unit = t.stride(0) == 1 and t.shape[0] > 1
    return 0 if rows_unit and (t.stride(1) != 1 or t.shape[1] == 1) else 1


def broadcast_copy_bytes(a3: torch.Tensor, b3: torch.Tensor, out3: torch.Tensor) -> int:
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
    c: torch.Tensor  # (M, N, L): N-major (M-major for swap-AB)
    a_major: str
    b_major: str
    copy_back: torch.Tensor | None  # (M, N, L) destination when ``c`` is a temporary
    copied: bool  # A or B is a padded copy, not a view of the caller's tensor

    @property
    def direct(self) -> bool:
        """All three are views of the caller's tensors: a later call of the same signature can
        rebuild them from its own tensors with one ``as_strided`` each."""
        return not self.copied and self.copy_back is None

    def finish(self) -> None:
        if self.copy_back is not None:
            n = self.copy_back.shape[1]
            self.copy_back.copy_(self.c[:, :n])


@dataclass(slots=True)
class _Decision:
    """What ``plan`` does with each operand of a call: the kernel view of A, B and C where one
    exists (``_kernel_view``'s answer), else None (A or B is copied, C goes through a
    temporary), and the extents the kernel sees."""

    a_mkl: torch.Tensor
    b_nkl: torch.Tensor
    c_mnl: torch.Tensor
    a_view: tuple[torch.Tensor, str] | None
    b_view: tuple[torch.Tensor, str] | None
    c_view: tuple[torch.Tensor, str] | None
    k_kernel: int
    n_kernel: int
    c_mode: int


def _decide(a3, b3, out3, need_extent: bool, c_major: str) -> _Decision:
    L = out3.shape[0]
    a_mkl = a3.expand(L, -1, -1).permute(1, 2, 0)
    b_nkl = b3.expand(L, -1, -1).permute(2, 1, 0)
    c_mnl = out3.permute(1, 2, 0)
    k, n = a_mkl.shape[1], b_nkl.shape[0]
    vec = _vector(a3.dtype)
    # cp.async kernels move whole 16-byte vectors along each unit-stride mode.
    k_kernel = _round_up(k, vec) if need_extent else k
    n_kernel = _round_up(n, vec) if need_extent else n
    a_view = _kernel_view(a_mkl, need_extent) if k_kernel == k else None
    b_view = _kernel_view(b_nkl, need_extent) if (k_kernel, n_kernel) == (k, n) else None
    c_mode = 0 if c_major == "m" else 1
    c_view = _kernel_view(c_mnl, need_extent, (c_mode,)) if n_kernel == n else None
    return _Decision(a_mkl, b_nkl, c_mnl, a_view, b_view, c_view, k_kernel, n_kernel, c_mode)


def plan(
    a3: torch.Tensor,
    b3: torch.Tensor,
    out3: torch.Tensor,
    need_extent: bool,
    *,
    c_major: str = "n",
) -> Launch:
    """Kernel views of a validated call's ``batched`` views; copies only what the kernel cannot
    address. ``c_major``: the unit-stride mode the kernel writes C along, "n" (row-major) or
    "m" (a swap-AB kernel, given the transposed problem: the caller's row-major C read as C^T)."""
    d = _decide(a3, b3, out3, need_extent, c_major)
    a_mkl, b_nkl, c_mnl, k_kernel, n_kernel = d.a_mkl, d.b_nkl, d.c_mnl, d.k_kernel, d.n_kernel
    m, L = a_mkl.shape[0], c_mnl.shape[2]
    if d.a_view:
        a_v, a_major = d.a_view[0], "k" if d.a_view[1] == "cols" else "m"
    else:
        unit = _copy_unit(a_mkl, need_extent)
        a_v, a_major = _padded(a_mkl, m, k_kernel, unit), "k" if unit else "m"
    if d.b_view:
        b_v, b_major = d.b_view[0], "k" if d.b_view[1] == "cols" else "n"
    else:
        unit = _copy_unit(b_nkl, need_extent)
        b_v, b_major = _padded(b_nkl, n_kernel, k_kernel, unit), "k" if unit else "n"
    copied = d.a_view is None or d.b_view is None
    if d.c_view is not None:
        return Launch(a_v, b_v, d.c_view[0], a_major, b_major, None, copied)
    vec_c = _vector(out3.dtype)
    if d.c_mode == 1:
        c_tmp = torch.empty(
            (L, m, _round_up(n_kernel, vec_c)), dtype=out3.dtype, device=out3.device
        )[:, :, :n_kernel].permute(1, 2, 0)
    else:
        c_tmp = torch.empty(
            (L, n_kernel, _round_up(m, vec_c)), dtype=out3.dtype, device=out3.device
        )[:, :, :m].permute(2, 1, 0)
    return Launch(a_v, b_v, c_tmp, a_major, b_major, c_mnl, copied)


def describe(
    a3: torch.Tensor,
    b3: torch.Tensor,
    out3: torch.Tensor,
    need_extent: bool,
    *,
    c_major: str = "n",
    swap: bool = False,
) -> str:
    """What ``plan`` does with each operand, in words and allocating nothing: read (or written)
    in place and along which mode, or copied on every call (into which major, how many bytes,
    and why). ``swap``: the views are swap-AB's (the kernel's A is the caller's ``b``), so the
    words name the caller's operands and modes."""
    d = _decide(a3, b3, out3, need_extent, c_major)
    # (caller's name, its (rows, cols) modes) of the kernel's A, B and C
    names = (
        (("b", "NK"), ("a", "MK"), ("out", "NM"))
        if swap
        else (("a", "MK"), ("b", "NK"), ("out", "MN"))
    )
    a_name, b_name, c_name = names
    said = {}
    m = d.a_mkl.shape[0]
    for (name, modes), t, view, extents in (
        (a_name, d.a_mkl, d.a_view, (m, d.k_kernel)),
        (b_name, d.b_nkl, d.b_view, (d.n_kernel, d.k_kernel)),
    ):
        if view is not None:
            said[name] = f"{name} read in place ({modes[view[1] == 'cols']}-major)"
            continue
        unit = _copy_unit(t, need_extent)
        batch, other, width = _padded_shape(t, *extents, unit)
        size = batch * other * width * t.element_size()
        why = _why(t, modes, need_extent, extents != tuple(t.shape[:2]), (1, 0))
        article = "an" if modes[unit] in "MN" else "a"
        said[name] = (
            f"{name} copied on every call into {article} {modes[unit]}-major buffer "
            f"({_megabytes(size)}: {why})"
        )
    name, modes = c_name
    if d.c_view is not None:
        said[name] = f"{name} written in place ({modes[d.c_mode]}-major)"
    else:
        why = _why(d.c_mnl, modes, need_extent, d.n_kernel != d.c_mnl.shape[1], (d.c_mode,))
        said[name] = f"{name} written to a temporary and copied back on every call ({why})"
    return "operands: " + "; ".join(said[name] for name in ("a", "b", "out"))


def _why(t: torch.Tensor, modes: str, need_extent: bool, padded: bool, majors) -> str:
    """Why ``plan`` finds no kernel view of ``t`` (its (rows, cols) named ``modes``): cp.async's
    padded extents (``padded``: ``plan`` does not look for a view), else ``_kernel_view``'s
    own refusal."""
    if padded:
        return f"cp.async kernels need K (and N) in whole {VECTOR_BYTES}-byte vectors"
    return _view_or_refusal(t, need_extent, majors).format(*modes)


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"
