"""Tables drawn from a benchmark record: the terminal report (rich) and a Markdown summary.

Every table lists cuBLAS first, then ``wsgemm:auto`` (what users call), then the rest in run
order; a record with another baseline (the moe suite's ``torch`` or ``loop``,
``header.options.baseline``) lists and compares with that one instead. Memory-bound shapes
(``roofline.py``) also show their effective bandwidth and its share of the HBM peak.
"""

from __future__ import annotations

import io
import math
import statistics

from .backends import BASELINE, leading_first

STATUS_STYLE = {"ok": "green", "wrong": "bold red", "skipped": "dim", "error": "red"}


def shapes_in_order(rec: dict) -> list[tuple]:
    """(label, m, n, k) of every shape, in run order."""
    seen: dict[tuple, None] = {}
    for r in rec["results"]:
        seen.setdefault((r["label"], r["m"], r["n"], r["k"]), None)
    return list(seen)


def baseline_of(rec: dict) -> str:
    """The backend the record's ratios are to (cuBLAS unless the record names another)."""
    return rec["header"]["options"].get("baseline", BASELINE)


def _vs(rec: dict) -> str:
    """The baseline as column titles name it."""
    name = baseline_of(rec)
    return "cuBLAS" if name == BASELINE else name


def backends_in_order(rec: dict) -> list[str]:
    """The baseline, then wsgemm:auto, then the other backends in the order they first
    appear."""
    names = list(dict.fromkeys(r["backend"] for r in rec["results"]))
    return leading_first(names, baseline_of(rec))


def memory_bound_shapes(rec: dict) -> list[tuple]:
    """(label, m, n, k) of the shapes below the device's ridge point, in run order."""
    bound = {(r["label"], r["m"], r["n"], r["k"]) for r in rec["results"] if r["memory_bound"]}
    return [shape for shape in shapes_in_order(rec) if shape in bound]


def header_lines(rec: dict) -> list[str]:
    h = rec["header"]
    c = h["clocks"]
    o = h["options"]
    observed = c.get("sm_observed_mhz")
    seen = f"{_num(observed[0], 0)}-{_num(observed[-1], 0)}" if observed else "n/a"
    lines = [
        f"GPU {h['gpu']} (sm_{(h['compute_capability'] or '?').replace('.', '')}, "
        f"{h['sm_count']} SMs), driver {_v(h['driver'])}, CUDA {_v(h['cuda'])}",
        f"torch {_v(h['torch'])}, cutlass-dsl {_v(h['cutlass_dsl'])}, triton {_v(h['triton'])}, "
        f"quack {_v(h['quack'])}, wsgemm {_v(h['wsgemm'])}, python {_v(h['python'])}",
        f"SM clock MHz: max {_num(c['sm_max_mhz'], 0)}, at start {_num(c['sm_at_start_mhz'], 0)}, "
        f"during measurements {seen}; power limit {_num(c['power_limit_w'], 0)} W; "
        f"tensor peak {_peak_line(h)}",
        _roofline_line(h),
        f"{o['dtype']} inputs, {o['accumulate']} accumulate, layout {o['layout']}, "
        f"{o['rounds']} interleaved rounds, ~{o['target_ms']:g} ms per measurement, "
        f"L2 flushed ({rec['header']['method']['l2_flush_bytes'] >> 20} MiB) before every call",
        f"{h['date']}  {h['command']}",
    ]
    lines += [f"note: {n}" for n in h["notes"]]
    return lines


