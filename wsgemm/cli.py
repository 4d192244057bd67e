"""``python -m wsgemm``: ``inspect`` (compile and read SASS, no GPU needed), ``warm`` (fill the
compile cache), ``cache info|clear``, ``explain`` (what ``matmul`` runs for a shape, and why),
``bench`` and ``trace`` (one call's per-role timeline).

Building the parser imports neither torch nor the DSL, so ``--help`` is fast; each command
imports what it needs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from .bench import cli as bench_cli
from .bench.cli import stderr_console as _err_console
from .tracing import cli as trace_cli

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: How many stored tuned picks ``cache info`` lists (the rest it counts).
LISTED_PICKS = 20


# ----------------------------------------------------------------------------- inspect


def _inspect(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from . import inspection as insp
    from .host import BACKENDS
    from .sass import NvdisasmMissing

    console = _err_console()
    if args.menu:
        menu = insp.menu_variants(args.arch, args.all)
        if not menu:
            console.print(
                "inspect: --menu lists the sm90 kernels backend='auto' picks from, which need "
                f"--arch sm_90a, not {args.arch}",
                markup=False,
            )
            return EXIT_USAGE
        todo = [m.variant for m in menu]
    else:
        names = insp.backends_for(args.arch)
        if args.backend:
            problem = insp.mismatch(args.arch, args.backend)
            if problem:
                console.print(f"inspect: {problem}", markup=False)
                return EXIT_USAGE
            names = [n for n in names if n in args.backend]
        if not names:
            console.print(f"inspect: no shipped kernel builds for {args.arch}", markup=False)
            return EXIT_FAILED
        todo = [v for name in names for v in insp.variants(args.arch, name, args.all)]
    reports = []
    try:
        with bench_cli.ProgressBar(console, len(todo), "inspect") as bar:
            for variant in todo:
                bar.start(variant.key())
                reports.append(insp.inspect_variant(variant))
    except NvdisasmMissing as exc:
        console.print(f"inspect: {exc}", markup=False)
        return EXIT_FAILED
    rows = [r.as_json() for r in reports]
    if args.menu:  # which entry of the menu, and whether its split-K variant
        rows = [
            {"entry": m.entry, "split": m.split, **row} for m, row in zip(menu, rows, strict=True)
        ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    ops = insp.opcode_columns(args.arch, {BACKENDS[r.kernel].family for r in reports})
    from .support import SHORT_NAMES as short

    if args.menu:
        title = f"the sm90 menu (backend='auto') compiled for {args.arch}"
        lead, config_col = ("entry", "split", "kernel"), "tile, cluster"
    else:
        title = f"wsgemm kernels compiled for {args.arch}"
        lead, config_col = ("kernel",), "config"
    table = Table(title=title)
    for col in (*lead, "in>out acc A B", config_col, "regs", "smem", "spill", *ops):
        table.add_column(col, justify="left" if col in (*lead, config_col) else "right")
    for row, r in zip(rows, reports, strict=True):
        v, c = r.variant, r.config
        if args.menu:
            cells = (row["entry"], "split" if row["split"] else "", r.kernel)
            config = f"{c['tile_m']}x{c['tile_n']}x{c['tile_k']}, {c['cluster_m']}x{c['cluster_n']}"
        else:
            cells = (r.kernel,)
            config = " ".join(f"{k}={val}" for k, val in c.items())
        table.add_row(
            *cells,
            f"{short[v['ab_dtype']]}>{short[v['c_dtype']]} {short[v['acc_dtype']]} "
            f"{v['a_major']} {v['b_major']}",
            config,
            str(r.registers),
            str(r.smem_bytes),
            str(r.spill_bytes),
            *(str(r.sass.get(op, 0)) for op in ops),
        )
    Console(width=max(Console().width, 200)).print(table)
    return EXIT_OK


# ----------------------------------------------------------------------------- warm


def _local_arch() -> tuple[str | None, str]:
    """(the local GPU's DSL target, '') or (None, why there is none)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "no CUDA GPU is visible"
    from .host import arch_for_capability

    return arch_for_capability(torch.cuda.get_device_capability()), ""


def _warm(args: argparse.Namespace) -> int:
    from . import inspection as insp
    from .host.compiling import cache, disk, warming

    console = _err_console()
    arch = args.arch
    if arch is None:
        arch, why = _local_arch()
        if arch is None:
            console.print(
                f"warm: {why}, so there is no local arch to compile for; pass --arch "
                f"({', '.join(insp.ARCHES)})",
                markup=False,
            )
            return EXIT_USAGE
    names = insp.backends_for(arch)
    if args.backend:
        problem = insp.mismatch(arch, args.backend)
        if problem:
            console.print(f"warm: {problem}", markup=False)
            return EXIT_USAGE
        names = [n for n in names if n in args.backend]
    variants = insp.warm_variants(arch, names)
    if args.grouped:  # grouped_mm's kernels compile at their first call otherwise
        from .host import grouped_variants

        grouped = [v for v in grouped_variants(arch) if v.backend in names]
        if not grouped:
            console.print(f"warm: no grouped kernel builds for {arch}", markup=False)
        variants += grouped
    menu = insp.menu_entries(arch, names)
    if menu:
        console.print(
            f"warm: the sm90 menu (docs/policy.md): {', '.join(e.name for e in menu)}",
            markup=False,
        )
    if not variants:
        console.print(f"warm: no shipped kernel builds for {arch}", markup=False)
        return EXIT_FAILED
    where = disk.location()
    if where.root is None:
        console.print(f"warm: the on-disk cache is {where.why_not}: nothing to warm", markup=False)
        return EXIT_USAGE
    store = cache.open_disk_cache()
    if store is None:
        console.print(f"warm: cannot use the cache at {where.root} (see the warning above)")
        return EXIT_FAILED
    unwritable = store.probe_writable()
    if unwritable:
        console.print(f"warm: {unwritable}", markup=False)
        return EXIT_FAILED
    limit = warming.max_jobs()
    jobs = args.jobs or max(1, min(limit, (os.cpu_count() or 2) - 1))
    if jobs > limit:
        console.print(f"warm: --jobs {jobs} is more than this machine holds (cores, 0.5 GB of "
                      f"available memory per worker): using {limit}", markup=False)  # fmt: skip
        jobs = limit
    jobs = min(jobs, len(variants))
    console.print(
        f"warm: {len(variants)} variants for {arch} into {store.folder}, {jobs} "
        f"process{'es' if jobs > 1 else ''}",
        markup=False,
    )
    start = time.perf_counter()
    seen_errors: set[str] = set()
    outcomes: list[warming.Outcome] = []
    show = not args.no_progress
    lines = _ProgressLines(console, len(variants), start)
    # a bar on a terminal; in a log or a pipe, where a bar shows nothing, plain lines
    bar = bench_cli.ProgressBar(
        console, len(variants), "warm", disabled=not (show and console.is_terminal)
    )

    def on_outcome(o: warming.Outcome) -> None:
        outcomes.append(o)
        if o.status == "failed" and o.error not in seen_errors:
            seen_errors.add(o.error)
            console.print(f"warm: {o.key} failed: {o.error}", markup=False)
        bar.done(o.key)
        if show and not console.is_terminal:
            lines.done(outcomes)

    try:
        with _signals_interrupt(), bar:
            warming.warm(variants, jobs, on_outcome)
    except KeyboardInterrupt as exc:
        console.print(
            f"warm: interrupted after {len(outcomes)} of {len(variants)} variants "
            f"({_counts(outcomes)['compiled']} compiled); compiled ones are kept in {store.folder}",
            markup=False,
        )
        return 128 + getattr(exc, "signum", signal.SIGINT)
    return _warm_summary(console, outcomes, time.perf_counter() - start, store.folder)


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP during ``warm``: stop as on Ctrl-C, workers first, and exit with
    128 + the signal as a shell expects."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise :class:`_Signalled` inside (their default ends the process at
    once, without the one line that says what was kept)."""

    def interrupt(signum, frame):
        raise _Signalled(signum)

    names = ("SIGTERM", "SIGHUP")
    previous = {s: signal.signal(s, interrupt) for n in names if (s := getattr(signal, n, None))}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _ProgressLines:
    """Plain progress lines for a log or a pipe (no terminal, so no bar): one each tenth of
    the variants, or after ``EVERY_S`` seconds without one; the summary says the last."""

    EVERY_S = 30.0

    def __init__(self, console, total: int, start: float) -> None:
        self._console, self._total, self._start = console, total, start
        self._step = max(1, -(-total // 10))
        self._last = start

    def done(self, outcomes) -> None:
        count, now = len(outcomes), time.perf_counter()
        if count == self._total or (count % self._step and now - self._last < self.EVERY_S):
            return
        self._last = now
        counts = _counts(outcomes)
        self._console.print(
            f"warm: {count} of {self._total} in {now - self._start:.0f} s ({counts['compiled']} "
            f"compiled, {counts['cached']} already cached, {counts['failed']} failed)",
            markup=False,
        )


def _counts(outcomes) -> dict[str, int]:
    return {s: sum(o.status == s for o in outcomes) for s in ("compiled", "cached", "failed")}


def _warm_summary(console, outcomes, seconds: float, folder) -> int:
    counts = _counts(outcomes)
    line = (
        f"warm: {counts['compiled']} compiled, {counts['cached']} already cached, "
        f"{counts['failed']} failed in {seconds:.0f} s ({folder})"
    )
    console.print(line, markup=False)
    if counts["failed"]:
        failed = [o.key for o in outcomes if o.status == "failed"]
        console.print(f"warm: not cached: {', '.join(failed)}", markup=False)
        return EXIT_FAILED
    return EXIT_OK


# ----------------------------------------------------------------------------- cache


def _cache(args: argparse.Namespace) -> int:
    import datetime

    from .host.compiling import disk

    where = disk.location()
    if where.root is None:
        if args.action == "info":
            print(f"cache: {where.why_not}")
            return EXIT_OK
        _err_console().print(f"cache: {where.why_not}: nothing to clear", markup=False)
        return EXIT_USAGE
    from .host.choosing import autotune

    if args.action == "clear":
        folders, size = disk.clear(where.root)
        tuned = autotune.clear(where.root)
        print(f"cache: removed {folders} folder(s), {size / 1e6:.1f} MB from {where.root}"
              + (f", and {tuned} file(s) of tuned choices" if tuned else ""))  # fmt: skip
        return EXIT_OK
    from .host.compiling.fingerprint import fingerprint, toolchain

    current = fingerprint()
    facts = toolchain()
    settings = " ".join(f"{k}={v}" for k, v in facts["dsl_settings"].items()) or "none"
    print(f"location     {where.root}{' (shared: WSGEMM_CACHE_SHARED)' if where.shared else ''}")
    refused = disk.refusal(where, current)
    print(f"status       {f'refused, compiling in memory: {refused}' if refused else 'in use'}")
    print(f"fingerprint  {current} (this environment)")
    print(
        f"toolchain    cutlass-dsl {facts['cutlass_dsl']} ({facts['dsl_flavour']}, CUDA "
        f"{facts['dsl_cuda']}), apache-tvm-ffi {facts['tvm_ffi']}, Python {facts['python']}"
    )
    print(f"DSL settings {settings}")
    total_entries = total_bytes = 0
    for folder in disk.fingerprint_folders(where.root):
        info = disk.folder_info(folder)
        total_entries += info["entries"]
        total_bytes += info["bytes"]
        used = datetime.datetime.fromtimestamp(info["last_used"]).strftime("%Y-%m-%d %H:%M")
        notes = ["this environment"] if folder.name == current else []
        if info["quarantined"]:
            notes.append(f"{info['quarantined']} quarantined")
        print(
            f"  {folder.name}  {info['entries']:4d} entries  {info['bytes'] / 1e6:7.1f} MB  "
            f"last used {used}" + (f"  ({', '.join(notes)})" if notes else "")
        )
    print(f"total        {total_entries} entries, {total_bytes / 1e6:.1f} MB")
    models, choices = autotune.store_info(where.root)
    state = {True: "on", False: "off"}.get(
        autotune.environment(),
        "unset (or not a switch word): tuning off on Hopper, and where auto runs the sm80 "
        "kernel the race against torch.matmul on",
    )
    print(f"autotune     {choices} tuned choice(s) for {models} GPU model(s) "
          f"({autotune.ENV_AUTOTUNE} is {state}: docs/policy.md)")  # fmt: skip
    listing = autotune.store_listing(where.root)
    for device, sms, key, winner, split, said in listing[:LISTED_PICKS]:
        runs = winner if key.startswith("route-") else f"{winner} split {split}"
        print(f"  {device} ({sms} SMs)  {key}: {runs} ({said})")
    if len(listing) > LISTED_PICKS:
        print(f"  ... and {len(listing) - LISTED_PICKS} more (under {where.root / 'autotune'})")
    return EXIT_OK


# ----------------------------------------------------------------------------- explain


def _explain(args: argparse.Namespace) -> int:
    """What ``wsgemm.matmul`` runs for one problem, as ``wsgemm.explain`` says it: for this
    machine's GPU, or for a stand-in GPU of ``--cc`` and ``--sm-count`` (the default without a
    GPU: an H200's sm_90 with 132 SMs). The operands are meta tensors in the layout (no memory:
    any size; their addresses read as aligned, as the allocator's are); nothing compiles."""
    import torch

    from .api import dispatch
    from .bench.layouts import Layout, make_operands
    from .host.dispatch import Dispatcher, StandInDevices
    from .support import torch_dtype

    [shape] = args.shape
    if args.groups is not None:  # grouped_mm's 2D x 3D form has no batch, layout, accumulator
        dense = [f"--{n.replace('_', '-')}" for n in _DENSE_ONLY if getattr(args, n) is not None]
        if dense:
            _err_console().print(f"explain: --groups explains grouped_mm's 2D x 3D form (fp32 "
                                 f"accumulation): no {', '.join(dense)}", markup=False)  # fmt: skip
            return EXIT_USAGE
    if torch.cuda.is_available():  # this GPU, or it with --cc or --sm-count in place of its own
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        cc = args.cc or (props.major, props.minor)
        sms = args.sm_count or props.multi_processor_count
        if args.cc is None and args.sm_count is None:
            name = props.name
            where = f"{name} (sm_{cc[0]}{cc[1]}, {sms} SMs)"
        else:
            name = "a stand-in GPU"
            where = f"a stand-in sm_{cc[0]}{cc[1]} GPU with {sms} SMs"
    else:
        cc, sms, name = args.cc or (9, 0), args.sm_count or 132, "a stand-in GPU"
        where = f"a stand-in sm_{cc[0]}{cc[1]} GPU with {sms} SMs" + (
            "" if args.cc or args.sm_count else " (no GPU here; --cc and --sm-count pick another)"
        )
    devices = StandInDevices(cc, sms, device_type="meta", name=name)
    if args.groups is not None:
        return _explain_grouped(args, shape, Dispatcher(cache=None, devices=devices), where)
    layout, batch = args.layout or "TN", args.batch or 1
    a, b = make_operands(
        Layout(layout), shape.m, shape.n, shape.k, torch_dtype(args.dtype), "meta", batch=batch,
    )  # fmt: skip
    out_dtype = torch_dtype(args.out_dtype) if args.out_dtype else None
    try:
        text = dispatch.explain(
            Dispatcher(cache=None, devices=devices), a, b, None, out_dtype,
            torch_dtype(args.accumulate or "fp32"), args.backend,
        )  # fmt: skip
    except (TypeError, ValueError, RuntimeError) as exc:
        _err_console().print(f"explain: {exc}", markup=False)
        return EXIT_USAGE
    batched = f" x {batch}" if batch > 1 else ""
    print(f"wsgemm.matmul of {shape.m}x{shape.n}x{shape.k}{batched}, {args.dtype} {layout}, "
          f"on {where}:")  # fmt: skip
    print(text)
    return EXIT_OK


