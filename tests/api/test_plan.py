"""The layout planner, checked on the CPU: for every layout, offset and ragged size, the views it
hands a kernel obey the kernel contract, aligned inputs travel without a copy, and a CPU stand-in
for the kernel (C[m,n,l] = sum_k A[m,k,l] B[n,k,l], run on the views) gives torch.matmul's answer.
"""

import itertools

import pytest
import torch
from operands import make

from wsgemm.api import Dispatcher, batched, dispatch, plan, validate
from wsgemm.api.plan import broadcast_copy_bytes, describe
from wsgemm.host.dispatch import StandInDevices

F16 = torch.float16


def contract_ok(t: torch.Tensor, need_extent: bool, unit: int | None = None):
    vec = 16 // t.element_size()
    assert t.dim() == 3
    assert t.data_ptr() % 16 == 0
    units = [i for i in (0, 1) if t.stride(i) == 1]
    assert units, f"no unit stride in {t.stride()}"
    major = units[0] if unit is None else unit
    assert t.stride(major) == 1
    minor = 1 - major
    assert t.stride(minor) % vec == 0 and t.stride(minor) > 0
    if t.shape[2] > 1:
        assert t.stride(2) % vec == 0 and t.stride(2) > 0
    if need_extent:
        assert t.shape[major] % vec == 0
    return "rows" if major == 0 else "cols"


def simulate(launch):
    """What a kernel computes, in float64, written where the kernel writes."""
    acc = torch.einsum("mkl,nkl->mnl", launch.a.double(), launch.b.double())
    launch.c.copy_(acc.to(launch.c.dtype))
    launch.finish()


SIZES = [(1, 1, 1), (7, 5, 3), (8, 16, 8), (37, 29, 13), (64, 48, 40), (1, 17, 9), (13, 1, 24)]


