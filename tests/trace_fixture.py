"""Synthetic raw traces for the CPU tests of ``wsgemm.tracing``, in exactly the format the
kernels write (``wsgemm/trace_format.py``).

``pingpong_run()`` simulates a persistent sm90 ping-pong call: 2 CTAs on 2 SMs, each a producer
warp and two consumer warpgroups over a ``stages``-deep ring; the producer fills stage
``f % stages`` once the consumers released fill ``f - stages``, a consumer waits for its k-tile's
data, issues its MMAs, waits for them, releases the stage; the consumer warpgroups take turns at
the mainloop (order barrier) and each one's epilogue overlaps the other's next mainloop. The
result is a list of ``Rec`` (plain Python, easy to mutate in a test) that ``pack`` turns into a
``RawTrace``.

``units_run()`` simulates the same kernel on split work units (``Unit``: a split-K split or a
stream-K part of a tile, over its own k-tiles): each unit's fetch names its first k-tile and
part (a stream-K unit's ``UNIT_RANGE`` its end and part count), every unit records its
fix-up after its mainloop, and only the part that arrives last at a tile's fix-up runs the
tile's epilogue. ``stream_k_run()`` takes its units from the kernel's own stream-K schedule
(``scheduler.unit_order``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wsgemm.trace_format import (
    EVENT_WORDS,
    HEADER_FIELDS,
    HEADER_WORDS,
    Event,
    RawTrace,
    Role,
    Timer,
)

# A plausible %globaltimer value (ns since the epoch): its high word is non-zero, as on a GPU.
BASE_NS = 1_700_000_000_000_000_000
# clock64 cycles per ns for CLOCK64 recorders (a 1.98 GHz SM clock).
CYCLES_PER_NS = 1.98

# Durations of the simulated steps, in ns.
LOAD_LATENCY = 600
ISSUE = 32
MMA = 256
EPILOGUE = 900
STORE_WAIT = 128
#: A shared tile's part's fix-up (storing its partial, or waiting and summing the others'); a
#: unit of a tile of one part records a fix-up span that skips it all.
FIXUP = 400


@dataclass
class Rec:
    """One recorder: its header facts and its events ``(kind, t_ns, m, n, l, k, stage)`` with
    ``t_ns`` relative to ``BASE_NS``. ``count`` None: the number of events."""

    smid: int
    cta: int
    role: Role
    warp: int
    events: list = field(default_factory=list)
    timer: Timer = Timer.GLOBALTIMER
    count: int | None = None

    def add(self, kind: Event, t: int, tile=(-1, -1, -1), k: int = -1, stage: int = -1) -> None:
        self.events.append((int(kind), int(t), *tile, k, stage))


def pack(recs: list[Rec], capacity: int | None = None, meta: dict | None = None) -> RawTrace:
    """The buffer a kernel would leave: one row per recorder, events past ``capacity`` dropped
    (their count kept), the header's anchors at the first and last event."""
    capacity = capacity or max(len(r.events) for r in recs)
    buf = np.zeros((len(recs) + 1, HEADER_WORDS + capacity * EVENT_WORDS), dtype=np.int32)
    # the last row stays empty: a recorder that never ran (count 0) is skipped
    h = {name: i for i, name in enumerate(HEADER_FIELDS)}
    for row, r in enumerate(recs):
        times = [e[1] for e in r.events]
        t0, t1 = BASE_NS + min(times), BASE_NS + max(times)
        c0, c1 = _cycles(min(times)), _cycles(max(times))
        count = r.count if r.count is not None else len(r.events)
        values = {"count": count, "smid": r.smid, "cta": r.cta, "role": int(r.role),
                  "warp": r.warp, "timer": int(r.timer)}  # fmt: skip
        for name, value in values.items():
            buf[row, h[name]] = value
        for name, value in (("t0", t0), ("t1", t1), ("c0", c0), ("c1", c1)):
            buf[row, h[f"{name}_lo"]], buf[row, h[f"{name}_hi"]] = _words(value)
        for i, (kind, t, *coords) in enumerate(r.events[:capacity]):
            at = HEADER_WORDS + i * EVENT_WORDS
            stamp = _cycles(t) if r.timer == Timer.CLOCK64 else BASE_NS + t
            buf[row, at : at + EVENT_WORDS] = [kind, *_words(stamp), *coords]
    return RawTrace(buffer=buf, meta={**(meta or pingpong_meta()), "capacity": capacity})


