"""What each recorder is doing at every instant, and the mainloop and epilogue intervals that
exposed-epilogue time is measured from. Shared by the summary and the PNG so that both show the
same numbers.

A recorder's time is painted in layers, the innermost on top:

1. the recorder itself (its begin .. end): "other" (fetching a tile, idle after its work);
2. a producer's loading, from its first wait on empty or load issue to its last: "loading";
3. each tile's mainloop on a consumer or worker (``mainloop_intervals``): "MMA";
4. epilogue and fix-up spans; the sm80 worker's load and compute spans ("loading", "MMA");
5. the waits: on empty, on full, on the ping-pong order, on MMAs to retire;
6. the store wait, which lies inside an epilogue.

So a producer's time between its waits counts as issuing loads, and a consumer's time inside a
mainloop but outside its waits as issuing MMAs: the events bound the waits exactly, the work
between them only by what is left.
"""

from __future__ import annotations

import numpy as np

from wsgemm.trace_format import Event

from .decoding import SPAN_NAMES, Decoded

__all__ = ["ACTIVITIES", "COLORS", "exclusive_time", "mainloop_intervals", "paint", "sweep"]

#: Activities in legend order.
ACTIVITIES = (
    "loading",
    "MMA",
    "MMA wait",
    "wait empty",
    "wait full",
    "order wait",
    "epilogue",
    "store wait",
    "fix-up",
    "other",
)
#: One color per activity: work in saturated colors, waits in greys and pale tones.
COLORS = {
    "loading": "#1f77b4",
    "MMA": "#2ca02c",
    "MMA wait": "#98df8a",
    "wait empty": "#d62728",
    "wait full": "#ff9896",
    "order wait": "#c7c7c7",
    "epilogue": "#9467bd",
    "store wait": "#c5b0d5",
    "fix-up": "#8c564b",
    "other": "#7f7f7f",
}
# span kind -> activity, outermost first: where spans overlap, the later entry shows
_LAYERS = (
    ("epilogue", "epilogue"),
    ("fixup", "fix-up"),
    ("load", "loading"),
    ("compute", "MMA"),
    ("wait empty", "wait empty"),
    ("wait full", "wait full"),
    ("order wait", "order wait"),
    ("mma wait", "MMA wait"),
    ("store wait", "store wait"),
)
# the events of a producer's loading
_LOAD_KINDS = [int(k) for k in (Event.WAIT_EMPTY_BEGIN, Event.WAIT_EMPTY_END, Event.LOAD_ISSUE)]
# the events of a tile's mainloop on a consumer (sm90, sm80 study kernel) or worker (multistage)
_MAINLOOP_KINDS = [
    int(k)
    for k in (Event.WAIT_FULL_BEGIN, Event.WAIT_FULL_END, Event.MMA_ISSUE, Event.MMA_WAIT_BEGIN,
              Event.MMA_WAIT_END, Event.STAGE_RELEASE, Event.LOAD_BEGIN, Event.LOAD_END,
              Event.COMPUTE_BEGIN, Event.COMPUTE_END)
]  # fmt: skip


def sweep(group, begin, end, layer, layers: int):
    """Cut the timeline of each group at every interval's ends and say which layers cover each
    piece.

    ``group``, ``begin``, ``end``, ``layer``: one entry per interval (ints, floats, floats,
    ints in ``range(layers)``). Returns ``(group, start, stop, covered)`` with one entry per
    piece of positive length, ordered by group then time; ``covered[i, j]`` is True when an
    interval of layer ``j`` covers piece ``i``.
    """
    group = np.asarray(group, dtype=np.int64)
    n = len(group)
    at = np.concatenate([begin, end]).astype(np.float64)
    g = np.concatenate([group, group])
    lay = np.concatenate([layer, layer]).astype(np.int64)
    step = np.concatenate([np.ones(n, np.int32), -np.ones(n, np.int32)])
    order = np.lexsort((at, g))
    at, g, lay, step = at[order], g[order], lay[order], step[order]
    covered = np.empty((len(at), layers), dtype=bool)
    for j in range(layers):
        # a group's steps sum to zero, so one running sum over all groups restarts at each
        covered[:, j] = np.cumsum(np.where(lay == j, step, 0)) > 0
    piece = np.flatnonzero((g[:-1] == g[1:]) & (at[1:] > at[:-1]))
    return g[piece], at[piece], at[piece + 1], covered[piece]


