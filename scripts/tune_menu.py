"""Measure the sm90 shape policy's table: every menu entry x split-K count against cuBLAS on the
``llm`` suite (more token counts) and the ``midsize`` suite, on the GPU this runs on.

    source .gpu/p2/install.sh            # on the H200 host
    PYTHONPATH=$PWD python scripts/tune_menu.py --out "$OUT"

Writes into ``--out``: ``sm90_<gpu>.json`` (the table ``host.choosing`` reads: copy
it to ``wsgemm/host/choosing/data/`` to ship it), ``tune_menu.csv`` (every candidate on every
shape), ``tune_menu.log`` (what was printed). Both data files are rewritten after every shape,
so a run cut short still leaves what it measured.

A partial re-tune (some suites or token counts, or dropped entries promoted to the menu since)
goes into the shipped table without a GPU:

    python scripts/tune_menu.py --merge tune_menu.csv \
        --into wsgemm/host/choosing/data/sm90_h200.json

rebuilds the CSV's shapes as table points from the rows of today's ``choosing.MENU`` and replaces
the table's points of the same labels (the others stay), noting the CSV in the table's source.

A new table, menu or rule changes what ``choose`` answers; once that is meant,

    python scripts/tune_menu.py --record-choices tests/data/policy_choices.json

records the new answers (``policy_choices``; no GPU needed), which
``tests/host/test_policy.py`` holds every later change to.

Protocol: fp16 inputs, TN (``x @ W.T``, both operands K-major; with ``--layouts own`` each shape
in the layout its suite names, e.g. the midsize suite's NT rows with an M-major A and an N-major
B, each operand's leading dimension padded to 16 bytes as the API's copy would), fp32
accumulate, fp16 out. For
each shape, decode-sized first: the candidates are each menu entry that fits the shape with each
split ``choosing.split_candidates`` allows (the same rule ``choose`` applies). Every candidate
and cuBLAS is checked against an fp32 reference (``wsgemm.bench.check``; a wrong one is reported
and never timed), then all are timed in ``--rounds`` rounds, each round every one once in an order
rotated per round, each timing the median of ``--reps`` calls, each after an L2 flush
(``wsgemm.bench.measure.CudaTimer``). A candidate's ratio is the median over rounds of cuBLAS's
time over its own in the same round. Split candidates run the entry's split-K variant through
``wsgemm.host.workspace.split_launcher`` (a fresh workspace per call, the stream's semaphores),
i.e. what the library will run; unsplit ones call the compiled kernel on kernel views (the API's
host path is not timed: CUDA events bracket the GPU work). Every variant is compiled first, in
``--jobs`` processes, into the on-disk cache.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import fnmatch
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from wsgemm import host
from wsgemm.bench import models, suites
from wsgemm.host import choosing
from wsgemm.host.choosing import MenuEntry, rules
from wsgemm.support import dtype_name, short_name

TOKENS = (1, 16, 64, 128, 256, 1024, 4096, 16384)
SUITES = ("llm", "midsize")

_of = MenuEntry.of
# Measured and left off the menu: no shape where they beat every menu entry by more than the
# run-to-run noise, and each would cost 36 more compiles in ``warm``; or candidates not yet
# measured (said so where they are listed). ``--with-dropped`` times
# them again next to the menu; the GPU tests still run them. What each measured: docs/policy.md.
DROPPED: tuple[MenuEntry, ...] = (
    # Gate/up at 16 tokens: as fast as pingpong-64x256-c1x1, not faster.
    _of("pingpong-64x256-c1x2", "sm90-pingpong", tile_m=64, tile_n=256, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="pingpong"),
    # The swap-AB tiles with 64-deep k-tiles (the menu's until perf.md entry 25): 24 stages of
    # 9 KiB (64x8) read the weights slower than 12 of 18 KiB at every decode shape measured.
    _of("swap-pingpong-64x16-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=16,
        tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    _of("swap-pingpong-64x8-c1x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=8,
        tile_k=64, cluster_m=1, cluster_n=1, schedule="pingpong", swap_ab=True),
    # Stream-K on the shipped tiles (docs/architecture.md): correct on the H200; against the
    # same tile unsplit it loses on every midsize row with short K, wins on half with long K.
    _of("sk-cooperative-128x256-c2x1", "sm90", tile_m=128, tile_n=256, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="cooperative", stream_k=True),
    _of("sk-pingpong-128x128-c2x1", "sm90-pingpong", tile_m=128, tile_n=128, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="pingpong", stream_k=True),
    # Stream-K in teams (the cluster rows sharing a B column take one range together, perf.md
    # entry 105), beside the layouts above, and on the 1x2 cluster that pads no m-tile: 1.026x
    # the layouts above on the band, the best with them 1.0045x the best without (entry 108)
    _of("skt-cooperative-128x256-c2x1", "sm90", tile_m=128, tile_n=256, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="cooperative", stream_k=True, stream_k_teams=True),
    _of("skt-pingpong-128x128-c2x1", "sm90-pingpong", tile_m=128, tile_n=128, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="pingpong", stream_k=True, stream_k_teams=True),
    _of("skt-cooperative-128x256-c1x2", "sm90", tile_m=128, tile_n=256, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="cooperative", stream_k=True, stream_k_teams=True),
    # The qkv layers at 128 tokens in 96-wide tiles (one wave of 128 CTAs): within noise of
    # the menu's 64x128.
    _of("pingpong-64x96-c2x1", "sm90-pingpong", tile_m=64, tile_n=96, tile_k=64,
        cluster_m=2, cluster_n=1, schedule="pingpong"),
    # CUTLASS's usual large tile: within noise of sm90; the 256x160 tile (on the menu) wins the
    # rows it was built for.
    _of("cooperative-256x128-c1x2", "sm90", tile_m=256, tile_n=128, tile_k=64,
        cluster_m=1, cluster_n=2, schedule="cooperative"),
    # Swap-AB with the tokens in a wide N tile, for 129-1024 tokens (perf.md entries 48, 51,
    # 66): timed on the fit draw's band (H100); the cooperative 128x{96,160,224} joined the
    # menu unsplit (entry 51), then 128x{144,192,208} (entry 66: a greedy search over the band's
    # oracle); these are the rest: their wins were within what the menu then ran.
    *(_of(f"swap-pingpong-64x{w}-c2x1", "sm90-pingpong", splits=True, tile_m=64, tile_n=w,
          tile_k=64, cluster_m=2, cluster_n=1, schedule="pingpong", swap_ab=True)
      for w in (96, 160, 192)),
    *(_of(f"swap-cooperative-128x{w}-c2x1", "sm90", tile_m=128, tile_n=w, tile_k=64,
          cluster_m=2, cluster_n=1, schedule="cooperative", swap_ab=True)
      for w in (112, 176, 240)),
)  # fmt: skip


#: Not yet measured: the menu's split-K entries with their K split over a cluster's CTAs instead
#: of through the workspace (``Sm90Config.cluster_split``, perf.md entry 94), each 2 and 4 ways
#: (``--with-cluster-split``; the tuner runs each unsplit: its ways are in its config).
CLUSTER_SPLIT: tuple[MenuEntry, ...] = tuple(
    c
    for e in choosing.MENU
    if e.splits and e.config["cluster_m"] == e.config["cluster_n"] == 1
    for ways in (2, 4)
    for c in [_of(f"cs{ways}-{e.name}", e.backend, **e.config, cluster_split=ways)]
    if c.variant_config().cluster_split_fits()
)


def entry(name: str) -> MenuEntry:
    """The menu, dropped or cluster-split entry called ``name`` (the GPU tests and scripts run
    them all)."""
    for e in choosing.MENU + DROPPED + CLUSTER_SPLIT:
        if e.name == name:
            return e
    names = ", ".join(e.name for e in choosing.MENU + DROPPED)
    raise ValueError(f"no menu or dropped entry {name!r}; there are: {names}")


@dataclass(frozen=True)
class Candidate:
    entry: MenuEntry
    split: int
    majors: tuple[str, str] = ("k", "k")  # the kernel's (A, B) majors (swap-AB: W's, then x's)
    dtype: str = "float16"  # A, B and C (the models suite draws each problem's)

    @property
    def name(self) -> str:
        return f"{self.entry.name}/{self.split}"

    @property
    def variant_key(self) -> tuple[str, bool, tuple[str, str], str]:
        """(entry name, split variant, majors, dtype): every split count runs the entry's one
        split kernel."""
        return (self.entry.name, self.split > 1, self.majors, self.dtype)


def kernel_majors(layout: str, swap_ab: bool) -> tuple[str, str]:
    """The kernel's (A, B) majors for operands in ``layout`` (BLAS letters for x then W^T: T
    row-major, N column-major): x (M, K) is K-major when row-major ("T"), else M-major; W^T
    (K, N) is N-major when row-major, else K-major. Under swap-AB the kernel's A is W (N, K)
    and its B is x: N plays the kernel's M and M its N."""
    x_k, w_k = layout[0] == "T", layout[1] == "N"
    if swap_ab:
        return ("k" if w_k else "m", "k" if x_k else "n")
    return ("k" if x_k else "m", "k" if w_k else "n")


