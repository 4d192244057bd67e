"""Host split-K (wsgemm.splitk): chunk planning, the kernel views, the coverage of K and the
reduction, on the CPU with a stand-in kernel; then (GPU) the real kernels.

The stand-in checks every view against the kernel contract (wsgemm.kernels: one unit-stride mode
per operand, other strides and the base 16-byte aligned, C N-major fp32) and computes its chunk
in fp64. Inputs are small integers, so every product and partial sum is exact in fp32: the
result must equal the fp64 reference rounded once to C's dtype, bit for bit, whatever the order
of the sum.
"""

import itertools
import random

import pytest
import torch
from operands import assert_within_torch_error

from wsgemm.host import policy
from wsgemm.kernels.common.scheduler import tile_order
from wsgemm.kernels.sm90.config import DEFAULT_RASTER_GROUP
from wsgemm.splitk import Chunks, plan_chunks, split_k

# ----------------------------------------------------------------------------- chunk planning


@pytest.mark.parametrize("k", [1, 5, 7, 8, 9, 63, 64, 100, 1021, 4096, 14336])
@pytest.mark.parametrize("split", [1, 2, 3, 4, 8, 16])
def test_chunks_cover_k_once_with_aligned_starts(k, split):
    c = plan_chunks(k, split, 8)
    ranges = c.ranges()
    assert ranges[0][0] == 0 and ranges[-1][1] == k
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(ranges))
    assert all(start % 8 == 0 for start, _ in ranges)
    assert 1 <= c.total <= split and c.length % 8 == 0
    assert all(stop - start == c.length for start, stop in ranges[: c.count])
    assert 0 <= c.tail < c.length


def test_policy_splits_are_one_launch_of_equal_chunks():
    # Every split > 1 the policy offers is cut by plan_chunks into equal chunks, no tail.
    e = policy.entry("pingpong-64x128-c1x2")
    for k in (4096, 14336, 28672, 1000, 1021, 8, 64):
        for s in policy.split_candidates(e, 16, 4096, k, 1, 132)[1:]:
            assert plan_chunks(k, s, 8) == Chunks(k // s, s, 0)


@pytest.mark.parametrize("bad", [dict(k=0), dict(split=0), dict(align=0), dict(split=2.0)])
def test_plan_chunks_rejects(bad):
    args = dict(k=64, split=2, align=8) | bad
    with pytest.raises((ValueError, TypeError)):
        plan_chunks(**args)


# ----------------------------------------------------------------------------- stand-in kernel


def _kernel_operand(rows, k, batch, k_major, dtype, gen, offset):
    """(rows, K, L) view with the plan's strides: a 16-byte-multiple leading dimension (padded
    by 8 more elements half the time), batches one after another, ``offset`` elements in."""
    inner, outer = (k, rows) if k_major else (rows, k)
    ld = -(-inner // 8) * 8 + 8 * gen.randint(0, 1)
    torch_gen = torch.Generator().manual_seed(gen.randint(0, 2**31))
    values = torch.randint(-3, 4, (offset + batch * outer * ld,), generator=torch_gen).to(dtype)
    buf = values[offset:].view(batch, outer, ld)[:, :, :inner]
    return buf.permute(1, 2, 0) if k_major else buf.permute(2, 1, 0)


class StandIn:
    """An fp32-output kernel variant: checks the contract, records each launch, computes."""

    def __init__(self, a_major, b_major):
        self.units = {"a": 1 if a_major == "k" else 0, "b": 1 if b_major == "k" else 0}
        self.launches = []

    def __call__(self, a, b, c, clusters):
        for name, t in (("a", a), ("b", b), ("c", c)):
            unit = 1 if name == "c" else self.units[name]
            assert t.shape[unit] == 1 or t.stride(unit) == 1, f"{name} lost its major mode"
            aligned = [1 - unit] + ([2] if t.shape[2] > 1 else [])
            assert all(t.stride(d) * t.element_size() % 16 == 0 for d in aligned), name
            assert t.storage_offset() * t.element_size() % 16 == 0, f"{name} base unaligned"
        assert c.dtype == torch.float32 and a.shape[2] == b.shape[2] == c.shape[2]
        assert a.shape[1] == b.shape[1] >= 1
        self.launches.append((a, b, c))
        c.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()))


def _cases(seed=2026, count=64):
    rng = random.Random(seed)
    for _ in range(count):
        yield dict(
            m=rng.choice([1, 3, 17, 64, 130]),
            n=rng.choice([1, 8, 24, 33]),
            k=rng.choice([1, 5, 8, 16, 100, 640, 1021, 2048]),
            batch=rng.choice([1, 1, 2, 3]),
            split=rng.choice([1, 2, 3, 4, 8, 16]),
            a_major=rng.choice("km"),
            b_major=rng.choice("kn"),
            ab=rng.choice([torch.float16, torch.bfloat16]),
            c=rng.choice([torch.float16, torch.bfloat16, torch.float32]),
            offset=rng.choice([0, 8]),
            c_col_major=rng.random() < 0.25,
        )


