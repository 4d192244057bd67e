"""The PNG timeline: a few SMs, one row per recorder colored by what it is doing, and one thin
lane per ring stage showing when the stage holds a k-tile.

Per SM, top to bottom: the producer, the consumers (or sm80 workers) by warp, then the stages.
A recorder's row is painted as ``activity.paint`` says (the innermost span on top: waits in
pale colors, loading and MMA in saturated ones). A stage lane has one bar per fill: from the
producer's ``LOAD_ISSUE`` into that stage to the last ``STAGE_RELEASE`` of it before the next
fill, alternating two colors tile by tile, so the ring's turnover and the gaps where a stage
sits empty (the producer behind) are visible at a glance.

matplotlib (the ``trace``, ``bench`` and ``test`` extras) is imported when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wsgemm.support import int_ranges
from wsgemm.trace_format import Event, Role

from .activity import ACTIVITIES, COLORS, paint
from .decoding import Decoded, role_name

__all__ = ["DEFAULT_SMS", "pick_sms", "plot"]

#: SMs drawn when none are chosen: the first few by SM id (more rows stop being legible).
DEFAULT_SMS = 4
# bar colors of a stage lane, alternating tile by tile
_STAGE_COLORS = ("#6baed6", "#fdae6b")
# room under the axes for the legend's two lines
_LEGEND_INCHES = 0.5
_ROLE_ORDER = {int(Role.PRODUCER): 0, int(Role.CONSUMER): 1, int(Role.WORKER): 2}


def pick_sms(d: Decoded, sms=None) -> list[int]:
    """The SMs to draw: ``sms`` (ids; those that recorded, in order) or the first
    ``DEFAULT_SMS``. ValueError when none of ``sms`` recorded."""
    recorded = sorted(set(d.recorders["smid"].tolist()))
    if sms is None:
        return recorded[:DEFAULT_SMS]
    chosen = [s for s in sorted(set(sms)) if s in recorded]
    if not chosen:
        raise ValueError(
            f"none of SMs {int_ranges(sorted(set(sms)))} recorded; the trace has SMs "
            f"{int_ranges(recorded)}"
        )
    return chosen


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the PNG timeline needs matplotlib: pip install 'wsgemm[trace]'"
        ) from exc
    matplotlib.use("Agg")  # files only: no display on a GPU host or in CI
    import matplotlib.pyplot as plt

    return plt


def plot(d: Decoded, path: str | Path, sms=None, title: str = "") -> Path:
    """Write the timeline of the SMs ``sms`` (default: the first ``DEFAULT_SMS``) to ``path``
    (PNG, or any format matplotlib infers from the suffix); returns ``path``."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    path = Path(path)
    chosen = pick_sms(d, sms)
    rows = _rows(d, chosen)
    fig, ax = plt.subplots(figsize=(14, 1.2 + _LEGEND_INCHES + 0.3 * sum(h for *_, h in rows)))
    y, labels, ticks, used = 0.0, [], [], set()
    segments = paint(d, np.flatnonzero(np.isin(d.recorders["smid"], chosen)))
    for label, what, height in rows:
        y -= height
        if isinstance(what, tuple):  # a stage lane: (cta list, stage)
            _stage_lane(ax, d, *what, y, height)
        else:
            used |= _recorder_row(ax, segments, what, y, height)
        labels.append(label)
        ticks.append(y + height / 2)
        if label.startswith("SM "):
            ax.axhline(y + height, color="black", linewidth=0.6)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(y, 0)
    mine = d.recorders[np.isin(d.recorders["smid"], chosen)]
    ax.set_xlim(mine["begin"].min() / 1000, mine["end"].max() / 1000)
    ax.set_xlabel("time from the first recorder's start (us)")
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=COLORS[a], label=a) for a in ACTIVITIES if a in used]
    legend += [
        Patch(color=_STAGE_COLORS[0], label="stage holds a k-tile: fill -> release"),
        Patch(color=_STAGE_COLORS[1], label="... of the next tile"),
    ]
    fig.legend(handles=legend, fontsize=7, ncol=min(len(legend), 7), loc="lower center")
    recorded = len(set(d.recorders["smid"].tolist()))
    shown = f"SMs {int_ranges(chosen)} ({len(chosen)} of {recorded} that recorded)"
    ax.set_title(f"wsgemm trace: {title}\n{shown}" if title else shown, fontsize=10)
    fig.tight_layout(rect=(0, _LEGEND_INCHES / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _rows(d: Decoded, sms: list[int]) -> list[tuple]:
    """``(label, what, height)`` per row, top to bottom: ``what`` is the recorder indices
    that share the row (one role and warp of the SM: successive CTAs of a non-persistent grid
    run on it one after another) or ``(ctas, stage)`` for a stage lane."""
    rec = d.recorders
    rows = []
    for sm in sms:
        on_sm = np.flatnonzero(rec["smid"] == sm)
        keys = sorted({(_ROLE_ORDER.get(int(rec["role"][i]), 3), int(rec["warp"][i]), int(i))
                       for i in on_sm})  # fmt: skip
        seen: dict[tuple, list] = {}
        for order, warp, i in keys:
            seen.setdefault((order, warp), []).append(i)
        first = True
        for (_, warp), members in seen.items():
            role = role_name(rec["role"][members[0]])
            label = f"{f'SM {sm}  ' if first else ''}{role} w{warp}"
            rows.append((label, np.array(members), 1.0))
            first = False
        ctas = rec["cta"][on_sm]
        fills = _fills(d, ctas)
        for stage in np.unique(fills["stage"]).tolist():
            rows.append((f"stage {stage}", (np.unique(ctas), stage), 0.45))
    return rows


def _recorder_row(ax, segments, members, y: float, height: float) -> set:
    rec, start, stop, activity = segments
    mine = np.isin(rec, members)
    used = set()
    for a in np.unique(activity[mine]).tolist():
        pick = mine & (activity == a)
        bars = np.column_stack([start[pick], stop[pick] - start[pick]]) / 1000
        ax.broken_barh(bars, (y + 0.1 * height, 0.8 * height), color=COLORS[ACTIVITIES[a]],
                       linewidth=0)  # fmt: skip
        used.add(ACTIVITIES[a])
    return used


def _fills(d: Decoded, ctas) -> np.ndarray:
    ev = d.events
    rec = d.recorders[ev["rec"]]
    pick = (ev["kind"] == Event.LOAD_ISSUE) & (ev["stage"] >= 0) & np.isin(rec["cta"], ctas)
    return ev[pick]


def _stage_lane(ax, d: Decoded, ctas, stage: int, y: float, height: float) -> None:
    """Bars from each fill of ``stage`` to its last release before the next fill."""
    ev = d.events
    rec = d.recorders[ev["rec"]]
    for cta in ctas.tolist():
        mine = (rec["cta"] == cta) & (ev["stage"] == stage)
        is_fill = mine & (ev["kind"] == Event.LOAD_ISSUE)
        fill_t = np.sort(ev["t"][is_fill])
        if not len(fill_t):
            continue
        rel_t = np.sort(ev["t"][mine & (ev["kind"] == Event.STAGE_RELEASE)])
        # fill i is held until the last release before fill i + 1
        nxt = np.append(fill_t[1:], np.inf)
        last = np.searchsorted(rel_t, nxt, side="left") - 1
        held = (last >= 0) & (rel_t[np.maximum(last, 0)] >= fill_t) if len(rel_t) else None
        end = np.where(held, rel_t[np.maximum(last, 0)], fill_t) if held is not None else fill_t
        tile = _tile_rank(ev, is_fill)[np.argsort(ev["t"][is_fill], kind="stable")]
        for parity in (0, 1):
            pick = tile % 2 == parity
            bars = np.column_stack([fill_t[pick], np.maximum(end - fill_t, 0)[pick]]) / 1000
            ax.broken_barh(bars, (y + 0.1 * height, 0.8 * height), color=_STAGE_COLORS[parity],
                           edgecolor="white", linewidth=0.3)  # fmt: skip


def _tile_rank(ev: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """For the events ``pick``, a number that changes when their tile does."""
    tiles = np.column_stack([ev[f][pick] for f in ("tile_m", "tile_n", "tile_l")])
    if not len(tiles):
        return np.zeros(0, dtype=np.int64)
    change = np.ones(len(tiles), dtype=np.int64)
    change[1:] = (tiles[1:] != tiles[:-1]).any(axis=1)
    return np.cumsum(change)