def _cycles(t_ns: int) -> int:
    return 5_000_000_000 + round(t_ns * CYCLES_PER_NS)


def _words(value: int) -> tuple[int, int]:
    lo = value & 0xFFFFFFFF
    return lo - (1 << 32) if lo >= 1 << 31 else lo, value >> 32


def pingpong_meta(tiles=(2, 3, 1), k_tiles: int = 4, **extra) -> dict:
    tile = (128, 128, 64)
    shape = [tiles[0] * tile[0], tiles[1] * tile[1], k_tiles * tile[2], tiles[2]]
    return {
        "backend": "sm90-pingpong",
        "config": {
            "tile_m": tile[0],
            "tile_n": tile[1],
            "tile_k": tile[2],
            "cluster_m": 1,
            "cluster_n": 1,
            "schedule": "pingpong",
        },  # fmt: skip
        "shape": shape,
        "dtype": "float16",
        "out_dtype": "float16",
        "accumulate": "float32",
        "layout": "TN",
        "tile": list(tile),
        "k_tiles": k_tiles,
        "tiles": list(tiles),
        "device": "synthetic",
        "num_sms": 132,
        "arch": "sm_90a",
        "traced_us": 10.4,
        "untraced_us": 10.0,
        **extra,
    }


@dataclass(frozen=True)
class Unit:
    """A split work unit: part ``part`` of ``tile`` (of ``parts``), over its k-tiles
    ``[k_begin, k_end)``; ``stream_k``: its fetch is followed by its ``UNIT_RANGE``."""

    tile: tuple
    part: int
    k_begin: int
    k_end: int
    parts: int
    stream_k: bool = False


