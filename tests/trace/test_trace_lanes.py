"""A CPU model of the traced sm90 kernel's ``lanes`` paths (``TraceKnobs``: producer, consumer
and epilogue ``lanes``): the staging of times in lane ``j % 32`` and the flushes that write them,
with the kernel's own index arithmetic (``trace.last_window``, ``load_offset``, ...), checked
event by event against what the per-event paths write, and as a whole recording by the one
consistency checker (``wsgemm.timeline.check``).

The model mirrors ``Sm90Gemm._load_lanes`` / ``_flush_load``, ``_mma_lanes`` / ``_flush_mma``
and ``_epilogue_lanes`` loop for loop: a change to their arithmetic belongs in both places.
Every lane writes from the count its warp's lane 0 holds (``trace.warp_hot``); the last test
shows what the checker reported on the H200 when the other lanes read a stale count instead.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest

from wsgemm import timeline
from wsgemm.kernels.common import trace
from wsgemm.trace_format import (
    EVENT_WORDS,
    HEADER_FIELDS,
    HEADER_WORDS,
    Event,
    RawTrace,
    Role,
    Timer,
)

LANES = trace.LANES
MASK = 0xFFFFFFFF
K_COUNTS = (1, 2, 31, 32, 33, 64, 65)


class Clock:
    """``%globaltimer``: every read later than the last, starting just before a 2^32 ns wrap of
    the low word (``widen`` must carry it)."""

    def __init__(self, start=(417 << 32) - 3000, step=40):
        self.t, self.step = start, step

    def now(self) -> int:
        self.t += self.step
        return self.t


def widen(lo: int, ref: int) -> int:
    """``trace.widen``: the time with low word ``lo`` at most 2^32 ns before ``ref``."""
    return ref - ((ref - lo) & MASK)


class Row:
    """One recorder's row. ``record``: ``trace._write`` (the writer lane, at ``count``);
    ``store``: an event written at index ``n`` by any lane (``trace.store_checked``)."""

    def __init__(self, cta, role, warp, capacity, strict=True):
        self.header = dict.fromkeys(HEADER_FIELDS, 0)
        self.header.update(cta=cta, role=int(role), warp=warp, timer=int(Timer.GLOBALTIMER))
        self.capacity, self.strict = capacity, strict
        self.slots: dict[int, list[int]] = {}
        self.count = 0
        self.tile = (-1, -1, -1)
        self.truth: list[tuple] = []  # (kind, t, k, stage, tile): what the per-event paths write

    def expect(self, kind, t, k=-1, stage=-1):
        self.truth.append((int(kind), t, k, stage, self.tile))

    def store(self, n, kind, t, tile, k=-1, stage=-1):
        if self.strict:
            assert n not in self.slots, f"event {n} written twice"
            assert 0 <= n < self.capacity, f"event {n} outside the row"
        if n in self.slots or not 0 <= n < self.capacity:
            return  # a lower lane of the same store won
        self.slots[n] = [int(kind), t & MASK, t >> 32, *tile, k, stage]

    def record(self, clock, kind, k=-1, stage=-1):
        t = clock.now()
        self.expect(kind, t, k, stage)
        self.store(self.count, kind, t, self.tile, k, stage)
        self.count += 1

    def fetch(self, clock, tile, k_begin=-1, split=-1):
        self.tile = tile
        self.record(clock, Event.TILE_FETCH, k_begin, split)

    def open(self, clock):
        self.header["t0_lo"], self.header["t0_hi"] = clock.t & MASK, clock.t >> 32
        self.record(clock, Event.RECORDER_BEGIN)

    def close(self, clock):
        self.tile = (-1, -1, -1)
        self.record(clock, Event.RECORDER_END)
        t1 = clock.now()
        self.header.update(count=self.count, t1_lo=t1 & MASK, t1_hi=t1 >> 32)

    def written(self) -> list[tuple]:
        """The row as the host reads it: ``count`` events (a hole reads as zeros)."""
        out = []
        for n in range(self.count):
            e = self.slots.get(n, [0] * EVENT_WORDS)
            out.append((e[0], (e[2] << 32) | e[1], e[6], e[7], tuple(e[3:6])))
        return out


class Hot:
    """``trace.warp_hot``: the count and tile every lane writes from. ``stale`` > 0 models the
    bug it fixed: lanes 1..31 read a count that many events old from the slot."""

    def __init__(self, row: Row, stale=0):
        self.row, self.count, self.tile, self.stale = row, row.count, row.tile, stale

    def count_on(self, lane):
        return self.count - (self.stale if lane else 0)

    def cool(self):
        self.row.count = self.count


# ------------------------------------------------------------------ the three paths, as the kernel


def load_lanes(row, clock, k_begin, k_end, stage0, stages, stale=0):
    """``_load_lanes``: a generator that yields after each k-tile's loads (the simulation runs
    the consumers between them)."""
    hot = Hot(row, stale)
    staged = [[0] * LANES for _ in range(3)]
    kinds = (Event.WAIT_EMPTY_BEGIN, Event.WAIT_EMPTY_END, Event.LOAD_ISSUE)

    def flush(first, end):  # _flush_load, lane by lane
        for lane in range(LANES):
            j = first + lane
            if j < end:
                ref = clock.now()
                n = hot.count_on(lane) + trace.load_offset(j)
                stage = (stage0 + j) % stages
                for i in range(3):
                    t = widen(staged[i][lane], ref)
                    row.store(n + i, kinds[i], t, hot.tile, k_begin + j, stage)

    for k in range(k_begin, k_end):
        j = k - k_begin
        times = (clock.now(), clock.now(), clock.now())  # around the acquire and the loads
        for kind, t in zip(kinds, times, strict=True):
            row.expect(kind, t, k, (stage0 + j) % stages)
        slot = j % LANES
        if slot == 0 and j > 0:
            flush(j - LANES, j)
        for i in range(3):
            staged[i][slot] = times[i] & MASK
        yield
    count = k_end - k_begin
    flush(trace.last_window(count), count)
    hot.count += trace.load_offset(count)
    hot.cool()


def mma_lanes(row, clock, k_begin, k_count, stage0, stages, stale=0):
    """``_mma_lanes``: a generator that yields after each k-tile's wait on full (the producer
    must have loaded it), then runs the iteration's issue and release."""
    hot = Hot(row, stale)
    staged = [[0] * LANES for _ in range(6)]
    issued = (Event.WAIT_FULL_BEGIN, Event.WAIT_FULL_END, Event.MMA_ISSUE)
    released = (Event.MMA_WAIT_BEGIN, Event.MMA_WAIT_END, Event.STAGE_RELEASE)

    def flush(first, end):  # _flush_mma, lane by lane
        for lane in range(LANES):
            j = first + lane
            if j < end:
                ref = clock.now()
                stage = (stage0 + j) % stages
                n = hot.count_on(lane) + trace.mma_issued_offset(j)
                for i in range(3):
                    t = widen(staged[i][lane], ref)
                    row.store(n + i, issued[i], t, hot.tile, k_begin + j, stage)
                if j > 0:
                    prev = (stage0 + j + stages - 1) % stages
                    m = hot.count_on(lane) + trace.mma_released_offset(j)
                    for i in range(3):
                        t = widen(staged[3 + i][lane], ref)
                        row.store(m + i, released[i], t, hot.tile, k_begin + j - 1, prev)

    for j in range(k_count):
        yield  # k-tile j is loaded: its wait on full may end
        stage = (stage0 + j) % stages
        times = [clock.now(), clock.now(), clock.now()]  # wait full begin, end, MMA issue
        for kind, t in zip(issued, times, strict=True):
            row.expect(kind, t, k_begin + j, stage)
        slot = j % LANES
        if j > 0:
            if slot == 0:
                flush(j - LANES, j)
            times += [clock.now(), clock.now(), clock.now()]  # k-tile j - 1's wait, release
            prev = (stage0 + j - 1) % stages
            for kind, t in zip(released, times[3:], strict=True):
                row.expect(kind, t, k_begin + j - 1, prev)
        for i, t in enumerate(times):
            staged[i][slot] = t & MASK
    last = (stage0 + k_count - 1) % stages
    w = (clock.now(), clock.now(), clock.now())  # the last k-tile's wait and release
    flush(trace.last_window(k_count), k_count)
    hot.count += trace.mma_staged_events(k_count)
    for kind, t in zip(released, w, strict=True):  # hot.emit_released: the writer lane
        row.expect(kind, t, k_begin + k_count - 1, last)
        row.store(hot.count, kind, t, hot.tile, k_begin + k_count - 1, last)
        hot.count += 1
    hot.cool()