def _run(case, seed):
    gen = random.Random(seed)
    m, n, k, batch = case["m"], case["n"], case["k"], case["batch"]
    a = _kernel_operand(m, k, batch, case["a_major"] == "k", case["ab"], gen, case["offset"])
    b = _kernel_operand(n, k, batch, case["b_major"] == "k", case["ab"], gen, case["offset"])
    # C is the caller's out: N-major, or column-major (the reduction writes any strides).
    shape = (batch, n, m) if case["c_col_major"] else (batch, m, n)
    out = torch.full(shape, float("nan"), dtype=case["c"])
    c = out.permute(2, 1, 0) if case["c_col_major"] else out.permute(1, 2, 0)
    kernel = StandIn(case["a_major"], case["b_major"])
    split_k(kernel, a, b, c, case["split"], 66, a_major=case["a_major"], b_major=case["b_major"])
    return a, b, c, kernel


@pytest.mark.parametrize("index", range(64))
def test_split_k_is_exact_and_writes_every_element(index):
    case = list(_cases())[index]
    a, b, c, _ = _run(case, index)
    want = torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype)
    assert torch.equal(c, want), case


def _k_ranges(view, base, k):
    """For each batch index q of a chunk view of ``base`` (rows, K, L): (l, first k, last k + 1)."""
    out = []
    bs, sk = base.stride(2), base.stride(1)
    for q in range(view.shape[2]):
        offset = view.storage_offset() + q * view.stride(2) - base.storage_offset()
        l_, rest = divmod(offset, bs) if base.shape[2] > 1 else (0, offset)
        assert rest % sk == 0
        first = rest // sk
        assert 0 <= first and first + view.shape[1] <= k
        out.append((l_, first, first + view.shape[1]))
    return out


