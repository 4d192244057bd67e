"""The cost model's prediction error on a bench record's ``wsgemm:auto`` rows (issue #24: "the
model's median prediction error on the held-out draw is reported").

For each ``ok`` row of ``wsgemm:auto`` in a ``python -m wsgemm bench`` record: the policy's pick
for its problem (``choosing.choose``, replayed on the CPU with the record's GPU's SM count and
capability, batch-invariant mode off), the cost model's time for that pick, and the measured
median; their ratio (predicted / measured). Prints the median of ``|ratio - 1|`` (the error) and
the median ratio (its sign: above 1 the model is slow), over all rows and per token band, and
per the pick's source (the model's own, or the table's correction).

The replay is today's policy: a record measured on other code may have run other picks. The
record's ``header.source_digest`` (where it has one) is compared with this tree's, and a
difference is said before the numbers.

    python scripts/prediction_error.py RECORD.json [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def rows_of(record: dict) -> list[dict]:
    """(label, m, n, k, band, source, entry, split, predicted us, measured us, ratio) per ok
    ``wsgemm:auto`` row, the policy replayed on the record's GPU."""
    from wsgemm.bench.suites import token_band
    from wsgemm.host.choosing import cost, rules

    header = record["header"]
    sm_count = header["sm_count"]
    cc = tuple(int(v) for v in header["compute_capability"].split("."))
    model = cost.cost_model_for(sm_count, cc)
    if model is None:
        raise SystemExit(f"no cost model for sm_{cc[0]}{cc[1]} with {sm_count} SMs")
    out = []
    for r in record["results"]:
        if r["backend"] != "wsgemm:auto" or r["status"] != "ok" or "grouped" in r:
            continue
        ab = NAMES.get(r["dtype"], r["dtype"])
        acc = NAMES.get(r["accumulate"], r["accumulate"])
        choice = rules.choose(
            r["m"], r["n"], r["k"], 1, ab, ab, acc, sm_count, cc, batch_invariant=False
        )
        e, split = choice.menu_entry, choice.split
        f = cost.features(e, split, r["m"], r["n"], r["k"], 1, sm_count, 2, 2)
        p = cost.predict(model, e, f)
        if p is None:
            continue
        measured = r["median_ms"] * 1e3
        out.append(dict(label=r["label"], m=r["m"], n=r["n"], k=r["k"], band=token_band(r["m"]),
                        source=choice.source, entry=e.name, split=split, predicted_us=p.us,
                        measured_us=measured, ratio=p.us / measured))  # fmt: skip
    return out


def summary(rows: list[dict]) -> dict:
    """Median error and median ratio, over all rows, per band and per the pick's source."""

    def stats(rs):
        ratios = [r["ratio"] for r in rs]
        return dict(rows=len(rs), median_error=statistics.median(abs(x - 1) for x in ratios),
                    median_ratio=statistics.median(ratios))  # fmt: skip

    out = {"all": stats(rows)} if rows else {}
    for key in ("band", "source"):
        for value in sorted({r[key] for r in rows}):
            out[f"{key} {value}"] = stats([r for r in rows if r[key] == value])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("record")
    p.add_argument("--json", default=None, help="write the rows and the summary here")
    args = p.parse_args(argv)
    with open(args.record) as f:
        record = json.load(f)
    from wsgemm.bench import env

    digest = record["header"].get("source_digest")
    if digest is None:
        print("note: the record has no source_digest: its code is unknown; the picks replayed "
              "are today's policy's")  # fmt: skip
    elif digest != env.source_digest():
        print("note: the record ran other code (its source_digest is not this tree's): the "
              "picks replayed are today's policy's, not necessarily the ones it ran")  # fmt: skip
    rows = rows_of(record)
    if not rows:
        print("no ok wsgemm:auto rows the model prices")
        return 1
    result = summary(rows)
    for name, s in result.items():
        print(f"{name:20s} {s['rows']:4d} rows  median error {s['median_error']:6.1%}  "
              f"median predicted/measured {s['median_ratio']:.3f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(record=args.record, summary=result, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