def render(rec: dict, console=None) -> None:
    """Print the header, the per-shape table and the per-backend summary."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    for line in header_lines(rec):
        console.print(line, highlight=False, markup=False)

    table = Table(show_lines=False, header_style="bold")
    for name, justify in (
        ("shape", "left"), ("M x N x K", "right"), ("backend", "left"), ("status", "left"),
        ("ms", "right"), ("TFLOP/s", "right"), (f"vs {_vs(rec)} (min-max)", "right"),
        ("% peak", "right"), ("TB/s", "right"), ("% HBM", "right"), ("SM MHz", "right"),
        ("W", "right"),
    ):  # fmt: skip
        table.add_column(Text(name), justify=justify)
    groups = _by_shape(rec)
    skews = clock_skews(rec)
    for g, (shape, rows) in enumerate(groups.items()):
        for i, r in enumerate(rows):
            last = i == len(rows) - 1 and g != len(groups) - 1
            skew = skews.get((r["label"], r["backend"]))
            table.add_row(*_cells(shape, r, first=i == 0, skew=skew), end_section=last)
    console.print(table)
    console.print(_summary_table(rec))
    if skews:
        console.print(_skew_note(skews, _vs(rec)), highlight=False, markup=False)


def render_text(rec: dict, width: int = 160) -> str:
    """``render`` into a string (no colour), for tests and logs."""
    from rich.console import Console

    buffer = io.StringIO()
    render(rec, Console(file=buffer, width=width, color_system=None, force_terminal=False))
    return buffer.getvalue()


#: A row whose SM clock differs from cuBLAS's rounds of the same shape by more than this share
#: is marked: under the power cap its ratio is partly the clock (docs/perf.md, entry 20).
CLOCK_SKEW = 0.05


def clock_skews(rec: dict) -> dict[tuple[str, str], float]:
    """(label, backend) -> its SM clock / the baseline's (cuBLAS's) clock on the same shape - 1,
    for the rows where that exceeds ``CLOCK_SKEW`` either way (both clocks known)."""
    baseline = baseline_of(rec)
    base = {
        r["label"]: r["sm_clock_mhz"]
        for r in rec["results"]
        if r["backend"] == baseline and r["status"] == "ok" and r["sm_clock_mhz"]
    }
    out = {}
    for r in rec["results"]:
        clock, ref = r["sm_clock_mhz"], base.get(r["label"])
        if r["backend"] == baseline or r["status"] != "ok" or not clock or not ref:
            continue
        skew = clock / ref - 1.0
        if abs(skew) > CLOCK_SKEW:
            out[(r["label"], r["backend"])] = skew
    return out


def _skew_note(skews: dict, baseline: str = "cuBLAS") -> str:
    return (
        f"* {len(skews)} row(s) ran at an SM clock more than {CLOCK_SKEW:.0%} from {baseline}'s "
        "rounds of the same shape (shown next to the ratio): under the power cap their ratio "
        "is partly the clock"
    )


def summary(rec: dict) -> list[dict]:
    """Per backend: counts by status and the geometric means over the shapes it ran."""
    out = []
    for backend in backends_in_order(rec):
        rows = [r for r in rec["results"] if r["backend"] == backend]
        ok = [r for r in rows if r["status"] == "ok"]
        ratios = [r["ratio_to_cublas"]["median"] for r in ok if r["ratio_to_cublas"]]
        out.append(
            {
                "backend": backend,
                "counts": {s: sum(r["status"] == s for r in rows) for s in _STATUSES},
                "geomean_ratio": _geomean(ratios),
                "geomean_tflops": _geomean([r["tflops"] for r in ok]),
                "worst_ratio": min(ratios) if ratios else None,
                "best_ratio": max(ratios) if ratios else None,
            }
        )
    return out


def markdown(rec: dict) -> str:
    """Shapes x backends, each cell ``TFLOP/s (median ratio to cuBLAS)``, then a summary."""
    backends = backends_in_order(rec)
    cells = {(r["label"], r["backend"]): r for r in rec["results"]}
    lines = [
        "| shape | M x N x K | " + " | ".join(backends) + " |",
        "|---|---:|" + "---:|" * len(backends),
    ]
    skews = clock_skews(rec)
    for label, m, n, k in shapes_in_order(rec):
        groups = _groups_text(next(r for r in rec["results"] if r["label"] == label))
        row = [label, f"{m} x {n} x {k}{groups}"]
        for backend in backends:
            r = cells.get((label, backend))
            skew = skews.get((label, backend))
            clock = "" if skew is None else f" *clock {skew:+.0%}"
            row.append(_md_cell(r, baseline_of(rec)) + clock)
        lines.append("| " + " | ".join(row) + " |")
    if skews:
        lines += ["", _skew_note(skews, _vs(rec))]
    bound = memory_bound_shapes(rec)
    if bound:
        lines += [
            "",
            f"Memory-bound shapes (below the ridge point of "
            f"{rec['header']['ridge_flop_per_byte']:.0f} FLOP/byte): effective TB/s "
            f"(% of the {rec['header']['hbm_tbps']:g} TB/s HBM peak)",
            "",
            "| shape | M x N x K | " + " | ".join(backends) + " |",
            "|---|---:|" + "---:|" * len(backends),
        ]
        for label, m, n, k in bound:
            row = [label, f"{m} x {n} x {k}"]
            row += [_md_bandwidth_cell(cells.get((label, backend))) for backend in backends]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"| backend | geomean vs {_vs(rec)} | range | geomean TFLOP/s | ok/wrong/skipped/error |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in summary(rec):
        c = s["counts"]
        span = (
            f"{s['worst_ratio']:.2f}-{s['best_ratio']:.2f}" if s["worst_ratio"] is not None else "-"
        )
        lines.append(
            f"| {s['backend']} | {_ratio_text(s['geomean_ratio'])} | {span} | "
            f"{_num(s['geomean_tflops'], 0)} | "
            f"{c['ok']}/{c['wrong']}/{c['skipped']}/{c['error']} |"
        )
    return "\n".join(lines) + "\n"


_STATUSES = ("ok", "wrong", "skipped", "error")


def _by_shape(rec: dict) -> dict[tuple, list[dict]]:
    """Each shape's rows, in ``backends_in_order``."""
    rank = {name: i for i, name in enumerate(backends_in_order(rec))}
    groups: dict[tuple, list[dict]] = {}
    for r in rec["results"]:
        groups.setdefault((r["label"], r["m"], r["n"], r["k"]), []).append(r)
    return {shape: sorted(rows, key=lambda r: rank[r["backend"]]) for shape, rows in groups.items()}


