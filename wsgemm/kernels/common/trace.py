"""The device side of a traced kernel (issue #13): one lane per role writes its row of the raw
trace buffer, in the layout of ``trace_format``.

A kernel built with ``trace=True`` takes the buffer as a trailing launch argument of its
``traced`` entry; built without, every hook here is handed ``None`` and emits nothing (each one
checks at trace time, ``const_expr``), so the untraced kernel's code is the same as with the
hooks deleted (``tests/trace/test_trace_kernels.py`` compiles both and compares).

Hooks, one statement each at an event point of a role:

* ``rec = trace.open_recorder(buffer, slots, role, gpu_arch, group_threads)``: the recorder of
  the calling thread's group (None when ``buffer`` is None); writes the header's start fields and
  ``RECORDER_BEGIN``. ``slots`` is a little shared memory (``SLOT_WORDS`` words per recorder of
  the CTA, ``trace.smem_slots``): the recorder's event count and its current tile live there,
  not in registers, so the hooks carry no state through the kernel's loops.
* ``trace.fetch(rec, tile)``: ``TILE_FETCH``; later events carry this tile.
* ``trace.record(rec, Event.X, k_tile, stage)``: one event.
* ``trace.close(rec)``: ``RECORDER_END`` and the header's end fields (count, end anchors).

Cost per event on the recording lane: a timer read, a 16-byte shared load and a 4-byte shared
store, two 16-byte global stores. Other lanes skip it; nothing waits on the stores.

Hot loops (the sm90 roles' k-loops and subtile loops, ``kernels/sm90/traced.py``) stage their
times in lanes instead: the loop only reads the timer and keeps the low 32 bits of each time in
a register of lane ``i % 32`` (``now_lo``, ``stage_lane``: a select per time, no store); every
``LANES`` items, and at the end, the writer's warp writes the staged events, one lane per item,
in parallel (``widen``, ``store_checked``), every lane from the writer lane's count and tile
(``warp_hot``). The offsets below (``load_offset``, ...) put each staged event at its place in
the row's event order.

Timer (``timer_for``): ``%globaltimer`` on sm_90 and later, where it steps every 32 ns and is
one clock for every SM; ``clock64`` (SM cycles, well under 1 ns) on sm_80/86/89, where
``%globaltimer`` steps every microsecond, longer than a k-tile. Every header holds both
timers at the recorder's start and end, so clock64 times map to ns through the line between
the two anchors: exact at the anchors, off by the SM clock's drift in between (its frequency
moves under load), and the anchors themselves carry ``%globaltimer``'s 1 us steps there.

Why not the DSL's own in-kernel tracer (``cute.experimental.iket``, DSL 4.8.1): its markers
are rewritten into the cubin by NVIDIA's tools and read back by an injection library that the
``iket`` command line loads into the process (``CUDA_INJECTION64_PATH``), so it cannot trace
one call inside a user's program or re-render a saved buffer without that tooling. It allows
31 event names per kernel and one payload value per event, where our events carry a tile, a
k-tile and a stage, and it is experimental in this release. A plain buffer that the kernel
writes and torch reads keeps the format ours (``trace_format``) and the cost visible here.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

from wsgemm.support import WARP_SIZE, arch_major
from wsgemm.trace_format import (
    EVENT_WORDS,
    HEADER_FIELDS,
    HEADER_WORDS,
    Event,
    Timer,
)

__all__ = [
    "LANES",
    "SLOT_WORDS",
    "HotRecorder",
    "Recorder",
    "close",
    "fetch",
    "hot",
    "open_recorder",
    "record",
    "smem_slots",
    "timer_for",
    "warp_hot",
]

#: A recorder's shared-memory slot: the events it tried to write, the current tile, its row's
#: capacity (0 outside the traced sample) and address.
SLOT_FIELDS = ("count", "tile_m", "tile_n", "tile_l", "capacity", "row_lo", "row_hi", "unused")
SLOT_WORDS = len(SLOT_FIELDS)
_S = {name: i for i, name in enumerate(SLOT_FIELDS)}
_H = {name: i for i, name in enumerate(HEADER_FIELDS)}


#: k-tiles (subtiles) a writer warp stages before it writes them: one per lane. Staged, not
#: written where they happen, so the hot loops stay cheap (docs/perf.md entry 24).
LANES = WARP_SIZE


def timer_for(gpu_arch: str) -> Timer:
    """What the events' times count on ``gpu_arch`` (see the module docstring)."""
    return Timer.GLOBALTIMER if arch_major(gpu_arch) >= 9 else Timer.CLOCK64


