"""Do strided views share memory? Pure arithmetic on (pointer, sizes, strides, item size): no
device memory, no synchronization, so the check is safe inside a CUDA-graph capture and costs
the same for a 1 GiB buffer as for a small one.

The bytes of a view are ``ptr + sum_k i_k * T_k`` over its dims (strides ``T_k`` in bytes,
``0 <= i_k < size_k``), one more dim being the bytes of an element. Two views x and y share a
byte iff some ``u_k = j_k - i_k`` with ``-(size_x_k - 1) <= u_k <= size_y_k - 1`` solves
``sum_k u_k * T_k = ptr_x - ptr_y``: a bounded integer equation. ``_solvable`` searches it depth
first, largest stride first, bounding each step by what the smaller strides can still reach.

Exact and quick (a few steps per dim) when the views share their strides: views of one buffer
(row blocks, column blocks such as the Q, K and V of a fused projection, batches), which is
also how two views' address ranges come to interleave at all. Views whose ranges do not meet are
decided before any search. For other layouts the search is still exact unless it would take
more than ``WORK_LIMIT`` steps; then the answer is "they overlap" (conservative: a false alarm
asks for a separate output tensor, never gives a wrong result).
"""

from __future__ import annotations

import torch

WORK_LIMIT = 256  # search steps before giving up with "overlap" (pathological layouts only)

Dims = tuple[tuple[int, int], ...]  # (stride in bytes, size) per dim


def byte_dims(sizes, strides, itemsize: int) -> Dims:
    """The view's dims in bytes, element bytes included, without the dims that add nothing
    (size 1, or stride 0: every index lands on the same bytes). A unit-stride dim and the
    element's bytes make one contiguous run."""
    dims = []
    run = itemsize
    for size, stride in zip(sizes, strides, strict=True):
        if size == 1 or stride == 0:
            continue
        if stride == 1 and run == itemsize:
            run = size * itemsize
        else:
            dims.append((stride * itemsize, size))
    dims.append((1, run))
    return tuple(dims)


def extent(sizes, strides, itemsize: int) -> int:
    """Bytes from the view's first byte to one past its last (0 for an empty view)."""
    if any(s == 0 for s in sizes):
        return 0
    return (sum((s - 1) * st for s, st in zip(sizes, strides, strict=True)) + 1) * itemsize


def _solvable(terms: list[tuple[int, int, int]], target: int) -> bool | None:
    """Is there an integer u with lo_k <= u_k <= hi_k and sum_k u_k * T_k == target?
    ``terms`` are (T_k > 0, lo_k, hi_k) with distinct T_k. None: undecided within WORK_LIMIT."""
    terms = sorted(terms, reverse=True)
    n = len(terms)
    # reach[k]: the least and greatest sum the dims k.. can make
    reach = [(0, 0)] * (n + 1)
    for k in range(n - 1, -1, -1):
        t, lo, hi = terms[k]
        reach[k] = (reach[k + 1][0] + lo * t, reach[k + 1][1] + hi * t)
    work = 0
    todo = [(0, target)]
    while todo:
        k, rest = todo.pop()
        t, lo, hi = terms[k]
        below_lo, below_hi = reach[k + 1]
        # u * t must leave a remainder the smaller dims can make
        first = max(lo, -((below_hi - rest) // t))
        last = min(hi, (rest - below_lo) // t)
        if first > last:
            continue
        if k == n - 1:
            return True
        work += last - first + 1
        if work > WORK_LIMIT:
            return None
        todo.extend((k + 1, rest - u * t) for u in range(first, last + 1))
    return False


def share_bytes(x: tuple[int, Dims], y: tuple[int, Dims]) -> bool | None:
    """Do views x = (ptr, byte_dims) and y share a byte? None: undecided (see WORK_LIMIT)."""
    (px, dx), (py, dy) = x, y
    bounds: dict[int, list[int]] = {}
    for dims, sign in ((dx, -1), (dy, 1)):
        for stride, size in dims:
            lo_hi = bounds.setdefault(stride, [0, 0])
            lo_hi[0 if sign < 0 else 1] += sign * (size - 1)
    return _solvable([(t, lo, hi) for t, (lo, hi) in bounds.items()], px - py)


def repeats_elements(sizes, strides) -> bool | None:
    """Do two different indices of a view name one element? None: undecided (WORK_LIMIT)."""
    dims = sorted((st, s) for s, st in zip(sizes, strides, strict=True) if s > 1)
    if any(st == 0 for st, _ in dims):
        return True
    reach = 0
    for st, s in dims:  # the usual layouts: each stride passes everything the smaller ones reach
        if st <= reach:
            break
        reach += (s - 1) * st
    else:
        return False
    if len({st for st, _ in dims}) < len(dims):
        return True  # two dims of one stride: (i + 1, j) and (i, j + 1) meet
    # a repeat is a nonzero u with sum u_k * T_k == 0; its first nonzero u_p can be taken > 0
    undecided = False
    for p in range(len(dims)):
        terms = [(st, 1 if k == p else -(s - 1), s - 1) for k, (st, s) in enumerate(dims) if k >= p]
        found = _solvable(terms, 0)
        if found:
            return True
        undecided = undecided or found is None
    return None if undecided else False


def overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Do ``x`` and ``y`` share a byte? Exact where ``share_bytes`` decides, else True."""
    sx, sy = x.shape, y.shape
    ex = extent(sx, x.stride(), x.element_size())
    ey = extent(sy, y.stride(), y.element_size())
    px, py = x.data_ptr(), y.data_ptr()
    if not (ex and ey and px < py + ey and py < px + ex):
        return False
    found = share_bytes(
        (px, byte_dims(sx, x.stride(), x.element_size())),
        (py, byte_dims(sy, y.stride(), y.element_size())),
    )
    return found is not False


def spans(out, a, b, bias=None) -> tuple[int, int, int, int] | None:
    """What a call signature's launcher keeps for the per-call overlap check: the byte
    extents of (out, a, b, bias; 0 without one), or None without ``out``."""
    if out is None:
        return None
    return (*(tensor_extent(t) for t in (out, a, b)), 0 if bias is None else tensor_extent(bias))


def tensor_extent(t) -> int:
    return extent(t.shape, t.stride(), t.element_size())