def epilogue_lanes(row, clock, subtiles, subtiles_done, epi_stages, stale=0):
    """``_epilogue_lanes``: subtile e's store wait in lane e, written after the last."""
    hot = Hot(row, stale)
    b0, b1 = [0] * LANES, [0] * LANES
    for e in range(subtiles):
        buf = (subtiles_done + e) % epi_stages
        t0, t1 = clock.now(), clock.now()
        row.expect(Event.STORE_WAIT_BEGIN, t0, -1, buf)
        row.expect(Event.STORE_WAIT_END, t1, -1, buf)
        b0[e], b1[e] = t0 & MASK, t1 & MASK
    for lane in range(subtiles):
        ref = clock.now()
        n = hot.count_on(lane) + trace.store_wait_offset(lane)
        buf = (subtiles_done + lane) % epi_stages
        row.store(n, Event.STORE_WAIT_BEGIN, widen(b0[lane], ref), hot.tile, -1, buf)
        row.store(n + 1, Event.STORE_WAIT_END, widen(b1[lane], ref), hot.tile, -1, buf)
    hot.count += trace.store_wait_offset(subtiles)
    hot.cool()


# ------------------------------------------------------------------------ one CTA of the kernel


def simulate_cta(units, *, pingpong, stages=4, subtiles=8, epi_stages=4, stale=0, strict=True):
    """One CTA running ``units`` ((tile, k_begin, k_end, split) each) in order: the producer
    loads every unit's k-tiles into the ring; the consumer recorder(s) (one on cooperative, the
    two warpgroups in turn on ping-pong) take the units, each k-tile after its load. Returns the
    rows (producer first)."""
    clock = Clock()
    capacity = 16 + sum(6 * (ke - kb) + 40 for _, kb, ke, _ in units)
    producer = Row(0, Role.PRODUCER, 8, capacity, strict)
    groups = 2 if pingpong else 1
    consumers = [Row(0, Role.CONSUMER, 4 * g, capacity, strict) for g in range(groups)]
    for r in (producer, *consumers):
        r.open(clock)
    ring = 0  # the ring stage of the next k-tile: both sides walk every unit's k-tiles
    subtiles_done = 0
    for u, (tile, k_begin, k_end, split) in enumerate(units):
        rec = consumers[u % groups]
        producer.fetch(clock, tile, k_begin, split)
        rec.fetch(clock, tile, k_begin, split)
        if pingpong:
            rec.record(clock, Event.ORDER_WAIT_BEGIN, stage=0)
            rec.record(clock, Event.ORDER_WAIT_END, stage=0)
        load = load_lanes(producer, clock, k_begin, k_end, ring, stages, stale)
        mma = mma_lanes(rec, clock, k_begin, k_end - k_begin, ring, stages, stale)
        next(mma)
        for _ in range(k_begin, k_end):
            next(load)  # k-tile j loaded ...
            next(mma, None)  # ... then waited on, issued, the one before released
        next(load, None)
        ring = (ring + k_end - k_begin) % stages
        if pingpong:
            rec.record(clock, Event.ORDER_WAIT_BEGIN, stage=1)
            rec.record(clock, Event.ORDER_WAIT_END, stage=1)
        rec.record(clock, Event.EPILOGUE_BEGIN)
        epilogue_lanes(rec, clock, subtiles, 0 if pingpong else subtiles_done, epi_stages, stale)
        rec.record(clock, Event.EPILOGUE_END)
        subtiles_done += subtiles
        if pingpong:
            rec.record(clock, Event.STORE_WAIT_BEGIN)
            rec.record(clock, Event.STORE_WAIT_END)
    producer.record(clock, Event.WAIT_EMPTY_BEGIN)
    producer.record(clock, Event.WAIT_EMPTY_END)
    if not pingpong:
        consumers[0].record(clock, Event.STORE_WAIT_BEGIN)
        consumers[0].record(clock, Event.STORE_WAIT_END)
    for r in (producer, *consumers):
        r.close(clock)
    return [producer, *consumers]


