"""``python -m wsgemm``: ``inspect`` (compile and read SASS, no GPU needed) and ``bench``."""

from __future__ import annotations

import argparse
import json
import sys


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import inspection as insp

    names = insp.backends_for(args.arch)
    if args.backend:
        names = [n for n in names if n in args.backend]
    if not names:
        print(f"no shipped kernel builds for {args.arch}", file=sys.stderr)
        return 1
    reports = []
    console = Console(stderr=True)
    for name in names:
        for variant in insp.variants(args.arch, name, args.all):
            if not args.json:
                console.print(f"compiling {variant.key()} ...", style="dim")
            reports.append(insp.inspect_variant(variant))
    if args.json:
        print(json.dumps([r.as_json() for r in reports], indent=2))
        return 0
    ops = ("HGMMA", "HMMA", "UTMALDG", "UTMASTG", "LDGSTS", "LDSM", "STSM", "SYNCS", "USETMAXREG")
    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
    table = Table(title=f"wsgemm kernels compiled for {args.arch}")
    for col in ("kernel", "in>out acc A B", "config", "regs", "smem", "spill", *ops):
        table.add_column(col, justify="right" if col not in ("kernel", "config") else "left")
    for r in reports:
        v = r.variant
        table.add_row(
            r.kernel,
            f"{short[v['ab_dtype']]}>{short[v['c_dtype']]} {short[v['acc_dtype']]} "
            f"{v['a_major']} {v['b_major']}",
            " ".join(f"{k}={val}" for k, val in r.config.items()),
            str(r.registers),
            str(r.smem_bytes),
            str(r.spill_bytes),
            *(str(r.sass.get(op, 0)) for op in ops),
        )
    Console(width=max(Console().width, 200)).print(table)
    return 0


def _warm(args: argparse.Namespace) -> int:
    import os

    from . import host
    from . import inspection as insp

    if host.cache_dir() is None:
        print(
            "warm: the on-disk cache is off (WSGEMM_DISK_CACHE=0): nothing to warm", file=sys.stderr
        )
        return 2
    names = [n for n in insp.backends_for(args.arch) if not args.backend or n in args.backend]
    variants = [v for n in names for v in insp.variants(args.arch, n, everything=True)]
    jobs = args.jobs or max(1, (os.cpu_count() or 2) - 1)
    print(
        f"compiling {len(variants)} variants for {args.arch} with {jobs} processes into "
        f"{host.cache_dir()}"
    )
    host.warm(variants, jobs, progress=lambda key: print("  ok", key, flush=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m wsgemm", description="Warp-specialized GEMM kernels in CuTe DSL."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "inspect",
        help="compile every shipped kernel for an arch (no GPU needed) and report its resources",
    )
    from .host import BACKENDS
    from .inspection import ARCHES

    p.add_argument("--arch", default="sm_90a", choices=ARCHES, help="target (default sm_90a)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument(
        "--all", action="store_true", help="every dtype/accumulator/layout variant, not one each"
    )
    p.add_argument(
        "--backend", action="append", choices=BACKENDS, help="only this backend (repeatable)"
    )
    p.set_defaults(func=_inspect)

    p = sub.add_parser(
        "warm", help="compile every variant of the shipped kernels into the on-disk cache"
    )
    p.add_argument("--arch", default="sm_90a", choices=ARCHES, help="target (default sm_90a)")
    p.add_argument(
        "--backend", action="append", choices=BACKENDS, help="only this backend (repeatable)"
    )
    p.add_argument("--jobs", type=int, default=0, help="compile processes (default: cores - 1)")
    p.set_defaults(func=_warm)

    p = sub.add_parser("bench", help="time wsgemm against torch.matmul and peers on the GPU")
    from .bench import cli as bench_cli

    bench_cli.add_arguments(p)
    p.set_defaults(func=bench_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