def _cells(shape: tuple, r: dict, first: bool, skew: float | None = None) -> list:
    from rich.text import Text

    label, m, n, k = shape
    dims = f"{m}x{n}x{k}" + _groups_text(r)
    status = Text(r["status"] if r["status"] == "ok" else f"{r['status']}: {r['note']}")
    status.stylize(STATUS_STYLE[r["status"]])
    ratio = r["ratio_to_cublas"]
    ratio_text = "-"
    if ratio:
        ratio_text = f"{ratio['median']:.3f} ({ratio['min']:.2f}-{ratio['max']:.2f})"
        if skew is not None:
            ratio_text += f" *clock {skew:+.0%}"
    bound = r["memory_bound"]
    # Text, not str: rich would read "[...]" in a label or note as markup.
    return [
        Text(label if first else ""),
        Text(dims if first else ""),
        Text(r["backend"]),
        status,
        Text(_num(r["median_ms"], 4)),
        Text(_num(r["tflops"], 1)),
        Text(ratio_text),
        Text(_num(r["pct_of_peak"], 1)),
        Text(_num(r["tbps"], 2) if bound else ""),
        Text(_num(r["pct_of_hbm"], 1) if bound else ""),
        Text(_num(r["sm_clock_mhz"], 0)),
        Text(_num(r["power_w"], 0)),
    ]


def _summary_table(rec: dict):
    from rich.table import Table
    from rich.text import Text

    table = Table(title="per backend, over the shapes it ran", header_style="bold")
    for name in ("backend", f"geomean vs {_vs(rec)}", "range", "geomean TFLOP/s", "ok", "wrong",
                 "skipped", "error"):  # fmt: skip
        table.add_column(name, justify="left" if name == "backend" else "right")
    for s in summary(rec):
        c = s["counts"]
        span = "-"
        if s["worst_ratio"] is not None:
            span = f"{s['worst_ratio']:.2f}-{s['best_ratio']:.2f}"
        table.add_row(
            Text(s["backend"]),
            _ratio_text(s["geomean_ratio"]),
            span,
            _num(s["geomean_tflops"], 1),
            *(str(c[k]) for k in _STATUSES),
        )
    return table


def _md_cell(r: dict | None, baseline: str = BASELINE) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        return r["status"]
    ratio = r["ratio_to_cublas"]
    tflops = f"{r['tflops']:.{0 if r['tflops'] >= 10 else 1}f}"
    if r["backend"] == baseline or not ratio:
        return tflops
    return f"{tflops} ({ratio['median']:.2f}x)"


def _groups_text(r: dict) -> str:
    """A grouped row's groups, for the M x N x K column: `` (256 groups, max 812, 3 empty)``
    (M is the rows of all groups); empty for any other row."""
    grouped = r.get("grouped")
    if not grouped:
        return ""
    sizes = grouped["sizes"]
    empty = sizes.count(0)
    return f" ({len(sizes)} groups, max {max(sizes)}" + (f", {empty} empty)" if empty else ")")


def _md_bandwidth_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        return r["status"]
    pct = r["pct_of_hbm"]
    return f"{r['tbps']:.2f}" + ("" if pct is None else f" ({pct:.0f}%)")


def _roofline_line(h: dict) -> str:
    if h["hbm_tbps"] is None:
        return "HBM peak unknown for this GPU (no % of HBM)"
    if h["ridge_flop_per_byte"] is None:
        return f"HBM peak {h['hbm_tbps']:g} TB/s, ridge point unknown (no max SM clock)"
    return (
        f"HBM peak {h['hbm_tbps']:g} TB/s, ridge point {h['ridge_flop_per_byte']:.0f} FLOP/byte "
        "(shapes below it show TB/s and % HBM)"
    )


def _peak_line(h: dict) -> str:
    fpc = h["flop_per_clock_per_sm"]
    if not fpc:
        return "unknown for this GPU (no % of peak)"
    return f"{h['sm_count']} SMs x {fpc} FLOP/clock/SM x measured clock"


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _num(value, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}f}"


def _v(value) -> str:
    return "n/a" if value is None else str(value)
