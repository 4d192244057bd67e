"""Traced kernels on the host side (issue #13): how big the trace buffer is, and compiling a
kernel's traced variant. The call that records (validation, launch, timing) is
``wsgemm.api.tracing.record``; the buffer's layout is ``wsgemm.kernels.common.trace_format``.

Which CTAs record, and how many events each row holds (``plan_trace``):

* every recorder row belongs to one group of threads of one CTA (``recorders_per_cta``: 3 for
  the sm90 kernels, one per warp for the sm80 ones); rows are ``cta * recorders_per_cta +
  group`` in launch order, so a buffer of the first ``ctas * recorders_per_cta`` rows traces the
  first ``ctas`` CTAs and the others write nothing;
* the persistent sm90 grid is traced whole by default (one CTA per SM); the sm80 grid (one CTA
  per tile) by its first ``DEFAULT_SM80_WAVES`` waves of one CTA per SM;
* a row's capacity counts the events its busiest role can write: per k-tile, per tile and per
  recorder (``EVENTS_PER_K_TILE`` etc.), times the tiles the CTA runs, capped so the whole
  buffer stays under ``MAX_BUFFER_BYTES``. A recorder past its capacity keeps counting, and the
  host reports the overflow.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ..kernels.common.trace_format import EVENT_WORDS, HEADER_WORDS
from ..support import WARP_SIZE, cutlass_dtype
from .registry import BACKENDS, Variant

__all__ = [
    "DEFAULT_SM80_WAVES",
    "MAX_BUFFER_BYTES",
    "TracePlan",
    "check_events",
    "compile_entry",
    "compile_traced",
    "recorder_rows",
    "fake_trace_buffer",
    "plan_trace",
    "recorders_per_cta",
    "traced_kernel",
]

#: The largest buffer ``plan_trace`` sizes by default (the capacity shrinks to fit it).
MAX_BUFFER_BYTES = 256 << 20
#: Waves of one CTA per SM that the sm80 sample covers by default.
DEFAULT_SM80_WAVES = 2
#: Events a recorder writes per k-tile, at most: a consumer's wait-full begin/end, MMA issue,
#: MMA wait begin/end and release (6); the producer's wait-empty begin/end and load issue (3);
#: a multistage worker's compute, load and wait begin/end (6).
EVENTS_PER_K_TILE = 6
#: Per tile: the fetch, two ping-pong order waits (4), epilogue begin/end, the last drain (2),
#: and a store wait (2) per epilogue subtile of at most 16.
EVENTS_PER_TILE = 1 + 4 + 2 + 2 + 2 * 16
#: Per recorder: begin, end, and the producer's final wait (2), with room to spare.
EVENTS_PER_RECORDER = 8


@dataclass(frozen=True)
class TracePlan:
    """The buffer of one traced launch: ``recorders`` rows of ``words`` int32 each."""

    recorders_per_cta: int
    ctas_launched: int  # CTAs in the grid
    ctas_traced: int  # the first this many record
    tiles_per_cta: int  # the most output tiles one CTA runs
    k_tiles: int
    capacity: int  # events per row

    @property
    def recorders(self) -> int:
        return self.ctas_traced * self.recorders_per_cta

    @property
    def words(self) -> int:
        """int32 words per row (a multiple of 8: every event stays 16-byte aligned)."""
        return HEADER_WORDS + self.capacity * EVENT_WORDS

    @property
    def nbytes(self) -> int:
        return self.recorders * self.words * 4


def recorders_per_cta(backend: str, config: Any) -> int:
    """Rows per CTA: one per warpgroup for sm90, one per warp for sm80 (``trace.open_recorder``
    groups); built from the kernel class, so no compile is needed."""
    cls = BACKENDS[backend].kernel_class()
    if BACKENDS[backend].family == "sm90":
        from ..kernels.sm90.kernel import RECORDERS_PER_CTA

        return RECORDERS_PER_CTA
    # The sm80 kernels' thread count depends only on the config.
    kernel = cls(config, *(cutlass_dtype(d) for d in ("float16", "float16", "float32")))
    return kernel.threads // WARP_SIZE


def plan_trace(
    backend: str,
    config: Any,
    shape: tuple[int, int, int, int],
    num_sms: int,
    *,
    capacity: int | None = None,
    max_ctas: int | None = None,
    max_bytes: int = MAX_BUFFER_BYTES,
) -> TracePlan:
    """The trace buffer for one launch of ``backend`` with ``config`` on ``shape`` = (M, N, K,
    L) on a GPU of ``num_sms`` SMs. ``capacity``: events per row (None: planned from the
    problem, capped by ``max_bytes``); ``max_ctas``: trace at most the first this many CTAs
    (None: all of the sm90 grid, ``DEFAULT_SM80_WAVES`` waves of the sm80 grid)."""
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
    ):
        raise ValueError(f"capacity must be a positive int (events per recorder), got {capacity!r}")
    if max_ctas is not None and (
        isinstance(max_ctas, bool) or not isinstance(max_ctas, int) or max_ctas < 1
    ):
        raise ValueError(f"max_ctas must be a positive int or None, got {max_ctas!r}")
    m, n, k, batch = shape
    tiles_m = math.ceil(m / config.tile_m)
    tiles_n = math.ceil(n / config.tile_n)
    k_tiles = max(1, math.ceil(k / config.tile_k))
    if BACKENDS[backend].family == "sm90":
        from ..kernels.common.scheduler import cluster_tile_counts, persistent_cluster_count

        cm, cn = cluster_tile_counts(tiles_m, tiles_n, config.cluster_m, config.cluster_n)
        work = cm * cn * batch
        clusters = persistent_cluster_count(work, num_sms // config.cluster_size)
        ctas = clusters * config.cluster_size
        tiles_per_cta = math.ceil(work / clusters)
        default_ctas = ctas
    else:
        ctas = tiles_m * tiles_n * batch
        tiles_per_cta = 1
        default_ctas = DEFAULT_SM80_WAVES * num_sms
    traced = min(ctas, default_ctas if max_ctas is None else max_ctas)
    per_cta = recorders_per_cta(backend, config)
    if capacity is None:
        capacity = (
            EVENTS_PER_K_TILE * k_tiles * tiles_per_cta
            + EVENTS_PER_TILE * tiles_per_cta
            + EVENTS_PER_RECORDER
        )
        row_budget = max_bytes // (4 * traced * per_cta)
        capacity = max(1, min(capacity, (row_budget - HEADER_WORDS) // EVENT_WORDS))
    return TracePlan(per_cta, ctas, traced, tiles_per_cta, k_tiles, capacity)


def traced_kernel(variant: Variant):
    """The kernel object of ``variant`` built with ``trace=True``."""
    return BACKENDS[variant.backend].kernel_class()(
        variant.kernel_config(),
        cutlass_dtype(variant.ab_dtype),
        cutlass_dtype(variant.c_dtype),
        cutlass_dtype(variant.acc_dtype),
        gpu_arch=variant.arch,
        trace=True,
    )


def fake_trace_buffer():
    """Compile-time stand-in for the trace buffer: int32 (recorders, words), both run-time
    values, rows 16-byte aligned with a stride a multiple of 8 words (``TracePlan.words``)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    rows, words = cute.sym_int64(symbol="R"), cute.sym_int64(symbol="W")
    stride = cute.sym_int64(divisibility=EVENT_WORDS)
    return make_fake_tensor(cutlass.Int32, (rows, words), (stride, 1), assumed_align=16)


