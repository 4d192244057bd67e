"""Diagnose the bimodal `fused` rounds of the gated held-out bench (perf.md entry 80): per
round, the fused call's and the forced kernel's CudaTimer sample, host ms per call, and the
kernels the profiler saw (names and GPU time) for the fused call."""

import json
import math
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import wsgemm
from wsgemm.api import gated as gated_core
from wsgemm.bench import measure
from wsgemm.bench.nvml import Nvml

sys.path.insert(0, "scripts")
from bench_epilogue import _kernel_only  # noqa: E402

SHAPES = [(2, 704, 2048), (119, 46080, 3072), (5415, 2048, 2048)]
out = {}
timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0))
gen = torch.Generator(device="cuda").manual_seed(0)
kernel = _kernel_only()
for m, n, k in SHAPES:
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / math.sqrt(k)
    calls = {
        "fused": lambda x=x, w=w: wsgemm.gated_linear(x, w, "silu"),
        "kernel": lambda x=x, w=w: gated_core.gated_linear(x, w, "silu", dispatcher=kernel),
    }
    road = gated_core._road(gated_core._default_dispatcher(), x, w, "silu", None)
    rec = {"road": road if isinstance(road, str) else "kernel " + str(road[2])}
    est = {name: timer.estimate(fn) for name, fn in calls.items()}
    rec["estimate"] = {n: [e.gpu_ms, e.host_ms, e.cycle_ms] for n, e in est.items()}
    rec["rounds"] = {n: [] for n in calls}
    rec["host_us"] = {n: [] for n in calls}
    for r in range(8):
        for name in measure.rotated(list(calls), r):
            rec["rounds"][name].append(timer.measure(calls[name], 20, est[name]).ms * 1e3)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                calls[name]()
            rec["host_us"][name].append((time.perf_counter() - t0) / 50 * 1e6)
            torch.cuda.synchronize()
    kerns = []
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                calls["fused"]()
            torch.cuda.synchronize()
        evs = [
            (e.name[:60], round(e.device_time, 1))
            for e in prof.events()
            if e.device_type.name == "CUDA"
        ]
        kerns.append(evs[:12])
    rec["fused_kernels"] = kerns
    out[f"{m}x{n}x{k}"] = rec
    print(f"{m}x{n}x{k}", json.dumps(rec)[:3000], flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "diag.json"), "w"), indent=1)
