"""Where the traced sm90 kernels' overhead comes from (issue #13: <= 5% at 4096^3 wanted).

Compiles the untraced kernel and traced variants that differ in one ``TraceKnobs`` choice each
(``wsgemm.kernels.common.trace``: which event groups are recorded, and how each role writes its
per-k-tile events), then times them all at M = N = K = 4096, fp16 TN, fp32 accumulate, fp16 out:
CUDA events around each call, L2 flushed before each (``wsgemm.bench.measure.CudaTimer``), the
median of ``--reps`` calls per measurement, ``--rounds`` rounds in rotated order. Overhead is
taken per round against that round's untraced time, and reported as the median over rounds with
its range, next to the SM clock NVML read while the variant ran.

Before timing, every variant that records all events also records one call through
``wsgemm.api.tracing.record`` and runs the recording checks (``wsgemm.timeline.check``), and
its product is compared with torch's: a variant that is fast but wrong shows up here.

Run from the repository root on the GPU host::

    PYTHONPATH=$PWD python3 scripts/trace_overhead_probe.py
    PYTHONPATH=$PWD python3 scripts/trace_overhead_probe.py --compile-only   # no GPU needed

Everything is compiled first (a few seconds per variant), then timed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

BACKENDS = ("sm90", "sm90-pingpong")

#: Every role's events written on the spot, in the untraced loops' own ``trace.record`` calls:
#: the baseline the lanes paths are measured against.
OLD = "producer=slow,consumer=slow,epilogue=slow"

#: (name, TraceKnobs spec or None for the untraced kernel, what it tells / predicts)
VARIANTS = (
    ("untraced", None, "the shipped kernel: the reference"),
    ("traced", "", "the traced kernel's defaults (all events; every role's lanes path)"),
    ("old", OLD, "all events written on the spot (every role's slow path)"),
    ("ev:none", "events=none", "no per-k-tile or store-wait events: the fixed cost of tracing"),
    ("ev:consumer", "events=consumer", "only the consumers' 6 k-tile events (default path)"),
    ("ev:producer", "events=producer", "only the producer's 3 k-tile events (default path)"),
    ("ev:epilogue", "events=epilogue", "only the epilogue's store waits (default path)"),
    ("old+prod-lanes", "producer=lanes,consumer=slow,epilogue=slow", "old, producer in lanes"),
    ("old+cons-lanes", "producer=slow,consumer=lanes,epilogue=slow", "old, consumer in lanes"),
    ("old+epi-lanes", "producer=slow,consumer=slow,epilogue=lanes", "old, store waits in lanes"),
)

#: A recording problem's kind (``timeline.check``'s sentences), first match wins.
PROBLEM_KINDS = (
    ("order", re.compile(r"time goes back")),
    ("pairing", re.compile(r": (\w+) at .* has no \w+ (?:before|after) it")),
    ("stages", re.compile(r"released it")),
    ("full-after-load", re.compile(r"waited on full|the wait on full ended")),
    ("tiles", re.compile(r"fetched tile|was run by|was fetched by|were run by no CTA")),
    ("overflow", re.compile(r"overflowed|lost \d+ events")),
)

SHAPE = (4096, 4096, 4096)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile every variant and stop")
    p.add_argument("--sass", action="store_true", help="with the compile: registers, spills")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument(
        "--variants", default="all", help="comma-separated names (untraced is always timed)"
    )
    p.add_argument("--reps", type=int, default=20, help="calls per measurement (median)")
    p.add_argument("--rounds", type=int, default=5, help="measurements per variant, interleaved")
    p.add_argument("--shape", default="4096,4096,4096", help="M,N,K")
    p.add_argument("--no-check", action="store_true", help="skip the recording checks")
    return p.parse_args(argv)


def chosen_variants(spec: str):
    if spec == "all":
        return list(VARIANTS)
    names = {n.strip() for n in spec.split(",") if n.strip()} | {"untraced"}
    unknown = names - {v[0] for v in VARIANTS}
    if unknown:
        sys.exit(f"unknown variants {sorted(unknown)}; known: {[v[0] for v in VARIANTS]}")
    return [v for v in VARIANTS if v[0] in names]


def compile_all(backends, variants, sass: bool):
    """{(backend, name): compiled function}; every variant compiled before any timing."""
    from wsgemm import host
    from wsgemm import inspection as insp
    from wsgemm.host import cache, tracing

    compiled = {}
    for backend in backends:
        variant = host.Variant(backend, "sm_90a")
        for name, spec, _ in variants:
            t0 = time.perf_counter()
            if spec is None:  # the address entry, called with the views (host.calls)
                fn = host.compile_variant(variant, keep=sass)
            else:
                fn = tracing.compile_traced(variant, keep=sass, trace_knobs=spec)
            line = f"compiled {backend:14s} {name:15s} {time.perf_counter() - t0:5.1f} s"
            if sass:
                r = insp.inspect_variant(variant, fn)
                line += (
                    f"  regs {r.registers} spill {r.spill_bytes} B  STG {r.sass.get('STG', 0)}"
                    f" LDS {r.sass.get('LDS', 0)}"
                )
            print(line, flush=True)
            # the untraced address entry is called with the views (host.calls.KernelCall)
            compiled[(backend, name)] = cache.kernel_call(fn, variant) if spec is None else fn
    return compiled


def operands(shape, device):
    """fp16 TN operands as the caller holds them (a: M x K row-major, b = bt.T with bt N x K
    row-major), the kernel views (M, K, 1), (N, K, 1), (M, N, 1) and C."""
    import torch

    m, n, k = shape
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=torch.float16, generator=gen)
    bt = torch.randn(n, k, device=device, dtype=torch.float16, generator=gen)
    c = torch.empty(m, n, device=device, dtype=torch.float16)

    def view(x):  # (rows, cols) -> (rows, cols, 1), batch stride rows * cols
        return x.unsqueeze(0).permute(1, 2, 0)

    return a, bt, c, (view(a), view(bt), view(c))


def check_recording(backend, name, fn, a, bt):
    """Record one call through ``api.tracing.record`` with this variant's kernel; return the
    recording's problems (``timeline.check``) and the product's largest error vs torch."""
    import torch

    from wsgemm import host, timeline
    from wsgemm.api import tracing as api_tracing
    from wsgemm.host import tracing as host_tracing
    from wsgemm.timeline import checks

    want = host.Variant(backend, "sm_90a").kernel_config()
    used = []

    def cached(variant):
        used.append(variant)
        if variant.kernel_config() != want:
            raise RuntimeError(f"record chose {variant}, the probe compiled {want}")
        return fn

    saved = host_tracing.cached_traced
    host_tracing.cached_traced = cached
    try:
        out = torch.empty(a.shape[0], bt.shape[0], device=a.device, dtype=torch.float16)
        raw = api_tracing.record(a, bt.t(), backend=backend, measure=False, out=out)
    finally:
        host_tracing.cached_traced = saved
    ref = (a.float() @ bt.float().t()).half()
    err = (out.float() - ref.float()).abs().max().item()
    listed = checks.MAX_LISTED
    checks.MAX_LISTED = 1 << 30  # every problem, not the first 5 of each check
    try:
        problems = timeline.check(raw)
    finally:
        checks.MAX_LISTED = listed
    return problems, err, raw.meta.get("overflow", 0), holes(raw)


def holes(raw) -> str:
    """Stored events that no lane wrote (kind 0: the host zeroes the buffer), per role."""
    import numpy as np

    from wsgemm import timeline

    d = timeline.decode(raw)
    empty = d.events["kind"] == 0
    if not empty.any():
        return ""
    recs = d.events["rec"][empty]
    roles = np.bincount(d.recorders["role"][recs].astype(np.int64), minlength=3)
    named = ", ".join(f"{n} {r}" for n, r in zip(roles, ("producer", "consumer", "worker"),
                                                strict=True) if n)  # fmt: skip
    return f"{int(empty.sum())} holes (kind 0) in {len(set(recs.tolist()))} recorders: {named}"


def summarize(problems: list[str], first: int = 3) -> list[str]:
    """Compactly: the problems' count per kind (``PROBLEM_KINDS``; pairing per event kind),
    then the first ``first`` problems, and the first of each kind not among them."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    for line in problems:
        kind = "other"
        for name, pattern in PROBLEM_KINDS:
            m = pattern.search(line)
            if m:
                kind = f"{name} {m.group(1)}" if m.groups() else name
                break
        counts[kind] = counts.get(kind, 0) + 1
        example.setdefault(kind, line)
    out = ["counts: " + ", ".join(f"{k} {n}" for k, n in counts.items())]
    out += problems[:first]
    out += [f"[{k}] {line}" for k, line in example.items() if line not in problems[:first]]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    variants = chosen_variants(args.variants)
    shape = tuple(int(x) for x in args.shape.split(","))

    print(f"compiling {len(variants)} variants x {len(backends)} backends", flush=True)
    t0 = time.perf_counter()
    compiled = compile_all(backends, variants, args.sass)
    print(f"compiled everything in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.compile_only:
        return 0

    import torch

    from wsgemm import host
    from wsgemm.bench.measure import CudaTimer, rotated
    from wsgemm.bench.nvml import Nvml
    from wsgemm.host import tracing

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU: run with --compile-only here, time on the GPU host")
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    num_sms = props.multi_processor_count
    nvml = Nvml.open(device.index)
    timer = CudaTimer(device, nvml, getattr(props, "L2_cache_size", None))
    print(f"{props.name}, {num_sms} SMs, NVML {'on' if nvml else 'off (no clocks)'}")
    a, bt, c, (av, bv, cv) = operands(shape, device)
    m, n, k = shape

    calls = {}
    for backend in backends:
        config = host.Variant(backend, "sm_90a").kernel_config()
        clusters = num_sms // host.cluster_size(config)
        plan = tracing.plan_trace(backend, config, (m, n, k, 1), num_sms)
        buffer = torch.zeros((plan.recorders, plan.words), dtype=torch.int32, device=device)
        for name, spec, _ in variants:
            fn = compiled[(backend, name)]
            if spec is None:
                calls[(backend, name)] = lambda fn=fn, cl=clusters: fn(av, bv, cv, cl)
            else:
                calls[(backend, name)] = lambda fn=fn, cl=clusters, buf=buffer: fn(
                    av, bv, cv, cl, 0, buf
                )

    # correctness first: every complete variant's recording is checked, every product compared
    verdict = {}
    failures = {}  # (backend, name): summarized check problems
    for backend in backends:
        ref = (a.float() @ bt.float().t()).half()
        for name, spec, _ in variants:
            calls[(backend, name)]()
            torch.cuda.synchronize()
            err = (c.float() - ref.float()).abs().max().item()
            note = f"max|err| {err:.3g}"
            complete = spec is not None and ("events=" not in spec or "events=all" in spec)
            if complete and not args.no_check:
                try:
                    problems, rec_err, overflow, empty = check_recording(
                        backend, name, compiled[(backend, name)], a, bt
                    )
                    note += f"; checks {'ok' if not problems else f'FAIL ({len(problems)})'}"
                    if overflow:
                        note += f"; overflow {overflow}"
                    if rec_err > 1:
                        note += f"; recorded call max|err| {rec_err:.3g}"
                    if problems or empty:
                        failures[(backend, name)] = ([empty] if empty else []) + summarize(problems)
                        for line in failures[(backend, name)]:
                            print(f"  {backend} {name}: {line}")
                except Exception as exc:  # report and keep timing the others
                    note += f"; check error {type(exc).__name__}: {exc}"[:120]
            verdict[(backend, name)] = note
            print(f"{backend:14s} {name:15s} {note}", flush=True)

    # timing: rounds x (backend, variant), rotated each round
    samples = {key: [] for key in calls}
    estimates = {key: timer.estimate(fn) for key, fn in calls.items()}
    for r in range(args.rounds):
        for backend in backends:
            for name, _, _ in rotated(variants, r):
                key = (backend, name)
                samples[key].append(timer.measure(calls[key], args.reps, estimates[key]))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    print()
    print(f"M=N=K={m},{n},{k} fp16 TN, {args.reps} cold-L2 calls per measurement (median), "
          f"{args.rounds} rounds")  # fmt: skip
    header = f"{'backend':14s} {'variant':15s} {'us':>8s} {'overhead %':>11s} {'[min, max]':>16s}"
    print(header + f" {'SM MHz':>7s}  check / what it tells")
    for backend in backends:
        base = [s.ms for s in samples[(backend, "untraced")]]
        for name, _, what in variants:
            ss = samples[(backend, name)]
            ms = statistics.median(s.ms for s in ss)
            over = [100 * (s.ms / b - 1) for s, b in zip(ss, base, strict=True)]
            clocks = [s.sm_clock_mhz for s in ss if s.sm_clock_mhz]
            mhz = f"{statistics.median(clocks):7.0f}" if clocks else "      -"
            rng = f"[{min(over):+6.1f}, {max(over):+6.1f}]"
            print(
                f"{backend:14s} {name:15s} {ms * 1e3:8.1f} {statistics.median(over):+10.1f}% "
                f"{rng:>16s} {mhz}  {verdict[(backend, name)]}; {what}"
            )
    if failures:  # again after the table, so that an output cut to its tail still has them
        print("\ncheck failures (counts per kind, the first problems, one of each other kind):")
        for (backend, name), lines in failures.items():
            print(f"{backend} {name}:")
            for line in lines:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
