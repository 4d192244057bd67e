"""Operand factories shared by the CPU planning tests and the GPU correctness tests, and the
suite's one tolerance rule (``assert_within_torch_error``)."""

import torch


def make(shape, dtype, device, *, col_major=False, offset=0, pad=0, gen=None):
    """A randn tensor of ``shape`` ((R, C) or (L, R, C)) as a view: row- or column-major within
    each matrix, ``pad`` extra elements on the leading dimension and ``offset`` elements of
    storage before it, so sliced views with offsets and unaligned strides are covered."""
    *batch, r, c = shape
    inner = (c, r) if col_major else (r, c)
    full = (*batch, inner[0], inner[1] + pad)
    numel = offset + int(torch.tensor(full).prod())
    flat = torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype).to(device)
    t = flat[offset:].view(full)[..., : inner[1]]
    return t.transpose(-1, -2) if col_major else t


def assert_within_torch_error(got, ref, theirs, what="max error", slack=0.0):
    """The suite's tolerance: ``got``'s largest error against the fp64 reference ``ref`` is at
    most twice that of ``theirs`` (PyTorch's own result for the same dtypes) plus eps (plus
    ``slack``, a bound the caller derives, e.g. for fp32 accumulation)."""
    ref = ref.double()
    err = (got.double() - ref).abs().max().item()
    torch_err = (theirs.double() - ref).abs().max().item()
    eps = 1e-6 * (ref.abs().max().item() + 1.0) + slack
    assert err <= 2 * torch_err + eps, f"{what}: {err:.3g} > 2 x torch's {torch_err:.3g} + eps"


def fp32_accumulation_bound(a, b, extra_adds: int = 0):
    """The textbook bound on fp32 accumulation (Higham's gamma_n): n rounding steps of at most
    one ulp (2^-23, the tensor cores truncate) of the running sum, n = K / 16 (one per 16-deep
    WGMMA k-step) plus ``extra_adds`` (a split-K fix-up's partial sums), times
    sum_k |a_mk b_kn|. An fp32 output shows it unrounded; PyTorch's own error there can be far
    smaller (cuBLAS answers M = 1 on CUDA cores), so the 2x rule alone would fail a correct
    tensor-core kernel at K = 1000 (it did: 1.6e-4 vs 8.8e-6)."""
    import math

    import torch

    k = a.shape[-1]
    magnitude = torch.matmul(a.detach().abs().double(), b.detach().abs().double()).max().item()
    return (math.ceil(k / 16) + extra_adds) * 2.0**-23 * magnitude


def assert_product_within_torch_error(got, a, b, extra_adds: int = 0):
    """``got`` is ``a @ b``: no poisoned (NaN) element left, and within the suite's tolerance
    of the fp64 product (``assert_within_torch_error``). An fp32 ``got`` shows the tensor
    cores' truncating accumulation, which PyTorch's fp32 product (cuBLAS answers M = 1 on CUDA
    cores) does not: it is judged against that bound too (``fp32_accumulation_bound``, with a
    split's ``extra_adds``)."""
    import torch

    assert not torch.isnan(got).any(), "unwritten (poisoned) output elements"
    ref = torch.matmul(a.double(), b.double())
    slack = 0.0
    if got.dtype == torch.float32:
        theirs = torch.matmul(a.float(), b.float())
        slack = fp32_accumulation_bound(a, b, extra_adds=extra_adds)
    else:
        theirs = torch.matmul(a, b).to(got.dtype)
    assert_within_torch_error(got, ref, theirs, slack=slack)


def run_into_poisoned(a, b, backend, config, out_dtype=None, **kwargs):
    """``api.matmul(a, b, ...)`` forced onto ``backend`` and ``config`` (and ``kwargs``: a
    bias, an activation) into a NaN-poisoned result of ``out_dtype`` (``a``'s by default), which
    it must return: an element the kernel leaves unwritten stays NaN."""
    import torch

    from wsgemm import api

    shape = (*a.shape[:-1], b.shape[-1])
    out = torch.full(shape, float("nan"), dtype=out_dtype or a.dtype, device=a.device)
    got = api.matmul(a, b, out=out, backend=backend, config=config, **kwargs)
    assert got is out
    return got
