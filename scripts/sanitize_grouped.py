"""Grouped GEMM cases for compute-sanitizer (issue #26): the ragged-M grouped kernel on every
tile ``auto`` and the named backends run, with groups that are empty, one row, a tile and one
past it, everything in one group, rows past ``offs[-1]``, ends that decrease or overrun (the
kernel clamps them), narrow N, fp32 results and ``out=``; each call twice (its kernel reused),
each checked per group against torch. Run as ``compute-sanitizer --tool memcheck|racecheck
python scripts/sanitize_grouped.py`` (scripts/gpu_session.sh, step ``grouped``); a plain run
first compiles the kernels outside the sanitizer."""

import sys

import torch

import wsgemm

CASES = [
    # (sizes, tail rows, K, N, dtype, out dtype, backend)
    ([5, 0, 130, 1, 64], 3, 64, 96, torch.float16, None, "auto"),
    ([0, 0, 300, 0], 0, 128, 13, torch.bfloat16, None, "auto"),
    ([128, 129, 255, 256], 7, 72, 256, torch.float16, torch.float32, "sm90"),
    ([8] * 64, 0, 256, 384, torch.bfloat16, None, "auto"),
    ([3, 17, 1, 0, 40], 0, 40, 200, torch.float16, None, "sm90-pingpong"),
    ([1000, 24], 0, 64, 128, torch.bfloat16, None, "auto"),
]


def run(sizes, tail, k, n, dtype, out_dtype, backend, ends=None):
    m = sum(sizes) + tail
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(len(sizes), n, k, device="cuda").to(dtype).transpose(1, 2)
    offs = ends if ends is not None else torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    c_dtype = out_dtype or dtype
    for use_out in (False, True):
        out = torch.zeros(m, n, dtype=c_dtype, device="cuda") if use_out else None
        for _ in range(2):
            got = wsgemm.grouped_mm(a, b, offs, out=out, out_dtype=out_dtype, backend=backend)
        e, prev = [], 0
        for x in offs.tolist():
            prev = min(max(x, prev), m)
            e.append(prev)
        lo = 0
        for g, hi in enumerate(e):
            if hi > lo:
                want = (a[lo:hi].float() @ b[g].float()).to(c_dtype)
                err = (got[lo:hi].float() - want.float()).abs().max().item()
                assert err <= 0.05 * want.float().abs().max().item() + 1e-2, (sizes, g, err)
            lo = hi


def main() -> int:
    for case in CASES:
        run(*case)
    # decreasing and overrunning ends: clamped, no access outside the operands
    run([120, 0, 80], 0, 64, 128, torch.float16, None, "auto",
        ends=torch.tensor([120, 40, 10_000], dtype=torch.int32, device="cuda"))  # fmt: skip
    torch.cuda.synchronize()
    print(f"grouped sanitizer cases: {len(CASES) + 1} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