#: ``explain``'s options of a dense call, which ``--groups`` (grouped_mm's 2D x 3D form) has not.
_DENSE_ONLY = ("batch", "layout", "accumulate")


def _explain_grouped(args: argparse.Namespace, shape, d, where: str) -> int:
    """``explain --groups``: ``wsgemm.grouped_mm(x, w.transpose(1, 2), offs)`` of M x K tokens
    and G expert weights (N, K), the groups' rows given (meta operands; the ends on the host,
    so the tile map is drawn)."""
    import torch

    from .api import grouped as grouped_api
    from .support import torch_dtype

    sizes = args.groups
    if sum(sizes) > shape.m:
        _err_console().print(f"explain: the groups hold {sum(sizes)} rows, more than M={shape.m}",
                             markup=False)  # fmt: skip
        return EXIT_USAGE
    dtype = torch_dtype(args.dtype)
    a = torch.empty(shape.m, shape.k, dtype=dtype, device="meta")
    b = torch.empty(len(sizes), shape.n, shape.k, dtype=dtype, device="meta").transpose(1, 2)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)
    out_dtype = torch_dtype(args.out_dtype) if args.out_dtype else None
    try:
        text = grouped_api.explain(d, a, b, offs, out_dtype, args.backend)
    except (TypeError, ValueError, RuntimeError) as exc:
        _err_console().print(f"explain: {exc}", markup=False)
        return EXIT_USAGE
    print(f"wsgemm.grouped_mm of {len(sizes)} groups, {shape.m}x{shape.n}x{shape.k}, "
          f"{args.dtype}, on {where}:")  # fmt: skip
    print(text)
    return EXIT_OK