def compile_traced(variant: Variant, *, keep: bool = False):
    """Compile the traced variant of ``variant`` (no GPU needed): its ``traced`` entry, which
    takes ``compile.fake_arguments``'s launch arguments and then the trace buffer. ``keep``
    retains the cubin in ``compiled.artifacts.CUBIN`` as ``compile_variant`` does. Traced
    kernels are compiled per process, never cached on disk (``cached_traced`` memoizes)."""
    from .compile import fake_arguments

    args = (*fake_arguments(variant), fake_trace_buffer())
    return compile_entry(traced_kernel(variant).traced, args, variant.arch, keep=keep)


def compile_entry(entry, args: tuple, arch: str, *, keep: bool = False):
    """``cute.compile(entry, *args)`` for ``arch`` under the compile lock, the cubin kept in
    ``artifacts.CUBIN`` (bytes) with ``keep``."""
    import os
    import tempfile
    from pathlib import Path

    import cutlass.cute as cute

    from .compile import _COMPILE_LOCK

    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    with _COMPILE_LOCK:
        if not keep:
            return cute.compile(entry, *args, options=options)
        with tempfile.TemporaryDirectory(prefix="wsgemm-keep-") as dump:
            compiled = cute.compile(
                entry, *args, options=f"{options} --keep-cubin --dump-dir {dump}"
            )
            cubin = getattr(compiled.artifacts, "CUBIN", None)
            if isinstance(cubin, str) and os.path.isfile(cubin):
                compiled.artifacts.CUBIN = Path(cubin).read_bytes()
            return compiled


