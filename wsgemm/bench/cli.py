"""``python -m wsgemm bench``: argument parsing and the run from options to files.

Exit codes: 0 all backends ran or were skipped with a reason; 1 a backend gave a wrong result,
a requested output could not be written, or a backend broke the CUDA context (the record up to
there is still written); 2 bad arguments (among them an option the run would ignore, and an
output file that cannot be written, found before anything is measured); 3 no CUDA GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys

from ..support import dtype_option
from . import models, moe, suites
from .backends import BASELINE, EPILOGUES, SELECTABLE
from .layouts import LAYOUTS
from .runner import (
    ACCUMULATORS,
    DTYPES,
    MAX_REPS,
    MAX_ROUNDS,
    MAX_TARGET_MS,
    SEED_LIMIT,
    Options,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3

# --quick: three shapes, three rounds, 5 ms per measurement: well under a minute of GPU time
# once kernels are compiled (compilation is excluded from timing by the checking call).
QUICK = {"suite": "quick", "rounds": 3, "target_ms": 5.0}
DEFAULT_ROUNDS = 5
DEFAULT_TARGET_MS = 10.0
# Table width when stdout is not a terminal.
PIPE_WIDTH = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser`` (the lead's ``wsgemm.cli`` subparser)."""
    parser.description = (
        "Check every backend against an fp32 reference, then time the right ones interleaved "
        "round-robin with cold L2, and report TFLOP/s, ratio to cuBLAS and % of the "
        "clock-adjusted tensor peak (memory-bound shapes: TB/s and % of HBM peak too). "
        "See docs/benchmarking.md."
    )
    what = parser.add_argument_group("what to run")
    pick = what.add_mutually_exclusive_group()
    pick.add_argument(
        "--quick",
        action="store_true",
        help="the README's smoke benchmark: 4096^3, 8192^3 and the 8B gate/up GEMM at 4096 "
        "tokens, 3 rounds",
    )
    pick.add_argument(
        "--suite",
        choices=suites.SUITES,
        help="a named suite (default: square; moe: grouped GEMMs of mixture-of-experts layers)",
    )
    pick.add_argument(
        "--shapes", metavar="M,N,K;...", help='explicit shapes, e.g. "4096,4096,4096;1,8192,8192"'
    )
    what.add_argument(
        "--tokens",
        metavar="T,T,...",
        help="token counts (M) for the llm/decode suites; average routed rows per expert for "
        f"the moe suite (default {','.join(map(str, moe.TOKENS_PER_EXPERT))})",
    )
    what.add_argument(
        "--models",
        metavar="NAME,...",
        help=f"models for the llm/decode suites ({', '.join(suites.MODELS)}) or the moe suite "
        f"({', '.join(moe.MODELS)})",
    )
    what.add_argument(
        "--routing",
        metavar="NAME,...",
        help=f"the moe suite's routings ({', '.join(moe.ROUTINGS)}; default: both)",
    )
    what.add_argument(
        "--pass",
        dest="passes",
        metavar="NAME,...",
        help=f"the moe suite's passes ({', '.join(moe.PASSES)}: the layer's product, its weight "
        "gradient, the 2D x 2D form, the product times each row's router weight; default: "
        "forward)",
    )
    what.add_argument(
        "--families",
        metavar="NAME,...",
        help=f"model families for the models suite ({', '.join(models.FAMILIES)}; "
        f"default: all; fit: {','.join(models.FIT_FAMILIES)}; "
        f"held out: {','.join(models.HELDOUT_FAMILIES)})",
    )
    what.add_argument(
        "--count",
        type=bounded_int(1, models.MAX_COUNT),
        help=f"problems the models suite draws, both dtypes (default {models.DEFAULT_COUNT}); "
        "a run measures those drawn in its --dtype",
    )
    what.add_argument(
        "--host-overhead",
        action="store_true",
        help="instead of GEMM speed: host time per call, torch.mm vs wsgemm.matmul on 64x64 "
        "fp16, with and without out= (--rounds applies)",
    )
    what.add_argument(
        "--dtype",
        type=dtype_option(DTYPES),
        default="fp16",
        metavar="|".join(DTYPES),
        help="input and output dtype (default fp16; torch's names work too: float16, half, "
        "bfloat16, also in --accumulate)",
    )
    what.add_argument(
        "--epilogue",
        choices=tuple(EPILOGUES),
        default="none",
        help="what every backend computes after a @ b (default none): a bias per column and/or "
        "an activation "
        "(wsgemm fuses it into the kernel; the cublas row is torch's unfused path: addmm, then "
        "the activation in place), or residual: out += a @ b in place (wsgemm's c=out; "
        "cublas's out.addmm_), or swiglu/geglu: act(y[:, :N/2]) * y[:, N/2:] of y = a @ b "
        "(wsgemm.gated_linear, auto only; cublas: the product, then torch's unit); contenders "
        "without an epilogue are skipped",
    )
    what.add_argument(
        "--accumulate",
        type=dtype_option(ACCUMULATORS),
        default="fp32",
        metavar="|".join(ACCUMULATORS),
        help="accumulator dtype (default fp32; fp16 needs --dtype fp16)",
    )
    what.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="TN",
        help="operand storage, BLAS letters for A then B: T row-major, N column-major "
        "(default TN: both K-major, the cuBLAS and linear-layer case)",
    )
    what.add_argument(
        "--backends",
        metavar="NAME,...",
        default="all",
        help=f"comma-separated, from {', '.join(SELECTABLE)} (default: all; cuBLAS always "
        "runs as the baseline; wsgemm = wsgemm:auto, then every named wsgemm backend); "
        f"the moe suite's: {', '.join(moe.SELECTABLE)} (the baseline, torch in bf16 and loop "
        "in fp16, always runs; wsgemm = wsgemm:auto)",
    )
    how = parser.add_argument_group("how to measure")
    how.add_argument(
        "--rounds",
        type=bounded_int(1, MAX_ROUNDS),
        help=f"interleaved rounds (default {DEFAULT_ROUNDS})",
    )
    how.add_argument(
        "--target-ms",
        type=_positive_float,
        help=f"GEMM time per measurement, sets the reps (default {DEFAULT_TARGET_MS:g})",
    )
    reps = bounded_int(1, MAX_REPS)
    how.add_argument(
        "--min-reps", type=reps, default=3, help="fewest calls a measurement (default 3)"
    )
    how.add_argument(
        "--max-reps", type=reps, default=100, help="most calls a measurement (default 100)"
    )
    how.add_argument(
        "--seed",
        type=bounded_int(0, SEED_LIMIT - 1),
        default=0,
        help="seed of the randn operands, and of the models suite's draw (default 0)",
    )
    how.add_argument("--device", default="cuda", help="CUDA device (default: cuda)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the record (docs/benchmarking.md)")
    out.add_argument("--csv", metavar="FILE", help="write one row per shape and backend")
    out.add_argument("--plot", metavar="FILE.png", help="TFLOP/s and ratio-to-cuBLAS figure")
    out.add_argument("--markdown", metavar="FILE", help="write a Markdown results table")
    out.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: render a recorded JSON (works without a GPU)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Run the ``bench`` subcommand; returns the process exit code."""
    console = stderr_console()
    ignored = _ignored_options(args)
    if ignored:
        console.print(f"bench: {ignored}", style="red", markup=False)
        return EXIT_USAGE
    if args.from_json:
        from . import schema

        try:
            rec = schema.load(args.from_json)
        except (OSError, schema.RecordError) as exc:
            console.print(f"bench: cannot read {args.from_json}: {exc}", style="red", markup=False)
            return EXIT_USAGE
        return _emit(rec, args, _stdout_console(), console)
    try:
        shapes, options, suite_name = _plan(args)
        selection = _selection(args.backends, grouped=suite_name == "moe")
        _check_outputs(args)
    except ValueError as exc:
        console.print(f"bench: {exc}", style="red", markup=False)
        return EXIT_USAGE
    problem = _no_gpu_reason(args.device)
    if problem:
        console.print(f"bench: {problem}", style="red", markup=False)
        console.print("The benchmark needs a CUDA GPU; --from-json FILE renders a recorded run "
                      "without one.", markup=False)  # fmt: skip
        return EXIT_NO_GPU
    if args.host_overhead:
        from . import host_overhead

        return host_overhead.report(args.device, options.rounds, _stdout_console())
    return _measure(args, shapes, options, suite_name, selection, console)


def _selection(text: str, grouped: bool = False) -> list[str]:
    """The --backends list, names checked (no GPU needed): ValueError for an unknown one
    (``grouped``: the moe suite's names)."""
    from .backends import _expand

    # commas inside {...} belong to a tuning candidate, not to the list
    names = re.split(r",(?![^{]*\})", text)
    if not (moe.expand if grouped else _expand)(names):
        choices = moe.SELECTABLE if grouped else SELECTABLE
        raise ValueError(f"--backends {text!r} names no backend; choose from {', '.join(choices)}")
    return names


#: The options each special run takes; any other one given is an error, not silently ignored.
_FROM_JSON_TAKES = ("from_json", "json", "csv", "plot", "markdown", "no_progress")
_HOST_OVERHEAD_TAKES = ("host_overhead", "rounds", "device", "no_progress")


def _ignored_options(args) -> str | None:
    """What is wrong when ``--from-json`` (measures nothing) or ``--host-overhead`` (times one
    fixed call, writes no file) is given with options it would ignore, or None."""
    if args.from_json:
        run, takes = "--from-json renders a recorded run as it was measured", _FROM_JSON_TAKES
    elif getattr(args, "host_overhead", False):
        run, takes = ("--host-overhead times torch.mm and wsgemm.matmul on 64x64 fp16 and "
                      "writes no file", _HOST_OVERHEAD_TAKES)  # fmt: skip
    else:
        return None
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    given = [
        action.option_strings[-1]
        for action in defaults._actions
        if action.option_strings and action.dest not in takes and action.dest != "help"
        and getattr(args, action.dest, action.default) != action.default
    ]  # fmt: skip
    return f"{run}: no {', '.join(given)}" if given else None


def _check_outputs(args) -> None:
    """ValueError for an output file that could not be written, before anything is measured
    (else the error comes at the end of the run, and the file is lost)."""
    for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot),
                       ("--markdown", args.markdown)):  # fmt: skip
        if path is None:
            continue
        if os.path.isdir(path):
            raise ValueError(f"{flag} {path}: is a directory")
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise ValueError(f"{flag} {path}: no directory {folder}")
        if not os.access(folder, os.W_OK | os.X_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)
        ):
            raise ValueError(f"{flag} {path}: not writable")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib (pip install matplotlib, or wsgemm[bench])")