def _tune(args: argparse.Namespace) -> int:
    """``wsgemm.tune`` on the user's shapes (``--shapes FILE``) or a model's layers
    (``--model CONFIG.json`` at ``--tokens``): per problem the cost model's pick, the fastest
    candidate as timed, and the gain; the picks stored where ``auto`` reads them with
    autotuning on."""
    if args.shapes is not None:
        given = [f for f, v in (("--tokens", args.tokens), ("--tp", args.tp)) if v is not None]
        if given:
            _err_console().print(f"tune: {', '.join(given)}: only for --model's layers, not "
                                 "--shapes (a file of M,N,K)", markup=False)  # fmt: skip
            return EXIT_USAGE
    try:
        problems = _tune_problems(args)
    except (OSError, ValueError) as exc:
        _err_console().print(f"tune: {exc}", markup=False)
        return EXIT_USAGE
    if args.dry_run:
        for label, (m, n, k) in problems:
            print(f"{label:32s} {m}x{n}x{k}")
        print(f"{len(problems)} problems")
        return EXIT_OK
    import torch

    from .api.tuning import geomean_gain, tune
    from .support import torch_dtype

    if not torch.cuda.is_available():
        _err_console().print("tune: needs a CUDA GPU (--dry-run lists the problems without one)")
        return 3  # as `bench`: no CUDA GPU
    console = _err_console()

    def progress(done, total, r):
        gain = f"{r.gain:.3f}x" if r.gain else "-"
        how = "stored before" if r.already else f"{len(r.times_ms)} timed"
        label = problems[done - 1][0]  # tune reports the problems in order
        console.print(
            f"[{done}/{total}] {label} {r.m}x{r.n}x{r.k}: model {r.model_pick}, tuned "
            f"{r.tuned_pick} ({how}), gain {gain}", markup=False,
        )  # fmt: skip

    try:
        results = tune(
            [p for _, p in problems], dtype=torch_dtype(args.dtype), progress=progress,
            top=args.top or None,
        )  # fmt: skip
    except ValueError as exc:
        console.print(f"tune: {exc}", markup=False)
        return EXIT_USAGE
    gain = geomean_gain(results)
    tuned = sum(r.tuned_pick != r.model_pick for r in results)
    print(f"{len(results)} problems: the tuned pick differs from the cost model's on {tuned}; "
          f"gain {'-' if gain is None else f'{gain:.3f}x'} geomean (the model's pick's time over "
          "the tuned pick's, warm L2). auto takes the stored picks while autotuning is on: "
          "WSGEMM_AUTOTUNE=1 or wsgemm.config.set_autotune(True).")  # fmt: skip
    return EXIT_OK


