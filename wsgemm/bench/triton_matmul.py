"""A persistent, autotuned Triton matmul: the benchmark's "well-written Triton" baseline.

It is the three knobs of Triton's persistent-matmul tutorial and nothing else: each program
(one per SM) walks output tiles in grouped order, loads the K slices of A and B (Triton
software-pipelines the loads ``num_stages`` deep and picks wgmma or mma.sync itself), and
stores the tile. Any strides work, so every layout runs without copies; edges are masked, so
any M, N, K work. Triton is imported on first use, so this module imports without it.

Offsets are 32-bit: operands with 2**31 or more elements past their base are refused.
"""

from __future__ import annotations

import functools

# Row tiles per group of the tile order: GROUP_M row tiles sweep the columns together, so each
# B tile is read from DRAM once per group and from L2 by the other GROUP_M - 1 row tiles.
GROUP_M = 8
INT32_LIMIT = 2**31

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): large tiles for large problems (the
# 128x256 two-warpgroup tile is Triton's best on Hopper), 64-row tiles for decode-sized M.
# Configs that do not fit a GPU's shared memory are dropped by the autotuner.
CONFIGS = (
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 128, 4, 4),
)
# Smallest tile edge the configs have; a config whose tile is more than this or the next power
# of two of the problem edge (whichever is larger) only wastes work, so it is not tuned.
MIN_TILE = 64


def matmul(a, b, *, out=None, accumulate=None):
    """``out[M, N] = a[M, K] @ b[K, N]`` in ``a``'s dtype, accumulating in ``accumulate``
    (``torch.float32``, the default, or ``torch.float16``)."""
    import torch

    from ..support import ACCUMULATOR_RULE, accumulator_allowed

    accumulate = torch.float32 if accumulate is None else accumulate
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"expected a (M, K) and b (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"expected two fp16 or two bf16 operands, got {a.dtype} and {b.dtype}")
    if accumulate not in (torch.float32, torch.float16):
        raise ValueError(f"accumulate must be torch.float32 or torch.float16, got {accumulate}")
    if not accumulator_allowed(a.dtype, accumulate):
        raise ValueError(ACCUMULATOR_RULE)
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if tuple(out.shape) != (m, n) or out.dtype != a.dtype:
        raise ValueError(f"out must be ({m}, {n}) {a.dtype}, got {tuple(out.shape)} {out.dtype}")
    for name, t in (("a", a), ("b", b), ("out", out)):
        if _max_offset(t) >= INT32_LIMIT:
            raise ValueError(f"{name} spans 2**31 elements or more; this kernel indexes with int32")
    if m == 0 or n == 0:
        return out
    kernel, tl = _build()
    sms = _sm_count(a.device.index if a.device.index is not None else torch.cuda.current_device())

    def grid(meta):
        tiles = -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"])
        return (min(sms, tiles),)

    with torch.cuda.device(a.device):
        kernel[grid](
            a, b, out, m, n, k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
            ACC_DTYPE=tl.float16 if accumulate == torch.float16 else tl.float32,
            GROUP_M=GROUP_M,
        )  # fmt: skip
    return out


@functools.cache
def _sm_count(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _max_offset(t) -> int:
    """One past the largest element offset ``t`` reaches from its base."""
    spans = ((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    return sum(spans) + 1


def _prune(configs, named_args, **kwargs):
    """Drop configs whose tile overshoots the problem; keep at least the smallest."""

    def cap(extent):
        return max(MIN_TILE, 1 << max(0, extent - 1).bit_length())

    m_cap, n_cap = cap(named_args["M"]), cap(named_args["N"])
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= m_cap and c.kwargs["BLOCK_N"] <= n_cap]
    if kept:
        return kept
    return [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def _autotune_bench(fn, quantiles):
    """Triton's do_bench with short windows: the configs differ by far more than its noise."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


@functools.cache
def _build():
    """Define and autotune-wrap the kernel on first use; returns (kernel, triton.language)."""
    import triton
    import triton.language as tl

    @triton.jit
    def tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
        per_group = GROUP_M * num_n
        first_m = (tile // per_group) * GROUP_M
        rows = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % per_group) % rows, (tile % per_group) // rows

    @triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=stages, num_warps=warps
            )
            for bm, bn, bk, stages, warps in CONFIGS
        ],
        # Layouts change the strides: tune each (shape, layout) pair on its own.
        key=["M", "N", "K", "stride_ak", "stride_bn", "ACC_DTYPE"],
        prune_configs_by={"early_config_prune": _prune},
        do_bench=_autotune_bench,
    )
    @triton.jit
    def persistent_matmul(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        ACC_DTYPE: tl.constexpr, GROUP_M: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        k_tiles = tl.cdiv(K, BLOCK_K)
        rk = tl.arange(0, BLOCK_K)
        for tile in range(tl.program_id(0), num_m * num_n, tl.num_programs(0)):
            pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
            b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
            for kt in range(k_tiles):
                # Masks, not clamped indices: an M or N mask on an aligned extent stays constant
                # across a 16-byte vector, so M- and N-major operands still load 16 bytes wide.
                k_left = K - kt * BLOCK_K
                a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
                acc = tl.dot(a, b, acc, out_dtype=ACC_DTYPE)
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
            c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
            c_mask = (rm[:, None] < M) & (rn[None, :] < N)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)

    return persistent_matmul, tl