@functools.cache
def cached_traced(variant: Variant):
    """``compile_traced(variant)``, once per process."""
    return compile_traced(variant)


# ---------------------------------------------------------------------------------------------
# Consistency of a recording (the GPU tests; ``wsgemm.trace`` may report the same)

#: ``%globaltimer``'s step on Hopper; ``check_events`` allows one step (or the coarsest step
#: seen in the recording) between clocks of different SMs.
GLOBALTIMER_TICK_NS = 32


@dataclass(frozen=True)
class RecorderRow:
    """One recorder's row, decoded: its header fields and its events (``trace_format``)."""

    index: int
    header: dict
    events: Any  # numpy (events, EVENT_WORDS) int32, the first min(count, capacity)

    def times(self) -> Any:
        import numpy as np

        return (self.events[:, 2].astype(np.int64) << 32) | (
            self.events[:, 1].astype(np.int64) & 0xFFFFFFFF
        )


def recorder_rows(buffer) -> list[RecorderRow]:
    """The rows of ``buffer`` (numpy int32, ``trace_format``) whose recorder ran."""
    from ..kernels.common.trace_format import HEADER_FIELDS

    capacity = (buffer.shape[1] - HEADER_WORDS) // EVENT_WORDS
    rows = []
    for i, row in enumerate(buffer):
        header = {name: int(row[j]) for j, name in enumerate(HEADER_FIELDS)}
        if header["count"] == 0:
            continue
        n = min(header["count"], capacity)
        events = row[HEADER_WORDS : HEADER_WORDS + n * EVENT_WORDS].reshape(n, EVENT_WORDS)
        rows.append(RecorderRow(i, header, events))
    return rows