def _tune_problems(args) -> list[tuple[str, tuple[int, int, int]]]:
    """(label, (M, N, K)) of ``--shapes`` (one M,N,K a line; # comments) or of ``--model``'s
    dense layers at ``--tokens`` on one of ``--tp`` ranks (the MoE experts' GEMMs run in
    ``wsgemm.grouped_mm``, which tunes nothing)."""
    if args.shapes is not None:
        out = []
        for number, line in enumerate(_read_text(args.shapes).splitlines(), 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                [(m, n, k)] = _one_shape(text)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"{args.shapes}:{number}: {exc}") from None
            if min(m, n, k) < 1:
                raise ValueError(f"{args.shapes}:{number}: sizes must be >= 1, got {text!r}")
            out.append((f"line {number}", (m, n, k)))
        if not out:
            raise ValueError(f"{args.shapes}: no shapes (one M,N,K a line)")
        return out
    from .bench import models, suites

    tokens = suites.parse_int_list(TUNE_TOKENS if args.tokens is None else args.tokens)
    try:
        config = json.loads(_read_text(args.model))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{args.model}: not JSON ({exc})") from None
    model = models.from_config(config, Path(args.model).stem)
    layers = [g for g in models.gemms(model, args.tp or 1) if not g.layer.startswith("expert_")]
    return [(f"{g.layer} t={t}", (t, g.n, g.k)) for g in layers for t in tokens]


