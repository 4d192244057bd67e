"""Run a ``python -m wsgemm`` command with ``host.registry`` family switches turned on for that
run alone: a kernel measured before main turns it on (e.g. the held-out judgment of
``CLUSTER_SPLIT_FAMILIES``, docs/perf.md entry 97).

    python scripts/switched.py CLUSTER_SPLIT_FAMILIES,... bench --suite models --seed S ...

    python scripts/switched.py GATED_SWAP_BIAS_FAMILIES --script scripts/bench_mlp_train.py ...

The first argument names the switches (comma-separated; empty: none); the rest is the CLI's,
or after ``--script PATH`` a script's own arguments (the script run as ``__main__``).
Each switch is set to the families the fused kernels run on (``EPILOGUE_FAMILIES``: sm90),
before the command's first call reads it; the policy's choices are computed afresh.
"""

from __future__ import annotations

import contextlib
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    from wsgemm import cli
    from wsgemm.host import registry

    names = [name for name in argv[0].split(",") if name]
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(
                registry.switches(**dict.fromkeys(names, registry.EPILOGUE_FAMILIES))
            )
        except ValueError as exc:
            print(f"switched.py: {exc}", file=sys.stderr)
            return 2
        print(f"switched on: {', '.join(names) or 'none'}", file=sys.stderr)
        if argv[1:2] == ["--script"] and len(argv) > 2:
            return run_script(argv[2], argv[3:])
        return cli.main(argv[1:])


def run_script(path: str, args: list[str]) -> int:
    """Run the script at ``path`` as ``__main__`` with ``args``; its exit status."""
    import runpy

    saved = sys.argv
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
