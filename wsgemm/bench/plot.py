"""The record as a figure: TFLOP/s per backend across the suite, and the ratio to cuBLAS."""

from __future__ import annotations

from .backends import BASELINE
from .report import backends_in_order, baseline_of, shapes_in_order

# Beyond this spread of TFLOP/s (decode next to 16k-token shapes) a linear axis flattens the
# small shapes into the floor, so the top panel goes logarithmic.
LOG_SCALE_SPREAD = 20.0


def plot(rec: dict, path) -> None:
    """Write a two-panel PNG (or any format matplotlib infers from ``path``)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the GPU host or in CI
    import matplotlib.pyplot as plt

    shapes = shapes_in_order(rec)
    cells = {(r["label"], r["backend"]): r for r in rec["results"]}
    runs = _runs([s[0] for s in shapes])
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(9.0, 0.45 * len(shapes) + 5), 8.5), sharex=True
    )
    not_plotted, all_tflops = [], []
    baseline = baseline_of(rec)  # cuBLAS; the moe suite's torch or loop
    for i, backend in enumerate(backends_in_order(rec)):
        rows = [cells.get((s[0], backend)) for s in shapes]
        ok = {x: r for x, r in enumerate(rows) if r is not None and r["status"] == "ok"}
        failed = [r["status"] for r in rows if r is not None and r["status"] != "ok"]
        if not ok:
            not_plotted.append(f"{backend} ({_count(failed)})")
            continue
        style = {"color": f"C{i % 10}", "marker": "os^vD<>ph*"[i % 10], "linewidth": 1}
        label = backend + (f" (not ok on {len(failed)})" if failed else "")
        all_tflops += [r["tflops"] for r in ok.values()]
        top.plot([], [], label=label, **style)
        if backend != baseline:
            bottom.plot([], [], label=backend, **style)
        # One line per run of related shapes (one projection across token counts), broken
        # where a shape has no ok result: a line never bridges shapes that are not a series.
        for run in runs:
            for segment in _segments([x for x in run if x in ok]):
                top.plot(segment, [ok[x]["tflops"] for x in segment], **style)
                ratios = [ok[x]["ratio_to_cublas"] for x in segment]
                if backend != baseline and None not in ratios:
                    _ratio_bars(bottom, segment, ratios, style)
    bottom.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label=f"{baseline} = 1")
    if all_tflops and max(all_tflops) > LOG_SCALE_SPREAD * min(all_tflops):
        top.set_yscale("log")
    top.set_ylabel("TFLOP/s (median over rounds)")
    name = "cuBLAS" if baseline == BASELINE else baseline
    bottom.set_ylabel(f"{name} time / backend time\n(median, min-max over rounds)")
    bottom.set_xticks(range(len(shapes)), [s[0] for s in shapes], rotation=60, ha="right")
    bottom.tick_params(axis="x", labelsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(_title(rec, not_plotted), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ratio_bars(ax, xs: list[int], ratios: list[dict], style: dict) -> None:
    medians = [r["median"] for r in ratios]
    spread = [[r["median"] - r["min"] for r in ratios], [r["max"] - r["median"] for r in ratios]]
    ax.errorbar(xs, medians, yerr=spread, capsize=3, **style)


def _title(rec: dict, not_plotted: list[str]) -> str:
    h, o = rec["header"], rec["header"]["options"]
    title = (
        f"{h['gpu']}: {o['suite']} suite, {o['dtype']} in / {o['accumulate']} accumulate, "
        f"layout {o['layout']}, {o['rounds']} interleaved rounds"
    )
    if not_plotted:
        title += "\nnot plotted: " + ", ".join(not_plotted)
    return title


def _runs(labels: list[str]) -> list[list[int]]:
    """Consecutive shapes that form a series: the same label up to its token count
    (``"8b qkv t=1"``, ``"8b qkv t=128"``); any other shapes each stand alone."""
    runs: list[list[int]] = []
    previous = None
    for x, label in enumerate(labels):
        series = label.rsplit(" t=", 1)[0] if " t=" in label else None
        if series is not None and series == previous:
            runs[-1].append(x)
        else:
            runs.append([x])
        previous = series
    return runs


def _segments(xs: list[int]) -> list[list[int]]:
    """Split sorted positions into runs of consecutive integers."""
    segments: list[list[int]] = []
    for x in xs:
        if segments and x == segments[-1][-1] + 1:
            segments[-1].append(x)
        else:
            segments.append([x])
    return segments


def _count(statuses: list[str]) -> str:
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    return ", ".join(f"{s} on {n}" for s, n in counts.items()) or "no results"