def tuned_layout(shape: suites.Shape, own: bool) -> str:
    """The layout a shape is timed in: its suite's (``--layouts own``) or TN."""
    return (shape.layout or "TN") if own else "TN"


def shapes_to_tune(names=SUITES, tokens=TOKENS) -> list[suites.Shape]:
    """The suites' shapes (each with its suite's layout, timed TN unless ``--layouts own``),
    fewest FLOP first: the decode shapes, the policy's reason to be, are measured first if a
    run is cut short."""
    shapes = []
    for name in names:
        shapes += suites.suite(name, tokens=tokens) if name == "llm" else suites.suite(name)
    return sorted(shapes, key=lambda s: s.flop)


def drawn_shapes(seed: int, families: str, count: int) -> tuple[list[suites.Shape], dict]:
    """A ``models`` draw (``--draw``): its shapes (TN, grouped by family), fewest FLOP first,
    and label -> the dtype each was drawn with. ``families``: "fit", "heldout" (the split of
    ``bench.models``) or family names, comma-separated."""
    named = {"fit": models.FIT_FAMILIES, "heldout": models.HELDOUT_FAMILIES}
    chosen = named.get(families) or tuple(f for f in families.split(",") if f)
    draws = models.draw(seed, chosen, count)
    shapes = [suites.Shape(d.m, d.n, d.k, label=d.label, group=d.family) for d in draws]
    dtypes = {d.label: dtype_name(d.dtype) for d in draws}
    return sorted(shapes, key=lambda s: s.flop), dtypes


