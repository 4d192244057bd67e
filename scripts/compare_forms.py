"""Each entry against another form of itself, on the shapes a ``tune_menu.py`` CSV timed both:
the ``cs2-``/``cs4-`` entries (``--with-cluster-split``) or any other prefixed form (the
whole-tile epilogue's ``wt-``, docs/perf.md entry 103) against the entry they are made from,
unsplit rows only (the candidates of one shape are timed interleaved, so their ratio is the
run's A/B).

    python scripts/compare_forms.py OUT/tune_menu.csv --prefix cs2-

Prints, per entry and over all, the geomean of (the entry's time / its form's time: above 1,
the form is faster), by token band; and over the shapes, the best wsgemm time with the forms
against the best without (what a policy free to take them could gain; cuBLAS's row is no
candidate). ``--json`` writes the same.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from wsgemm.bench.suites import token_band


def _geomean(values) -> float | None:
    values = list(values)
    return round(math.exp(sum(map(math.log, values)) / len(values)), 4) if values else None


def compare(rows, prefix: str, base_prefix: str = "") -> dict:
    """``rows``: tune_menu CSV rows (dicts of strings). The summary (module docstring); a form
    ``prefix + X`` pairs with the entry ``base_prefix + X``."""
    times = defaultdict(dict)  # (label, m) -> entry -> median us (unsplit rows)
    for r in rows:
        if r["entry"] == "cublas":  # the baseline, not a candidate
            continue
        if r["status"] == "ok" and r["median_us"] and int(r["split"]) == 1:
            times[(r["label"], int(r["m"]))][r["entry"]] = float(r["median_us"])
    per_entry, per_band, gains = defaultdict(list), defaultdict(list), defaultdict(list)
    for (_, m), by in times.items():
        pairs = [
            (base_prefix + name[len(prefix) :], name) for name in by if name.startswith(prefix)
        ]
        pairs = [(base, form) for base, form in pairs if base in by]
        for base, form in pairs:
            ratio = by[base] / by[form]
            per_entry[base].append(ratio)
            per_band[token_band(m)].append(ratio)
        if pairs:
            without = min(t for name, t in by.items() if not name.startswith(prefix))
            gains[token_band(m)].append(without / min(by.values()))
    return {
        "prefix": prefix,
        "pairs": sum(map(len, per_entry.values())),
        "form_speedup": _geomean(r for v in per_entry.values() for r in v),
        "by_entry": {k: {"shapes": len(v), "geomean": _geomean(v), "min": round(min(v), 4),
                         "max": round(max(v), 4)} for k, v in sorted(per_entry.items())},
        "by_band": {k: {"pairs": len(v), "geomean": _geomean(v)} for k, v in per_band.items()},
        "best_gain_by_band": {k: {"shapes": len(v), "geomean": _geomean(v)}
                              for k, v in gains.items()},
    }  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="tune_menu.csv files")
    parser.add_argument("--prefix", required=True, help="the form's name prefix (cs2-, cs4-)")
    parser.add_argument("--base-prefix", default="", help="the entry's own prefix (sk- for skt-)")
    parser.add_argument("--json", help="write the summary here too")
    args = parser.parse_args(argv)
    rows = []
    for path in args.csv:
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    summary = compare(rows, args.prefix, args.base_prefix)
    if not summary["pairs"]:
        parser.error(f"no shape timed both an entry and its {args.prefix!r} form")
    print(f"{summary['pairs']} pairs; the {args.prefix} form over its entry: "
          f"{summary['form_speedup']}x (geomean of entry time / form time)")  # fmt: skip
    for name, s in summary["by_entry"].items():
        print(f"  {name:34s} {s['shapes']:4d} shapes  {s['geomean']:.4f}x  "
              f"({s['min']:.3f}-{s['max']:.3f})")  # fmt: skip
    for name, s in summary["by_band"].items():
        gain = summary["best_gain_by_band"][name]
        print(
            f"  tokens {name:10s} {s['pairs']:4d} pairs {s['geomean']:.4f}x; best with the "
            f"forms over best without: {gain['geomean']:.4f}x on {gain['shapes']} shapes"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
