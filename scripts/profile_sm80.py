"""One GEMM call of a wsgemm kernel inside a cudaProfilerStart/Stop window, for Nsight Compute:

    ncu --profile-from-start off --section WarpStateStats ... \\
        python scripts/profile_sm80.py 'sm80{tile_k=32,stages=4}' fp32 4096 4096 4096

The kernel is compiled and run twice before the window, so ncu sees one warm launch only.
The candidate syntax is the benchmark's (``wsgemm.bench.backends.parse_candidate``)."""

import sys

import torch

from wsgemm.bench.backends import Workload, wsgemm_candidate


def main(candidate: str, accumulate: str, m: int, n: int, k: int) -> None:
    acc = torch.float16 if accumulate == "fp16" else torch.float32
    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    b = torch.randn(n, k, dtype=torch.float16, device="cuda").t()
    out = torch.empty(m, n, dtype=torch.float16, device="cuda")
    # The benchmark's own resolution of a candidate (shipped config + overrides), one call.
    call = wsgemm_candidate(candidate).make(Workload(a, b, acc, accumulate), out)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    err = (out.float() - a.float() @ b.float()).abs().max().item()
    print(f"{candidate} {accumulate} {m}x{n}x{k}: max error {err:.3g}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