def plan(
    shapes, entries, sm_count: int, own_layouts: bool = False, dtypes: dict | None = None
) -> list[tuple[suites.Shape, list[Candidate]]]:
    """Per shape: each entry that fits with each split the policy allows; the shipped entries
    unsplit even where they do not fit (the baseline the menu is measured against). Each
    candidate's kernel reads the operands in the shape's timed layout (``tuned_layout``), in
    the shape's dtype (``dtypes``: label -> dtype; fp16 where it has none)."""
    out = []
    for s in shapes:
        cands = []
        layout = tuned_layout(s, own_layouts)
        dtype = (dtypes or {}).get(s.label, "float16")
        for e in entries:
            config = e.variant_config()  # (None: the backend's shipped config)
            if config is not None and not config.k_tiles_for_every_rank(s.k):
                splits = ()  # a cluster split's rank without a k-tile would wait forever
            elif choosing.fits(e, s.m, s.n):
                splits = choosing.split_candidates(e, s.m, s.n, s.k, 1, sm_count)
            else:
                splits = (1,) if e.shipped else ()
            majors = kernel_majors(layout, e.swap_ab)
            cands += [Candidate(e, split, majors, dtype) for split in splits]
        out.append((s, cands))
    return out


def variants(planned, arch: str = "sm_90a") -> dict[tuple, host.Variant]:
    """(entry name, split variant, majors, dtype) -> the compiled variant, C in the inputs'
    dtype (split-K runs inside the kernel: one split variant per entry, majors and dtype serves
    every count)."""
    out = {}
    for _, cands in planned:
        for c in cands:
            if c.variant_key not in out:
                config = c.entry.variant_config(split=c.split > 1)
                out[c.variant_key] = host.Variant(c.entry.backend, arch, c.dtype, c.dtype,
                                                  "float32", *c.majors, config)  # fmt: skip
    return out


def kernel_view(t):
    """(rows, cols) with one unit-stride mode -> (rows, cols, 1) with a 16-byte-multiple batch
    stride, as the API's plan makes them (the compiled kernel declares every non-unit stride
    16-byte divisible)."""
    rows, cols = t.shape
    if t.stride(1) == 1:  # row-major: cols contiguous
        return t.as_strided((rows, cols, 1), (t.stride(0), 1, rows * t.stride(0)))
    return t.as_strided((rows, cols, 1), (1, t.stride(1), cols * t.stride(1)))