def paint(decoded: Decoded, recs=None):
    """The top activity of each recorder over time: ``(rec, start, stop, activity)``, ordered
    by recorder then time, with neighbouring pieces of one activity merged; ``activity``
    indexes ``ACTIVITIES``. ``recs``: only these recorder indices (default all)."""
    recorders, spans = decoded.recorders, decoded.spans
    recs = np.arange(len(recorders)) if recs is None else np.asarray(recs, dtype=np.int64)
    # channel 0: the recorder itself; 1: a producer's loading; 2: a consumer's or worker's
    # mainloops; then the spans in _LAYERS order
    channel_of = np.full(len(SPAN_NAMES), -1)
    for channel, (name, _) in enumerate(_LAYERS, start=3):
        channel_of[SPAN_NAMES.index(name)] = channel
    s = spans[np.isin(spans["rec"], recs) & (channel_of[spans["span"]] > 0)]
    l_rec, l_begin, l_end = _intervals(decoded, recs, _LOAD_KINDS, per_tile=False)
    m_rec, m_begin, m_end = mainloop_intervals(decoded, recs)
    rec, start, stop, covered = sweep(
        np.concatenate([recs, l_rec, m_rec, s["rec"]]),
        np.concatenate([recorders["begin"][recs], l_begin, m_begin, s["begin"]]),
        np.concatenate([recorders["end"][recs], l_end, m_end, s["end"]]),
        np.concatenate(
            [
                np.zeros(len(recs), np.int64),
                np.ones(len(l_rec), np.int64),
                np.full(len(m_rec), 2),
                channel_of[s["span"]],
            ]
        ),
        len(_LAYERS) + 3,
    )
    live = covered.any(axis=1)
    rec, start, stop, covered = rec[live], start[live], stop[live], covered[live]
    top = covered.shape[1] - 1 - np.argmax(covered[:, ::-1], axis=1)
    channel_activity = ["other", "loading", "MMA", *(act for _, act in _LAYERS)]
    activity = np.array([ACTIVITIES.index(a) for a in channel_activity])[top]
    # merge neighbours of one activity
    new = np.ones(len(rec), dtype=bool)
    new[1:] = (rec[1:] != rec[:-1]) | (activity[1:] != activity[:-1]) | (start[1:] > stop[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(rec)) - 1
    return rec[first], start[first], stop[last], activity[first]


def exclusive_time(decoded: Decoded) -> np.ndarray:
    """ns per (recorder, activity): how long each recorder spent in each activity, the
    innermost span counting (the layers above). Rows sum to the recorder's time."""
    rec, start, stop, activity = paint(decoded)
    out = np.zeros((len(decoded.recorders), len(ACTIVITIES)))
    np.add.at(out, (rec, activity), stop - start)
    return out


def mainloop_intervals(decoded: Decoded, recs):
    """``(rec, begin, end)``: each tile's mainloop on each of the recorders ``recs``: from its
    first mainloop event (wait on full, MMA issue, stage release, sm80 load/compute) to its
    last. A recorder's tiles are told apart by its tile fetches and epilogues: the events
    between two of them belong to one tile (a split-K unit that does not finish its tile has
    no epilogue, but its fetch starts the next unit)."""
    return _intervals(decoded, recs, _MAINLOOP_KINDS, per_tile=True)


def _intervals(decoded: Decoded, recs, kinds, per_tile: bool):
    """``(rec, begin, end)`` from the first to the last event of ``kinds`` on each recorder of
    ``recs`` (``per_tile``: on each of its tiles, as ``mainloop_intervals`` says)."""
    ev = decoded.events
    ev = ev[np.isin(ev["rec"], recs)]
    # events are recorder-major in recording order: a running count of tile fetches and
    # epilogue begins numbers each recorder's tiles (the count only grows, so (rec, count)
    # names one tile or split unit)
    bounds = np.isin(ev["kind"], (Event.EPILOGUE_BEGIN, Event.TILE_FETCH))
    tile = np.cumsum(bounds) if per_tile else np.zeros(len(ev))
    main = np.isin(ev["kind"], kinds)
    rec, tile, t = ev["rec"][main], tile[main], ev["t"][main]
    if not len(rec):
        return rec, t, t
    first = np.ones(len(rec), dtype=bool)
    first[1:] = (rec[1:] != rec[:-1]) | (tile[1:] != tile[:-1])
    starts = np.flatnonzero(first)
    return rec[starts], np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts)