def _plan(args) -> tuple[list, Options, str]:
    quick = getattr(args, "quick", False)
    tokens = suites.parse_int_list(args.tokens) if args.tokens else None
    names = _names(args.models)
    families = _names(args.families)
    routings = _names(getattr(args, "routing", None))
    passes = _names(getattr(args, "passes", None))
    if args.shapes is not None:
        if routings or passes:
            raise ValueError("--routing/--pass apply to the moe suite, not --shapes")
        if tokens or names:
            raise ValueError("--tokens/--models apply to the llm and decode suites, not --shapes")
        if families is not None or args.count is not None:
            raise ValueError("--families/--count apply to the models suite, not --shapes")
        shapes, suite_name = suites.parse_shapes(args.shapes), "custom"
    else:
        suite_name = QUICK["suite"] if quick else (args.suite or "square")
        shapes = suites.suite(
            suite_name,
            tokens=tokens,
            models=names,
            seed=args.seed,
            families=families,
            count=args.count,
            dtype=args.dtype,
            routings=routings,
            passes=passes,
        )
        if suite_name == "moe":
            _check_moe_options(args)
    options = Options(
        dtype=args.dtype,
        accumulate=args.accumulate,
        layout=args.layout,
        rounds=args.rounds or (QUICK["rounds"] if quick else DEFAULT_ROUNDS),
        target_ms=args.target_ms or (QUICK["target_ms"] if quick else DEFAULT_TARGET_MS),
        min_reps=args.min_reps,
        max_reps=args.max_reps,
        seed=args.seed,
        epilogue=args.epilogue,
    )
    return shapes, options, suite_name