def operand(torch, rows: int, cols: int, rows_unit: bool, device, generator, dtype=None):
    """A randn (rows, cols) view (fp16 unless ``dtype``) whose unit-stride mode is rows
    (``rows_unit``) or cols, the other stride padded to a 16-byte multiple."""
    dtype = dtype or torch.float16
    if rows_unit:
        pad = -(-rows // 8) * 8
        return torch.randn(cols, pad, device=device, generator=generator).to(dtype)[:, :rows].t()
    pad = -(-cols // 8) * 8
    return torch.randn(rows, pad, device=device, generator=generator).to(dtype)[:, :cols]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="output folder ($OUT)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10, help="calls per timing (median)")
    parser.add_argument("--jobs", type=int, default=14, help="compile processes")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="llm token counts")
    parser.add_argument(
        "--with-dropped",
        action="store_true",
        help="also time DROPPED (CSV only, never in the table)",
    )
    parser.add_argument(
        "--with-cluster-split",
        action="store_true",
        help="also time CLUSTER_SPLIT: the split entries with K split over a cluster (CSV only)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="stop starting new shapes after this many seconds",
    )
    parser.add_argument(
        "--layouts",
        choices=("TN", "own"),
        default="TN",
        help="time every shape TN (x @ W.T), or in the layout its suite names",
    )
    parser.add_argument(
        "--draw",
        metavar="SEED:FAMILIES:COUNT",
        help="tune a models-suite draw instead of --suites (FAMILIES: fit, heldout or names "
        "joined by +), each problem in its drawn dtype: with --with-dropped, the oracle",
    )
    parser.add_argument(
        "--shapes",
        help="M,N,K;M,N,K...: time these (TN) instead of --suites or --draw, in --dtype",
    )
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                        help="--shapes' dtype")  # fmt: skip
    parser.add_argument(
        "--m-range",
        metavar="LO:HI",
        help="only the shapes with LO <= M <= HI (e.g. 129:1024, the band of perf.md entry 33)",
    )
    parser.add_argument(
        "--entries",
        metavar="PATTERNS",
        help="only the entries whose names match one of these shell patterns, comma-separated "
        "(e.g. 'swap-pingpong-*,cs*', the decode entries and their cluster splits)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan; no GPU needed")
    parser.add_argument("--merge", metavar="CSV", help="a tune_menu.csv to merge (no GPU needed)")
    parser.add_argument("--into", metavar="TABLE", help="the table --merge rewrites")
    parser.add_argument("--sm-count", type=int, default=132, help="SMs, for --dry-run")
    parser.add_argument(
        "--record-choices",
        metavar="JSON",
        help="write what choose answers on the suites' shapes (policy_choices; no GPU needed)",
    )
    args = parser.parse_args(argv)  # fmt: skip

    if args.record_choices:
        Path(args.record_choices).write_text(choices_json(policy_choices()))
        return 0
    if args.merge or args.into:
        if not (args.merge and args.into):
            parser.error("--merge CSV and --into TABLE go together")
        return _merge(Path(args.merge), Path(args.into))
    entries = choosing.MENU + (DROPPED if args.with_dropped else ())
    entries += CLUSTER_SPLIT if args.with_cluster_split else ()
    if args.entries:
        patterns = [p for p in args.entries.split(",") if p]
        entries = tuple(e for e in entries if any(fnmatch.fnmatchcase(e.name, p) for p in patterns))
        if not entries:
            parser.error(f"--entries {args.entries!r} matches no entry")
    dtypes = None
    if args.shapes:
        try:
            shapes = sorted(
                (suites.Shape(int(m), int(n), int(k), label=f"{m}x{n}x{k}")
                 for m, n, k in (s.split(",") for s in args.shapes.split(";") if s.strip())),
                key=lambda s: s.flop,
            )  # fmt: skip
        except ValueError as exc:
            parser.error(f"--shapes {args.shapes!r}: want M,N,K;M,N,K...: {exc}")
        dtypes = {s.label: args.dtype for s in shapes}
    elif args.draw:
        try:
            seed, families, count = args.draw.split(":")
            shapes, dtypes = drawn_shapes(int(seed), families.replace("+", ","), int(count))
        except ValueError as exc:
            parser.error(f"--draw {args.draw!r}: {exc}")
    else:
        shapes = shapes_to_tune(args.suites.split(","), suites.parse_int_list(args.tokens))
    if args.m_range:
        try:
            lo, hi = (int(v) for v in args.m_range.split(":"))
        except ValueError:
            parser.error(f"--m-range {args.m_range!r}: want LO:HI, two integers")
        if lo > hi:
            parser.error(f"--m-range {args.m_range!r}: LO is above HI")
        shapes = [s for s in shapes if lo <= s.m <= hi]
    args.dtypes = dtypes
    if args.dry_run:
        planned = plan(shapes, entries, args.sm_count, args.layouts == "own", dtypes)
        for s, cands in planned:
            layout = tuned_layout(s, args.layouts == "own")
            print(f"{s.label:22s} {s.m}x{s.n}x{s.k} {layout}: {' '.join(c.name for c in cands)}")
        count = sum(len(c) for _, c in planned)
        print(f"{len(planned)} shapes, {count} candidates, {len(variants(planned))} variants")
        return 0
    if not args.out:
        parser.error("--out (or $OUT) is required")
    return _tune(args, entries, shapes)


