"""Where a new process's first ``wsgemm.matmul`` spends its time when the kernel is in the disk
cache (docs/perf.md, entry 16). Each run is a fresh interpreter; the first run fills the cache
(it may compile) and is not counted. The CUDA context and the inputs exist before the clock
starts, as the goal (issue #10: <= 1 s) says.

    python scripts/cold_start.py [--runs 5] [--size 4096] [--cache-dir DIR]
    python scripts/cold_start.py --object      # the entry's object through the DSL (as before)
    python scripts/cold_start.py --stand-in    # no GPU: the CPU poses as an sm_90 GPU, the
                                               # kernel is loaded, its launch is a no-op

Columns (ms, median of the runs): ``import wsgemm``; ``API`` (the first ``wsgemm.matmul``
attribute: torch op registration, the API modules); ``first call`` (to the result, synchronized;
on the stand-in without the launch), of which ``load`` (the compile cache fetching the
kernel from disk); ``second call``; and whether the DSL was imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(size: int, stand_in: bool, object_form: bool) -> dict:
    """One fresh process's timings (runs in the child)."""
    import warnings

    import torch

    if stand_in:
        a = torch.randn(size, size).half()
        b = torch.randn(size, size).half().t()  # (N, K) k-major: the sm90 variant's default
    else:
        torch.cuda.init()
        a = torch.randn(size, size, device="cuda", dtype=torch.float16)
        b = torch.randn(size, size, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    import wsgemm

    t1 = time.perf_counter()
    matmul = wsgemm.matmul
    t2 = time.perf_counter()
    from wsgemm.host.compiling import cache, disk

    loads = []
    load_or_compile = cache.CompileCache._load_or_compile

    def timed(variant):
        start = time.perf_counter()
        try:
            return load_or_compile(variant)
        finally:
            loads.append(time.perf_counter() - start)

    cache.CompileCache._load_or_compile = staticmethod(timed)
    if object_form:

        def no_library(payload, name):
            raise OSError("--object: the library form is skipped")

        disk.link_library = no_library
        warnings.simplefilter("ignore", disk.CacheWarning)
    t3 = time.perf_counter()
    call = _stand_in_call(a, b) if stand_in else lambda: (matmul(a, b), torch.cuda.synchronize())
    call()
    t4 = time.perf_counter()
    call()
    t5 = time.perf_counter()
    return {
        "import wsgemm": t1 - t0,
        "API": t2 - t1,
        "first call": t4 - t3,
        "load": sum(loads),
        "second call": t5 - t4,
        "DSL imported": "cutlass" in sys.modules,
    }


def _stand_in_call(a, b):
    """The first call on the CPU posing as an sm_90 GPU: everything but the launch, which is a
    no-op (the real kernel would refuse CPU tensors, and building that error's backtrace takes
    tvm-ffi a second the first time)."""
    import torch

    from wsgemm.api import dispatch
    from wsgemm.host import COMPILE_CACHE
    from wsgemm.host.dispatch import Dispatcher, StandInDevices

    class Loading:
        def get(self, variant):
            COMPILE_CACHE.get(variant)
            return lambda *args: None

    d = Dispatcher(cache=Loading(), devices=StandInDevices(capability=(9, 0)))
    return lambda: dispatch.call(d, a, b, None, None, torch.float32, "sm90", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--cache-dir", help="the disk cache to use (default: a new one)")
    parser.add_argument("--object", action="store_true", help="skip the entries' libraries")
    parser.add_argument("--stand-in", action="store_true", help="no GPU (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.size, args.stand_in, args.object)))
        return 0
    if args.fill:  # the stand-in's kernel: a compiled-in-process one refuses CPU tensors otherwise
        from wsgemm.host.compiling import cache
        from wsgemm.host.registry import Variant

        print(cache.ensure_on_disk(Variant("sm90", "sm_90a")))
        return 0
    with tempfile.TemporaryDirectory(prefix="wsgemm-cold-") as scratch:
        env = dict(os.environ, WSGEMM_CACHE_DIR=args.cache_dir or scratch)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        env.pop("WSGEMM_DISK_CACHE", None)
        command = [sys.executable, __file__, "--child", "--size", str(args.size)]
        command += ["--stand-in"] * args.stand_in + ["--object"] * args.object
        fill = [sys.executable, __file__, "--fill"] if args.stand_in else command
        rows = []
        for i in range(args.runs + 1):  # the first fills the cache
            done = subprocess.run(command if i else fill, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            if i:
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    what = "CPU stand-in (sm_90 posed)" if args.stand_in else f"{args.size}^2 fp16 on the GPU"
    form = "object through the DSL" if args.object else "library where the entry has one"
    print(f"first call of a new process, kernel in the disk cache: {what}, {form}")
    print(f"median of {args.runs} processes (min-max), ms")
    for name in ("import wsgemm", "API", "first call", "load", "second call"):
        ms = [1e3 * r[name] for r in rows]
        print(f"  {name:14s} {statistics.median(ms):8.1f}  ({min(ms):.1f}-{max(ms):.1f})")
    print(f"  DSL imported   {sorted({r['DSL imported'] for r in rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
