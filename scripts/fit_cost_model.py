"""Fit the sm90 cost model's constants (``wsgemm/host/choosing/cost.py``) to measured kernel
times, and say how well the model chooses on families it was not fitted on.

    python scripts/fit_cost_model.py docs/data/oracle_fit_seed1_2026-12-03.csv ... \
        --out wsgemm/host/choosing/data/cost/sm90_h200.json

Reads ``scripts/tune_menu.py`` CSVs (every menu candidate's median time on each problem); a row
of an entry that is not on today's menu, or not timed, is left out. Fits, by least squares on
log time with a soft-L1 loss (so one odd measurement does not pull every constant), each
entry's four constants and the machine's four (docs/policy.md lists them). Then, per group of
the CSVs (a model family of a ``--draw``, a suite), it refits without that group and chooses on
it: the choices' geomean against cuBLAS next to the best candidate's, the model's view of a
family it never saw. Writes the model (with this record in its ``fit`` field) to ``--out``;
``--markdown`` prints the constants as docs/policy.md's table.

``--extend MODEL.json`` fits only the menu entries MODEL has no constants for, keeping its
machine constants and every other entry's: for entries timed on another GPU than MODEL's (the
device time one has). Each problem's times are first scaled by how the GPU that timed them
compares with MODEL there: the median, over the problem's candidates MODEL knows, of MODEL's
prediction over the measured time; so a new entry is placed against the menu it was timed
beside, not against the other GPU's clock and memory.

``--cluster-split MODEL.json [--judge RECORDS]`` fits only MODEL's ``per_cluster_split`` (the
cluster split's price, ``cost.py``) on timings of the menu's split entries in both forms
(``tune_menu.py --with-cluster-split`` CSVs or ``bench_cluster_split.py`` records), anchored
as ``--extend`` anchors; ``--judge`` reports the picks with and without the cluster form on
records it was not fitted on. Both go in the model's ``fit.cluster_split``.

Needs numpy and scipy (a development tool: the model itself is pure Python).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from wsgemm.host import choosing
from wsgemm.host.choosing import cost, rules
from wsgemm.support import element_bytes

ENTRY_CONSTANTS = ("per_k_tile", "per_unit", "per_split_unit", "dram_tb_s")
MACHINE_CONSTANTS = ("launch_us", "l2_tb_s", "q", "per_extra_split")
START = {"per_k_tile": 0.5, "per_unit": 1.0, "per_split_unit": 2.0, "dram_tb_s": 3.5,
         "launch_us": 4.0, "l2_tb_s": 10.0, "q": 4.0, "per_extra_split": 0.3}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    label: str
    group: str
    m: int
    n: int
    k: int
    dtype: str
    entry: str
    split: int
    us: float
    cublas_us: float
    cluster_split: bool = False  # the split runs over a cluster (``cs{ways}-`` entries)


def read_samples(paths, sm_count: int) -> list[Sample]:
    """The CSVs' timed rows of today's menu entries, each with a split it can run (an entry
    without a split variant: its unsplit rows only, whatever the tuner timed of it before it
    joined the menu)."""
    splits = {e.name: e.splits for e in choosing.MENU}
    out = []
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["entry"] not in splits or r["status"] != "ok" or not r["median_us"]:
                    continue
                if int(r["split"]) != 1 and not splits[r["entry"]]:
                    continue
                out.append(Sample(r["label"], r["group"], int(r["m"]), int(r["n"]), int(r["k"]),
                                  r.get("dtype") or "float16", r["entry"], int(r["split"]),
                                  float(r["median_us"]), float(r["cublas_us"])))  # fmt: skip
    return out


class Fitter:
    """The samples as arrays, and the model's prediction of all of them from a parameter vector
    (the logs of the constants): the same arithmetic as ``cost.predict``, vectorized."""

    def __init__(self, samples: list[Sample], sm_count: int):
        import numpy as np

        self.np, self.samples, self.sm_count = np, samples, sm_count
        self.names = [e.name for e in choosing.MENU]
        index = {name: i for i, name in enumerate(self.names)}
        rows = []
        for s in samples:
            e = choosing.entry(s.entry)
            b = element_bytes(s.dtype)
            f = cost.features(e, s.split, s.m, s.n, s.k, 1, sm_count, b, b)
            rows.append((index[s.entry], f.waves, f.k_tiles * f.volume, s.split > 1,
                         s.split - 1, f.dram_bytes, f.l2_bytes, s.us))  # fmt: skip
        cols = list(zip(*rows, strict=True))
        self.entry = np.array(cols[0])
        self.waves, self.work, self.split, self.extra, self.dram, self.l2, self.us = (
            np.array(c, dtype=float) for c in cols[1:]
        )

    def unpack(self, p):
        n = len(self.names)
        per_entry = {c: self.np.exp(p[i * n : (i + 1) * n]) for i, c in enumerate(ENTRY_CONSTANTS)}
        machine = {c: float(self.np.exp(p[4 * n + i])) for i, c in enumerate(MACHINE_CONSTANTS)}
        return per_entry, machine

    def predict(self, p, mask):
        e, m = self.unpack(p)
        i = self.entry[mask]
        compute = self.waves[mask] * (
            self.work[mask] * e["per_k_tile"][i] + e["per_unit"][i]
            + self.split[mask] * (e["per_split_unit"][i] + m["per_extra_split"] * self.extra[mask])
        )  # fmt: skip
        dram = self.dram[mask] / (e["dram_tb_s"][i] * 1e6)
        l2 = self.l2[mask] / (m["l2_tb_s"] * 1e6)
        q = m["q"]
        return m["launch_us"] + (compute**q + dram**q + l2**q) ** (1 / q)

    def fit(self, mask, base: cost.CostModel | None = None):
        """The constants' logs fitted on the samples of ``mask``; with ``base``, only those of
        the entries ``base`` has none for (the others and the machine's are ``base``'s)."""
        from scipy.optimize import least_squares

        np = self.np
        n = len(self.names)
        start = [math.log(START[c]) for c in ENTRY_CONSTANTS for _ in range(n)]
        start += [math.log(START[c]) for c in MACHINE_CONSTANTS]
        start = np.array(start)
        free = np.ones(len(start), dtype=bool)
        if base is not None:
            for i, name in enumerate(self.names):
                known = base.entries.get(name)
                for j, c in enumerate(ENTRY_CONSTANTS):
                    if known is not None:
                        # a never-split entry's 0.0 stands for "unmeasured": any small value
                        start[j * n + i] = math.log(max(getattr(known, c), 1e-6))
                        free[j * n + i] = False
            for j, c in enumerate(MACHINE_CONSTANTS):
                start[4 * n + j] = math.log(getattr(base, c))
                free[4 * n + j] = False
            if not free.any():
                raise SystemExit("--extend: every menu entry already has constants")

        def residuals(x):
            p = start.copy()
            p[free] = x
            return np.log(self.predict(p, mask)) - np.log(self.us[mask])

        x = least_squares(residuals, start[free], loss="soft_l1", f_scale=0.05).x
        out = start.copy()
        out[free] = x
        return out

    def anchor(self, base: cost.CostModel) -> None:
        """Scale each problem's times to ``base``'s GPU (``anchor_to``)."""
        self.samples = anchor_to(self.samples, base, self.sm_count)
        self.us = self.np.array([s.us for s in self.samples])

    def model(self, p, device: str, source: str, fit: dict, base=None) -> dict:
        per_entry, machine = self.unpack(p)
        splits = {e.name for e in choosing.MENU if e.splits}
        entries = {}
        timed = set(self.entry.tolist())
        for i, name in enumerate(self.names):
            if i not in timed and (base is None or name not in base.entries):
                continue  # nothing measured it: no constants (a later --extend fits them)
            values = {c: round(float(per_entry[c][i]), 4) for c in ENTRY_CONSTANTS}
            if name not in splits:
                values["per_split_unit"] = 0.0  # never splits: nothing measured it
            entries[name] = values
        return dict(schema=cost.COST_SCHEMA, device=device, sm_count=self.sm_count, cc=[9, 0],
                    source=source, **{k: round(v, 4) for k, v in machine.items()},
                    entries=entries, fit=fit)  # fmt: skip


def read_cluster_samples(paths, sm_count: int) -> list[Sample]:
    """The menu's split entries' samples with their cluster-split forms: tune_menu CSV rows of
    ``cs{ways}-{entry}`` (``--with-cluster-split``) beside those of ``entry``, or
    ``scripts/bench_cluster_split.py`` JSON records (the menu's swap-AB tiles' rows; its
    ``unsplit``, ``splitW`` and ``clusterW`` times)."""
    menu = {e.name for e in choosing.MENU if e.splits}
    out = []
    for path in paths:
        if str(path).endswith(".json"):
            for r in json.loads(Path(path).read_text())["rows"]:
                name = f"{r['tile']}-c1x1"
                if name not in menu:
                    continue
                for contender, us in r["us"].items():
                    kind = contender.rstrip("0123456789")
                    ways = contender[len(kind) :]
                    if kind not in ("unsplit", "split", "cluster"):
                        continue
                    out.append(Sample(r["label"], r["label"].split(" t=")[0], r["m"], r["n"],
                                      r["k"], "float16", name, int(ways or 1), float(us),
                                      float(r["us"]["cublas"]), kind == "cluster"))  # fmt: skip
            continue
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["status"] != "ok" or not r["median_us"]:
                    continue
                name, ways, cluster = r["entry"], int(r["split"]), False
                if name.startswith("cs") and name[2:3].isdigit() and name[3:4] == "-":
                    name, ways, cluster = name[4:], int(name[2]), True
                if name not in menu or (cluster and int(r["split"]) != 1):
                    continue
                dims = int(r["m"]), int(r["n"]), int(r["k"])
                out.append(Sample(r["label"], r["group"], *dims, r.get("dtype") or "float16",
                                  name, ways, float(r["median_us"]), float(r["cublas_us"]),
                                  cluster))  # fmt: skip
    return out


def _prediction(model: cost.CostModel, s: Sample, sm_count: int) -> cost.Prediction | None:
    e = choosing.entry(s.entry)
    b = element_bytes(s.dtype)
    f = cost.features(e, s.split, s.m, s.n, s.k, 1, sm_count, b, b, s.cluster_split)
    return cost.predict(model, e, f)


def anchor_to(samples: list[Sample], base: cost.CostModel, sm_count: int) -> list[Sample]:
    """``samples`` (in their order) with each problem's times, its cuBLAS time too, scaled to
    ``base``'s GPU: by the median, over the problem's unsplit and workspace-split candidates
    ``base`` has constants for, of ``base``'s prediction over the time. So a model is judged on
    its error, not on the two GPUs' difference, and the choices' ratios stay as measured."""
    import numpy as np

    ratios = defaultdict(list)
    for s in samples:
        p = None if s.cluster_split else _prediction(base, s, sm_count)
        if p is not None:
            ratios[s.label].append(p.us / s.us)
    missing = sorted({s.label for s in samples} - set(ratios))
    if missing:
        raise SystemExit(f"no candidate of {missing[0]!r} has constants to anchor it")
    factor = {label: float(np.median(r)) for label, r in ratios.items()}
    return [dataclasses.replace(s, us=s.us * f, cublas_us=s.cublas_us * f)
            for s in samples for f in [factor[s.label]]]  # fmt: skip


def fit_cluster_split(samples: list[Sample], base: cost.CostModel, sm_count: int):
    """``per_cluster_split`` fitted on the cluster-split samples, the rest of ``base`` kept,
    each problem first anchored to ``base``'s GPU (``anchor_to``). Returns (the constant, the
    samples anchored)."""
    from scipy.optimize import least_squares

    anchored = anchor_to(samples, base, sm_count)
    cluster = [s for s in anchored if s.cluster_split]
    if not cluster:
        raise SystemExit("--cluster-split: no cluster-split sample in the inputs")

    def residuals(x):
        model = dataclasses.replace(base, per_cluster_split=float(x[0]))
        return [math.log(_prediction(model, s, sm_count).us / s.us) for s in cluster]

    fit = least_squares(residuals, [0.05], bounds=([0.0], [5.0]), loss="soft_l1", f_scale=0.05)
    return float(fit.x[0]), anchored


def split_choice_quality(model: cost.CostModel, samples: list[Sample], sm_count: int,
                         cluster: bool) -> dict:  # fmt: skip
    """The picks among each problem's timed candidates: unsplit and the workspace splits
    (``cluster`` False) or unsplit and the cluster splits (True), each priced as it runs and
    ranked as ``choose`` ranks (its split margins): geomean over cuBLAS of the pick and of the
    best, and the model's median error on those candidates."""
    by_problem = defaultdict(list)
    for s in samples:
        if s.split == 1 or s.cluster_split == cluster:
            by_problem[s.label].append(s)
    picks, bests, errors = [], [], []
    for rows in by_problem.values():
        ranked = []
        for s in rows:
            p = _prediction(model, s, sm_count)
            errors.append(abs(math.log(p.us / s.us)))
            ranked.append((p.us * (1 + rules._margin(p.features)), s))
        pick = min(ranked, key=lambda x: x[0])[1]
        picks.append(rows[0].cublas_us / pick.us)
        bests.append(rows[0].cublas_us / min(s.us for s in rows))
    errors.sort()
    return dict(problems=len(picks), pick_geomean=round(_geomean(picks), 4),
                best_geomean=round(_geomean(bests), 4),
                median_error=round(math.exp(errors[len(errors) // 2]) - 1, 4))  # fmt: skip


def choice_quality(model: cost.CostModel, samples: list[Sample], sm_count: int) -> dict:
    """On ``samples``' problems: the geomean over problems of cuBLAS's time over the time of
    what the model picks among ``choose``'s candidates, and of the best of them; the smallest
    pick; how many picks are below 0.95x cuBLAS; the model's median error."""
    by_problem = defaultdict(list)
    for s in samples:
        by_problem[s.label].append(s)
    picks, bests, errors = [], [], []
    for rows in by_problem.values():
        s0 = rows[0]
        allowed = set(choosing.candidates(s0.m, s0.n, s0.k, 1, s0.dtype, s0.dtype, "float32",
                                          sm_count, (9, 0)))  # fmt: skip
        timed = [(r, choosing.entry(r.entry)) for r in rows]
        timed = [(r, e) for r, e in timed if (e, r.split) in allowed]
        if not timed:
            continue
        b = element_bytes(s0.dtype)
        predicted = []
        for r, e in timed:
            f = cost.features(e, r.split, r.m, r.n, r.k, 1, sm_count, b, b)
            p = cost.predict(model, e, f)
            predicted.append((p.us, r))
            errors.append(abs(math.log(p.us / r.us)))
        pick = min(predicted, key=lambda x: x[0])[1]
        picks.append(s0.cublas_us / pick.us)
        bests.append(s0.cublas_us / min(r.us for r, _ in timed))
    errors.sort()
    return dict(
        problems=len(picks),
        pick_geomean=round(_geomean(picks), 4),
        best_geomean=round(_geomean(bests), 4),
        pick_min=round(min(picks), 4),
        picks_below_095=sum(p < 0.95 for p in picks),
        median_error=round(math.exp(errors[len(errors) // 2]) - 1, 4),
    )


def _geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _as_model(raw: dict, path: Path) -> cost.CostModel:
    path.write_text(json.dumps(raw))
    return cost.load_cost_model(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", help="tune_menu.py CSVs to fit on")
    parser.add_argument("--out", help="the cost model JSON to write")
    parser.add_argument("--device", default="NVIDIA H200")
    parser.add_argument("--sm-count", type=int, default=132)
    parser.add_argument("--no-cv", action="store_true", help="skip the leave-one-group-out refits")
    parser.add_argument("--markdown", action="store_true", help="print the constants as a table")
    parser.add_argument(
        "--extend",
        metavar="MODEL",
        help="fit only the entries MODEL lacks (its other constants kept), each problem "
        "anchored to MODEL's GPU",
    )
    parser.add_argument(
        "--cluster-split",
        metavar="MODEL",
        help="fit only MODEL's per_cluster_split, on cluster-split timings (tune_menu CSVs with "
        "--with-cluster-split, or bench_cluster_split.py JSON), anchored to MODEL's GPU",
    )
    parser.add_argument(
        "--judge",
        nargs="+",
        metavar="RECORD",
        help="with --cluster-split: bench_cluster_split.py records (or tune_menu CSVs) not fitted "
        "on, whose picks with and without the cluster form are reported and recorded",
    )
    args = parser.parse_args(argv)
    if args.cluster_split:
        return _fit_cluster_split(args)

    import tempfile

    import numpy as np

    samples = read_samples(args.csv, args.sm_count)
    if not samples:
        raise SystemExit("no timed menu candidate in the CSVs")
    fitter = Fitter(samples, args.sm_count)
    base = None
    if args.extend:
        base = cost.load_cost_model(args.extend)
        if base.sm_count != args.sm_count:
            raise SystemExit(f"--extend: {args.extend} is of {base.sm_count} SMs, not "
                             f"--sm-count {args.sm_count}")  # fmt: skip
        args.device = base.device  # the model extended keeps its GPU's name
        fitter.anchor(base)
        samples = fitter.samples  # the choices' quality on the anchored times too
    everything = np.ones(len(samples), dtype=bool)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "model.json"
        names = ", ".join(Path(p).name for p in args.csv)
        source = (f"scripts/fit_cost_model.py on {names}, {datetime.date.today()}, "
                  f"git {_git_sha()}")  # fmt: skip
        p = fitter.fit(everything, base)
        raw = fitter.model(p, args.device, source, {}, base)
        if base is not None:  # the base's record stays; this fit's follows it
            old = json.loads(Path(args.extend).read_text())
            raw["source"] = f"{old['source']}; extended by {source}"
        fit = {
            "samples": len(samples),
            "in_sample": choice_quality(_as_model(raw, scratch), samples, args.sm_count),
        }
        print(f"in sample: {fit['in_sample']}")
        if not args.no_cv:
            groups = sorted({s.group for s in samples})
            fit["left_out"] = {}
            for g in groups:
                inside = np.array([s.group != g for s in samples])
                q = fitter.fit(inside, base)
                model = _as_model(fitter.model(q, args.device, source, {}, base), scratch)
                held = [s for s in samples if s.group == g]
                fit["left_out"][g] = choice_quality(model, held, args.sm_count)
                print(f"left out {g}: {fit['left_out'][g]}")
        if base is not None:
            before = json.loads(Path(args.extend).read_text())["fit"]
            raw["fit"] = dict(before, extended=[*before.get("extended", []), fit])
        else:
            raw["fit"] = fit
        _as_model(raw, scratch)  # what ships must load
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {args.out}")
    if args.markdown:
        print(markdown(raw))
    return 0


def _fit_cluster_split(args) -> int:
    base = cost.load_cost_model(args.cluster_split)
    samples = read_cluster_samples(args.csv, base.sm_count)
    value, anchored = fit_cluster_split(samples, base, base.sm_count)
    model = dataclasses.replace(base, per_cluster_split=value)
    names = ", ".join(_data_name(p) for p in args.csv)
    record = {
        "per_cluster_split": round(value, 4),
        "source": f"scripts/fit_cost_model.py --cluster-split on {names}, "
        f"{datetime.date.today()}, git {_git_sha()}",
        "samples": sum(s.cluster_split for s in samples),
        "workspace": split_choice_quality(base, anchored, base.sm_count, cluster=False),
        "cluster": split_choice_quality(model, anchored, base.sm_count, cluster=True),
    }
    if args.judge:  # records never fitted on: the picks with and without the cluster form
        judged = anchor_to(read_cluster_samples(args.judge, base.sm_count), base, base.sm_count)
        record["judged"] = {
            "records": [_data_name(p) for p in args.judge],
            "workspace": split_choice_quality(base, judged, base.sm_count, cluster=False),
            "cluster": split_choice_quality(model, judged, base.sm_count, cluster=True),
        }
    print(json.dumps(record, indent=1))
    if args.out:
        raw = json.loads(Path(args.cluster_split).read_text())
        raw["per_cluster_split"] = record["per_cluster_split"]
        raw["fit"] = dict(raw["fit"], cluster_split=record)
        _as_model(raw, Path(args.out))  # what ships must load
        Path(args.out).write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def _data_name(path) -> str:
    """``path`` as the model's record names it: under docs/data/ if it is there."""
    data = (Path(__file__).parents[1] / "docs" / "data").resolve()
    resolved = Path(path).resolve()
    return str(resolved.relative_to(data)) if resolved.is_relative_to(data) else Path(path).name


def markdown(raw: dict) -> str:
    """The constants as docs/policy.md's table."""
    lines = ["| entry | per k-tile (us, 128x256x64) | per unit (us) | per split unit (us) | "
             "DRAM (TB/s) |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, c in raw["entries"].items():
        lines.append(f"| `{name}` | {c['per_k_tile']:.3f} | {c['per_unit']:.2f} | "
                     f"{c['per_split_unit']:.2f} | {c['dram_tb_s']:.2f} |")  # fmt: skip
    lines.append("")
    lines.append(f"Machine: launch {raw['launch_us']:.2f} us, L2 {raw['l2_tb_s']:.2f} TB/s, "
                 f"q {raw['q']:.2f}, each split beyond the first "
                 f"{raw['per_extra_split']:.2f} us a unit.")  # fmt: skip
    return "\n".join(lines)


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