# The GPU the recorded choices are made for: the tests' stand-in H200.
CHOICE_SM_COUNT, CHOICE_CC = 132, (9, 0)
CHOICE_COLUMNS = (
    "label", "m", "n", "k", "ab_dtype", "batch_invariant", "table", "entry", "split", "source"
)  # fmt: skip


def policy_choices() -> list[list]:
    """What ``choose`` answers (``CHOICE_COLUMNS``) on every shape of the tuned suites (the
    ``llm`` suite at ``TOKENS``, and ``midsize``) with fp16 and bf16 inputs and output and fp32
    accumulation, batch-invariant off and on, from the shipped table ("shipped") and from
    none ("none": the heuristic's answers), on ``CHOICE_SM_COUNT`` SMs of capability
    ``CHOICE_CC``. The environment's table, if any, is set aside while it runs."""
    sm_count, cc = CHOICE_SM_COUNT, CHOICE_CC
    shapes = suites.suite("llm", tokens=TOKENS) + suites.suite("midsize")
    before = os.environ.pop(choosing.ENV_TABLE, None)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            empty = Path(tmp) / "none.json"
            table = dict(schema=choosing.TABLE_SCHEMA, device="none", sm_count=sm_count,
                         cc=list(cc), source="no measurement", points=[])  # fmt: skip
            empty.write_text(json.dumps(table))
            for name, override in (("shipped", None), ("none", str(empty))):
                if override:
                    os.environ[choosing.ENV_TABLE] = override
                rules._environment.cache_clear()  # the policy reads the variable once
                for s in shapes:
                    for ab in ("float16", "bfloat16"):
                        for invariant in (False, True):
                            c = choosing.choose(s.m, s.n, s.k, 1, ab, ab, "float32", sm_count, cc,
                                                batch_invariant=invariant)  # fmt: skip
                            rows.append([s.label, s.m, s.n, s.k, ab, invariant, name,
                                         c.menu_entry.name, c.split, c.source])  # fmt: skip
    finally:
        os.environ.pop(choosing.ENV_TABLE, None)
        if before is not None:
            os.environ[choosing.ENV_TABLE] = before
        rules._environment.cache_clear()
    return rows


def choices_json(rows: list[list]) -> str:
    """``policy_choices``'s rows as tests/data/policy_choices.json holds them: one a line."""
    about = (
        "choose's answers (scripts/tune_menu.py policy_choices): C = A @ B, batch 1, C in the "
        "inputs' dtype, fp32 accumulate, on a stand-in H200 (132 SMs, sm_90); regenerate after "
        "a deliberate policy change: python scripts/tune_menu.py --record-choices "
        "tests/data/policy_choices.json"
    )
    head = {"about": about, "sm_count": CHOICE_SM_COUNT, "cc": list(CHOICE_CC),
            "tokens": list(TOKENS),
            "columns": list(CHOICE_COLUMNS)}  # fmt: skip
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    body = ",\n".join(f"    {json.dumps(row)}" for row in rows)
    return "{\n" + "\n".join(lines) + '\n  "rows": [\n' + body + "\n  ]\n}\n"


def compiled(needed: dict, jobs: int, sms: int, log) -> dict | None:
    """``needed`` (key -> ``host.Variant``) compiled in parallel and loaded: key -> (kernel,
    the clusters that run at once on ``sms`` SMs); None, each failure logged, if any failed
    (the current warm reports a failure per variant, an older one raised)."""
    outcomes = host.warm(list(needed.values()), jobs=jobs) or []
    failed = [o for o in outcomes if getattr(o, "status", "") == "failed"]
    for o in failed:
        log(f"compile FAILED: {o.key}: {getattr(o, 'error', '')}")
    if failed:
        return None
    return {key: (host.COMPILE_CACHE.get(v), _clusters(v, sms)) for key, v in needed.items()}


