"""Grouped GEMM cases for compute-sanitizer (issue #26): the ragged-M grouped kernel on every
tile ``auto`` and the named backends run, with groups that are empty, one row, a tile and one
past it, everything in one group, rows past ``offs[-1]``, ends that decrease or overrun (the
kernel clamps them), narrow N, fp32 results and ``out=``; each call twice (its kernel reused),
each checked per group against torch. Then the ragged-K kernel (2D x 2D, K split by offs)
with empty groups, K past offs[-1] and bad ends. Run as ``compute-sanitizer --tool
memcheck|racecheck python scripts/sanitize_grouped.py`` (scripts/gpu_session.sh, step
``grouped``); a plain run first compiles the kernels outside the sanitizer. With
``--initcheck`` (``compute-sanitizer --tool initcheck ... --initcheck``) the same calls run but
no result is read back: initcheck does not count a TMA store as a write, so torch's reference
reading our output would be reported (as ``scripts/sanitize_auto.py``); what remains is a
read, by our kernels, of memory nobody wrote (a group's rows past its end, K past offs[-1])."""

import sys

import torch

import wsgemm

READ_BACK = "--initcheck" not in sys.argv

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
        if not READ_BACK:
            continue
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


#: The ragged-K kernel (2D x 2D): (sizes along K, tail past offs[-1], M, N, dtype, backend)
RAGGED_K_CASES = [
    ([5, 0, 130, 1, 64], 3, 96, 128, torch.float16, "sm90"),
    ([0, 0, 300, 0], 0, 64, 13, torch.bfloat16, "sm90-pingpong"),
    ([8] * 64, 5, 128, 256, torch.bfloat16, "sm90"),
]


def run_ragged_k(sizes, tail, m, n, dtype, backend, ends=None):
    k = sum(sizes) + tail
    a = torch.randn(k, m, device="cuda").to(dtype).t()  # dY^T: M-major, read in place
    b = torch.randn(k, n, device="cuda").to(dtype)  # X: N-major
    offs = ends if ends is not None else torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    for _ in range(2):
        got = wsgemm.grouped_mm(a, b, offs, backend=backend)
    if not READ_BACK:
        return
    ends_host = offs.tolist()
    for g, end in enumerate(ends_host):
        lo = min(max(ends_host[g - 1], 0), k) if g else 0  # each end read on its own
        hi = min(max(end, lo), k)
        want = a[:, lo:hi].float() @ b[lo:hi].float()
        err = (got[g].float() - want).abs().max().item()
        assert err <= 0.05 * want.abs().max().item() + 1e-2, (sizes, g, err)


def main() -> int:
    for case in CASES:
        run(*case)
    for case in RAGGED_K_CASES:
        run_ragged_k(*case)
    bad = torch.tensor([120, 40, 10_000], dtype=torch.int32, device="cuda")
    run_ragged_k([120, 0, 30], 0, 64, 128, torch.float16, "sm90", ends=bad)
    # decreasing and overrunning ends: clamped, no access outside the operands
    run([120, 0, 80], 0, 64, 128, torch.float16, None, "auto",
        ends=torch.tensor([120, 40, 10_000], dtype=torch.int32, device="cuda"))  # fmt: skip
    torch.cuda.synchronize()
    print(f"grouped sanitizer cases: {len(CASES) + len(RAGGED_K_CASES) + 2} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