def slot_words(recorders: int) -> int:
    """Shared-memory words for the slots of ``recorders`` recorders (a CTA's)."""
    return recorders * SLOT_WORDS


def smem_slots(buffer, smem, recorders: int):
    """The CTA's recorder slots ``(SLOT_WORDS, recorders)``, allocated from ``smem`` (a
    ``SmemAllocator``); None, and no allocation, when untraced (``buffer`` None)."""
    if const_expr(buffer is None):
        return None
    ptr = smem.allocate_array(Int32, slot_words(recorders), byte_alignment=16)
    return cute.make_tensor(ptr, cute.make_layout((SLOT_WORDS, recorders)))


def struct_slots(buffer, storage, recorders: int):
    """The same from a shared-storage struct's ``trace_slots`` field (``slot_words`` Int32,
    present in traced kernels only); None when untraced."""
    if const_expr(buffer is None):
        return None
    return storage.trace_slots.get_tensor(cute.make_layout((SLOT_WORDS, recorders)))


class Recorder:
    """The recorder of a group of threads: the CTA's shared slots, and which lane of the group
    writes. Everything else (count, tile, capacity, row address) lives in the group's slot, so
    a recorder keeps no register of its role live and no loop-carried state."""

    def __init__(self, slots: Any, group_threads: int, timer: Timer):
        self.slots = slots  # (SLOT_WORDS, groups) Int32 in shared memory; SLOT_FIELDS
        self.group_threads = group_threads
        self.timer = timer

    @property
    def slot(self):
        """This thread's group's slot, found from the thread index at each use: a role at its
        register limit (the multistage worker) keeps no address live for tracing."""
        tidx, _, _ = cute.arch.thread_idx()
        return self.slots[None, tidx // self.group_threads]

    # Let a recorder be used inside dynamic (scf) control flow in the DSL.
    def __extract_mlir_values__(self) -> list:
        return extract_mlir_values(self.slots)

    def __new_from_mlir_values__(self, values: list) -> Recorder:
        return Recorder(new_from_mlir_values(self.slots, values), self.group_threads, self.timer)


class HotRecorder:
    """A recorder's state in registers for one hot loop (``hot(rec)``, then ``emit`` with times
    taken by ``now``, then ``cool``): its count, capacity, row and tile are read from the slot
    once, so an event costs two 16-byte stores and no shared-memory round trip, and the loop
    can take its time stamps on the critical path and write them where the warp has slack.
    The lanes loops use it (``warp_hot``); the count goes back to the slot in ``cool``."""

    def __init__(self, rec: Recorder, writer, count, capacity, row_lo, row_hi, tile):
        self.rec = rec
        self.writer = writer  # Int32: 1 on the lane that writes
        self.count, self.capacity = count, capacity
        self.row_lo, self.row_hi = row_lo, row_hi
        self.tile = tile  # (m, n, l) Int32

    def _values(self) -> list:
        return [self.writer, self.count, self.capacity, self.row_lo, self.row_hi, *self.tile]

    def __extract_mlir_values__(self) -> list:
        return extract_mlir_values(self.rec) + [Int32(v).ir_value() for v in self._values()]

    def __new_from_mlir_values__(self, values: list) -> HotRecorder:
        n = len(extract_mlir_values(self.rec))
        rec = new_from_mlir_values(self.rec, values[:n])
        w, c, cap, lo, hi, m, nn, l = (Int32(v) for v in values[n:])  # noqa: E741
        return HotRecorder(rec, w, c, cap, lo, hi, (m, nn, l))

    def now(self):
        return _now(self.rec.timer)

    @cute.jit
    def emit(self, kind: cutlass.Constexpr, t, k_tile, stage):
        """Event ``kind`` at time ``t`` (from ``now``); counted always, written while the row
        has room."""
        if self.writer == 1:
            if self.count < self.capacity:
                row = _row_at(self.row_lo, self.row_hi)
                _store_event(row, self.count, kind, t, self.tile, k_tile, stage)
        self.count = self.count + 1

    @cute.jit
    def emit_released(self, times, k_tile, stage):
        """A consumer k-tile's wait for its MMAs (begin, end) and its stage release."""
        self.emit(Event.MMA_WAIT_BEGIN, times[0], k_tile, stage)
        self.emit(Event.MMA_WAIT_END, times[1], k_tile, stage)
        self.emit(Event.STAGE_RELEASE, times[2], k_tile, stage)

    @cute.jit
    def cool(self):
        """Hand the count back to the slot (the recorder's later events continue from it)."""
        if self.writer == 1:
            self.rec.slot[_S["count"]] = self.count


@cute.jit
def hot(rec: Recorder) -> HotRecorder:
    """``rec``'s state in registers for a hot loop (``HotRecorder``), as the writer lane reads
    it (``warp_hot`` hands it to the warp); ``rec`` must not record until
    ``HotRecorder.cool``."""
    slot = rec.slot
    writer = cutlass.select_(_writes(rec), Int32(1), Int32(0))
    tile = (slot[_S["tile_m"]], slot[_S["tile_n"]], slot[_S["tile_l"]])
    return HotRecorder(
        rec, writer, slot[_S["count"]], slot[_S["capacity"]], slot[_S["row_lo"]],
        slot[_S["row_hi"]], tile,
    )  # fmt: skip


@cute.jit
def warp_hot(rec: Recorder) -> HotRecorder:
    """``hot(rec)`` for a lanes loop, where every lane of the writer's warp writes events:
    the count, capacity, row and tile as the writing lane (lane 0) holds them, handed to the
    warp's other lanes by shuffles (each warp of the group takes its own lane 0's; only the
    writer's warp writes). Called by every lane of the warp.

    The other lanes must not take them from the slot: the writing lane updates it inside
    branches only it takes (``_write``), and nothing orders those stores before another lane's
    later loads. Lanes that skipped the branches can run ahead of the writer to their loads and
    read a count one or two events old (seen on the H200: each flush wrote its events one or two
    places early, over the writer's, leaving holes), or the previous tile. A shuffle reads the
    writer's registers and meets the whole warp first."""
    h = hot(rec)
    tile = (_lane0(h.tile[0]), _lane0(h.tile[1]), _lane0(h.tile[2]))
    return HotRecorder(
        rec, h.writer, _lane0(h.count), _lane0(h.capacity), _lane0(h.row_lo), _lane0(h.row_hi),
        tile,
    )  # fmt: skip


def _lane0(v) -> Int32:
    """Lane 0's ``v``, on every lane of the warp (all 32 take part)."""
    return cute.arch.shuffle_sync(Int32(v), 0)


# Where each lanes path writes its staged events: offsets from the recorder's count when the
# path began.


def last_window(count):
    """The first index of the last window of ``LANES`` of ``count`` (>= 1) staged items: the
    one the final flush writes (the loop flushed the full windows before it)."""
    return (count - 1) // LANES * LANES


def load_offset(j):
    """Producer: k-tile j's wait-empty begin, end and load issue at ``3 j .. 3 j + 2``."""
    return 3 * j


def mma_issued_offset(j):
    """Consumer iteration j: its k-tile's wait-full begin, end and MMA issue, after iteration
    j - 1's events (``_mma_lanes``' order): 0 for j = 0, else ``6 j - 3``."""
    return cutlass.max(6 * j - 3, 0)


def mma_released_offset(j):
    """Consumer iteration j >= 1: k-tile j - 1's MMA wait begin, end and release at ``6 j``
    (right after iteration j's issue: they are timed after it)."""
    return 6 * j


def mma_staged_events(k_count):
    """Events of a unit's ``k_count`` iterations (all but the last k-tile's wait and release,
    which the writer lane records itself)."""
    return 6 * k_count - 3


def store_wait_offset(e):
    """Epilogue subtile e's store wait begin and end at ``2 e``, ``2 e + 1``."""
    return 2 * e


def writer_warp(rec: Recorder):
    """True on every lane of the warp that holds the recorder's writing lane (warp-uniform)."""
    tidx, _, _ = cute.arch.thread_idx()
    return tidx % rec.group_threads < WARP_SIZE


def now_lo(rec: Recorder) -> Int32:
    """The low 32 bits of the timer (``lanes`` staging; ``widen`` restores the rest)."""
    return _lo(_now(rec.timer))


def stage_lane(lane, slot, t, staged):
    """``t`` where ``lane == slot``, else ``staged``: lane ``slot`` keeps the stamp."""
    return cutlass.select_(lane == slot, t, staged)


def widen(lo, ref):
    """The 64-bit time whose low word is ``lo``, taken at most 2^32 ticks before ``ref`` (a
    64-bit time read after it)."""
    back = Int64(Int32(_lo(ref) - lo)) & Int64(0xFFFFFFFF)
    return ref - back


@cute.jit
def store_checked(hot: HotRecorder, n, kind: cutlass.Constexpr, t, k_tile, stage):
    """Event ``n`` of ``hot``'s row (from any lane), written while the row has room."""
    if n < hot.capacity:
        _store_event(_row_at(hot.row_lo, hot.row_hi), n, kind, t, hot.tile, k_tile, stage)


def _now(timer: Timer):
    if const_expr(timer == Timer.GLOBALTIMER):
        return cute.arch.globaltimer()
    return cute.arch.clock64()


def _lo(t) -> Int32:
    return Int32(t & Int64(0xFFFFFFFF))


def _hi(t) -> Int32:
    return Int32(t >> Int64(32))


def _writes(rec: Recorder):
    """True on the one lane of the recorder's group that writes."""
    tidx, _, _ = cute.arch.thread_idx()
    return tidx % rec.group_threads == 0


def _row(slot):
    """The recorder's row in global memory (its address is in the slot)."""
    return _row_at(slot[_S["row_lo"]], slot[_S["row_hi"]])


def _row_at(lo, hi):
    """The row at the address of words ``lo`` and ``hi``."""
    address = (Int64(hi) << Int64(32)) | (Int64(lo) & Int64(0xFFFFFFFF))
    # HEADER_WORDS and EVENT_WORDS are multiples of 4 words and the host's row stride a
    # multiple of 8: the row and every event in it start on 16 bytes.
    return cute.make_ptr(Int32, address, cute.AddressSpace.gmem, assumed_align=16)


@cute.jit
def _store_event(row, n, kind: cutlass.Constexpr, t, tile, k_tile, stage):
    """Event ``n`` of ``row``: ``kind`` at time ``t`` for ``tile`` (m, n, l), ``k_tile`` and
    ``stage``. Indexed through a layout, which keeps every event on 16 bytes, so the copy is two
    16-byte stores (a pointer offset by n * EVENT_WORDS would lose the alignment: eight
    4-byte stores)."""
    event = cute.make_rmem_tensor((EVENT_WORDS,), Int32)
    event[0] = Int32(int(kind))
    event[1] = _lo(t)
    event[2] = _hi(t)
    event[3], event[4], event[5] = tile
    event[6] = Int32(k_tile)
    event[7] = Int32(stage)
    events = cute.make_tensor(
        row + HEADER_WORDS, cute.make_layout((EVENT_WORDS, n + 1), stride=(1, EVENT_WORDS))
    )
    cute.autovec_copy(event, events[None, n])


def check_entry(traced: bool, trace_buffer) -> None:
    """A kernel built with ``trace=True`` launches through ``traced(..., trace_buffer)``, an
    untraced one through ``__call__`` (checked while tracing the host entry)."""
    if traced != (trace_buffer is not None):
        raise ValueError(
            "a kernel built with trace=True launches through traced(..., trace_buffer), "
            "an untraced one through __call__"
        )


@cute.jit
def open_recorder(
    buffer,
    slots,
    role: cutlass.Constexpr,
    gpu_arch: cutlass.Constexpr,
    group_threads: cutlass.Constexpr,
):
    """The calling thread's recorder for ``role``, or None when ``buffer`` is None.

    The CTA's threads form recorder groups of ``group_threads`` consecutive threads (a warp, or
    a warpgroup); group ``g`` owns slot ``g`` and row ``cta * recorders + g`` of ``buffer``
    (``cta``: the CTA's linear index in the grid, x fastest), and its first lane writes. A row
    past the buffer (a CTA outside the traced sample) records nothing (capacity 0).
    ``gpu_arch`` picks the timer (``timer_for``)."""
    rec = None
    if const_expr(buffer is not None):
        timer = timer_for(gpu_arch)
        tidx, _, _ = cute.arch.thread_idx()
        group = tidx // group_threads
        rec = Recorder(slots, group_threads, timer)
        if _writes(rec):
            t0 = cute.arch.globaltimer()
            c0 = cute.arch.clock64()
            bx, by, bz = cute.arch.block_idx()
            gx, gy, _ = cute.arch.grid_dim()
            cta = Int32(bx + by * gx + bz * gx * gy)
            row_index = cta * cute.size(slots, mode=[1]) + Int32(group)
            rows = Int32(cute.size(buffer, mode=[0]))
            sampled = row_index < rows
            row = buffer[cutlass.min(row_index, rows - 1), None]  # in the buffer either way
            address = row.iterator.toint()
            slot = rec.slot
            slot[_S["count"]] = Int32(0)
            for i in cutlass.range_constexpr(_S["tile_m"], _S["tile_l"] + 1):
                slot[i] = Int32(-1)
            capacity = Int32((cute.size(buffer, mode=[1]) - HEADER_WORDS) // EVENT_WORDS)
            slot[_S["capacity"]] = cutlass.select_(sampled, capacity, Int32(0))
            slot[_S["row_lo"]] = _lo(address)
            slot[_S["row_hi"]] = _hi(address)
            if sampled:
                row[_H["smid"]] = cute.arch.smid()
                row[_H["cta"]] = cta
                row[_H["role"]] = Int32(int(role))
                row[_H["warp"]] = Int32(group * (group_threads // WARP_SIZE))
                row[_H["timer"]] = Int32(int(timer))
                row[_H["t0_lo"]], row[_H["t0_hi"]] = _lo(t0), _hi(t0)
                row[_H["c0_lo"]], row[_H["c0_hi"]] = _lo(c0), _hi(c0)
        _write(rec, Event.RECORDER_BEGIN, Int32(-1), Int32(-1))
    return rec


@cute.jit
def _write(rec: Recorder, kind: cutlass.Constexpr, k_tile, stage):
    """Event ``kind`` at the current time with the recorder's tile; counted always, written
    only while the row has room."""
    if _writes(rec):
        t = _now(rec.timer)
        slot = rec.slot
        n = slot[_S["count"]]
        slot[_S["count"]] = n + 1
        if n < slot[_S["capacity"]]:
            tile = (slot[_S["tile_m"]], slot[_S["tile_n"]], slot[_S["tile_l"]])
            _store_event(_row(slot), n, kind, t, tile, k_tile, stage)


@cute.jit
def record(rec, kind: cutlass.Constexpr, k_tile=-1, stage=-1):
    """Event ``kind`` (a ``trace_format.Event``) with ``k_tile`` and ``stage``; nothing when
    ``rec`` is None (an untraced kernel)."""
    if const_expr(rec is not None):
        _write(rec, kind, Int32(k_tile), Int32(stage))


@cute.jit
def fetch(rec, tile):
    """``TILE_FETCH`` of ``tile`` (a ``WorkTile`` or an (m, n, l) tuple); later events carry
    it. A split-K unit's fetch carries its first k-tile and its split index (in the event's
    k-tile and stage fields); a stream-K unit's its first k-tile and its part, then a
    ``UNIT_RANGE`` its k-range's end and its tile's part count (neither follows from a launch
    constant, as a split's range does). Nothing when ``rec`` is None."""
    if const_expr(rec is not None):
        m, n, l = tile if const_expr(isinstance(tile, tuple)) else tile.coord_mnl  # noqa: E741
        if _writes(rec):
            rec.slot[_S["tile_m"]] = Int32(m)
            rec.slot[_S["tile_n"]] = Int32(n)
            rec.slot[_S["tile_l"]] = Int32(l)
        if const_expr(not isinstance(tile, tuple) and tile.is_split):
            _write(rec, Event.TILE_FETCH, Int32(tile.k_begin), Int32(tile.split))
            if const_expr(tile.is_stream_k):
                _write(rec, Event.UNIT_RANGE, Int32(tile.k_end), Int32(tile.parts))
        else:
            _write(rec, Event.TILE_FETCH, Int32(-1), Int32(-1))


@cute.jit
def close(rec):
    """``RECORDER_END``, then the header's count and end anchors. Nothing when ``rec`` is
    None."""
    if const_expr(rec is not None):
        if _writes(rec):
            for i in cutlass.range_constexpr(_S["tile_m"], _S["tile_l"] + 1):
                rec.slot[i] = Int32(-1)  # the end is no tile's
        _write(rec, Event.RECORDER_END, Int32(-1), Int32(-1))
        if _writes(rec):
            slot = rec.slot
            if slot[_S["capacity"]] > 0:
                t1 = cute.arch.globaltimer()
                c1 = cute.arch.clock64()
                row = cute.make_tensor(_row(slot), cute.make_layout(HEADER_WORDS))
                row[_H["count"]] = slot[_S["count"]]
                row[_H["t1_lo"]], row[_H["t1_hi"]] = _lo(t1), _hi(t1)
                row[_H["c1_lo"]], row[_H["c1_hi"]] = _lo(c1), _hi(c1)