def buffer_of(rows):
    capacity = max(r.capacity for r in rows)
    buf = np.zeros((len(rows), HEADER_WORDS + capacity * EVENT_WORDS), dtype=np.int64)
    for i, r in enumerate(rows):
        buf[i, :HEADER_WORDS] = [r.header[f] for f in HEADER_FIELDS]
        for n, words in r.slots.items():
            at = HEADER_WORDS + n * EVENT_WORDS
            buf[i, at : at + EVENT_WORDS] = words
    return buf.astype(np.uint32).view(np.int32)


def check(rows, *, pingpong, tiles, split=1):
    capacity = (buffer_of(rows).shape[1] - HEADER_WORDS) // EVENT_WORDS
    meta = dict(
        capacity=capacity, tiles=[tiles, 1, 1], split=split, ctas_traced=1, ctas_launched=1,
        backend="sm90-pingpong" if pingpong else "sm90", consumers_per_tile=1,
        config=dict(cluster_m=1, cluster_n=1, schedule="pingpong" if pingpong else "cooperative"),
    )  # fmt: skip
    return timeline.check(RawTrace(buffer_of(rows), meta))


def units_for(k_counts, split=1):
    """One unit per k-count, tile (i, 0, 0); with ``split`` > 1 each k-count is a tile cut in
    ``split`` units (k_begin != 0 for all but the first)."""
    out = []
    for i, k in enumerate(k_counts):
        bounds = [k * s // split for s in range(split + 1)]
        for s in range(split):
            if bounds[s + 1] > bounds[s]:
                out.append(((i, 0, 0), bounds[s], bounds[s + 1], s if split > 1 else -1))
    return out


# ----------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
@pytest.mark.parametrize("k_count", K_COUNTS)
def test_every_event_is_written_once_in_order_with_its_own_time(k_count, pingpong):
    rows = simulate_cta(units_for([k_count] * 3), pingpong=pingpong)
    for r in rows:
        assert r.written() == r.truth  # each index once (Row.store), each event its own
        times = [e[1] for e in r.written()]
        assert times == sorted(times) and len(set(times)) == len(times)
    assert check(rows, pingpong=pingpong, tiles=3) == []


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
def test_mixed_units_and_split_k(pingpong):
    rows = simulate_cta(units_for(K_COUNTS), pingpong=pingpong, stages=5)
    for r in rows:
        assert r.written() == r.truth
    assert check(rows, pingpong=pingpong, tiles=len(K_COUNTS)) == []
    # split-K units: k_begin != 0, several units per tile
    rows = simulate_cta(units_for([65, 64, 33, 7], split=3), pingpong=pingpong, stages=7)
    for r in rows:
        assert r.written() == r.truth
    assert check(rows, pingpong=pingpong, tiles=4, split=3) == []


def test_the_offsets_match_the_per_event_order():
    """Iteration j's events follow iteration j - 1's: the consumer's 3 + 6 (k - 1) staged
    events, the producer's 3 per k-tile, the epilogue's 2 per subtile, without gaps."""
    for k in K_COUNTS:
        issued = [trace.mma_issued_offset(j) for j in range(k)]
        released = [trace.mma_released_offset(j) for j in range(1, k)]
        slots = sorted(o + i for o in issued + released for i in range(3))
        assert slots == list(range(trace.mma_staged_events(k)))
        assert trace.last_window(k) % LANES == 0 and 0 < k - trace.last_window(k) <= LANES
        assert trace.load_offset(k) == 3 * k
    assert [trace.store_wait_offset(e) for e in range(4)] == [0, 2, 4, 6]


def test_widen_carries_the_low_word_wrap():
    for t in ((5 << 32) - 1, 5 << 32, (5 << 32) + 7):
        ref = t + 1000
        assert widen(t & MASK, ref) == t


@pytest.mark.parametrize("method", ["_load_lanes", "_mma_lanes", "_epilogue_lanes"])
def test_lanes_paths_write_from_the_writer_lanes_state(method):
    """Each lanes path takes its recorder state through ``trace.warp_hot`` (the writer lane's
    registers), never ``trace.hot`` (each lane's own read of the shared slot)."""
    from wsgemm.kernels.sm90.kernel import Sm90Gemm

    source = textwrap.dedent(inspect.getsource(getattr(Sm90Gemm, method)))
    calls = {
        n.func.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    assert "warp_hot" in calls and "hot" not in calls


@pytest.mark.parametrize("stale", [1, 2])
def test_a_stale_count_on_the_other_lanes_breaks_the_recording(stale):
    """What the H200 showed before ``warp_hot``: lanes 1..31 writing from a count one or two
    events old put their events over the writer lane's and left holes (zeros: time 0)."""
    for pingpong in (False, True):
        rows = simulate_cta(units_for([33, 65]), pingpong=pingpong, stale=stale, strict=False)
        problems = check(rows, pingpong=pingpong, tiles=2)
        assert any("time goes back" in p for p in problems)  # the holes
        if stale == 1:  # a begin overwritten by the event before it
            assert any("has no WAIT_FULL_BEGIN before it" in p for p in problems)
