"""Time every grouped-kernel tile on the ``moe`` suite's problems: the data ``grouped_config``'s
rule should be fitted on (issue #26).

The host chooses a grouped kernel's tile knowing only the total rows and the group count
(``wsgemm.host.grouped_config``: the mean rows per group), never the sizes; the H100 run of
docs/perf.md entry 41 lost 8-18% to ``torch._grouped_mm`` on every skewed (Zipf) problem at 512
tokens per expert while winning the balanced ones. The candidates here differ in what a small
group wastes: a cluster along M (the shipped ``c2x1``) spans ``2 x tile_m`` rows of one group,
so a group of 20 rows occupies 256; a cluster along N (``c1x2``) spans ``tile_m``.

For each problem (model x projection x tokens per expert x routing), in one process: every
candidate and ``torch._grouped_mm`` (bf16; the per-group ``torch.mm`` loop for fp16), checked
once against the per-group float64 reference, then timed in interleaved rounds with the order
rotated each round, cold L2 (``wsgemm.bench.measure.CudaTimer``); a candidate's ratio is the
median over rounds of baseline time / its time (above 1: faster). The summary names the best
candidate per problem and, for each tokens-per-expert bucket, the candidate with the best
geomean over the *training* models, then judges that choice on the held-out models (never
used to pick it).

    python scripts/tune_grouped.py --out DIR [--dtype bf16] [--tokens 8,64,512,4096]
        [--train deepseek-v3,qwen3-30b-a3b] [--rounds 5] [--reps 20] [--budget-s 480]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from wsgemm import host
from wsgemm.bench import moe

#: (name, backend, Sm90Config fields or None for the backend's shipped config)
CANDIDATES: tuple[tuple[str, str, dict | None], ...] = (
    ("pp64x128c1x1", "sm90-pingpong", dict(tile_m=64, tile_n=128, schedule="pingpong")),
    ("pp64x256c1x1", "sm90-pingpong", dict(tile_m=64, tile_n=256, schedule="pingpong")),
    ("pp128x128c2x1", "sm90-pingpong", None),  # the shipped ping-pong tile
    ("pp128x128c1x2", "sm90-pingpong", dict(tile_n=128, cluster_n=2, schedule="pingpong")),
    ("coop128x256c2x1", "sm90", None),  # the shipped cooperative tile
    ("coop128x256c1x2", "sm90", dict(cluster_n=2)),
    ("coop128x256c1x1", "sm90", dict()),
    ("coop128x128c1x2", "sm90", dict(tile_n=128, cluster_n=2)),
)
TRAIN = ("deepseek-v3", "qwen3-30b-a3b")


@dataclass(frozen=True)
class Candidate:
    name: str
    backend: str
    config: object  # an Sm90Config, or None (the backend's shipped one)


def candidates(names: list[str] | None = None) -> list[Candidate]:
    from wsgemm.kernels.sm90.config import Sm90Config

    out = []
    for name, backend, fields in CANDIDATES:
        if names and name not in names:
            continue
        out.append(Candidate(name, backend, None if fields is None else Sm90Config(**fields)))
    if names and len(out) != len(names):
        known = ", ".join(n for n, _, _ in CANDIDATES)
        raise SystemExit(f"unknown candidate in {names}; choose from {known}")
    return out


def shipped_pick(rows: int, groups: int, cands: list[Candidate]) -> str | None:
    """The candidate ``backend="auto"`` runs for ``rows`` rows in ``groups`` groups
    (``host.grouped_config``, the shipped rule), or None when none of ``cands`` is it."""
    backend, config = host.grouped_config("auto", rows, groups)
    mine = (backend, config or host.BACKENDS[backend].config())
    theirs = ((c.name, (c.backend, c.config or host.BACKENDS[c.backend].config())) for c in cands)
    return next((name for name, run in theirs if run == mine), None)


def _geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary(rows: list[dict], train: tuple[str, ...]) -> list[str]:
    """Per tokens-per-expert bucket: the candidate with the best geomean ratio on the training
    models (balanced and skewed together: the host cannot tell them apart), then that choice's
    geomean on the held-out models, beside the held-out oracle (the best per problem) and the
    shipped rule's pick (a row's ``shipped``, where a candidate is it)."""
    lines = []
    for t in sorted({r["tokens_per_expert"] for r in rows}):
        bucket = [r for r in rows if r["tokens_per_expert"] == t and r["ratio"]]
        names = sorted({r["candidate"] for r in bucket})
        fit = {}
        for c in names:
            fit[c] = _geomean(
                r["ratio"] for r in bucket if r["candidate"] == c and r["model"] in train
            )
        fit = {c: g for c, g in fit.items() if not math.isnan(g)}
        if not fit:
            continue
        pick = max(fit, key=fit.get)
        held = [r for r in bucket if r["model"] not in train]
        judged = _geomean(r["ratio"] for r in held if r["candidate"] == pick)
        problems = {(r["model"], r["label"]) for r in held}
        oracle = _geomean(max(r["ratio"] for r in held if (r["model"], r["label"]) == p)
                          for p in problems)  # fmt: skip
        ranked = ", ".join(f"{c} {g:.3f}" for c, g in sorted(fit.items(), key=lambda x: -x[1]))
        lines.append(f"t/e={t}: fitted on {'+'.join(train)}: {ranked}")
        lines.append(f"t/e={t}: pick {pick}: held-out {judged:.3f}x geomean "
                     f"(held-out oracle {oracle:.3f}x, {len(problems)} problems)")  # fmt: skip
        shipped = {r["shipped"] for r in bucket if r.get("shipped")}
        if len(shipped) == 1:
            (name,) = shipped
            ours = _geomean(r["ratio"] for r in held if r["candidate"] == name)
            lines.append(f"t/e={t}: the shipped rule runs {name}: held-out {ours:.3f}x geomean")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--models", default=",".join(moe.MODELS))
    p.add_argument("--tokens", default="8,64,512,4096")
    p.add_argument("--routings", default=",".join(moe.ROUTINGS))
    p.add_argument("--candidates", default="", help="comma-separated names (default: all)")
    p.add_argument("--train", default=",".join(TRAIN), help="models the choice is fitted on")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--jobs", type=int, default=8, help="parallel compiles")
    p.add_argument("--budget-s", type=float, default=480.0)
    args = p.parse_args(argv)
    cands = candidates([c for c in args.candidates.split(",") if c])
    shapes = moe.problems(
        models=tuple(args.models.split(",")),
        tokens=tuple(int(t) for t in args.tokens.split(",")),
        routings=tuple(args.routings.split(",")),
    )
    return _tune(args, cands, shapes)


def _tune(args, cands: list[Candidate], shapes) -> int:
    import torch

    import wsgemm
    from wsgemm.bench import check
    from wsgemm.bench.measure import CudaTimer, interleaved
    from wsgemm.bench.nvml import Nvml

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    ab = "bfloat16" if args.dtype == "bf16" else "float16"
    needed = [host.Variant(c.backend, "sm_90a", ab, ab, "float32", "k", "n",
                           c.config or wsgemm.api.shipped_config(c.backend), grouping="m")
              for c in cands]  # fmt: skip
    failed = [o for o in host.warm(needed, jobs=args.jobs) or [] if o.status == "failed"]
    for o in failed:
        print(f"compile FAILED: {o.key}: {o.error}", flush=True)
    bad = {o.key for o in failed}
    cands = [c for c, v in zip(cands, needed, strict=True) if v.key not in bad]
    print(f"{props.name}: {len(shapes)} problems x {len(cands)} candidates "
          f"({time.perf_counter() - start:.0f} s to compile)", flush=True)  # fmt: skip

    timer = CudaTimer(device, Nvml.open(device.index), getattr(props, "L2_cache_size", None))
    real_config = host.grouped_config
    rows = []
    for shape in shapes:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: {len(shapes) - len(rows) // max(len(cands), 1)} problems left")
            break
        work = moe.workload(shape, dtype, device, torch.Generator(device=device).manual_seed(7))
        base_name = "torch" if dtype == torch.bfloat16 else "loop"
        base_out = torch.empty(shape.m, shape.n, dtype=dtype, device=device)
        calls = {base_name: ((moe.torch_grouped() if base_name == "torch" else moe.loop())
                             .make(work, base_out), base_out)}  # fmt: skip
        for c in cands:
            o = torch.empty(shape.m, shape.n, dtype=dtype, device=device)

            def run(c=c, o=o, work=work):
                host.grouped_config = lambda backend, rows, groups, c=c: (c.backend, c.config)
                try:
                    return wsgemm.grouped_mm(work.a, work.b, work.offs, out=o, backend=c.backend)
                finally:
                    host.grouped_config = real_config

            calls[c.name] = (run, o)
        status = {}
        for name, (fn, o) in calls.items():
            check.poison(o)
            got = fn()
            torch.cuda.synchronize(device)
            err = moe.errors(got if got is not None else o, work)
            tol = check.model_tolerance(args.dtype, "fp32", shape.k)
            status[name] = tol.verdict(err) or "ok"
            if status[name] != "ok":
                print(f"  WRONG {shape.label} {name}: {status[name]}", flush=True)
        timed = {n: fn for n, (fn, _) in calls.items() if status[n] == "ok"}
        samples = interleaved(timer, timed, args.rounds, args.reps)
        base = samples.get(base_name)
        model = shape.group
        shipped = shipped_pick(shape.m, len(shape.sizes), cands)
        for c in cands:
            ratio = None
            if base and c.name in samples:
                pairs = zip(base, samples[c.name], strict=True)
                ratio = round(statistics.median(b.ms / s.ms for b, s in pairs), 4)
            rows.append(dict(label=shape.label, model=model, n=shape.n, k=shape.k, m=shape.m,
                             groups=len(shape.sizes), routing=shape.routing,
                             tokens_per_expert=shape.tokens_per_expert, candidate=c.name,
                             shipped=shipped, baseline=base_name,
                             status=status.get(c.name, "compile failed"),
                             ratio=ratio))  # fmt: skip
        mine = [r for r in rows[-len(cands) :] if r["ratio"]]
        best = max(mine, key=lambda r: r["ratio"], default=None)
        if best:
            ours = next((r["ratio"] for r in mine if r["candidate"] == shipped), None)
            print(f"{shape.label:44s} best {best['candidate']:18s} {best['ratio']:.3f}x"
                  f"  (the shipped rule's {shipped}: {ours})", flush=True)  # fmt: skip
        (out_dir / "tune_grouped.json").write_text(json.dumps(dict(
            device=props.name, dtype=args.dtype, rounds=args.rounds, reps=args.reps,
            torch=torch.__version__, rows=rows), indent=1))  # fmt: skip
    for line in summary(rows, tuple(args.train.split(","))):
        print(line, flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s; wrote {out_dir / 'tune_grouped.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