@pytest.mark.parametrize("index", range(64))
@pytest.mark.parametrize("name", ["pingpong-64x128-c1x2", "sm90"])
def test_work_units_cover_each_output_tile_k_range_once(index, name):
    """The coverage model: replay each launch's persistent schedule (the kernel's own tile order)
    over its (M, N, L * chunks) problem; map each work unit to its output tile and K range; every
    output tile of every batch must see [0, K) exactly once, A and B the same range."""
    case = list(_cases())[index]
    a, b, c, kernel = _run(case, index)
    e = policy.entry(name)
    m, k, batch = a.shape
    num_m, num_n = -(-m // e.tile_m), -(-b.shape[0] // e.tile_n)
    seen = {}
    for a_v, b_v, _ in kernel.launches:
        ranges = _k_ranges(a_v, a, k)
        assert ranges == _k_ranges(b_v, b, k)
        group = DEFAULT_RASTER_GROUP[e.config["schedule"]]
        order = tile_order(num_m, num_n, len(ranges), group, 8, e.cluster)
        for tm, tn, q in (t for per_cta in order for t in per_cta):
            if tm < num_m and tn < num_n:
                l_, lo, hi = ranges[q]
                seen.setdefault((tm, tn, l_), []).append((lo, hi))
    assert set(seen) == set(itertools.product(range(num_m), range(num_n), range(batch)))
    for spans in seen.values():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == k
        assert all(s1 == s2 for (_, s1), (s2, _) in itertools.pairwise(spans))


def test_one_launch_when_chunks_fold_into_the_batch_mode():
    gen = random.Random(0)
    # L == 1, K a multiple of 8 x split: one launch of all chunks
    a = _kernel_operand(16, 4096, 1, True, torch.float16, gen, 0)
    b = _kernel_operand(24, 4096, 1, True, torch.float16, gen, 0)
    c = torch.empty(16, 24, 1, dtype=torch.float16)
    kernel = StandIn("k", "k")
    split_k(kernel, a, b, c, 4, 66, a_major="k", b_major="k")
    assert [t[0].shape for t in kernel.launches] == [(16, 1024, 4)]
    # ragged K: the equal chunks, then the tail with its own extent
    kernel = StandIn("k", "k")
    split_k(kernel, a[:, :1021], b[:, :1021], c, 2, 66, a_major="k", b_major="k")
    assert [t[0].shape for t in kernel.launches] == [(16, 512, 1), (16, 509, 1)]
    # L > 1, M-major A and N-major B stored batch after batch: the batches fold too
    a = _kernel_operand(16, 256, 3, False, torch.float16, gen, 0)
    b = _kernel_operand(24, 256, 3, False, torch.float16, gen, 0)
    c = torch.empty(16, 24, 3, dtype=torch.float16)
    kernel = StandIn("m", "n")
    split_k(kernel, a, b, c, 2, 66, a_major="m", b_major="n")
    assert [t[0].shape for t in kernel.launches] == [(16, 128, 6)]
    # L > 1 with K-major rows: batches are not chunk-spaced, so one launch per chunk
    a = _kernel_operand(16, 256, 3, True, torch.float16, gen, 0)
    b = _kernel_operand(24, 256, 3, True, torch.float16, gen, 0)
    kernel = StandIn("k", "k")
    split_k(kernel, a, b, c, 2, 66, a_major="k", b_major="k")
    assert [t[0].shape for t in kernel.launches] == [(16, 128, 3), (16, 128, 3)]


def test_split_k_rejects_bad_arguments():
    gen = random.Random(0)
    a = _kernel_operand(4, 64, 1, True, torch.float16, gen, 0)
    b = _kernel_operand(8, 64, 1, True, torch.float16, gen, 0)
    c = torch.empty(4, 8, 1, dtype=torch.float16)
    kernel = StandIn("k", "k")
    with pytest.raises(ValueError, match="split must be"):
        split_k(kernel, a, b, c, 0, 66, a_major="k", b_major="k")
    with pytest.raises(ValueError, match="a_major='m' but its mode 0"):
        split_k(kernel, a, b, c, 2, 66, a_major="m", b_major="k")
    with pytest.raises(ValueError, match="shapes do not chain"):
        split_k(kernel, a, b, c[:3], 2, 66, a_major="k", b_major="k")
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        split_k(kernel, a.float(), b, c, 2, 66, a_major="k", b_major="k")
    assert kernel.launches == []


# ----------------------------------------------------------------------------- GPU


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _compiled(entry_name, c_dtype, a_major, b_major):
    from wsgemm import host

    e = policy.entry(entry_name)
    variant = host.Variant(
        e.backend, "sm_90a", "float16", c_dtype, "float32", a_major, b_major, e.variant_config()
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return host.COMPILE_CACHE.get(variant), sms // host.cluster_size(variant.kernel_config())


def _gpu_operands(m, n, k, batch, a_major, b_major, seed):
    gen = torch.Generator().manual_seed(seed)

    def operand(rows, k_major):
        inner, outer = (k, rows) if k_major else (rows, k)
        ld = -(-inner // 8) * 8
        buf = torch.randn(batch, outer, ld, generator=gen).half().cuda()[:, :, :inner]
        return buf.permute(1, 2, 0) if k_major else buf.permute(2, 1, 0)

    return operand(m, a_major == "k"), operand(n, b_major == "k")


# (M, N, K, L, a_major, b_major, split, out dtype): even and ragged K (a tail launch), K shorter
# than split x tile_k, M = 1, ragged N, batched with folded and per-chunk launches, fp32 out.
GPU_CASES = [
    (16, 4096, 4096, 1, "k", "k", 4, torch.float16),
    (1, 1000, 1021, 1, "k", "k", 2, torch.float16),
    (7, 520, 100, 1, "k", "k", 8, torch.float32),
    (130, 264, 2048, 3, "k", "k", 2, torch.float16),
    (64, 384, 512, 3, "m", "n", 4, torch.float16),
    (33, 136, 777, 2, "m", "k", 3, torch.float32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_split_k_matches_reference(case):
    if not _hopper():
        pytest.skip("sm_90 only")
    m, n, k, batch, am, bm, split, out_dtype = case
    fn, clusters = _compiled("pingpong-64x128-c1x2", "float32", am, bm)
    a, b = _gpu_operands(m, n, k, batch, am, bm, seed=m + n + k)
    out = torch.full((batch, m, n), float("nan"), dtype=out_dtype, device="cuda")
    split_k(fn, a, b, out.permute(1, 2, 0), split, clusters, a_major=am, b_major=bm)
    a_lmk, b_lkn = a.permute(2, 0, 1), b.permute(2, 1, 0)
    ref = torch.matmul(a_lmk.double(), b_lkn.double())
    theirs = torch.matmul(a_lmk, b_lkn).to(out_dtype)  # PyTorch's own error, same dtypes
    if out_dtype == torch.float32:
        theirs = torch.matmul(a_lmk.float(), b_lkn.float())
    assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
    assert_within_torch_error(out, ref, theirs)


@pytest.mark.gpu
def test_gpu_split_k_bitwise_deterministic_on_side_streams_and_in_graphs():
    if not _hopper():
        pytest.skip("sm_90 only")
    fn, clusters = _compiled("pingpong-64x128-c1x2", "float32", "k", "k")
    a, b = _gpu_operands(16, 4096, 14336, 1, "k", "k", seed=3)

    def run(split):
        out = torch.empty(16, 4096, 1, dtype=torch.float16, device="cuda")
        split_k(fn, a, b, out, split, clusters, a_major="k", b_major="k")
        return out

    for split in (2, 4, 8):
        first = run(split)
        assert all(torch.equal(run(split), first) for _ in range(3))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = run(split)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, first)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run(split)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, first)
