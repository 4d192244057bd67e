"""Traced kernels on the host side (issue #13): how big the trace buffer is, and compiling a
kernel's traced variant. The call that records (validation, launch, timing) is
``record.record``; the buffer's layout is ``wsgemm.trace_format``.

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

from ..host.compiling.compile import compile_entry, fake_arguments, make_kernel
from ..host.registry import BACKENDS, Variant
from ..support import WARP_SIZE, cutlass_dtype
from ..trace_format import EVENT_WORDS, HEADER_WORDS

__all__ = [
    "DEFAULT_SM80_WAVES",
    "MAX_BUFFER_BYTES",
    "TracePlan",
    "compile_traced",
    "fake_trace_buffer",
    "plan_trace",
    "recorders_per_cta",
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
#: and a store wait (2) per epilogue subtile of at most 32 (a swap-AB 256x144 tile has 18
#: 16-column subtiles; the shipped ones at most 16).
EVENTS_PER_TILE = 1 + 4 + 2 + 2 + 2 * 32
#: Per recorder: begin, end, and the producer's final wait (2), with room to spare.
EVENTS_PER_RECORDER = 8
#: Per split-K or stream-K work unit: FIXUP_BEGIN/END.
EVENTS_PER_FIXUP = 2
#: Per stream-K work unit: its UNIT_RANGE after its fetch.
EVENTS_PER_UNIT_RANGE = 1


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
    split: int = 1,
    units: tuple[int, int] | None = None,
) -> TracePlan:
    """The trace buffer for one launch of ``backend`` with ``config`` on ``shape`` = (M, N, K,
    L) on a GPU of ``num_sms`` SMs. ``capacity``: events per row (None: planned from the
    problem, capped by ``max_bytes``); ``max_ctas``: trace at most the first this many CTAs
    (None: all of the sm90 grid, ``DEFAULT_SM80_WAVES`` waves of the sm80 grid). ``split``:
    the split-K count the launch runs (as the kernel clamps it): each tile is then that many
    work units of about ``k_tiles / split`` k-tiles, each with its fix-up. A stream-K
    ``config`` (``stream_k``) launches the clusters its layout takes, and a CTA's row holds
    its share of whole tiles and of the shared k-tiles (``_stream_k_share``). ``units``: a
    grouped launch's (work units its groups hold, the bound its grid is sized by:
    ``grouped_scheduler.unit_bound``), in place of the dense grid's."""
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
        work = bound = cm * cn * batch * split
        if units is not None:
            work, bound = units
        clusters = persistent_cluster_count(bound, num_sms // config.cluster_size)
        tiles_per_cta = max(1, math.ceil(work / clusters))  # work units
        cta_k_tiles = math.ceil(k_tiles / split) * tiles_per_cta
        if getattr(config, "stream_k", False):
            max_clusters = num_sms // config.cluster_size
            team = config.stream_k_problem(m, n, k, batch, max_clusters)[2]
            clusters, tiles_per_cta, cta_k_tiles = _stream_k_share(
                work, k_tiles, max_clusters, team
            )
        ctas = clusters * config.cluster_size
        default_ctas = ctas
    else:
        ctas = tiles_m * tiles_n * batch
        tiles_per_cta = 1
        cta_k_tiles = k_tiles
        default_ctas = DEFAULT_SM80_WAVES * num_sms
    traced = min(ctas, default_ctas if max_ctas is None else max_ctas)
    per_cta = recorders_per_cta(backend, config)
    if capacity is None:
        split_variant = split > 1 or getattr(config, "split_k", 1) != 1
        stream_k = getattr(config, "stream_k", False)
        per_unit = (
            EVENTS_PER_TILE
            # a split variant records its fix-up span even when the count clamps to 1
            + (EVENTS_PER_FIXUP if split_variant or stream_k else 0)
            + (EVENTS_PER_UNIT_RANGE if stream_k else 0)
        )
        capacity = EVENTS_PER_K_TILE * cta_k_tiles + per_unit * tiles_per_cta + EVENTS_PER_RECORDER
        row_budget = max_bytes // (4 * traced * per_cta)
        capacity = max(1, min(capacity, (row_budget - HEADER_WORDS) // EVENT_WORDS))
    return TracePlan(per_cta, ctas, traced, tiles_per_cta, k_tiles, capacity)


def _stream_k_share(
    work: int, k_tiles: int, max_clusters: int, team: int = 1
) -> tuple[int, int, int]:
    """(clusters launched, the most units a CTA runs, the most k-tiles it runs) of a stream-K
    launch of ``work`` cluster tiles of ``k_tiles`` k-tiles on at most ``max_clusters``
    (``scheduler.stream_k_layout``; ``team``: its teams' size): each cluster's whole tiles,
    then its range of the shared k-tiles (with teams, of the shared columns': a member runs its
    row's tile of each), which meets at most ``ceil(range / k_tiles) + 1`` tiles."""
    from ..kernels.common.scheduler import stream_k_layout

    launched, dp_tiles, sk_clusters, shared = stream_k_layout(work, k_tiles, max_clusters, team)
    whole = dp_tiles // launched
    longest = math.ceil(shared / sk_clusters)
    pieces = math.ceil(longest / k_tiles) + 1 if shared else 0
    return launched, max(1, whole + pieces), whole * k_tiles + longest


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
    kernel = make_kernel(variant, trace=True)
    # a split-K variant's run-time count, workspace and semaphores follow the buffer
    args = (*fake_arguments(variant), fake_trace_buffer(), *kernel.fake_launch_extras())
    return compile_entry(kernel.traced, args, variant.arch, keep=keep)


@functools.cache
def cached_traced(variant: Variant):
    """``compile_traced(variant)``, once per process."""
    return compile_traced(variant)