def pingpong_run(tiles=(2, 3, 1), k_tiles: int = 4, stages: int = 4, ctas: int = 2,
                 smids=(3, 7), stagger: int = 1000) -> list[Rec]:  # fmt: skip
    """The recorders of a simulated persistent ping-pong call (see the module docstring):
    CTA ``c`` runs work units ``c, c + ctas, ...`` in m-major order and starts ``stagger`` ns
    after CTA ``c - 1``."""
    tm, tn, tl = tiles
    recs = []
    for cta in range(ctas):
        work = range(cta, tm * tn * tl, ctas)
        coords = [(w % tm, w // tm % tn, w // (tm * tn)) for w in work]
        recs += _cta(smids[cta], cta, coords, k_tiles, stages, 1000 + stagger * cta)
    return recs


def units_run(work: list[list[Unit]], stages: int = 4, smids=None,
              stagger: int = 1000) -> list[Rec]:  # fmt: skip
    """The recorders of a simulated ping-pong call on split units (module docstring): CTA
    ``c`` runs ``work[c]`` in order, on SM ``smids[c]`` (default ``2 c + 3``), starting
    ``stagger`` ns after CTA ``c - 1``. The part whose fix-up begins last (then the highest
    part) runs its tile's epilogue; a unit that does not keeps the epilogue's time idle, so
    the timing does not depend on which part finishes."""
    smids = smids or [2 * c + 3 for c in range(len(work))]

    def run(finishers):
        recs = []
        for cta, units in enumerate(work):
            recs += _cta(smids[cta], cta, units, 0, stages, 1000 + stagger * cta, finishers)
        return recs

    arrived: dict[tuple, tuple] = {}  # tile -> (the latest fix-up begin, its part)
    for r in run(None):
        unit = None
        for kind, t, *coords in r.events:
            if kind == Event.TILE_FETCH and r.role == Role.CONSUMER:
                unit = (tuple(coords[:3]), coords[4])
            elif kind == Event.FIXUP_BEGIN:
                arrived[unit[0]] = max(arrived.get(unit[0], (-1, -1)), (t, unit[1]))
    return run({(tile, part) for tile, (_, part) in arrived.items()})


def stream_k_run(tiles=(3, 3, 1), k_tiles: int = 8, ctas: int = 4, **options) -> list[Rec]:
    """``units_run`` on the stream-K schedule the kernel runs for ``tiles`` output tiles of
    ``k_tiles`` k-tiles with ``ctas`` resident CTAs (no cluster, raster group 1): by default 4
    tiles run whole (a wave), the other five's 40 k-tiles shared 10 a CTA, so tiles (1, 2, 0),
    (2, 0, 0) and (2, 1, 0) have two parts each. ``options``: ``units_run``'s."""
    from wsgemm.kernels.common.scheduler import unit_order

    order = unit_order(*tiles, 1, ctas, split_k=(k_tiles, 1), stream_k=True)
    work = [
        [Unit(u.coord_mnl, u.split, u.k_begin, u.k_end, u.parts, stream_k=True) for u in units]
        for units in order
    ]
    return units_run(work, **options)


def stream_k_meta(tiles=(3, 3, 1), k_tiles: int = 8, **extra) -> dict:
    return pingpong_meta(tiles=tiles, k_tiles=k_tiles, split=1, stream_k=True, **extra)


def _cta(smid: int, cta: int, work, k_tiles: int, stages: int, start: int,
         finishers=None) -> list[Rec]:  # fmt: skip
    """One CTA's recorders; ``work``: tile coordinates (whole tiles of ``k_tiles`` k-tiles) or
    ``Unit``s; ``finishers``: the (tile, part) units that run their tile's epilogue (None:
    every one)."""
    producer = Rec(smid, cta, Role.PRODUCER, 8)
    consumers = [Rec(smid, cta, Role.CONSUMER, 0), Rec(smid, cta, Role.CONSUMER, 4)]
    for r in (producer, *consumers):
        r.add(Event.RECORDER_BEGIN, start)
    p_time = start + ISSUE
    wg_free = [start + ISSUE, start + ISSUE]
    turn = start + ISSUE  # when the previous tile's mainloop let the next warpgroup go
    release: dict[int, int] = {}
    fill = 0
    for i, item in enumerate(work):
        unit = item if isinstance(item, Unit) else None
        tile = unit.tile if unit else item
        ks = range(unit.k_begin, unit.k_end) if unit else range(k_tiles)
        wg = consumers[i % 2]
        c = wg_free[i % 2]
        for r, at in ((producer, p_time), (wg, c)):
            if unit:
                r.add(Event.TILE_FETCH, at, tile, unit.k_begin, unit.part)
                if unit.stream_k:
                    r.add(Event.UNIT_RANGE, at, tile, unit.k_end, unit.parts)
            else:
                r.add(Event.TILE_FETCH, at, tile)
        p_time += ISSUE
        wg.add(Event.ORDER_WAIT_BEGIN, c + ISSUE, stage=0)
        c = max(c + 2 * ISSUE, turn)
        wg.add(Event.ORDER_WAIT_END, c, stage=0)
        for k in ks:
            stage = fill % stages
            producer.add(Event.WAIT_EMPTY_BEGIN, p_time, stage=stage)
            p_time = max(p_time, release.get(fill - stages, p_time)) + ISSUE
            producer.add(Event.WAIT_EMPTY_END, p_time, stage=stage)
            producer.add(Event.LOAD_ISSUE, p_time + ISSUE, tile, k, stage)
            ready = p_time + ISSUE + LOAD_LATENCY
            p_time += 2 * ISSUE
            wg.add(Event.WAIT_FULL_BEGIN, c, tile, k, stage)
            c = max(c + ISSUE, ready)
            wg.add(Event.WAIT_FULL_END, c, tile, k, stage)
            wg.add(Event.MMA_ISSUE, c + ISSUE, tile, k, stage)
            wg.add(Event.MMA_WAIT_BEGIN, c + 2 * ISSUE, tile, k, stage)
            c += 2 * ISSUE + MMA
            wg.add(Event.MMA_WAIT_END, c, tile, k, stage)
            c += ISSUE
            wg.add(Event.STAGE_RELEASE, c, tile, k, stage)
            release[fill] = c
            fill += 1
        turn = c + ISSUE
        epi = turn
        if unit:
            wg.add(Event.FIXUP_BEGIN, turn, tile)
            epi = turn + (FIXUP if unit.parts > 1 else ISSUE)
            wg.add(Event.FIXUP_END, epi, tile)
            epi += ISSUE
        if not unit or finishers is None or (tile, unit.part) in finishers:
            wg.add(Event.EPILOGUE_BEGIN, epi, tile)
            wg.add(Event.STORE_WAIT_BEGIN, epi + EPILOGUE - STORE_WAIT, tile, stage=i % 2)
            wg.add(Event.STORE_WAIT_END, epi + EPILOGUE, tile, stage=i % 2)
            wg.add(Event.EPILOGUE_END, epi + EPILOGUE + ISSUE, tile)
        wg_free[i % 2] = epi + EPILOGUE + 2 * ISSUE
    end = max(p_time, *wg_free) + ISSUE
    for r in (producer, *consumers):
        r.add(Event.RECORDER_END, end)
    return [producer, *consumers]


def hand_run() -> list[Rec]:
    """One SM, a producer and two consumers with round numbers (ns), for summaries checked by
    hand. Each recorder runs 0..1000.

    producer: loads tile (0, 0) k 0 at 50 into stage 0, waits on empty 100..300 (20%), loads
    k 0 of tile (1, 0) at 320 into stage 1: loading 50..320 less the wait (7%), other 73%.
    consumer w0: tile (0, 0): waits on full 0..100, MMA to 550 (its mainloop 0..550, release
    of stage 0); epilogue 600..900 with a store wait 700..800; other 550..600 and 900..1000.
    consumer w4: tile (1, 0): waits on order 0..400, on full 400..450, MMA to 850 (release of
    stage 1); other 850..1000. Its mainloop (400..850) hides 600..850 of w0's epilogue: 50 ns
    of 300 exposed.
    """
    p = Rec(0, 0, Role.PRODUCER, 8)
    w0 = Rec(0, 0, Role.CONSUMER, 0)
    w4 = Rec(0, 0, Role.CONSUMER, 4)
    for r in (p, w0, w4):
        r.add(Event.RECORDER_BEGIN, 0)
    p.add(Event.TILE_FETCH, 10, (0, 0, 0))
    p.add(Event.LOAD_ISSUE, 50, (0, 0, 0), 0, 0)
    p.add(Event.WAIT_EMPTY_BEGIN, 100, stage=1)
    p.add(Event.WAIT_EMPTY_END, 300, stage=1)
    p.add(Event.TILE_FETCH, 310, (1, 0, 0))
    p.add(Event.LOAD_ISSUE, 320, (1, 0, 0), 0, 1)
    w0.add(Event.TILE_FETCH, 0, (0, 0, 0))
    w0.add(Event.WAIT_FULL_BEGIN, 0, (0, 0, 0), 0, 0)
    w0.add(Event.WAIT_FULL_END, 100, (0, 0, 0), 0, 0)
    w0.add(Event.MMA_ISSUE, 110, (0, 0, 0), 0, 0)
    w0.add(Event.STAGE_RELEASE, 550, (0, 0, 0), 0, 0)
    w0.add(Event.EPILOGUE_BEGIN, 600, (0, 0, 0))
    w0.add(Event.STORE_WAIT_BEGIN, 700, (0, 0, 0), stage=0)
    w0.add(Event.STORE_WAIT_END, 800, (0, 0, 0), stage=0)
    w0.add(Event.EPILOGUE_END, 900, (0, 0, 0))
    w4.add(Event.TILE_FETCH, 0, (1, 0, 0))
    w4.add(Event.ORDER_WAIT_BEGIN, 0, stage=0)
    w4.add(Event.ORDER_WAIT_END, 400, stage=0)
    w4.add(Event.WAIT_FULL_BEGIN, 400, (1, 0, 0), 0, 1)
    w4.add(Event.WAIT_FULL_END, 450, (1, 0, 0), 0, 1)
    w4.add(Event.MMA_ISSUE, 460, (1, 0, 0), 0, 1)
    w4.add(Event.STAGE_RELEASE, 850, (1, 0, 0), 0, 1)
    for r in (p, w0, w4):
        r.add(Event.RECORDER_END, 1000)
    return [p, w0, w4]


def hand_meta() -> dict:
    return pingpong_meta(tiles=(2, 1, 1), k_tiles=1, traced_us=1.05, untraced_us=1.0)
