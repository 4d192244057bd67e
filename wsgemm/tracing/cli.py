"""``python -m wsgemm trace``: record one call's per-role timeline on the GPU, or re-render a
recording without one (``--from-raw``), into ``--out DIR``: ``trace.json`` (Chrome/Perfetto),
``timeline.png``, ``summary.json`` and ``raw.npz`` (the recording). docs/trace.md.

Exit codes: 0 written (an inconsistent recording is a warning, not a failure); 1 the recording
failed or a file could not be written; 2 bad arguments; 3 no CUDA GPU to record on.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..bench import suites
from ..bench.cli import PIPE_WIDTH, bounded_int, group_sizes, stderr_console
from ..bench.layouts import LAYOUTS, Layout, make_operands
from ..support import (
    AB_DTYPES,
    ACC_DTYPES,
    ACCUMULATOR_RULE,
    C_DTYPES,
    accumulator_allowed,
    dtype_option,
    short_name,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
#: What ``--out DIR`` receives.
FILES = {"raw": "raw.npz", "chrome": "trace.json", "png": "timeline.png", "summary": "summary.json"}
# The options of a new recording: meaningless with --from-raw.
_RECORDING = ("batch", "backend", "dtype", "out_dtype", "accumulate", "layout", "capacity",
              "max_ctas", "split_k", "stream_k", "groups")  # fmt: skip
#: The backends whose kernel has a stream-K schedule (``--stream-k``), the first the default.
STREAM_K_BACKENDS = ("sm90", "sm90-pingpong")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``trace`` options to ``parser`` (the ``wsgemm.cli`` subparser)."""
    from ..host.registry import BACKENDS

    parser.description = (
        "Run one GEMM on the traced variant of its kernel and show what each warp role did: a "
        "Chrome/Perfetto trace, a PNG timeline, and a summary (busy and waiting shares per "
        "role, exposed epilogue, tail, tracing overhead). See docs/trace.md."
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--shape", type=_shape, metavar="M,N,K", help="record this problem")
    what.add_argument(
        "--from-raw",
        type=_raw_file,
        metavar="FILE",
        help="record nothing: re-render a recording (a raw.npz); no GPU needed",
    )
    call = parser.add_argument_group("the call to record (with --shape)")
    call.add_argument(
        "--batch", type=bounded_int(1), metavar="L", help="batch count (default 1: 2-D operands)"
    )
    call.add_argument(
        "--backend", choices=("auto", *BACKENDS), help="kernel (default auto: what matmul picks)"
    )
    for flag, allowed, what in (
        ("--dtype", AB_DTYPES, "operand dtype: float16 (the default; also fp16 or half) or "
         "bfloat16 (also bf16); --out-dtype and --accumulate take the short names too"),
        ("--out-dtype", C_DTYPES, "output dtype (default: the operand dtype)"),
        ("--accumulate", ACC_DTYPES, "accumulator dtype (default float32)"),
    ):  # fmt: skip
        call.add_argument(flag, type=dtype_option(allowed), metavar="|".join(allowed), help=what)
    call.add_argument(
        "--layout",
        type=_layout,
        metavar="|".join(LAYOUTS),
        help=f"operand storage, BLAS letters for A then B ({', '.join(LAYOUTS)}; default TN: "
        "both K-major, as in bench)",
    )
    call.add_argument(
        "--capacity",
        type=bounded_int(1),
        metavar="N",
        help="events per recorder (default: enough for the problem, capped)",
    )
    call.add_argument(
        "--max-ctas", type=bounded_int(1), metavar="N", help="record at most this many CTAs"
    )
    call.add_argument(
        "--split-k",
        action="store_true",
        default=None,
        help="trace the split-K count the call runs, with each unit's fix-up (default: a split "
        "choice is traced unsplit); docs/trace.md",
    )
    call.add_argument(
        "--stream-k",
        action="store_true",
        default=None,
        help="trace the call on the stream-K schedule of --backend's shipped tile (sm90, the "
        "default here: 128x256; sm90-pingpong: 128x128; the dropped sk-* entries), each tile's "
        "parts and their fix-up; docs/trace.md",
    )
    call.add_argument(
        "--groups",
        type=group_sizes,
        metavar="ROWS,...",
        help="record wsgemm.grouped_mm instead: the 2D x 3D form, one expert weight (N, K) a "
        "group and these rows each (their sum at most M); each tile's fetch names its group "
        "(docs/trace.md)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=_out_dir, required=True, metavar="DIR", help="where to write")
    out.add_argument(
        "--sms",
        type=_sm_list,
        metavar="IDS",
        help="SMs drawn in the PNG, e.g. 0-7 or 0,2,5 (default: the first 4 that recorded); "
        "the JSON files cover every SM",
    )


def run(args: argparse.Namespace) -> int:
    """Run the ``trace`` subcommand; returns the process exit code."""
    console = stderr_console()
    if args.from_raw is not None:
        given = [f"--{n.replace('_', '-')}" for n in _RECORDING if getattr(args, n) is not None]
        if given:
            console.print(
                f"trace: {', '.join(given)}: only for a new recording (--shape); --from-raw "
                "re-renders one as it was recorded",
                style="red",
                markup=False,
            )
            return EXIT_USAGE
        return _render(args.from_raw, args, console)
    dtype = args.dtype or "float16"
    accumulate = args.accumulate or "float32"
    if not accumulator_allowed(dtype, accumulate):
        console.print(f"trace: --accumulate {accumulate} with --dtype {dtype}: {ACCUMULATOR_RULE}",
                      style="red", markup=False)  # fmt: skip
        return EXIT_USAGE
    refusal = _groups_refusal(args) if args.groups is not None else None
    if refusal is None and args.stream_k:
        refusal = _stream_k_refusal(args, accumulate)
    if refusal:
        console.print(f"trace: {refusal}", style="red", markup=False)
        return EXIT_USAGE
    problem = _no_gpu_reason()
    if problem:
        console.print(
            f"trace: {problem}: recording a trace needs a CUDA GPU. --from-raw FILE re-renders "
            "a recording (raw.npz) without one.",
            style="red",
            markup=False,
        )
        return EXIT_NO_GPU
    timeline = _record(args, dtype, accumulate, console)
    if isinstance(timeline, int):
        return timeline
    return _render(timeline, args, console)


def _no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def _record(args, dtype: str, accumulate: str, console):
    """The recorded ``Timeline``, or an exit code."""
    import torch

    from .timeline import trace, trace_grouped

    m, n, k = args.shape
    if args.groups is not None:
        return _record_grouped(args, dtype, console, trace_grouped)
    batch = args.batch or 1
    layout = Layout(args.layout or "TN")
    backend, config = args.backend or "auto", None
    if args.stream_k:
        backend, config = _stream_k_config(args.backend)
    torch.manual_seed(0)
    a, b = make_operands(layout, m, n, k, getattr(torch, dtype), "cuda", batch=batch)
    what = f"{m}x{n}x{k}" + (f" (batch {batch})" if batch > 1 else "")
    how = " stream-K" if args.stream_k else ""
    console.print(f"trace: recording {backend}{how} {what} {short_name(dtype)} "
                  f"{layout.name} ...", markup=False)  # fmt: skip
    try:
        timeline = trace(
            a,
            b,
            backend=backend,
            config=config,
            out_dtype=getattr(torch, args.out_dtype) if args.out_dtype else None,
            accumulate=getattr(torch, accumulate),
            capacity=args.capacity,
            max_ctas=args.max_ctas,
            split_k=bool(args.split_k or args.stream_k),
        )
    except (TypeError, ValueError) as exc:  # the call was refused: this problem, this GPU
        console.print(f"trace: {exc}", style="red", markup=False)
        return EXIT_USAGE
    except (NotImplementedError, RuntimeError) as exc:
        console.print(f"trace: recording failed: {exc}", style="red", markup=False)
        return EXIT_FAILED
    timeline.raw.meta.setdefault("layout", layout.name)
    return timeline


def _stream_k_refusal(args, accumulate: str) -> str | None:
    """What is wrong with a ``--stream-k`` recording's options, or None."""
    if args.split_k:
        return "--stream-k and --split-k trace two different splits: give one"
    if args.backend not in (None, *STREAM_K_BACKENDS):
        return (f"--stream-k runs the stream-K schedule of {' or '.join(STREAM_K_BACKENDS)}'s "
                f"tile, not --backend {args.backend}")  # fmt: skip
    if accumulate != "float32":
        return "--stream-k adds each tile's partial sums in fp32: --accumulate float32"
    return None


def _stream_k_config(backend: str | None):
    """(backend, config) of a ``--stream-k`` recording: ``backend``'s shipped tile (default
    ``STREAM_K_BACKENDS[0]``) on the stream-K schedule."""
    import dataclasses

    from ..host.registry import BACKENDS

    backend = backend or STREAM_K_BACKENDS[0]
    return backend, dataclasses.replace(BACKENDS[backend].config(), stream_k=True)


def _groups_refusal(args) -> str | None:
    """What is wrong with a ``--groups`` recording's options, or None."""
    refused = [f"--{name.replace('_', '-')}" for name in ("batch", "layout", "accumulate",
               "split_k", "stream_k") if getattr(args, name) is not None]  # fmt: skip
    if refused:
        return f"--groups records the 2D x 3D grouped form: no {', '.join(refused)}"
    if sum(args.groups) > args.shape[0]:
        return f"the groups hold {sum(args.groups)} rows, more than M={args.shape[0]}"
    return None


def _record_grouped(args, dtype: str, console, trace_grouped):
    """``--groups``: the recorded ``Timeline`` of ``grouped_mm(x, w.transpose(1, 2), offs)``
    (x (M, K) tokens, w (G, N, K) expert weights, the groups' rows given), or an exit code."""
    import torch

    m, n, k = args.shape
    sizes = args.groups
    torch.manual_seed(0)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(m, k, dtype=torch_dtype, device="cuda")
    b = (torch.randn(len(sizes), n, k, dtype=torch_dtype, device="cuda") / k**0.5).transpose(1, 2)
    offs = torch.tensor(sizes, dtype=torch.int64, device="cuda").cumsum(0).to(torch.int32)
    console.print(f"trace: recording grouped_mm of {len(sizes)} groups, {m}x{n}x{k} "
                  f"{short_name(dtype)} ...", markup=False)  # fmt: skip
    try:
        return trace_grouped(
            a,
            b,
            offs,
            backend=args.backend or "auto",
            out_dtype=getattr(torch, args.out_dtype) if args.out_dtype else None,
            capacity=args.capacity,
            max_ctas=args.max_ctas,
        )
    except (TypeError, ValueError) as exc:
        console.print(f"trace: {exc}", style="red", markup=False)
        return EXIT_USAGE
    except (NotImplementedError, RuntimeError) as exc:
        console.print(f"trace: recording failed: {exc}", style="red", markup=False)
        return EXIT_FAILED


def _render(timeline, args, console) -> int:
    """Warn about inconsistencies, write the four files, print the summary."""
    from rich.console import Console

    from .plot import pick_sms
    from .summary import tables

    try:
        sms = pick_sms(timeline.decoded, args.sms)
    except ValueError as exc:
        console.print(f"trace: --sms: {exc}", style="red", markup=False)
        return EXIT_USAGE
    problems = timeline.check()
    if problems:
        console.print(f"trace: warning: the recording is not consistent ({len(problems)} "
                      "problem(s), docs/trace.md says what each check means):",
                      style="yellow", markup=False)  # fmt: skip
        for line in problems:
            console.print(f"  {line}", markup=False)
    out: Path = args.out
    code, written, writers = EXIT_OK, [], []
    try:  # checked when parsed, but a recording takes a while: it may have gone since
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        console.print(f"trace: cannot make {out}: {exc.strerror or exc}", style="red",
                      markup=False)  # fmt: skip
        code = EXIT_FAILED
    else:
        writers = [
            (FILES["raw"], timeline.save),
            (FILES["chrome"], timeline.to_chrome),
            (FILES["png"], lambda p: timeline.plot(p, sms=sms)),
            (FILES["summary"], timeline.write_summary),
        ]
    for name, write in writers:
        try:
            write(out / name)
        except Exception as exc:  # one file that cannot be written must not lose the others
            console.print(f"trace: could not write {out / name}: {exc}", style="red",
                          markup=False)  # fmt: skip
            code = EXIT_FAILED
        else:
            written.append(str(out / name))
    stdout = Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)
    for table in tables(timeline.summary()):
        stdout.print(table)
    if written:
        console.print(f"trace: wrote {', '.join(written)}", markup=False)
    if args.from_raw is None and str(out / FILES["raw"]) not in written:
        _keep(timeline, console)
    return code


def _keep(timeline, console) -> None:
    """Save a new recording that ``--out`` did not take in a temporary folder, and say where."""
    import tempfile

    try:
        path = timeline.save(Path(tempfile.mkdtemp(prefix="wsgemm-trace-")) / FILES["raw"])
    except Exception as exc:
        console.print(f"trace: the recording is lost: could not keep it either: {exc}",
                      style="red", markup=False)  # fmt: skip
    else:
        console.print(f"trace: the recording is kept in {path} (--from-raw re-renders it)",
                      style="red", markup=False)  # fmt: skip


# ----------------------------------------------------------------------------- argument types


def _shape(text: str) -> tuple[int, int, int]:
    try:
        shapes = suites.parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if len(shapes) != 1:
        raise argparse.ArgumentTypeError(f"expected one shape M,N,K, got {text!r}")
    return shapes[0].m, shapes[0].n, shapes[0].k


def _layout(text: str) -> str:
    if text.upper() not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LAYOUTS)}, got {text!r}")
    return text.upper()