def _read_text(path: str) -> str:
    """The text of ``path``; an error that names the file (OSError's own message may not)."""
    try:
        return Path(path).read_text()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


#: ``tune --model``'s token counts when ``--tokens`` is not given.
TUNE_TOKENS = "1,16,128,1024,4096"

_Problem = collections.namedtuple("_Problem", "m n k")


def _one_shape(text: str):
    """One problem "M,N,K" (``x`` also separates); zero sizes are a problem too (an empty
    result, or K = 0: zeros), as ``wsgemm.matmul`` takes them."""
    fields = [f for f in re.split(r"[,xX\s]+", text.strip()) if f]
    if len(fields) != 3 or not all(f.isascii() and f.isdigit() for f in fields):
        raise argparse.ArgumentTypeError(
            f"{text!r}: want one shape M,N,K of three non-negative integers"
        )
    return [_Problem(*(int(f) for f in fields))]


def _cc(text: str) -> tuple[int, int]:
    parts = text.split(".")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: want MAJOR.MINOR of non-negative integers, e.g. 9.0"
        )
    return int(parts[0]), int(parts[1])


# ----------------------------------------------------------------------------- parser


def _dtype_argument(p, flag: str, allowed, default, what: str) -> None:
    """A dtype option taking the short names (fp16, ...) and torch's (float16, half, ...)."""
    from .support import dtype_option, short_name

    short = tuple(short_name(d) for d in allowed)
    p.add_argument(
        flag, type=dtype_option(short), default=default, metavar="|".join(short), help=what
    )