def check_events(buffer, meta: dict) -> list[str]:
    """What is inconsistent in a recording (an empty list: nothing). ``buffer`` and ``meta``
    as in ``RawTrace``. Checks: no overflow; each row's events in time order with balanced
    spans; every output tile fetched by ``meta["consumers_per_tile"]`` consumer recorders of
    one CTA (every tile when the whole grid was traced); per CTA and stage, each fill released
    by ``consumers_per_tile`` recorders, none releasing a stage twice without a fill between;
    a consumer's wait on a k-tile's full barrier ends no earlier than the load issue of that
    k-tile in its CTA and in every cluster peer that multicasts into it (one timer step of
    tolerance across SMs)."""
    import numpy as np

    from ..kernels.common.trace_format import SPANS, Event, Role, Timer

    problems: list[str] = []
    rows = recorder_rows(buffer)
    capacity = (buffer.shape[1] - HEADER_WORDS) // EVENT_WORDS
    if not rows:
        return ["no recorder wrote anything"]
    for r in rows:
        if r.header["count"] > capacity:
            problems.append(f"row {r.index}: {r.header['count'] - capacity} events overflowed")
        t = r.times()
        if np.any(np.diff(t) < 0):
            problems.append(f"row {r.index}: event times go backwards")
        kinds = r.events[:, 0]
        for name, (begin, end) in SPANS.items():
            depth = np.cumsum((kinds == begin).astype(int) - (kinds == end).astype(int))
            if depth.size and (depth.min() < 0 or depth.max() > 1 or depth[-1] != 0):
                problems.append(f"row {r.index}: unbalanced {name!r} spans")
    if problems:
        return problems

    per_tile = meta["consumers_per_tile"]
    consumers = [r for r in rows if r.header["role"] in (Role.CONSUMER, Role.WORKER)]
    producers = {r.header["cta"]: r for r in rows if r.header["role"] == Role.PRODUCER}
    fetched: dict[tuple, list[tuple[int, int]]] = {}
    for r in consumers:
        for e in r.events[r.events[:, 0] == Event.TILE_FETCH]:
            fetched.setdefault(tuple(int(x) for x in e[3:6]), []).append((r.header["cta"], r.index))
    tm, tn, tl = meta["tiles"]
    in_range = {t: who for t, who in fetched.items() if t[0] < tm and t[1] < tn and t[2] < tl}
    for tile, who in in_range.items():
        if len(who) != per_tile or len({c for c, _ in who}) != 1 or len(set(who)) != len(who):
            problems.append(f"tile {tile} fetched by (CTA, row) {who}, expected {per_tile}")
    if meta["ctas_traced"] == meta["ctas_launched"] and len(in_range) != tm * tn * tl:
        problems.append(f"{tm * tn * tl - len(in_range)} output tiles were never fetched")

    tick = GLOBALTIMER_TICK_NS
    if meta["timer"] == Timer.GLOBALTIMER:
        steps = np.diff(np.unique(np.concatenate([r.times() for r in rows])))
        tick = max(tick, int(steps.min()) if steps.size else tick)
    cm, cn = meta.get("cluster", [1, 1])
    for cta, prod in producers.items():
        issue = {}  # (tile, k) -> (time, stage, fill index in its stage)
        fills: dict[int, int] = {}
        for e, t in zip(prod.events, prod.times(), strict=True):
            if e[0] == Event.LOAD_ISSUE:
                stage = int(e[7])
                key = (tuple(int(x) for x in e[3:6]), int(e[6]))
                issue[key] = (int(t), stage, fills.get(stage, 0))
                fills[stage] = fills.get(stage, 0) + 1
        released: dict[tuple, int] = {}
        for r in (c for c in consumers if c.header["cta"] == cta):
            last: dict[int, int] = {}
            for e, t in zip(r.events, r.times(), strict=True):
                key = (tuple(int(x) for x in e[3:6]), int(e[6]))
                if e[0] == Event.STAGE_RELEASE:
                    if key not in issue or issue[key][1] != int(e[7]):
                        problems.append(f"row {r.index}: {key} released, never filled")
                        continue
                    fill = issue[key][2]
                    if fill <= last.get(int(e[7]), -1):
                        problems.append(f"row {r.index}: stage {e[7]} released twice, unfilled")
                    last[int(e[7])] = fill
                    released[key] = released.get(key, 0) + 1
                elif e[0] == Event.WAIT_FULL_END:
                    writers = _multicast_writers(cta, cm, cn)
                    j = _tile_turn(prod, key[0])
                    for peer in writers:
                        peer_issue = _issue_at_turn(producers.get(peer), j, key[1])
                        if peer_issue is None:
                            problems.append(f"row {r.index}: no load of {key} in CTA {peer}")
                            continue
                        slack = tick if peer != cta else 0
                        if int(t) + slack < peer_issue:
                            problems.append(
                                f"row {r.index}: wait on {key} ended at {int(t)}, before CTA "
                                f"{peer} issued its load at {peer_issue}"
                            )
        for key in issue:
            if released.get(key, 0) != per_tile:
                problems.append(
                    f"CTA {cta}: fill {key} released {released.get(key, 0)} times, "
                    f"expected {per_tile}"
                )
    return problems


def _multicast_writers(cta: int, cm: int, cn: int) -> list[int]:
    """The CTAs whose loads land in ``cta``'s stages: itself, the CTAs of its cluster row (A
    is multicast along N) and column (B along M). Grid (cm, cn, clusters), x fastest."""
    size = cm * cn
    base, x, y = cta - cta % size, cta % cm, (cta % size) // cm
    return [base + i + j * cm for j in range(cn) for i in range(cm) if i == x or j == y]


def _tile_turn(producer: RecorderRow, tile: tuple) -> int:
    """Which of ``producer``'s tiles ``tile`` is (cluster peers run their tiles in turns)."""
    from ..kernels.common.trace_format import Event

    fetches = [tuple(int(x) for x in e[3:6]) for e in producer.events if e[0] == Event.TILE_FETCH]
    return fetches.index(tile) if tile in fetches else -1


def _issue_at_turn(producer: RecorderRow | None, turn: int, k_tile: int) -> int | None:
    """The time ``producer`` issued k-tile ``k_tile`` of its ``turn``-th tile."""
    from ..kernels.common.trace_format import Event

    if producer is None or turn < 0:
        return None
    seen = -1
    times = producer.times()
    for e, t in zip(producer.events, times, strict=True):
        if e[0] == Event.TILE_FETCH:
            seen += 1
        elif e[0] == Event.LOAD_ISSUE and seen == turn and int(e[6]) == k_tile:
            return int(t)
    return None