@pytest.mark.parametrize("need_extent", [False, True], ids=["tma", "cpasync"])
@pytest.mark.parametrize("a_col, b_col", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("m, n, k", SIZES)
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("offset", [0, 3])
def test_plan_matches_torch(need_extent, a_col, b_col, m, n, k, batch, offset):
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    lead = () if batch is None else (batch,)
    a = make((*lead, m, k), F16, "cpu", col_major=a_col, offset=offset, gen=gen)
    b = make((*lead, k, n), F16, "cpu", col_major=b_col, offset=offset, gen=gen)
    out = torch.full((*lead, m, n), float("nan"), dtype=F16)
    launch = plan(*batched(a, b, out), need_extent)
    contract_ok(launch.a, need_extent)
    contract_ok(launch.b, need_extent)
    assert contract_ok(launch.c, need_extent, unit=1) == "cols"
    assert launch.a.shape[1] == launch.b.shape[1]
    assert launch.c.shape[:2] == (launch.a.shape[0], launch.b.shape[0])
    simulate(launch)
    ref = torch.matmul(a.double(), b.double()).to(F16)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("need_extent", [False, True])
@pytest.mark.parametrize("a_col, b_col", list(itertools.product([False, True], repeat=2)))
def test_aligned_operands_travel_without_a_copy(need_extent, a_col, b_col):
    a = make((64, 32), F16, "cpu", col_major=a_col)
    b = make((32, 48), F16, "cpu", col_major=b_col)
    out = torch.empty(64, 48, dtype=F16)
    launch = plan(*batched(a, b, out), need_extent)
    assert launch.a.data_ptr() == a.data_ptr() and launch.b.data_ptr() == b.data_ptr()
    assert launch.c.data_ptr() == out.data_ptr() and launch.copy_back is None
    assert launch.a_major == ("m" if a_col else "k")
    assert launch.b_major == ("k" if b_col else "n")


def test_unaligned_leading_dim_is_copied_once_and_padded_with_zeros():
    a = make((16, 12), F16, "cpu", pad=3)  # row stride 15: not 16-byte aligned
    b = make((12, 16), F16, "cpu")
    out = torch.empty(16, 16, dtype=F16)
    launch = plan(*batched(a, b, out), need_extent=True)
    assert launch.a.data_ptr() != a.data_ptr()
    assert launch.a.shape[1] == 16  # K padded to a whole vector for cp.async ...
    assert torch.all(launch.a[:, 12:] == 0)  # ... with zeros
    assert launch.b.shape[1] == 16 and torch.all(launch.b[:, 12:] == 0)


@pytest.mark.parametrize("need_extent", [False, True], ids=["tma", "cpasync"])
def test_a_copy_keeps_the_operands_own_contiguous_mode_for_tma(need_extent):
    """NN/TT operands whose leading dimension is misaligned (M = 37, N = 29): for TMA the copy
    runs along the source's contiguous mode (M-major A, N-major B), not a transposing copy into
    K-major (perf.md entry 29: 2.1-4.7x the kernel's own time); cp.async kernels keep K-major."""
    a = make((37, 40), F16, "cpu", col_major=True)  # (M, K) stored (K, M): M-major, ld 37
    b = make((40, 29), F16, "cpu")  # (K, N) row-major: N-major, ld 29
    out = torch.full((37, 29), float("nan"), dtype=F16)
    launch = plan(*batched(a, b, out), need_extent)
    assert launch.copied and launch.a.data_ptr() != a.data_ptr()
    assert (launch.a_major, launch.b_major) == (("k", "k") if need_extent else ("m", "n"))
    assert contract_ok(launch.a, need_extent) == ("cols" if need_extent else "rows")
    assert contract_ok(launch.b, need_extent) == ("cols" if need_extent else "rows")
    if not need_extent:
        assert launch.a.stride() == (1, 40, 40 * 40) and launch.b.stride() == (1, 32, 32 * 40)
    simulate(launch)
    torch.testing.assert_close(out, torch.matmul(a.double(), b.double()).half(), rtol=0, atol=0)


def _said(text: str) -> dict[str, str]:
    """describe's line as {operand: what it says of it}."""
    assert text.startswith("operands: ")
    return {part.split()[0]: part for part in text.removeprefix("operands: ").split("; ")}


@pytest.mark.parametrize("need_extent", [False, True], ids=["tma", "cpasync"])
@pytest.mark.parametrize("a_col, b_col", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("m, n, k", SIZES)
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("swap", [False, True])
def test_describe_says_what_plan_does(need_extent, a_col, b_col, m, n, k, batch, offset, swap):
    """explain's operands line, allocating nothing, against what plan then does: an operand
    said to be read in place is (its data pointer, the major it names), one said to be copied
    is, into the major it names; C through a temporary exactly when plan makes one."""
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    lead = () if batch is None else (batch,)
    a = make((*lead, m, k), F16, "cpu", col_major=a_col, offset=offset, gen=gen)
    b = make((*lead, k, n), F16, "cpu", col_major=b_col, offset=offset, gen=gen)
    out = torch.empty(*lead, m, n, dtype=F16)
    a3, b3, out3 = batched(a, b, out)
    if swap:  # as dispatch.kernel_views: the kernel's A is b^T, its B a^T, its C out^T
        a3, b3, out3 = b3.transpose(1, 2), a3.transpose(1, 2), out3.transpose(1, 2)
    c_major = "m" if swap else "n"
    text = describe(a3, b3, out3, need_extent, c_major=c_major, swap=swap)
    assert "{" not in text  # every refusal named its modes
    said = _said(text)
    launch = plan(a3, b3, out3, need_extent, c_major=c_major)
    # (the caller's operand, the kernel's view of it, its major there, the view's (rows, cols)
    # in the caller's modes)
    kernel_a = ("a", launch.a, launch.a_major, "MK")
    kernel_b = ("b", launch.b, launch.b_major, "NK")
    if swap:
        kernel_a, kernel_b = (
            ("b", launch.a, launch.a_major, "NK"),
            ("a", launch.b, launch.b_major, "MK"),
        )
    for name, view, major, modes in (kernel_a, kernel_b):
        letter = "K" if major == "k" else modes[0]
        in_place = view.data_ptr() == {"a": a, "b": b}[name].data_ptr()
        article = "a" if letter == "K" else "an"
        want = f"{name} read in place ({letter}-major)" if in_place else (
            f"{name} copied on every call into {article} {letter}-major buffer")  # fmt: skip
        assert said[name].startswith(want), (said[name], want)
    temporary = launch.copy_back is not None
    assert said["out"].startswith(
        "out written to a temporary" if temporary else "out written in place"
    )


def test_describe_names_the_reason_and_the_bytes_of_a_copy():
    """608x3263x4259 TT (the midsize row of perf.md entry 30): a and b misaligned rows, copied
    along their own majors; the result's rows too, through a temporary."""
    a = torch.empty(608, 4259, dtype=F16)
    b = torch.empty(4259, 3263, dtype=F16)
    out = torch.empty(608, 3263, dtype=F16)
    said = _said(describe(*batched(a, b, out), need_extent=False))
    assert said["a"] == ("a copied on every call into a K-major buffer (5.2 MB: its leading "
                         "dimension, 4259 elements, is not a multiple of 8)")  # fmt: skip
    assert said["b"] == ("b copied on every call into an N-major buffer (27.8 MB: its leading "
                         "dimension, 3263 elements, is not a multiple of 8)")  # fmt: skip
    assert said["out"] == ("out written to a temporary and copied back on every call (its "
                           "leading dimension, 3263 elements, is not a multiple of 8)")  # fmt: skip
    said = _said(describe(*batched(a, b, out), need_extent=True))
    assert "a copied on every call into a K-major buffer" in said["a"]
    assert "cp.async kernels need K (and N) in whole 16-byte vectors" in said["a"]
    flat = torch.empty(64 * 32 + 1, dtype=F16)
    shifted = flat[1:].view(64, 32)  # 2-byte offset: the address is not 16-byte aligned
    said = _said(describe(*batched(shifted, torch.empty(32, 16, dtype=F16),
                                   torch.empty(64, 16, dtype=F16)), need_extent=False))  # fmt: skip
    assert said["a"].endswith("its address is not 16-byte aligned)")
    assert said["b"] == "b read in place (N-major)"
    assert said["out"] == "out written in place (N-major)"


def test_broadcast_3d_by_2d_folds_into_one_product():
    a = make((4, 24, 16), F16, "cpu")
    b = make((16, 8), F16, "cpu")
    out = torch.empty(4, 24, 8, dtype=F16)
    launch = plan(*batched(a, b, out), need_extent=False)
    assert launch.a.shape == (96, 16, 1) and launch.a.data_ptr() == a.data_ptr()
    assert launch.c.shape == (96, 8, 1) and launch.copy_back is None


def test_broadcast_2d_by_3d_is_materialized_correctly():
    a = make((24, 16), F16, "cpu")
    b = make((4, 16, 8), F16, "cpu")
    out = torch.empty(4, 24, 8, dtype=F16)
    launch = plan(*batched(a, b, out), need_extent=False)
    assert launch.a.shape == (24, 16, 4) and launch.a.stride(2) != 0
    simulate(launch)
    torch.testing.assert_close(out, torch.matmul(a.double(), b.double()).half(), rtol=0, atol=0)


def test_non_row_major_out_goes_through_a_temporary():
    a, b = make((16, 16), F16, "cpu"), make((16, 24), F16, "cpu")
    out = torch.empty(24, 16, dtype=F16).t()  # column-major (16, 24)
    launch = plan(*batched(a, b, out), need_extent=False)
    assert launch.copy_back is not None
    simulate(launch)
    torch.testing.assert_close(out, torch.matmul(a.double(), b.double()).half(), rtol=0, atol=0)


class _StandInKernel:
    """What a compiled kernel does, in float64 on the CPU, with a count of launches."""

    def __init__(self):
        self.launches = 0

    def __call__(self, a, b, c, clusters):
        self.launches += 1
        c.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype))