def _program_name() -> str:
    """What the user typed, for usage lines: ``wsgemm`` run as the installed console script
    (pyproject's ``[project.scripts]``), ``python -m wsgemm`` run as a module (where
    ``sys.argv[0]`` is the package's ``__main__.py``) or with no script at all."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m wsgemm" if name in ("", "-c", "__main__.py") else name


def build_parser() -> argparse.ArgumentParser:
    from .bench.layouts import LAYOUTS
    from .bench.models import TP_DEGREES
    from .host.choosing.tuning import TUNE_TOP
    from .host.registry import BACKENDS
    from .inspection import ARCHES
    from .support import AB_DTYPES, ACC_DTYPES, C_DTYPES

    parser = argparse.ArgumentParser(
        prog=_program_name(), description="Warp-specialized GEMM kernels in CuTe DSL."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "inspect",
        help="compile every shipped kernel for an arch (no GPU needed) and report its resources",
    )
    p.add_argument("--arch", default="sm_90a", choices=ARCHES, help="target (default sm_90a)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument(
        "--all", action="store_true", help="every dtype/accumulator/layout variant, not one each"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--backend", action="append", choices=BACKENDS, help="only this backend (repeatable)"
    )
    which.add_argument(
        "--menu",
        action="store_true",
        help="the kernels backend='auto' picks from: each sm90 menu entry and its split-K "
        "variant, one row each (with --all: every variant `warm` compiles for them)",
    )
    p.set_defaults(func=_inspect)

    p = sub.add_parser(
        "warm",
        help="compile every variant of the shipped kernels and the sm90 menu into the on-disk "
        "cache",
    )
    p.add_argument(
        "--arch", choices=ARCHES, help="target (default: the local GPU's; required without one)"
    )
    p.add_argument(
        "--backend", action="append", choices=BACKENDS, help="only this backend (repeatable)"
    )
    p.add_argument(
        "--jobs",
        type=bench_cli.bounded_int(1),
        default=0,
        help="compile processes (default: cores - 1, at most one per 0.5 GB of free memory)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (on a terminal) or progress lines (in a log); failures and the "
        "summary still print",
    )
    p.add_argument(
        "--grouped",
        action="store_true",
        help="also the grouped GEMM's kernels (wsgemm.grouped_mm; 40 on sm_90a), which "
        "otherwise compile at their first call",
    )
    p.set_defaults(func=_warm)

    p = sub.add_parser("cache", help="show or clear the on-disk compile cache")
    p.add_argument(
        "action",
        choices=("info", "clear"),
        help="info: location, fingerprint, entries per folder, tuned choices; clear: remove "
        "every entry and tuned choice",
    )
    p.set_defaults(func=_cache)

    p = sub.add_parser(
        "explain",
        help="which kernel, tile, split and operand copies wsgemm.matmul runs for a shape, and "
        "why (no GPU needed)",
    )
    p.add_argument(
        "--shape",
        type=_one_shape,
        required=True,
        metavar="M,N,K",
        help="M,N,K of C (M, N) = A (M, K) B (x also separates; zero sizes allowed)",
    )
    p.add_argument(
        "--batch",
        type=bench_cli.bounded_int(1),
        metavar="L",
        help="a batch of this many (default 1: 2-D operands)",
    )
    p.add_argument("--layout", choices=LAYOUTS,
                   help="operand storage, BLAS letters for A then B: T row-major, N column-major "
                   "(default TN: x @ W.T)")  # fmt: skip
    for flag, allowed, default, what in (
        ("--dtype", AB_DTYPES, "fp16", "operand dtype (default fp16); each dtype option takes "
         "torch's names too (float16, half, bfloat16, float32)"),
        ("--out-dtype", C_DTYPES, None, "output dtype (default: --dtype)"),
        ("--accumulate", ACC_DTYPES, None, "accumulator dtype (default fp32)"),
    ):  # fmt: skip
        _dtype_argument(p, flag, allowed, default, what)
    p.add_argument("--backend", default="auto", choices=("auto", *BACKENDS),
                   help="the kernel matmul is asked for (default auto: what it picks)")  # fmt: skip
    p.add_argument(
        "--cc",
        type=_cc,
        metavar="MAJOR.MINOR",
        help="another GPU's compute capability (default: this GPU's; without one 9.0)",
    )
    p.add_argument("--sm-count", type=bench_cli.bounded_int(1), metavar="N",
                   help="... and its SMs (default: this GPU's; without one 132)")  # fmt: skip
    p.add_argument(
        "--groups",
        type=bench_cli.group_sizes,
        metavar="ROWS,...",
        help="explain wsgemm.grouped_mm instead: the 2D x 3D form, one expert weight (N, K) a "
        "group and these rows each (their sum at most M), with its tile map (which tiles of "
        "which group run on which CTAs); no --batch, --layout or --accumulate",
    )
    p.set_defaults(func=_explain)

    p = sub.add_parser(
        "tune",
        help="time auto's candidates for your shapes on this GPU and keep the fastest where "
        "auto reads it (with autotuning on)",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--shapes",
        metavar="FILE",
        help="one problem a line, M,N,K of x (M, K) @ W (N, K).T; # comments",
    )
    which.add_argument("--model", metavar="CONFIG.json",
                       help="a Hugging Face config.json: its layers' GEMMs (qkv, o, gate_up, "
                       "down, lm_head) at --tokens")  # fmt: skip
    p.add_argument(
        "--tokens",
        metavar="T,T,...",
        help=f"token counts (M) of --model's layers (default {TUNE_TOKENS})",
    )
    p.add_argument(
        "--tp",
        type=int,
        choices=TP_DEGREES,
        help="--model's layers as one of this many tensor-parallel ranks has them (default 1)",
    )
    _dtype_argument(p, "--dtype", AB_DTYPES, "fp16",
                    "operand and output dtype (default fp16; fp32 accumulation)")  # fmt: skip
    p.add_argument(
        "--top",
        type=bench_cli.bounded_int(0),
        default=TUNE_TOP,
        help=f"candidates timed per problem, the cost model's fastest first (default "
        f"{TUNE_TOP}; 0: every one the policy allows, each a compile the first time)",
    )
    p.add_argument("--dry-run", action="store_true",
                   help="list the problems, time nothing (no GPU needed)")  # fmt: skip
    p.set_defaults(func=_tune)

    p = sub.add_parser("bench", help="time wsgemm against torch.matmul and peers on the GPU")
    bench_cli.add_arguments(p)
    p.set_defaults(func=bench_cli.run)

    p = sub.add_parser(
        "trace",
        help="record what each warp role does during one call on the GPU (or re-render a "
        "recording): Perfetto trace, PNG timeline, summary",
    )
    trace_cli.add_arguments(p)
    p.set_defaults(func=trace_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # the reader went away (`inspect --json | head`): stop quietly, as Unix tools do; point
        # stdout at /dev/null so the interpreter's final flush does not raise again
        with contextlib.suppress(OSError, ValueError):  # a stdout without a file descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a reader that left


if __name__ == "__main__":
    sys.exit(main())