def _sm_list(text: str) -> tuple[int, ...]:
    """``"0-7"``, ``"3"``, ``"0,2,5-6"`` -> SM ids."""
    ids = []
    for part in (p.strip() for p in text.split(",")):
        found = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not found:
            raise argparse.ArgumentTypeError(f"expected SM ids such as 0-7 or 0,2,5, got {text!r}")
        low, high = int(found[1]), int(found[2] or found[1])
        if high < low:
            raise argparse.ArgumentTypeError(f"the range {part} runs backwards (in {text!r})")
        ids += range(low, high + 1)
    return tuple(sorted(set(ids)))


def _out_dir(text: str) -> Path:
    """A directory that exists and is writable, or can be made (tried, then removed again: a
    run that stops before writing leaves nothing behind)."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    missing, parent = [], path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make {text}: {parent} is not a directory")
    made = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot make {text}: {exc.strerror or exc}") from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {parent}")
    return path


def _raw_file(text: str):
    """The ``Timeline`` of the recording saved in ``text``."""
    import zipfile

    from .timeline import Timeline

    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    try:
        return Timeline.from_raw(text)
    except ValueError as exc:  # it names the file and says what is wrong with it
        raise argparse.ArgumentTypeError(str(exc)) from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise argparse.ArgumentTypeError(f"{text} is not a wsgemm raw trace: {exc}") from None
