"""Which kernels cuBLAS runs on the ``llm`` suite's shapes, or on given ones (needs a CUDA GPU).

    PYTHONPATH=$PWD python scripts/cublas_kernels.py --tokens 1,16,128
    PYTHONPATH=$PWD python scripts/cublas_kernels.py --shapes "1311,4608,3072;391,1024,2304" \
        --dtype bf16

One line per shape: the kernel names ``torch.profiler`` sees for one ``torch.mm(x, W.T)`` with
warm L2, and their device time. On Hopper the names carry cuBLAS's choice: tile (``64x64``),
stages, cluster, ``splitK`` (with a ``splitKreduce_kernel`` after it) or not. docs/perf.md,
entry 19, reads them against the shape policy's choices.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,16,128", help="token counts (M), comma-separated")
    parser.add_argument("--shapes", help="M,N,K;M,N,K... (TN: x @ W.T) instead of the llm suite")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from wsgemm.bench import suites

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    if args.shapes:
        shapes = [
            suites.Shape(int(m), int(n), int(k), label=f"{m}x{n}x{k}")
            for m, n, k in (s.split(",") for s in args.shapes.split(";") if s.strip())
        ]
    else:
        shapes = suites.suite("llm", tokens=tuple(int(t) for t in args.tokens.split(",")))
    for shape in shapes:
        x = torch.randn(shape.m, shape.k, device="cuda", dtype=dtype)
        w = torch.randn(shape.n, shape.k, device="cuda", dtype=dtype)
        for _ in range(3):
            torch.mm(x, w.t())
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.mm(x, w.t())
            torch.cuda.synchronize()
        kernels = [
            f"{e.name[:120]} {e.device_time:.1f} us"
            for e in prof.events()
            if e.device_type.name == "CUDA"
        ]
        print(f"{shape.label:20s} {shape.m}x{shape.n}x{shape.k}: " + " | ".join(kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