def _clusters(v: host.Variant, sms: int) -> int:
    """The clusters a persistent launch of ``v`` runs at once: ``sms // size``, or for a
    cluster of more than two CTAs (a cluster split of 4) what the driver says fits (a cluster
    lies in one GPC), as the library launches it (``CudaDevices.clusters``)."""
    size = host.cluster_size(v.kernel_config())
    if size <= 2:
        return sms // size
    import torch

    from wsgemm.host.dispatch import CudaDevices

    return min(sms // size, CudaDevices().clusters(torch.cuda.current_device(), size))


def launcher(c: Candidate, kernels: dict, semaphores) -> tuple:
    """(launch, clusters) of candidate ``c`` from ``compiled``'s kernels: its split-K or
    stream-K variant through ``split_launcher`` (a fresh workspace per call, the stream's
    semaphores), what the library runs; an unsplit one as compiled."""
    from wsgemm.host.workspace import split_launcher

    fn, clusters = kernels[c.variant_key]
    config = c.entry.variant_config(split=c.split > 1)
    if config is not None and config.splits_in_kernel:
        fn = split_launcher(fn, config, c.split, semaphores)
    return fn, clusters


class Log:
    """A log line to stdout and to ``path``."""

    def __init__(self, path: Path):
        self._file = path.open("w")

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self._file.write(text + "\n")
        self._file.flush()


def _tune(args, entries, shapes) -> int:
    import torch

    from wsgemm.bench import check
    from wsgemm.bench.measure import CudaTimer, interleaved
    from wsgemm.bench.nvml import Nvml

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "tune_menu.log")
    start = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    cc = torch.cuda.get_device_capability(device)
    if cc != (9, 0):
        raise SystemExit(
            f"the sm90 menu needs an sm_90 GPU; this is {props.name} sm_{cc[0]}{cc[1]}"
        )
    sms = props.multi_processor_count
    planned = plan(shapes, entries, sms, args.layouts == "own", args.dtypes)
    needed = variants(planned)
    log(f"{props.name}, {sms} SMs; {len(planned)} shapes, "
        f"{sum(len(c) for _, c in planned)} candidates, {len(needed)} variants")  # fmt: skip
    kernels = compiled(needed, args.jobs, sms, log)
    if kernels is None:
        return 1
    log(f"compiled and loaded in {time.perf_counter() - start:.0f} s")

    # As the benchmark (runner._full_precision_cublas_reductions): an fp32-accumulate cuBLAS
    # must not reduce its split-K partials in fp16.
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    nvml = Nvml.open(device.index)
    timer = CudaTimer(device, nvml, getattr(props, "L2_cache_size", None))
    words = props.name.lower().replace("nvidia", "").split()
    stem = "sm90_" + "_".join("".join(ch for ch in w if ch.isalnum()) for w in words)
    layouts = "TN" if args.layouts == "TN" else "each shape in its suite's layout"
    table = {
        "schema": choosing.TABLE_SCHEMA,
        "device": props.name,
        "sm_count": sms,
        "cc": list(cc),
        "source": (
            f"scripts/tune_menu.py on {props.name}, {datetime.date.today()}, git {_git_sha()}, "
            f"torch {torch.__version__}: "
            + (f"models draw {args.draw}, each in its dtype" if args.draw else "fp16")
            + f" {layouts}, fp32 accumulate (cuBLAS too), C in the inputs' dtype; "
            f"{args.rounds} interleaved rounds x {args.reps} cold-L2 reps, median of rounds"
        ),
        "points": [],
    }
    rows = []
    done = 0
    for shape, cands in planned:
        if time.perf_counter() - start > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: {len(planned) - done} shapes not measured")
            table["source"] += f"; cut short: {len(planned) - done} shapes not measured"
            break
        point, shape_rows = _measure_shape(
            shape, cands, kernels, timer, args, device, torch, check, interleaved, log
        )
        table["points"].append(point)
        rows += shape_rows
        done += 1
        _write(out, stem, table, rows)
    _summary(table, rows, log)
    for line in oracle_summary(rows, sms):
        log(line)
    log(f"done in {time.perf_counter() - start:.0f} s; wrote {out / (stem + '.json')}")
    return 0


