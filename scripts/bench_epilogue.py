"""Fused epilogues against the plain GEMM and torch's unfused path (issue #25), interleaved.

For each shape (tokens x N x K of a linear layer: x (tokens, K) @ W^T, W (N, K) row-major, as
``nn.Linear`` holds it) and each epilogue, in one process, round-robin with the order rotated
each round, cold L2 (``wsgemm.bench.measure.CudaTimer``):

* ``plain``: ``wsgemm.linear(x, W)`` (no bias, no activation), the same auto choice of kernel;
* ``fused``: ``wsgemm.linear(x, W, bias, activation=...)``;
* ``torch``: the faster of ``F.linear(x, W, bias)`` -> activation and, for bias+relu/gelu_tanh,
  ``torch._addmm_activation`` (cuBLASLt's fused epilogue); both recorded.

Prints per shape the median over rounds of fused/plain, fused/torch and the share of torch's
unfused overhead (t_torch - t_plain) that fusing recovers, and the geomeans; ``--json`` keeps
every time with the clocks. Epilogues: bias, bias_relu, bias_gelu (erf), bias_gelu_tanh,
bias_silu, silu, gelu_tanh (no bias), and ``residual``: the in-place ``r += x @ W^T``
(``wsgemm.matmul(x, W.t(), c=r, out=r)``) against ``r.add_(F.linear(x, W))`` and cuBLASLt's
``r.addmm_(x, W.t())`` (torch's best, recorded as ``torch_lt``). ``swiglu`` / ``geglu`` run on the
suite's gate/up rows only (W = ``[w_gate; w_up]``, N = 2I): ``fused`` is ``wsgemm.gated_linear(x,
W)`` (whichever road it takes), ``kernel`` the gated kernel whatever the road (a dispatcher whose
``gated_unfused`` says None; at up to 32 rows, unbiased, the swap-AB decode tile since docs/perf.md
entry 85: the record's ``kernel_tile``), ``plain`` the same 2I-wide product without the unit,
``unfused`` that product then torch's unit in the inputs' dtype, ``road`` gated_linear's own unfused
road (the product in fp32, then ``api.gated.gated_in_torch``, rounded once: what
``Dispatcher.gated_unfused`` prices) and ``torch`` ``silu(y[:, :I]) * y[:, I:]`` of ``y =
F.linear(x, W)``. (Records before 2026-12-06's second have no ``road``.)

    python scripts/bench_epilogue.py [--suite llm|models] [--seed S --count C] [--rounds 7]
        [--epilogues bias,bias_gelu_tanh] [--dtype fp16|bf16] [--json FILE]

It measures the fused kernels whether or not main runs them yet: it switches the sm90 family on
(``host.registry.FUSING_FAMILIES``, ``RESIDUAL_FAMILIES``) for its own process, and any other
family switch ``--switch-on`` names (the record's ``args`` keep it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

import wsgemm
from wsgemm.api import gated as gated_core
from wsgemm.api.epilogue import gated_unit, torch_activation
from wsgemm.api.gated import gated_in_torch
from wsgemm.bench import backends, env, measure, suites
from wsgemm.bench.nvml import Nvml
from wsgemm.host import registry

EPILOGUES = {name: e for name, e in backends.EPILOGUES.items() if name != "none"}
EPILOGUES["residual"] = (False, None)  # contenders() takes its own road
GATED = backends.GATED  # swiglu -> silu, geglu -> gelu_tanh: contenders() takes its own road
LT_ACTIVATIONS = {"relu": False, "gelu_tanh": True}  # torch._addmm_activation's use_gelu


def contenders(x, w, bias, act, residual=None, gated=None):
    """name -> zero-argument call (``residual``: the tensor the residual calls update;
    ``gated``: the gated unit's activation, ``w`` being ``[w_gate; w_up]``)."""
    if gated is not None:
        kernel = _kernel_only()
        return {
            "plain": lambda: wsgemm.linear(x, w),
            "fused": lambda: wsgemm.gated_linear(x, w, gated),
            "kernel": lambda: gated_core.gated_linear(x, w, gated, dispatcher=kernel),
            "unfused": lambda: gated_unit(gated, wsgemm.linear(x, w)),
            "road": lambda: gated_in_torch(
                wsgemm.matmul(x, w.t(), out_dtype=torch.float32), gated, x.dtype
            ),
            "torch": lambda: gated_unit(gated, F.linear(x, w)),
        }
    if residual is not None:
        r = residual
        return {
            "plain": lambda: wsgemm.linear(x, w),
            "fused": lambda: wsgemm.matmul(x, w.t(), c=r, out=r),
            "torch": lambda: r.add_(F.linear(x, w)),
            "torch_lt": lambda: r.addmm_(x, w.t()),
        }
    calls = {
        "plain": lambda: wsgemm.linear(x, w),
        "fused": lambda: wsgemm.linear(x, w, bias, activation=act),
        "torch": lambda: torch_activation(act or "none", F.linear(x, w, bias)),
    }
    if bias is not None and act in LT_ACTIVATIONS:
        use_gelu = LT_ACTIVATIONS[act]
        calls["torch_lt"] = lambda: torch._addmm_activation(bias, x, w.t(), use_gelu=use_gelu)
    return calls


def _kernel_only():
    """A dispatcher whose gated calls always take the gated kernel (the road choice's other
    side, timed where ``auto`` takes the unfused road)."""
    from wsgemm.host.dispatch import Dispatcher

    class KernelOnly(Dispatcher):
        def gated_unfused(self, *args):
            return None

    return KernelOnly()


def kernel_tile(x, w, gated) -> str:
    """Which gated tile the ``kernel`` contender runs on ``x`` and ``w``, as ``explain`` names
    it: "swap" (the swap-AB decode tile, on for unbiased calls of up to 32 rows since
    docs/perf.md entry 85), "small" (the small row tile, ``GATED_SMALL_FAMILIES``, entry 88) or
    "row" (the rule's row tile); ``scripts/fit_gated_cost.py`` reads it."""
    text = wsgemm.explain(x, w.t(), activation=gated, gated=True)
    if "the gated kernel's swap-AB" in text:
        return "swap"
    return "small" if "the gated kernel's small row tile" in text else "row"


def check(calls, x, w, bias, act, residual=None, gated=None) -> None:
    """Every contender's result (residual: the fused call's) against float64."""
    bare = F.linear(x.double(), w.double())  # what "plain" computes: the product alone
    ref = bare if bias is None else bare + bias.double()
    ref = gated_unit(gated, ref) if gated is not None else torch_activation(act or "none", ref)
    if residual is not None:
        ref = ref + residual.double()
    for name in ("fused",) if residual is not None else calls:
        want = bare if name == "plain" else ref
        scale = want.abs().max().item() + 1.0
        got = calls[name]().double()
        err = (got - want).abs().max().item()
        if not err <= 2e-2 * scale:
            raise AssertionError(f"{name} result off by {err:.3g} (scale {scale:.3g})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="llm", choices=("llm", "models"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--families", default=None)
    p.add_argument("--tokens", default=None, help="llm suite token counts, e.g. 16,1024,4096")
    p.add_argument("--models", default=None, help="llm suite models, e.g. 8b,70b")
    p.add_argument("--epilogues", default="bias,bias_gelu_tanh,bias_silu")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default=None)
    p.add_argument("--switch-on", default="", metavar="NAME,...",
                   help="host.registry family switches to turn on for this run, e.g. "
                   "GATED_SMALL_FAMILIES: a kernel measured before main turns it on")  # fmt: skip
    args = p.parse_args(argv)
    registry.FUSING_FAMILIES = registry.EPILOGUE_FAMILIES  # the fused kernels, measured
    registry.RESIDUAL_FAMILIES = registry.EPILOGUE_FAMILIES
    for name in filter(None, args.switch_on.split(",")):
        if not name.endswith("_FAMILIES") or not hasattr(registry, name):
            p.error(f"--switch-on: {name!r} is not a host.registry family switch")
        setattr(registry, name, registry.EPILOGUE_FAMILIES)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    if args.suite == "llm":
        tokens = suites.parse_int_list(args.tokens) if args.tokens else None
        models = tuple(args.models.split(",")) if args.models else None
        shapes = suites.suite("llm", tokens=tokens, models=models)
    else:
        fams = tuple(args.families.split(",")) if args.families else None
        shapes = suites.suite("models", seed=args.seed, families=fams, count=args.count)
    nvml = Nvml.open(0)
    timer = measure.CudaTimer(torch.device("cuda"), nvml)
    gen = torch.Generator(device="cuda").manual_seed(0)
    records, summary = [], {}
    for name in args.epilogues.split(","):
        has_bias, act = EPILOGUES[name]
        gated = GATED.get(name)
        fused_plain, fused_torch, recovered = [], [], []
        for s in shapes:
            if gated is not None and not (s.n % 2 == 0 and "gate_up" in (s.label or "")):
                continue  # a gated unit needs a [gate; up] product
            x = torch.randn(s.m, s.k, device="cuda", dtype=dtype, generator=gen)
            w = torch.randn(s.n, s.k, device="cuda", dtype=dtype, generator=gen) / math.sqrt(s.k)
            bias = torch.randn(s.n, device="cuda", dtype=dtype, generator=gen) if has_bias else None
            r = None
            if name == "residual":  # (its values grow with every timed call: only time counts)
                r = torch.randn(s.m, s.n, device="cuda", dtype=dtype, generator=gen)
            calls = contenders(x, w, bias, act, r, gated)
            check(calls, x, w, bias, act, None if r is None else r.clone(), gated)
            extra = {} if gated is None else dict(kernel_tile=kernel_tile(x, w, gated))
            names = list(calls)
            estimates = {n: timer.estimate(calls[n]) for n in names}
            times = {n: [] for n in names}
            clocks = []
            for r in range(args.rounds):
                for n in measure.rotated(names, r):
                    sample = timer.measure(calls[n], args.reps, estimates[n])
                    times[n].append(sample.ms)
                    clocks.append(sample.sm_clock_mhz)
            med = {n: statistics.median(v) for n, v in times.items()}
            t_torch = min(med["torch"], med.get("torch_lt", math.inf))
            r_fp = statistics.median(f / q for f, q in zip(times["fused"], times["plain"],
                                                             strict=True))  # fmt: skip
            r_ft = med["fused"] / t_torch
            over = t_torch - med["plain"]
            rec = (over - (med["fused"] - med["plain"])) / over if over > 0 else float("nan")
            fused_plain.append(r_fp)
            fused_torch.append(r_ft)
            recovered.append(rec)
            label = s.label or f"{s.m}x{s.n}x{s.k}"
            us = med["plain"] * 1e3
            print(f"{name:15s} {label:28s} fused/plain {r_fp:.3f}  fused/torch {r_ft:.3f}  "
                  f"recovered {rec:6.1%}  plain {us:8.1f} us", flush=True)  # fmt: skip
            records.append(dict(epilogue=name, m=s.m, n=s.n, k=s.k, label=label,
                                times_ms=times, median_ms=med, fused_over_plain=r_fp,
                                fused_over_torch=r_ft, recovered=rec,
                                clock_mhz=[c for c in clocks if c], **extra))  # fmt: skip

        def geo(v):
            return math.exp(statistics.fmean(math.log(x) for x in v))

        summary[name] = dict(
            fused_over_plain_geomean=geo(fused_plain), fused_over_plain_max=max(fused_plain),
            fused_over_torch_geomean=geo(fused_torch), fused_over_torch_max=max(fused_torch),
            recovered_median=statistics.median(r for r in recovered if r == r) if any(
                r == r for r in recovered) else None,
        )  # fmt: skip
        print(f"== {name}: {json.dumps(summary[name])}", flush=True)
    if args.json:
        env.write_script_record(args.json, args, records, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