def _check_moe_options(args) -> None:
    """What the moe suite does not vary: ValueError for an option it would ignore."""
    if args.accumulate != "fp32":
        raise ValueError("the moe suite accumulates in fp32 (grouped_mm has no accumulate=)")
    if args.epilogue != "none":
        raise ValueError("--epilogue applies to the dense suites, not moe")
    if args.layout != moe.LAYOUT:
        raise ValueError(
            f"the moe suite runs {moe.LAYOUT} (the experts' [G, N, K] weights, transposed), "
            f"not --layout {args.layout}"
        )


def _names(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option's names (None when the option is not given)."""
    return tuple(n.strip() for n in text.split(",") if n.strip()) if text else None


def _no_gpu_reason(device: str) -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        return f"bad --device {device!r}: {exc}"
    if dev.type != "cuda":
        return f"--device must be a CUDA device, got {device!r}"
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible"
    return None


def _measure(args, shapes, options: Options, suite_name: str, selection, console) -> int:
    import torch

    from . import env, hardware, runner, schema
    from .backends import resolve
    from .measure import CudaTimer
    from .nvml import Nvml

    device = torch.device(args.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    baseline = BASELINE
    try:
        if suite_name == "moe":
            backends, unavailable, baseline = moe.resolve(selection, device, options.dtype)
        else:
            backends, unavailable = resolve(selection, device)
    except ValueError as exc:
        console.print(f"bench: {exc}", style="red", markup=False)
        return EXIT_USAGE
    nvml = Nvml.open(device.index)
    props = torch.cuda.get_device_properties(device)
    timer = CudaTimer(device, nvml, getattr(props, "L2_cache_size", None))
    notes = [f"{u.name}: {u.reason}" for u in unavailable]
    if nvml is None:
        notes.append("NVML unavailable (pip install nvidia-ml-py): no clocks, power or % of peak")
    if options.accumulate == "fp16":
        notes.append("cuBLAS (torch.matmul) accumulates in fp32 whatever --accumulate says")
    method = {
        "l2_flush_bytes": timer.flush_bytes,
        "hold_gpu": timer.can_hold,
        "order": "rotated",
        "clock_source": "nvml" if nvml is not None else None,
        "cublas_reduced_precision_reduction": False,
    }
    names = [b.name for b in backends] + [u.name for u in unavailable]
    recorded = options.to_dict(suite_name, names)
    if baseline != BASELINE:
        recorded["baseline"] = baseline
    header = env.collect(device, nvml, options=recorded, method=method, notes=notes)
    fpc = header["flop_per_clock_per_sm"]

    def peak_at(clock_mhz):
        return hardware.peak_tflops(props.multi_processor_count, fpc, clock_mhz)

    steps = len(shapes) * (1 + options.rounds)
    with ProgressBar(console, steps, disabled=args.no_progress) as bar:
        output = runner.run(
            shapes, backends, unavailable, options, timer, device, peak_at, bar.start, baseline
        )
    if output.clocks_mhz:
        header["clocks"]["sm_observed_mhz"] = [min(output.clocks_mhz), max(output.clocks_mhz)]
    if output.aborted:
        header["notes"].append(f"run stopped early: {output.aborted}")
    rec = schema.record(header, output.rows)
    code = _emit(rec, args, _stdout_console(), console)
    if output.aborted:
        console.print(f"bench: stopped early: {output.aborted}", style="red", markup=False)
        return EXIT_FAILED
    if any(r["status"] == "wrong" for r in rec["results"]):
        console.print("[red]bench: at least one backend gave a wrong result (see the table)[/red]")
        return EXIT_FAILED
    return code


def _emit(rec: dict, args, out_console, err_console) -> int:
    """Print the tables and write every requested file; 1 if a file could not be written."""
    from . import report, schema

    report.render(rec, out_console)
    writers = [
        (args.json, lambda p: schema.write_json(rec, p)),
        (args.csv, lambda p: schema.write_csv(rec, p)),
        (args.markdown, lambda p: _write_text(p, report.markdown(rec))),
        (args.plot, lambda p: _plot(rec, p)),
    ]
    code = EXIT_OK
    for path, write in writers:
        if not path:
            continue
        try:
            write(path)
        except Exception as exc:  # one unwritable file must not lose the others
            err_console.print(f"bench: could not write {path}: {exc}", style="red", markup=False)
            code = EXIT_FAILED
        else:
            err_console.print(f"wrote {path}", markup=False)
    return code


def _plot(rec: dict, path: str) -> None:
    from .plot import plot

    plot(rec, path)


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class ProgressBar:
    """A transient rich progress bar (i/N, elapsed, ETA) on ``console``: ``start`` a step (the
    one before is done) or count one ``done``. Shows nothing when stderr is not a terminal, or
    when ``disabled``. Shared with ``wsgemm.cli``."""

    def __init__(self, console, total: int, what: str = "", disabled: bool = False):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        label = f"{what} {{task.description}}".lstrip()
        columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn())  # fmt: skip
        self._bar = Progress(*columns, console=console, transient=True, disable=disabled)
        self._task = self._bar.add_task("", total=total)
        self._started = False

    def __enter__(self) -> ProgressBar:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def start(self, description: str) -> None:
        self._bar.update(self._task, advance=int(self._started), description=description)
        self._started = True

    def done(self, description: str) -> None:
        self._bar.update(self._task, advance=1, description=description)


def _stdout_console():
    """Tables on stdout; when it is not a terminal (a log, a remote run) rich would wrap them
    at 80 columns, so give them room."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def stderr_console():
    """Messages and progress on stderr; not hard-wrapped at 80 columns when stderr is a file
    or a pipe (a log keeps each message on one line). Shared with ``wsgemm.cli``."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=not sys.stderr.isatty(), highlight=False)


def group_sizes(text: str) -> list[int]:
    """An argparse ``type``: rows per group (``--groups``), comma-separated ints >= 0. Shared
    with ``wsgemm.cli``'s ``explain`` and the ``trace`` subcommand."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected rows per group like 300,0,1,389, got {text!r}"
        ) from None
    if not sizes or any(v < 0 for v in sizes):
        raise argparse.ArgumentTypeError(f"group rows must be ints >= 0, got {text!r}")
    return sizes


def bounded_int(low: int, high: int | None = None):
    """An argparse ``type``: an integer in ``[low, high]`` (no upper bound when ``high`` is
    None), else an ArgumentTypeError saying what is allowed. Shared with ``wsgemm.cli``."""
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {allowed}, got {text!r}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_TARGET_MS):
        raise argparse.ArgumentTypeError(f"expected a number in (0, {MAX_TARGET_MS:g}], got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m wsgemm.bench``)."""
    parser = argparse.ArgumentParser(prog="python -m wsgemm.bench")
    add_arguments(parser)
    return run(parser.parse_args(argv))
