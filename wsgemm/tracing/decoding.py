"""A raw trace buffer (``trace_format.py``) as numpy tables: recorders, events,
spans.

Everything is vectorized over the whole buffer (a persistent 4096^3 call records ~10^6 events):
no Python loop runs per event. Times become float64 nanoseconds relative to the earliest
recorder's start, so every table shares one clock:

* ``Timer.GLOBALTIMER`` rows: ``%globaltimer`` ns, shifted by that origin;
* ``Timer.CLOCK64`` rows: SM cycles, mapped to ns by the line through the recorder's two anchors
  (``clock64`` and ``%globaltimer`` read together at its start and its end).

Spans pair each ``SPANS`` begin with the next end of the same kind on the same recorder; a begin
not followed by its end, or an end with no begin before it, is kept in ``unmatched`` and reported
by ``checks``, never raised: a trace cut short by overflow still renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wsgemm.trace_format import (
    EVENT_FIELDS,
    EVENT_WORDS,
    HEADER_FIELDS,
    HEADER_WORDS,
    SPANS,
    Event,
    RawTrace,
    Role,
    Timer,
)

__all__ = [
    "EVENT_DTYPE",
    "RECORDER_DTYPE",
    "SPAN_DTYPE",
    "SPAN_NAMES",
    "UNIT_DTYPE",
    "Decoded",
    "decode",
    "recorder_label",
    "role_name",
]

#: Span kinds in ``SPANS`` order; a span's ``span`` field indexes this tuple.
SPAN_NAMES = tuple(SPANS)

RECORDER_DTYPE = np.dtype(
    [
        ("row", np.int32),  # the recorder's row in the raw buffer
        ("smid", np.int32),
        ("cta", np.int32),
        ("role", np.int8),  # Role
        ("warp", np.int32),
        ("timer", np.int8),  # Timer
        ("count", np.int64),  # events the recorder tried to write
        ("stored", np.int64),  # events in the buffer: min(count, capacity)
        ("overflow", np.int64),  # events lost: max(0, count - capacity)
        ("begin", np.float64),  # ns: RECORDER_BEGIN, else the header's start anchor
        ("end", np.float64),  # ns: RECORDER_END, else the header's end anchor, else last event
    ]
)
EVENT_DTYPE = np.dtype(
    [
        ("rec", np.int32),  # index into Decoded.recorders
        ("kind", np.int16),  # Event
        ("t", np.float64),  # ns from the origin
        ("tile_m", np.int32),
        ("tile_n", np.int32),
        ("tile_l", np.int32),
        ("k_tile", np.int32),
        ("stage", np.int32),
    ]
)
SPAN_DTYPE = np.dtype(
    [
        ("rec", np.int32),
        ("span", np.int8),  # index into SPAN_NAMES
        ("begin", np.float64),
        ("end", np.float64),
        # the work unit its recorder had fetched last when it began (index into
        # Decoded.units(); -1: none)
        ("unit", np.int32),
        # from the begin event; a field it leaves at -1 is taken from the end event
        ("tile_m", np.int32),
        ("tile_n", np.int32),
        ("tile_l", np.int32),
        ("k_tile", np.int32),
        ("stage", np.int32),
    ]
)
#: A work unit as a recorder fetched it (``Decoded.units``): a whole tile, a split-K split or a
#: stream-K part of one.
UNIT_DTYPE = np.dtype(
    [
        ("rec", np.int32),
        ("event", np.int64),  # its TILE_FETCH's index into Decoded.events
        ("t", np.float64),  # when it was fetched
        ("tile_m", np.int32),
        ("tile_n", np.int32),
        ("tile_l", np.int32),
        ("part", np.int32),  # its split or part of the tile (0: a whole tile)
        ("k_begin", np.int32),  # its k-tiles [k_begin, k_end) of the tile's
        ("k_end", np.int32),  # -1: unknown (a stream-K fetch without its UNIT_RANGE)
        ("parts", np.int32),  # how many units the tile is cut into (-1: unknown)
    ]
)
_COORDS = ("tile_m", "tile_n", "tile_l", "k_tile", "stage")
#: The roles that run the mainloop and the epilogue (sm90 consumers, sm80 workers).
CONSUMER_ROLES = (int(Role.CONSUMER), int(Role.WORKER))
_H = {name: i for i, name in enumerate(HEADER_FIELDS)}
_E = {name: i for i, name in enumerate(EVENT_FIELDS)}


@dataclass(frozen=True)
class Decoded:
    """One recording as tables (numpy structured arrays, fields in the ``*_DTYPE`` above).

    ``recorders``: the rows that recorded anything (``count > 0``), in buffer order.
    ``events``: every stored event, ordered by recorder then as recorded.
    ``spans``: paired begin/end events, ordered by recorder then begin time, each with the
    work unit it belongs to (``units``).
    ``unmatched``: the begin/end events no span took (``EVENT_DTYPE``).
    ``capacity``: events per recorder row. ``origin_ns``: the absolute ``%globaltimer`` time
    that ``t = 0`` stands for. ``notes``: what could not be read as the format says (a bad
    clock anchor), one sentence each.
    """

    recorders: np.ndarray
    events: np.ndarray
    spans: np.ndarray
    unmatched: np.ndarray
    capacity: int
    origin_ns: int
    meta: dict
    notes: tuple[str, ...] = ()

    @property
    def sampled(self) -> bool:
        """Only a sample of the grid recorded (``max_ctas``, or sm80's default waves): fewer
        CTAs traced than launched."""
        return self.meta.get("ctas_traced", 0) < self.meta.get("ctas_launched", 0)

    @property
    def splits(self) -> int:
        """The split-K count the call was traced with (1: unsplit, or stream-K)."""
        return int(self.meta.get("split") or 1)

    @property
    def stream_k(self) -> bool:
        """Whether the call was traced on the stream-K schedule (each tile cut into its own
        number of parts, ``units``)."""
        return bool(self.meta.get("stream_k"))

    @property
    def is_split(self) -> bool:
        """Whether a work unit may be a piece of a tile (split-K or stream-K), whose partial
        sums meet in a fix-up."""
        return self.splits > 1 or self.stream_k

    def fetch_split(self, pick: np.ndarray) -> np.ndarray:
        """The split (stream-K: the part) of each picked ``TILE_FETCH`` event: a split unit's
        fetch carries it in ``stage``; 0 when the call was traced unsplit."""
        if self.is_split:
            return self.events["stage"][pick].astype(np.int64)
        return np.zeros(int(np.count_nonzero(pick)), dtype=np.int64)

    def units(self) -> np.ndarray:
        """Every work unit a recorder fetched (``UNIT_DTYPE``, in event order), with its k-tiles
        and its tile's part count: unsplit, the whole tile ([0, k_tiles), 1 part); split-K,
        split s of ``splits`` ([s * k_tiles // splits, (s + 1) * k_tiles // splits), as
        ``scheduler.split_k_range``), from its first k-tile on; stream-K, the part, first
        k-tile, end and part count the kernel recorded (the ``UNIT_RANGE`` right after the
        fetch; -1 where it is missing)."""
        ev = self.events
        at = np.flatnonzero(_fetches(ev))
        units = np.zeros(len(at), dtype=UNIT_DTYPE)
        units["rec"], units["event"], units["t"] = ev["rec"][at], at, ev["t"][at]
        for name in ("tile_m", "tile_n", "tile_l"):
            units[name] = ev[name][at]
        k_tiles = int(self.meta.get("k_tiles") or 1)
        pick = np.zeros(len(ev), dtype=bool)
        pick[at] = True
        part = self.fetch_split(pick)
        units["part"] = part
        if self.stream_k:
            units["k_begin"] = ev["k_tile"][at]
            nxt = np.minimum(at + 1, len(ev) - 1)
            ranged = (nxt > at) & (ev["kind"][nxt] == Event.UNIT_RANGE)
            ranged &= ev["rec"][nxt] == ev["rec"][at]
            units["k_end"] = np.where(ranged, ev["k_tile"][nxt], -1)
            units["parts"] = np.where(ranged, ev["stage"][nxt], -1)
        elif self.splits > 1:
            units["k_begin"] = ev["k_tile"][at]
            units["k_end"] = (part + 1) * k_tiles // self.splits
            units["parts"] = self.splits
        else:
            units["k_end"], units["parts"] = k_tiles, 1
        return units

    def unit_spans(self, name: str) -> np.ndarray:
        """The consumer roles' spans called ``name`` (one of ``SPAN_NAMES``) that belong to a
        work unit (their ``unit``, a row of ``units``)."""
        spans = self.spans
        consumer = np.isin(self.recorders["role"], CONSUMER_ROLES)
        return spans[
            (spans["unit"] >= 0)
            & consumer[spans["rec"]]
            & (spans["span"] == SPAN_NAMES.index(name))
        ]

    def inside(self, tile: tuple) -> bool:
        """Whether ``tile`` (m, n, l) is a tile of the problem (``meta["tiles"]``), not one a
        ragged cluster runs past its edge; True where the recording does not say."""
        counts = self.meta.get("tiles")
        return counts is None or all(0 <= v < c for v, c in zip(tile, counts, strict=True))

    @property
    def duration_ns(self) -> float:
        """From the earliest recorder start to the latest recorder end."""
        if not len(self.recorders):
            return 0.0
        return float(self.recorders["end"].max() - self.recorders["begin"].min())


def unit_tile(unit) -> tuple:
    """(m, n, l) of one row of ``Decoded.units`` (its tile)."""
    return (int(unit["tile_m"]), int(unit["tile_n"]), int(unit["tile_l"]))


def role_name(value: int) -> str:
    """``"producer"``, ``"consumer"``, ``"worker"`` (``"role 7"`` for a value the format does
    not define: a damaged buffer still renders)."""
    try:
        return Role(int(value)).name.lower()
    except ValueError:
        return f"role {int(value)}"


def recorder_label(rec) -> str:
    """``"producer w8"``, ``"consumer w4"``: a recorder row's role and warp."""
    return f"{role_name(rec['role'])} w{int(rec['warp'])}"


def _u64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two int32 words as one 64-bit value (int64: timers stay below 2^63)."""
    return (hi.astype(np.int64) << 32) | (lo.astype(np.int64) & 0xFFFFFFFF)


def decode(raw: RawTrace) -> Decoded:
    """Read ``raw.buffer``: ValueError if its shape cannot be the format's."""
    buf = np.asarray(raw.buffer)
    if buf.ndim != 2 or buf.dtype != np.int32 or buf.shape[1] < HEADER_WORDS:
        raise ValueError(
            f"a raw trace buffer is int32 (recorders, {HEADER_WORDS} + capacity * {EVENT_WORDS}),"
            f" got {buf.dtype} {buf.shape}"
        )
    if (buf.shape[1] - HEADER_WORDS) % EVENT_WORDS:
        raise ValueError(
            f"a raw trace row holds {HEADER_WORDS} header words and whole {EVENT_WORDS}-word "
            f"events, got {buf.shape[1]} words"
        )
    capacity = (buf.shape[1] - HEADER_WORDS) // EVENT_WORDS
    notes = []
    if "capacity" in raw.meta and raw.meta["capacity"] != capacity:
        notes.append(
            f"meta says capacity {raw.meta['capacity']} but the rows hold {capacity} events: "
            "read with the rows' size"
        )
    header = buf[:, :HEADER_WORDS]
    rows = np.flatnonzero(header[:, _H["count"]] > 0)
    header = header[rows]
    count = header[:, _H["count"]].astype(np.int64)
    stored = np.minimum(count, capacity)

    # ---- the events, flattened recorder by recorder
    body = buf[rows, HEADER_WORDS:].reshape(len(rows), capacity, EVENT_WORDS)
    keep = np.arange(capacity)[None, :] < stored[:, None]
    flat = body[keep]  # (events, EVENT_WORDS), recorder-major, in recording order
    rec = np.repeat(np.arange(len(rows), dtype=np.int32), stored)
    ticks = _u64(flat[:, _E["t_lo"]], flat[:, _E["t_hi"]])

    # ---- one clock: ns from the earliest recorder start
    t0 = _u64(header[:, _H["t0_lo"]], header[:, _H["t0_hi"]])
    t1 = _u64(header[:, _H["t1_lo"]], header[:, _H["t1_hi"]])
    c0 = _u64(header[:, _H["c0_lo"]], header[:, _H["c0_hi"]])
    c1 = _u64(header[:, _H["c1_lo"]], header[:, _H["c1_hi"]])
    timer = header[:, _H["timer"]]
    is_clock = timer == Timer.CLOCK64
    if not np.isin(timer, [int(t) for t in Timer]).all():
        bad = sorted(set(timer.tolist()) - {int(t) for t in Timer})
        notes.append(f"unknown timer kind(s) {bad}: read as %globaltimer")
    started = t0 > 0
    if started.any():
        origin = int(t0[started].min())
    elif len(ticks) and not is_clock.any():
        origin = int(ticks.min())
    else:
        origin = 0
    ns_per_cycle = np.ones(len(rows))
    anchored = (t1 > t0) & (c1 > c0) & started
    ns_per_cycle[anchored] = (t1 - t0)[anchored] / (c1 - c0)[anchored]
    unanchored = is_clock & ~anchored
    if unanchored.any():
        notes.append(
            f"{int(unanchored.sum())} clock64 recorder(s) lack a start/end anchor pair: their "
            "cycles are read as 1 ns each"
        )
    rel_start = (t0 - origin).astype(np.float64)
    t = (ticks - origin).astype(np.float64)
    ev_clock = is_clock[rec]
    t[ev_clock] = (rel_start[rec] + (ticks - c0[rec]) * ns_per_cycle[rec])[ev_clock]

    events = np.empty(len(flat), dtype=EVENT_DTYPE)
    events["rec"] = rec
    events["kind"] = flat[:, _E["kind"]]
    events["t"] = t
    for name in _COORDS:
        events[name] = flat[:, _E[name]]

    spans, unmatched = _pair(events, _unit_of(events))
    recorders = _recorders(rows, header, count, stored, capacity, started, rel_start, t1, origin,
                           events)  # fmt: skip
    return Decoded(recorders, events, spans, unmatched, capacity, origin, dict(raw.meta),
                   tuple(notes))  # fmt: skip


def _recorders(rows, header, count, stored, capacity, started, rel_start, t1, origin, events):
    n = len(rows)
    recorders = np.empty(n, dtype=RECORDER_DTYPE)
    recorders["row"] = rows
    for name in ("smid", "cta", "role", "warp", "timer"):
        recorders[name] = header[:, _H[name]]
    recorders["count"] = count
    recorders["stored"] = stored
    recorders["overflow"] = np.maximum(0, count - capacity)
    rec, t = events["rec"], events["t"]
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, rec, t)
    np.maximum.at(last, rec, t)
    begin = np.where(started, rel_start, first)
    end = np.where(t1 > 0, (t1 - origin).astype(np.float64), last)
    # the recorder's own marks, where it wrote them, say best when its role started and ended
    for kind, bound in ((Event.RECORDER_BEGIN, begin), (Event.RECORDER_END, end)):
        mark = events["kind"] == kind
        bound[rec[mark]] = t[mark]
    # an event outside those (a store after RECORDER_END) still lies within the recorder
    begin, end = np.minimum(begin, first), np.maximum(end, last)
    empty = ~np.isfinite(begin) | ~np.isfinite(end)
    recorders["begin"] = np.where(empty, 0.0, begin)
    recorders["end"] = np.where(empty, 0.0, end)
    return recorders


def _fetches(events: np.ndarray) -> np.ndarray:
    """Which events fetch a work unit (a ``TILE_FETCH`` that names a tile)."""
    return (events["kind"] == Event.TILE_FETCH) & (events["tile_m"] >= 0)


def _unit_of(events: np.ndarray) -> np.ndarray:
    """For each event, the work unit its recorder fetched last, at or before it: the index of
    that fetch among all (``Decoded.units``' order), -1 for none."""
    fetch = _fetches(events)
    at = np.flatnonzero(fetch)
    idx = np.cumsum(fetch) - 1
    own = idx >= 0
    own[own] = events["rec"][at[idx[own]]] == events["rec"][own]
    return np.where(own, idx, -1).astype(np.int32)


def _pair(events: np.ndarray, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair begins with ends per recorder and kind. A begin pairs with the event right after it
    among that span kind's begins and ends on its recorder, if that is an end: exactly what a
    left-to-right scan pairs, done at once with array shifts. ``unit``: each event's
    (``_unit_of``)."""
    kind, rec = events["kind"], events["rec"]
    spans, lost = [], []
    for index, (begin_kind, end_kind) in enumerate(SPANS.values()):
        at = np.flatnonzero((kind == begin_kind) | (kind == end_kind))
        is_begin = kind[at] == begin_kind
        paired = np.zeros(len(at), dtype=bool)
        if len(at) > 1:
            ok = is_begin[:-1] & ~is_begin[1:] & (rec[at[:-1]] == rec[at[1:]])
            paired[:-1] |= ok
            paired[1:] |= ok
            b, e = at[:-1][ok], at[1:][ok]
        else:
            b = e = np.empty(0, dtype=np.intp)
        lost.append(at[~paired])
        span = np.empty(len(b), dtype=SPAN_DTYPE)
        span["rec"] = rec[b]
        span["span"] = index
        span["begin"] = events["t"][b]
        span["end"] = events["t"][e]
        span["unit"] = unit[b]
        for name in _COORDS:
            span[name] = np.where(events[name][b] >= 0, events[name][b], events[name][e])
        spans.append(span)
    spans = np.concatenate(spans)
    spans = spans[np.lexsort((spans["begin"], spans["rec"]))]
    unmatched = events[np.sort(np.concatenate(lost))]
    return spans, unmatched
