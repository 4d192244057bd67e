"""The instruction-stream digest (``wsgemm.sass.instruction_digest``) of every ``auto`` menu
variant, compiled without a GPU in worker processes.

    python scripts/sass_digests.py --write tests/data/menu_sass_digests.json   # record
    python scripts/sass_digests.py --check tests/data/menu_sass_digests.json   # compare
    python scripts/sass_digests.py --add tests/data/menu_sass_digests.json     # a new entry's

Recorded before a change that should not touch the kernels' code (a refactor that moves it),
checked after: a different digest means a variant now issues other instructions. The CPU tests
check one variant of every menu entry against the file; ``-m sweep`` checks them all.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys


def digest(variant) -> tuple[str, str]:
    from wsgemm import host, inspection, sass

    fn = host.compile_variant(variant, keep=True)
    r = inspection.inspect_variant(variant, fn)
    return variant.key(), sass.instruction_digest(r.sass_text)


def menu_variants(one_per_entry: bool = False) -> list:
    """Every menu variant, or each entry's and split variant's first (its fp16, K-major one):
    ``inspection.menu_variants``, the selection the CPU tests compile."""
    from wsgemm import inspection

    return [m.variant for m in inspection.menu_variants(everything=not one_per_entry)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="JSON")
    mode.add_argument("--check", metavar="JSON")
    mode.add_argument("--add", metavar="JSON", help="record the variants the file lacks only")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--one-per-entry", action="store_true", help="one variant of each entry")
    args = p.parse_args(argv)
    variants = menu_variants(args.one_per_entry)
    if args.add:  # a menu entry joined: compile its variants, keep every recorded digest
        with open(args.add) as f:
            recorded = json.load(f)
        variants = [v for v in variants if v.key() not in recorded]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        got = dict(pool.map(digest, variants))
    if args.write or args.add:
        if args.add:
            got = recorded | got
        with open(args.write or args.add, "w") as f:
            json.dump(dict(sorted(got.items())), f, indent=1)
            f.write("\n")
        print(f"{len(got)} digests written to {args.write or args.add}")
        return 0
    with open(args.check) as f:
        want = json.load(f)
    missing = sorted(k for k in got if k not in want)
    if missing:
        print(f"not recorded: {missing}")
        return 2
    differ = sorted(k for k in got if want[k] != got[k])
    for key in differ:
        print(f"differs: {key}")
    print(f"{len(got) - len(differ)} of {len(got)} variants issue the recorded instructions")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