class _StandInCache:
    def __init__(self, kernel):
        self.kernel = kernel

    def get(self, variant):
        return self.kernel


def cpu_dispatcher(**limits):
    """A dispatcher on the CPU posing as an H200, every kernel the float64 stand-in."""
    return Dispatcher(_StandInCache(_StandInKernel()), StandInDevices((9, 0), 132), **limits)


def run_on(d, a, b, backend="sm90"):
    """A validated call on ``d``, planned and launched (``dispatch.run``)."""
    p = validate(a, b, None, None, torch.float32, backend, device_type="cpu")
    return dispatch.run(d, a, b, None, p, backend)


@pytest.mark.parametrize(
    "sa, sb",
    [((0, 4, 8), (8, 16)), ((0, 4, 8), (1, 8, 16)), ((1, 4, 8), (0, 8, 16)), ((3, 0, 8), (8, 5))],
)
def test_zero_size_batches_follow_torch(sa, sb):
    d = cpu_dispatcher()
    a, b = torch.randn(sa).half(), torch.randn(sb).half()
    got = run_on(d, a, b)
    assert got.shape == torch.matmul(a.float(), b.float()).shape
    assert d.cache.kernel.launches == 0


def test_large_broadcast_copies_become_one_launch_per_batch():
    d = cpu_dispatcher(max_broadcast_copy_bytes=0)
    a = make((24, 16), F16, "cpu")
    b = make((5, 16, 8), F16, "cpu")
    got = run_on(d, a, b)
    assert d.cache.kernel.launches == 5
    torch.testing.assert_close(got, torch.matmul(a.double(), b.double()).half(), rtol=0, atol=0)


def test_batches_past_the_grid_limit_are_split():
    d = cpu_dispatcher(max_batch_per_launch=2)
    a, b = make((5, 9, 16), F16, "cpu"), make((5, 16, 8), F16, "cpu")
    got = run_on(d, a, b, backend="sm80")
    assert d.cache.kernel.launches == 3
    torch.testing.assert_close(got, torch.matmul(a.double(), b.double()).half(), rtol=0, atol=0)


def test_broadcast_copy_cost_counts_only_what_cannot_fold():
    out = torch.empty(4, 24, 8)
    folds = batched(torch.empty(4, 24, 16), torch.empty(16, 8), out)
    assert broadcast_copy_bytes(*folds) == 0
    cannot = batched(torch.empty(1, 24, 16), torch.empty(4, 16, 8), out)
    assert broadcast_copy_bytes(*cannot) == 4 * 24 * 16 * 4
