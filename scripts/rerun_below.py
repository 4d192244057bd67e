"""The rows of a bench record below a floor, as ``bench --shapes`` arguments: issue #24's
acceptance run re-runs each held-out shape below the floor (0.92x cuBLAS) in a fresh process
and keeps both records (``scripts/gpu_session.sh heldout``).

For each ``ok`` row of ``--backend`` (``wsgemm:auto`` by default) whose median ratio to cuBLAS
is below ``--floor``: its problem, grouped by layout, dtype and accumulator (a bench run takes
one of each). Prints one line per group, ``LAYOUT DTYPE ACCUMULATE M,N,K;M,N,K;...`` (in the
record's order, each problem once), and nothing where no row is below the floor. Grouped
(moe) rows are not problems ``--shapes`` can name; they are skipped.

    python scripts/rerun_below.py RECORD.json [--floor 0.92] [--backend wsgemm:auto]
"""

from __future__ import annotations

import argparse
import json


def below(record: dict, floor: float, backend: str = "wsgemm:auto") -> dict[tuple, list]:
    """(layout, dtype, accumulate) -> [(m, n, k), ...] of ``backend``'s ok rows whose median
    ratio to cuBLAS is below ``floor``, in the record's order, each problem once."""
    if not floor > 0:
        raise ValueError(f"floor={floor}; it must be > 0")
    found: dict[tuple, list] = {}
    for r in record["results"]:
        ratio = r.get("ratio_to_cublas") or {}
        if r["backend"] != backend or r["status"] != "ok" or "grouped" in r:
            continue
        if ratio.get("median") is None or not ratio["median"] < floor:
            continue
        shapes = found.setdefault((r["layout"], r["dtype"], r["accumulate"]), [])
        if (r["m"], r["n"], r["k"]) not in shapes:
            shapes.append((r["m"], r["n"], r["k"]))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", help="a `python -m wsgemm bench --json` record")
    parser.add_argument("--floor", type=float, default=0.92, help="ratio to cuBLAS (0.92)")
    parser.add_argument("--backend", default="wsgemm:auto", help="the rows' backend")
    args = parser.parse_args(argv)
    with open(args.record) as f:
        record = json.load(f)
    for (layout, dtype, acc), shapes in below(record, args.floor, args.backend).items():
        print(layout, dtype, acc, ";".join(f"{m},{n},{k}" for m, n, k in shapes))


if __name__ == "__main__":
    main()
