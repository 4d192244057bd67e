"""Split-K on the host, with the existing kernels unchanged: K cut into chunks, each chunk's product
an fp32 partial, the partials summed in a fixed order into C.

The kernel computes ``C[m, n, l] = sum_k A[m, k, l] B[n, k, l]`` over a batch mode L. A chunk of
K is a view of A and B that starts further along K, so the chunks of all batches become one
batched launch of an fp32-output variant: A as ``(M, K / s, L * s)``, B as ``(N, K / s, L * s)``,
C as an ``(M, N, L * s)`` fp32 workspace, without a copy. Then one or two torch kernels add the
``s`` partials of every element and write C (any strides, any output dtype).

Why on the host first: the prototype (docs/perf.md, entry 11) showed the split pays on decode
shapes with few tiles and a long K (the down projections: +0.05 to +0.2x of cuBLAS) without a
kernel change; a split inside the persistent scheduler (issue #10, item 1) saves the extra
kernels later.

Chunks (``plan_chunks``): ``s`` chunks of equal length, a multiple of 8 elements (16 bytes of a
16-bit operand), so every chunk's first element is as aligned as A's and B's first. When K is a
multiple of ``8 * s`` (the only splits the policy chooses, ``host.policy.split_candidates``)
that is one launch. Any other K is handled too, for correctness, with a second launch: the
chunks of the rounded-up length that fit, then the shorter tail chunk with its own K extent;
``s`` larger than K / 8 gives fewer, longer chunks. With L > 1 the chunks of all batches fold
into one batch mode only when each batch starts where the last chunk of the previous one ends
(an M-major A stored batch after batch does; a K-major A does not); otherwise one launch per
chunk, each over the whole batch.

Determinism: each partial is written by exactly one CTA, and the sum adds them in a fixed order
(``torch.add`` for two, ``torch.sum`` over the chunk mode for more, atomics-free), so the same
inputs and split give the same bits on every run. The order differs from an unsplit product,
so a row's bits depend on the split, which the policy picks per problem: batch-invariant mode
never splits (``host.policy``).

Not with ``accumulate=torch.float16``: the policy never splits then (``split_candidates``). The
chunks would each accumulate in fp16 and add in fp32, which is neither the one fp16 running sum
that option promises nor independent of the split.

Memory and streams: the workspace is ``torch.empty`` on the current device, from torch's caching
allocator on the current stream, and everything runs on the current stream: no ``cudaMalloc``
of our own, no host synchronization, nothing to reset between calls. Under CUDA-graph capture
the workspace comes from the graph's private pool, as any tensor a captured op allocates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .support import AB_DTYPES, VECTOR_BYTES, torch_dtype, vector_elems

__all__ = ["Chunks", "plan_chunks", "split_k"]

# A chunk starts on a 16-byte boundary (VECTOR_BYTES along K), as aligned as A's and B's first
# element. The fp32 workspace's rows are padded to 16 bytes too (TMA-storable: strides are
# 16-byte multiples).
_WS_ROW_ALIGN = vector_elems("float32")
_AB_TORCH = tuple(map(torch_dtype, AB_DTYPES))


@dataclass(frozen=True)
class Chunks:
    """K cut as ``count`` chunks of ``length``, then one chunk of ``tail`` (0: none)."""

    length: int
    count: int
    tail: int

    @property
    def total(self) -> int:
        """Partials: one per chunk."""
        return self.count + (self.tail > 0)

    def ranges(self) -> list[tuple[int, int]]:
        """[start, stop) of each chunk along K, in order."""
        out = [(j * self.length, (j + 1) * self.length) for j in range(self.count)]
        if self.tail:
            start = self.count * self.length
            out.append((start, start + self.tail))
        return out


def plan_chunks(k: int, split: int, align: int) -> Chunks:
    """At most ``split`` chunks covering [0, K) once: equal lengths rounded up to ``align``
    elements, the last one shorter when K asks for it."""
    for name, value, low in (("k", k, 1), ("split", split, 1), ("align", align, 1)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < low:
            raise ValueError(f"{name}={value}; it must be >= {low}")
    per_chunk = -(-k // split)
    length = -(-per_chunk // align) * align
    count = k // length
    return Chunks(length, count, k - count * length)


def split_k(kernel, a_mkl, b_nkl, c_mnl, split, clusters, *, a_major: str, b_major: str) -> None:
    """``c_mnl = a_mkl @ b_nkl`` in ``split`` K chunks through ``kernel``, an fp32-output variant.

    Args:
        kernel: ``kernel(a, b, c, clusters)``, the compiled variant with C in fp32 and the
            majors given (what ``host.COMPILE_CACHE.get`` returns); persistent (sm90), so a
            batch mode of any size fits one launch.
        a_mkl: (M, K, L) kernel view of A (``api.plan``'s), 16-bit, unit stride along K
            (``a_major="k"``) or M (``"m"``), other strides and base 16-byte aligned.
        b_nkl: (N, K, L) kernel view of B, unit stride along K (``b_major="k"``) or N (``"n"``).
        c_mnl: (M, N, L) destination, any dtype and strides (the caller's ``out`` itself: the
            reduction writes it directly, so no temporary C is needed).
        split: how many chunks to aim for (``plan_chunks``); 1 still goes through the workspace.
        clusters: what the kernel takes as its resident-cluster count.
    """
    m, k, batch = _check(a_mkl, b_nkl, c_mnl, split, a_major, b_major)
    n = b_nkl.shape[0]
    if c_mnl.numel() == 0:
        return
    if k == 0:
        c_mnl.zero_()
        return
    chunks = plan_chunks(k, split, VECTOR_BYTES // a_mkl.element_size())
    n_pad = -(-n // _WS_ROW_ALIGN) * _WS_ROW_ALIGN
    # (L, chunks, M, N_pad): chunk j of batch l is partial l * chunks + j.
    ws = torch.empty((batch, chunks.total, m, n_pad), dtype=torch.float32, device=c_mnl.device)
    for first, count, length in _launches(a_mkl, b_nkl, chunks):
        kernel(
            _chunk_view(a_mkl, first, count, length, chunks),
            _chunk_view(b_nkl, first, count, length, chunks),
            _partials_view(ws, first, count, n),
            clusters,
        )
    _reduce(ws[..., :n], c_mnl.permute(2, 0, 1))


def _check(a_mkl, b_nkl, c_mnl, split, a_major, b_major) -> tuple[int, int, int]:
    for name, t in (("a_mkl", a_mkl), ("b_nkl", b_nkl), ("c_mnl", c_mnl)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise TypeError(f"{name} must be a 3-D torch.Tensor (rows, cols, L)")
    if a_mkl.dtype not in _AB_TORCH or b_nkl.dtype != a_mkl.dtype:
        raise TypeError(
            f"A and B must both be {' or '.join(AB_DTYPES)}, got {a_mkl.dtype}, {b_nkl.dtype}"
        )
    m, k, batch = a_mkl.shape
    if b_nkl.shape[1:] != (k, batch) or tuple(c_mnl.shape) != (m, b_nkl.shape[0], batch):
        raise ValueError(
            f"shapes do not chain: A (M, K, L) {tuple(a_mkl.shape)}, B (N, K, L) "
            f"{tuple(b_nkl.shape)}, C (M, N, L) {tuple(c_mnl.shape)}"
        )
    if not isinstance(split, int) or isinstance(split, bool) or split < 1:
        raise ValueError(f"split must be an int >= 1, got {split!r}")
    for name, t, major, unit in (("a", a_mkl, a_major, {"k": 1, "m": 0}),
                                 ("b", b_nkl, b_major, {"k": 1, "n": 0})):  # fmt: skip
        if major not in unit:
            raise ValueError(f"{name}_major={major!r}; allowed: {', '.join(unit)}")
        if t.shape[unit[major]] > 1 and t.stride(unit[major]) != 1:
            raise ValueError(
                f"{name}_major={major!r} but its mode {unit[major]} has stride "
                f"{t.stride(unit[major])}: pass the kernel view the plan made"
            )
    return m, k, batch


def _launches(a_mkl, b_nkl, chunks: Chunks) -> list[tuple[int, int, int]]:
    """(first chunk, chunks, their length) per launch: the equal chunks folded into the batch
    mode where the strides allow, then the tail chunk on its own."""
    batch = a_mkl.shape[2]
    foldable = batch == 1 or (
        chunks.tail == 0
        and all(t.stride(2) == chunks.count * chunks.length * t.stride(1) for t in (a_mkl, b_nkl))
    )
    if foldable:
        launches = [(0, chunks.count, chunks.length)] if chunks.count else []
    else:
        launches = [(j, 1, chunks.length) for j in range(chunks.count)]
    if chunks.tail:
        launches.append((chunks.count, 1, chunks.tail))
    return launches


def _chunk_view(t: torch.Tensor, first: int, count: int, length: int, chunks: Chunks):
    """(rows, length, L * count) view of chunks first .. first + count - 1 of ``t`` (rows, K, L),
    batch-major: index l * count + j. With count > 1 the batches are either one (L == 1) or
    spaced exactly ``count`` chunks apart (``_launches``)."""
    rows, _, batch = t.shape
    step = chunks.length * t.stride(1)  # one chunk further along K
    if count == 1:
        shape, stride = (rows, length, batch), (t.stride(0), t.stride(1), t.stride(2))
    else:
        shape, stride = (rows, length, batch * count), (t.stride(0), t.stride(1), step)
    return t.as_strided(shape, stride, t.storage_offset() + first * step)


def _partials_view(ws: torch.Tensor, first: int, count: int, n: int) -> torch.Tensor:
    """(M, N, L * count) N-major fp32 view of the workspace slots of chunks first .. first +
    count - 1, numbered as ``_chunk_view`` numbers them (l * count + j)."""
    batch, total, m, n_pad = ws.shape
    slot = m * n_pad
    # count > 1 only when batch == 1 or count == total: then slot l * count + j is one stride.
    step = slot if count > 1 else total * slot
    size = batch * count
    return ws.as_strided((m, n, size), (n_pad, 1, step), ws.storage_offset() + first * slot)


def _reduce(parts: torch.Tensor, c_lmn: torch.Tensor) -> None:
    """c = sum over the chunk mode of ``parts`` (L, chunks, M, N), added in fp32 in a fixed order
    and rounded once to C's dtype. ``torch.sum(out=half)`` would round each partial to half
    first, so for more than two partials the fp32 sum is its own step."""
    total = parts.shape[1]
    if total == 1:
        c_lmn.copy_(parts[:, 0])
    elif total == 2:
        torch.add(parts[:, 0], parts[:, 1], out=c_lmn)  # fp32 add, one rounding on store
    elif c_lmn.dtype == torch.float32:
        torch.sum(parts, dim=1, out=c_lmn)
    else:
        c_lmn.copy_(parts.sum(dim=1))