def _measure_shape(shape, cands, kernels, timer, args, device, torch, check, interleaved, log):
    from wsgemm.host.workspace import SemaphoreCache

    semaphores = SemaphoreCache()

    m, n, k = shape.m, shape.n, shape.k
    layout = tuned_layout(shape, args.layouts == "own")
    dtype_name = cands[0].dtype if cands else "float16"
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=device).manual_seed(m * 131 + n * 7 + k)
    # 16-byte leading dimensions, as the API's kernel views (or its copies) have them
    x = operand(torch, m, k, layout[0] == "N", device, gen, dtype)  # x (M, K): M-major if "N"
    w = operand(torch, n, k, layout[1] == "T", device, gen, dtype)  # W (N, K): N-major if "T"
    ref = check.reference(x, w.t())
    a, b = kernel_view(x), kernel_view(w)

    def buffer():
        return torch.empty(m, -(-n // 8) * 8, dtype=dtype, device=device)[:, :n]

    calls = {}
    cublas_out = buffer()
    calls["cublas"] = (lambda: torch.mm(x, w.t(), out=cublas_out), cublas_out)
    for c in cands:
        fn, clusters = launcher(c, kernels, semaphores)
        o = buffer()
        if c.entry.swap_ab:  # C^T = B^T A^T: the kernel's A is W, its B is x, its C is o^T
            ld = o.stride(0)  # (n, m, 1), unit stride along the kernel's M, 16-byte strides
            ct = o.as_strided((n, m, 1), (1, ld, m * ld))
            calls[c.name] = (_call(fn, b, a, ct, clusters), o)
        else:
            calls[c.name] = (_call(fn, a, b, kernel_view(o), clusters), o)

    model = check.model_tolerance(short_name(dtype_name), "fp32", k)
    status, errors = {}, {}
    for name, (call, o) in calls.items():
        check.poison(o)
        call()
        torch.cuda.synchronize(device)
        errors[name] = check.errors(o, ref)
        tol = model if name == "cublas" else check.tolerance(model, errors["cublas"])
        status[name] = tol.verdict(errors[name]) or "ok"
        if status[name] != "ok":
            log(f"  WRONG {shape.label} {name}: {status[name]}")
    del ref
    timed = {name: fn for name, (fn, _) in calls.items() if status[name] == "ok"}
    samples = interleaved(timer, timed, args.rounds, args.reps)

    base = samples.get("cublas")
    point = _point(shape.label, m, n, k, layout)
    if base:
        point["cublas_us"] = round(statistics.median(s.ms for s in base) * 1e3, 2)
    rows = []
    menu = {e.name for e in choosing.MENU}
    for c in [None, *cands]:
        name = "cublas" if c is None else c.name
        row = dict(label=shape.label, group=shape.group, m=m, n=n, k=k, layout=layout,
                   dtype=dtype_name,
                   entry="cublas" if c is None else c.entry.name, split=1 if c is None else c.split,
                   status=status[name], median_us=None, cublas_us=point.get("cublas_us"),
                   ratio=None, ratio_min=None, ratio_max=None, sm_mhz=None,
                   on_menu=c is not None and c.entry.name in menu)  # fmt: skip
        if name in samples and base:
            ratios = [bs.ms / s.ms for bs, s in zip(base, samples[name], strict=True)]
            clocks = [s.sm_clock_mhz for s in samples[name] if s.sm_clock_mhz]
            row.update(
                median_us=round(statistics.median(s.ms for s in samples[name]) * 1e3, 2),
                ratio=round(statistics.median(ratios), 4),
                ratio_min=round(min(ratios), 4),
                ratio_max=round(max(ratios), 4),
                sm_mhz=round(statistics.median(clocks)) if clocks else None,
            )
            if c is not None and row["on_menu"]:
                point["ratios"].append(
                    dict(
                        entry=c.entry.name, split=c.split, ratio=row["ratio"], us=row["median_us"]
                    )  # fmt: skip
                )
        rows.append(row)
    best = max((r for r in rows if r["ratio"] and r["entry"] != "cublas"),
               key=lambda r: r["ratio"], default=None)  # fmt: skip
    if best:
        log(f"{shape.label:22s} cuBLAS {point.get('cublas_us', 0):8.1f} us  best "
            f"{best['entry']}/{best['split']} {best['ratio']:.3f}x "
            f"({len(timed) - 1} timed)")  # fmt: skip
    return point, rows


def _call(fn, a, b, c, clusters):
    return lambda: fn(a, b, c, clusters)


def _write(out: Path, stem: str, table: dict, rows: list[dict]) -> None:
    (out / f"{stem}.json").write_text(json.dumps(table, indent=1) + "\n")
    with (out / "tune_menu.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _point(label: str, m: int, n: int, k: int, layout: str = "TN") -> dict:
    """A table point with no candidates yet (one batch, the layout it was timed in)."""
    return dict(label=label, m=m, n=n, k=k, batch=1, layout=layout, ratios=[])


def points_from_rows(rows: list[dict], menu: set[str]) -> list[dict]:
    """Table points from ``tune_menu.csv`` rows (strings, as read back): per shape, in the CSV's
    order, the timed candidates whose entry is in ``menu``, and cuBLAS's time."""
    points: dict[str, dict] = {}
    for r in rows:
        # a CSV older than --layouts has no layout column: it timed TN
        point = _point(r["label"], int(r["m"]), int(r["n"]), int(r["k"]), r.get("layout") or "TN")
        p = points.setdefault(r["label"], point)
        if r["cublas_us"]:
            p["cublas_us"] = float(r["cublas_us"])
        if r["entry"] in menu and r["status"] == "ok" and r["ratio"]:
            p["ratios"].append(dict(entry=r["entry"], split=int(r["split"]),
                                    ratio=float(r["ratio"]), us=float(r["median_us"])))  # fmt: skip
    return [p for p in points.values() if p["ratios"]]


def merge_points(table: dict, points: list[dict], note: str) -> dict:
    """``table`` with ``points`` in place of its points of the same labels (new labels are
    appended), and ``note`` added to its source."""
    new = {p["label"]: p for p in points}
    kept = [p for p in table["points"] if p["label"] not in new]
    return dict(table, points=kept + list(new.values()), source=f"{table['source']}; {note}")


def _merge(csv_path: Path, table_path: Path) -> int:
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    points = points_from_rows(rows, {e.name for e in choosing.MENU})
    if not points:
        raise SystemExit(f"{csv_path}: no timed row of a menu entry")
    table = json.loads(table_path.read_text())
    merged = merge_points(
        table, points, f"{len(points)} points rebuilt from {csv_path.name} by --merge"
    )
    staged = table_path.with_name(table_path.name + ".merging")
    staged.write_text(json.dumps(merged, indent=1) + "\n")
    try:
        choosing.load_table(staged)  # what the policy reads must load before it replaces the table
    except ValueError:
        staged.unlink()
        raise
    staged.replace(table_path)
    replaced = len(table["points"]) + len(points) - len(merged["points"])
    print(f"{table_path}: {len(points)} points from {csv_path} ({replaced} replaced)")
    return 0


def _geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def _summary(table: dict, rows: list[dict], log) -> None:
    """Per suite: the best menu candidate per shape (what the table makes the policy pick at
    these shapes) against the pre-menu choice (auto's rule before the policy: the 128x256 tile
    unless it has fewer tiles than half the SMs, then the shipped ping-pong)."""
    by_shape = {}
    for r in rows:
        by_shape.setdefault((r["group"], r["label"]), []).append(r)
    sms = table["sm_count"]
    groups = {}
    for (group, _), rs in by_shape.items():
        m, n = rs[0]["m"], rs[0]["n"]
        menu = [r for r in rs if r["ratio"] and r["on_menu"] and r["entry"] != "cublas"]
        if not menu:
            continue
        best = max(r["ratio"] for r in menu)
        shipped_name = "sm90" if -(-m // 128) * -(-n // 256) >= sms // 2 else "sm90-pingpong"
        shipped = [r["ratio"] for r in menu if r["entry"] == shipped_name and r["split"] == 1]
        groups.setdefault(group, []).append((best, shipped[0] if shipped else None))
    for group, pairs in sorted(groups.items()):
        best, shipped = zip(*pairs, strict=True)
        log(f"{group:8s} {len(pairs):3d} shapes: menu+policy geomean {_geomean(best):.3f}x "
            f"(min {min(best):.3f}), pre-policy rule {_geomean(shipped):.3f}x")  # fmt: skip


def oracle_summary(rows: list[dict], sm_count: int) -> list[str]:
    """Per token band (``suites.TOKEN_BANDS``) and overall: the geomean over shapes of the best
    timed candidate (the oracle: menu and dropped entries), of the best menu candidate, and of
    what ``choose`` picks today (the policy as these timings price it: the kernel time, not the
    API's host path), with the minimum and the shapes below 0.95x cuBLAS."""
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        by_shape.setdefault(r["label"], []).append(r)
    columns: dict[str, dict[str, list[float]]] = {}
    for rs in by_shape.values():
        timed = {(r["entry"], int(r["split"])): float(r["ratio"]) for r in rs
                 if r["ratio"] and r["entry"] != "cublas"}  # fmt: skip
        if not timed:
            continue
        m, n, k = int(rs[0]["m"]), int(rs[0]["n"]), int(rs[0]["k"])
        dtype = rs[0].get("dtype") or "float16"
        pick = choosing.choose(m, n, k, 1, dtype, dtype, "float32", sm_count, (9, 0))
        menu = [v for (name, _), v in timed.items() if name in {e.name for e in choosing.MENU}]
        values = {
            "oracle": max(timed.values()),
            "menu": max(menu, default=None),
            "policy": timed.get((pick.menu_entry.name, pick.split)),
        }
        for key in (suites.token_band(m), "all"):
            for name, v in values.items():
                if v is not None:
                    columns.setdefault(key, {}).setdefault(name, []).append(v)
    lines = []
    for key in [*(suites.token_band(lo) for lo, _ in suites.TOKEN_BANDS), "all"]:
        if key not in columns:
            continue
        parts = [
            f"{name} {_geomean(vs):.3f}x (min {min(vs):.2f}, {sum(v < 0.95 for v in vs)} < 0.95)"
            for name, vs in columns[key].items()
        ]
        lines.append(f"{key:>9s} {len(columns[key]['oracle']):4d} shapes: " + "; ".join(parts))
    return lines


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
