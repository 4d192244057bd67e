"""Measure the split-K / stream-K fix-up: its exposed cost per shared tile, and the stream-K
tile against the same tile unsplit on the rows where docs/perf.md entry 28 measured it (issue
#23 item 1: the cost before and after a change to ``kernels/sm90/split_k.py``).

Part 1, the cost per shared tile. A grid of T output tiles cut ``p`` ways with ``T * p`` at most
the SM count is one wave in which every unit (a k-range of one tile) has its own SM: each does
the mainloop of ``K / p`` and then takes part in one fix-up (stores its fp32 partial, or waits
for the others' and sums them). The same tile unsplit on a problem of depth ``K / p`` does the
same mainloop on ``T`` SMs with no fix-up. So ``time(split p, K) - time(unsplit, K / p)`` is
the fix-up's cost on the critical path: per shared tile, since every tile's fix-up runs at
once. (The unsplit call runs ``p`` times fewer CTAs: their HBM traffic is lower, so the
difference also holds the extra operand bytes of the split call; with K / p of at least 512
that is a small part of it.)

Part 2, the stream-K hybrid against the same tile unsplit (``sk-cooperative-128x256-c2x1``
against ``sm90``) on entry 28's six midsize rows, where it measured 0.50-1.11x.

Every call is checked once against float64, then all of a problem's calls are timed in
interleaved rounds (``wsgemm.bench.measure.interleaved``: cold L2, order rotated per round);
a difference or ratio is formed within each round and the median over rounds reported.

    python scripts/bench_fixup.py --out DIR [--rounds 7] [--reps 20] [--jobs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_menu  # noqa: E402  (scripts/ is no package)

#: Part 2: entry 28's midsize rows (M, N, K) and its stream-K / unsplit ratio there.
ENTRY_28: tuple[tuple[int, int, int, float], ...] = (
    (4472, 1928, 680, 0.80),
    (5024, 880, 1112, 0.82),
    (2888, 2072, 1504, 0.79),
    (2712, 3592, 2920, 1.04),
    (4241, 2251, 5402, 1.11),
    (1118, 811, 646, 0.50),
)
STREAM_K, UNSPLIT = "sk-cooperative-128x256-c2x1", "sm90"
SMS = 132


@dataclass(frozen=True)
class FixupCase:
    entry: str
    m: int
    n: int
    k: int
    parts: int

    @property
    def tiles(self) -> int:
        return tune_menu.entry(self.entry).tiles(self.m, self.n, 1)

    @property
    def label(self) -> str:
        return f"{self.entry} {self.m}x{self.n}x{self.k} /{self.parts}"


def fixup_cases(sms: int = SMS) -> list[FixupCase]:
    """Part 1's problems: each entry on grids of 32 and 64 tiles, K from 1024 to 8192, cut 2 or
    4 ways where the units make at most one wave and each keeps at least 8 k-tiles."""
    out = []
    for name, grids in (
        ("cooperative-128x128-c1x2", ((1024, 512), (1024, 1024))),
        ("pingpong-64x128-c2x1", ((512, 512), (512, 1024))),
    ):
        e = tune_menu.entry(name)
        for m, n in grids:
            for k in (1024, 4096, 8192):
                for p in (2, 4):
                    c = FixupCase(name, m, n, k, p)
                    if c.tiles * p <= sms and k // p >= 8 * e.tile_k:
                        out.append(c)
    return out


def _problems(sms: int) -> list[tuple[str, object, list[tuple[str, int, int, int, object]]]]:
    """(kind, key, calls): the calls of one problem, timed together, each (name, m, n, k,
    tune_menu.Candidate)."""
    out = []
    for c in fixup_cases(sms):
        e = tune_menu.entry(c.entry)
        out.append(
            (
                "fixup",
                c,
                [
                    ("split", c.m, c.n, c.k, tune_menu.Candidate(e, c.parts)),
                    ("part", c.m, c.n, c.k // c.parts, tune_menu.Candidate(e, 1)),
                ],
            )
        )
    for m, n, k, before in ENTRY_28:
        out.append(
            (
                "streamk",
                (m, n, k, before),
                [
                    ("streamk", m, n, k, tune_menu.Candidate(tune_menu.entry(STREAM_K), 1)),
                    ("unsplit", m, n, k, tune_menu.Candidate(tune_menu.entry(UNSPLIT), 1)),
                ],
            )
        )
    return out


def _variants(problems) -> dict:
    return tune_menu.variants([(None, [c]) for _, _, calls in problems for *_, c in calls])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for fixup.json and the log")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=8, help="parallel compiles")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the problems and variants (no GPU needed)"
    )
    args = parser.parse_args(argv)
    problems = _problems(SMS)
    needed = _variants(problems)
    if args.dry_run:
        for kind, _, calls in problems:
            print(kind, [(name, f"{m}x{n}x{k}", c.name) for name, m, n, k, c in calls])
        print(f"{len(problems)} problems, {len(needed)} variants")
        return 0
    return _run(args, problems, needed)


def _run(args, problems, needed) -> int:
    import torch

    from wsgemm.bench import check
    from wsgemm.bench.measure import CudaTimer, interleaved
    from wsgemm.bench.nvml import Nvml
    from wsgemm.host.workspace import SemaphoreCache

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = tune_menu.Log(out / "fixup.log")

    start = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    sms = props.multi_processor_count
    if sms != SMS:
        log(f"note: {sms} SMs, the cases were sized for {SMS}")
    kernels = tune_menu.compiled(needed, args.jobs, sms, log)
    if kernels is None:
        return 1
    log(f"{props.name}; {len(needed)} variants compiled in {time.perf_counter() - start:.0f} s")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    timer = CudaTimer(device, Nvml.open(device.index), getattr(props, "L2_cache_size", None))
    semaphores = SemaphoreCache()
    gen = torch.Generator(device=device).manual_seed(0)

    def call(m, n, k, cand):
        """A checked call of ``cand`` on a randn TN problem (m, n, k), as tune_menu runs it."""
        x = tune_menu.operand(torch, m, k, False, device, gen)
        w = tune_menu.operand(torch, n, k, False, device, gen)
        o = torch.empty(m, -(-n // 8) * 8, dtype=torch.float16, device=device)[:, :n]
        fn, clusters = tune_menu.launcher(cand, kernels, semaphores)
        run = tune_menu._call(fn, tune_menu.kernel_view(x), tune_menu.kernel_view(w),
                              tune_menu.kernel_view(o), clusters)  # fmt: skip
        check.poison(o)
        run()
        torch.cuda.synchronize(device)
        ref = check.reference(x, w.t())
        mine, theirs = check.errors(o, ref), check.errors(torch.mm(x, w.t()), ref)
        tol = check.tolerance(check.model_tolerance("fp16", "fp32", k), theirs)
        return run, tol.verdict(mine)

    record = {"device": props.name, "git": tune_menu._git_sha(), "rounds": args.rounds,
              "reps": args.reps, "fixup": [], "streamk": []}  # fmt: skip
    for kind, key, spec in problems:
        calls = {}
        for name, m, n, k, cand in spec:
            calls[name], wrong = call(m, n, k, cand)
            if wrong:
                log(f"WRONG {cand.name} {m}x{n}x{k}: {wrong}")
                return 1
        samples = interleaved(timer, calls, args.rounds, args.reps)
        if kind == "fixup":
            record["fixup"].append(_fixup_row(key, samples["split"], samples["part"], log))
        else:
            record["streamk"].append(_streamk_row(key, samples["streamk"], samples["unsplit"], log))
        (out / "fixup.json").write_text(json.dumps(record, indent=1) + "\n")
    if record["fixup"]:
        costs = [r["fixup_us"] for r in record["fixup"]]
        log(f"fix-up per shared tile: median {statistics.median(costs):.2f} us "
            f"({min(costs):.2f}-{max(costs):.2f}) over {len(costs)} problems")  # fmt: skip
    log(f"done in {time.perf_counter() - start:.0f} s")
    return 0


def _us(samples) -> float:
    return round(statistics.median(s.ms for s in samples) * 1e3, 2)


def _fixup_row(c: FixupCase, split, part, log) -> dict:
    """The split call's time less the unsplit K / parts call's, per round (timed beside each
    other), median over rounds."""
    diffs = [(s.ms - p.ms) * 1e3 for s, p in zip(split, part, strict=True)]
    row = dict(entry=c.entry, m=c.m, n=c.n, k=c.k, parts=c.parts, tiles=c.tiles,
               split_us=_us(split), part_us=_us(part),
               fixup_us=round(statistics.median(diffs), 2),
               lo=round(min(diffs), 2), hi=round(max(diffs), 2))  # fmt: skip
    log(f"{c.label}: split {row['split_us']} us, K/{c.parts} unsplit {row['part_us']} us -> "
        f"fix-up {row['fixup_us']} us ({row['lo']}..{row['hi']})")  # fmt: skip
    return row


def _streamk_row(key, sk, un, log) -> dict:
    m, n, k, before = key
    ratios = [u.ms / t.ms for t, u in zip(sk, un, strict=True)]
    row = dict(m=m, n=n, k=k, streamk_over_unsplit=round(statistics.median(ratios), 3),
               lo=round(min(ratios), 3), hi=round(max(ratios), 3), entry28=before,
               streamk_us=_us(sk), unsplit_us=_us(un))  # fmt: skip
    log(f"stream-K {m}x{n}x{k}: {row['streamk_over_unsplit']:.3f}x the unsplit tile "
        f"({row['lo']:.3f}-{row['hi']:.3f}; entry 28: {before:.2f}x)")  # fmt: skip
    return row


if __name__ == "__main__":
    sys.exit(main())
