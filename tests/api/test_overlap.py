"""The overlap arithmetic (``wsgemm.api.overlap``) against brute force on CPU tensors: every byte
of one view marked in a scratch array, then looked for under the other. Random views of one
buffer, of every stride and offset, with mixed element sizes; the layouts that matter (row and
column blocks, batches) in every position."""

import itertools
import random

import pytest
import torch

from wsgemm.api.overlap import (
    byte_dims,
    extent,
    overlaps,
    repeats_elements,
    share_bytes,
)

BUFFER_BYTES = 512


def marked(buf: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """A byte mask over ``buf``'s storage: 1 under every byte of ``view``."""
    marks = torch.zeros(BUFFER_BYTES, dtype=torch.uint8)
    es = view.element_size()
    marks.as_strided(
        (*view.shape, es), (*(st * es for st in view.stride()), 1), view.storage_offset() * es
    ).fill_(1)
    return marks


def brute_overlap(buf, x, y) -> bool:
    return bool((marked(buf, x) & marked(buf, y)).any())


def brute_repeats(sizes, strides) -> bool:
    offsets = [
        sum(i * st for i, st in zip(index, strides, strict=True))
        for index in itertools.product(*(range(s) for s in sizes))
    ]
    return len(offsets) != len(set(offsets))


def random_view(rng: random.Random, buf16: torch.Tensor) -> torch.Tensor:
    """A random strided view (1-3 dims, strides 0-24, any offset) of ``buf16``'s storage, as
    fp16, or as fp32 (the same bytes read four at a time)."""
    buf = buf16 if rng.random() < 0.7 else buf16.view(torch.float32)
    capacity = buf.numel()
    while True:
        dims = rng.randint(1, 3)
        sizes = [rng.randint(1, 6) for _ in range(dims)]
        strides = [rng.choice([0, 1, 1, 2, 3, 5, 8, 13, 16, 24]) for _ in range(dims)]
        span = sum((s - 1) * st for s, st in zip(sizes, strides, strict=True)) + 1
        if span <= capacity:
            return buf.as_strided(sizes, strides, rng.randint(0, capacity - span))


def as_layout(t: torch.Tensor):
    return (t.data_ptr(), byte_dims(t.shape, t.stride(), t.element_size()))


def test_random_views_match_brute_force():
    rng = random.Random(0)
    buf = torch.zeros(BUFFER_BYTES // 2, dtype=torch.float16)
    undecided = 0
    for _ in range(3000):
        x, y = random_view(rng, buf), random_view(rng, buf)
        truth = brute_overlap(buf, x, y)
        found = share_bytes(as_layout(x), as_layout(y))
        assert found is None or found == truth, (x.shape, x.stride(), y.shape, y.stride())
        undecided += found is None
        assert overlaps(x, y) == (truth if found is not None else True)
    assert undecided < 30, f"{undecided} of 3000 undecided"  # rare, and then conservative


@pytest.mark.parametrize("itemsize_x, itemsize_y", [(2, 2), (2, 4), (4, 2)])
def test_blocks_of_one_buffer_are_decided_exactly(itemsize_x, itemsize_y):
    """Row blocks, column blocks and batch blocks of a (3, 8, 24)-byte-unit buffer, in every
    position and width: never undecided, always right."""
    dtypes = {2: torch.float16, 4: torch.float32}
    base = torch.zeros(BUFFER_BYTES // 4, dtype=torch.float32)
    # each block's bytes marked once (brute force), every pair's overlap one matrix product
    xs = [(cut, _block(base, dtypes[itemsize_x], cut)) for cut in _cuts()]
    ys = [(cut, _block(base, dtypes[itemsize_y], cut)) for cut in _cuts()]
    x_marks = torch.stack([marked(base, x) for _, x in xs]).float()
    y_marks = torch.stack([marked(base, y) for _, y in ys]).float()
    truth = (x_marks @ y_marks.T > 0).tolist()
    for (x_cut, x), row in zip(xs, truth, strict=True):
        for (y_cut, y), brute in zip(ys, row, strict=True):
            found = share_bytes(as_layout(x), as_layout(y))
            assert found is not None
            assert found == brute, (x_cut, y_cut)


def _cuts():
    """(batch slice, row slice, byte-column slice in 4-byte units) of a (3, 8, 4) fp32 grid."""
    for b0, b1 in [(0, 3), (0, 1), (1, 2), (2, 3)]:
        for r0, r1 in [(0, 8), (0, 4), (4, 8), (3, 5)]:
            for c0, c1 in [(0, 4), (0, 1), (1, 3), (3, 4), (2, 4)]:
                yield (b0, b1), (r0, r1), (c0, c1)


def _block(base: torch.Tensor, dtype: torch.dtype, cut) -> torch.Tensor:
    grid = base[: 3 * 8 * 4].view(3, 8, 4).view(dtype)  # fp16 doubles the last dim
    per = grid.shape[2] // 4
    (b0, b1), (r0, r1), (c0, c1) = cut
    return grid[b0:b1, r0:r1, c0 * per : c1 * per]


def test_transposed_views_of_disjoint_column_blocks():
    """out written column-major into the right half of a buffer whose left half is an operand:
    different dims, same byte strides."""
    buf = torch.zeros(8, 32, dtype=torch.float16)
    a = buf[:, :16]
    out = buf[:, 16:].t().contiguous().t()  # a separate buffer: must not overlap
    assert share_bytes(as_layout(a), as_layout(out)) is False
    right = buf[:, 16:]
    assert share_bytes(as_layout(a), as_layout(right)) is False
    assert share_bytes(as_layout(a), as_layout(buf[:, 15:17])) is True


def test_empty_views_overlap_nothing():
    buf = torch.zeros(64, dtype=torch.float16)
    assert not overlaps(buf[:0], buf)
    assert not overlaps(buf, buf.as_strided((0, 4), (4, 1)))
    assert extent((0, 4), (4, 1), 2) == 0


def test_random_strides_repeat_elements_exactly():
    rng = random.Random(1)
    undecided = 0
    for _ in range(3000):
        dims = rng.randint(1, 4)
        sizes = [rng.randint(1, 5) for _ in range(dims)]
        strides = [rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 16]) for _ in range(dims)]
        found = repeats_elements(sizes, strides)
        assert found is None or found == brute_repeats(sizes, strides), (sizes, strides)
        undecided += found is None
    assert undecided == 0


def test_a_search_past_its_budget_says_overlap():
    """Two byte-strided walks through one buffer with co-prime strides (1009 and 1013 bytes),
    three bytes apart: they never meet, but proving it takes more than WORK_LIMIT steps, so the
    answer is the conservative one."""
    buf = torch.zeros(400 * 1013 + 8, dtype=torch.uint8)
    x = buf.as_strided((400, 2), (1009, 1), 0)
    y = buf.as_strided((400, 2), (1013, 1), 3)
    marks = torch.zeros_like(buf)
    marks.as_strided(x.shape, x.stride(), 0).fill_(1)
    assert not marks.as_strided(y.shape, y.stride(), 3).any()  # brute force: disjoint
    assert share_bytes(as_layout(x), as_layout(y)) is None
    assert overlaps(x, y)
