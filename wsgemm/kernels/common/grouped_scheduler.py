"""Persistent tile scheduling over groups of rows whose sizes only the GPU knows (grouped GEMM).

A grouped GEMM with ragged M (``wsgemm.grouped_mm``'s 2D x 3D form, a mixture-of-experts
layer) multiplies the rows ``[end[g - 1], end[g])`` of A by B's batch ``g`` for every group
``g`` (``end[-1] = 0``). The ends (``offs``) live in device memory: the host knows the total
rows and the group count, never the sizes, so it launches a persistent grid as for a dense
GEMM, sized by a bound (:func:`unit_bound`), and each CTA finds its tiles from ``offs``.

Work units: group after group, each group's cluster tiles in the dense kernel's grouped raster
order (``scheduler.grouped_cluster_coord`` on the group's own cluster rows): a group of
``rows`` rows holds ``ceil(ceil(rows / tile_m) / cluster_m) * clusters_n`` units, so a
cluster never straddles two groups (a ragged last cluster row has CTAs past the group's rows:
they load and compute, and store nothing). Cluster ``c`` runs units ``c, c + P, ...`` as in
the dense schedule; it keeps a *cursor* on the group holding its current unit (the group, its
rows, its first and end unit) and moves it forward only, reading one ``offs`` entry per group
passed: a CTA's whole walk reads each entry at most once.

Ends are read defensively: clamped to ``[previous end, rows]``, so ends that decrease or
exceed the rows (which the host cannot check without a sync) give empty groups and rows past
``rows`` that nothing stores to, never an access outside the operands.

The arithmetic runs on Python ints (host replay, :func:`ragged_unit_order`, the tests) and on
DSL ``Int32`` values (in the kernel) alike; only the walk's loop differs (a Python loop, a
``@cute.jit`` loop on the GPU). :class:`RaggedSchedule` is the host replay at a cost per group
rather than per CTA and tile (``explain``'s tile map): the same cursors and coordinates, each
computed once.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import cutlass
import cutlass.cute as cute

from wsgemm.kernels.common.scheduler import (
    GroupedTileScheduler,
    WorkTile,
    _ceil_div,
    _select,
    cluster_tile_counts,
    group_rows,
    grouped_cluster_coord,
    persistent_cluster_count,
    replay,
)

__all__ = [
    "GroupWorkTile",
    "KGroupWorkTile",
    "RaggedKScheduler",
    "RaggedMScheduler",
    "RaggedSchedule",
    "group_k_span",
    "ragged_k_unit_order",
    "ragged_unit_order",
    "unit_bound",
]

#: A cursor past the last group ends at this unit: no work index reaches it.
_NO_END = 2**31 - 1


def unit_bound(rows: Any, groups: Any, tile_m: int, cluster_m: int, clusters_n: Any) -> Any:
    """At most how many work units ``groups`` groups of ``rows`` rows in all hold, whatever
    their sizes: each group's cluster rows exceed its share of ``rows / (tile_m * cluster_m)``
    by less than one."""
    return (_ceil_div(rows, tile_m * cluster_m) + groups) * clusters_n


class GroupWorkTile(WorkTile):
    """A ``WorkTile`` of the grouped schedule: ``l`` is the group (B's batch), ``m`` the tile
    index inside the group's rows, and the cursor: the group's first row ``row0``, its end row
    ``row_end`` (rows ``[row0 + m * tile_m, row_end)`` of the tile are the group's) and its
    units ``[unit_start, unit_end)``."""

    __slots__ = ("row0", "row_end", "unit_start", "unit_end")

    def __init__(self, m, n, l, work, is_valid, row0, row_end, unit_start, unit_end):  # noqa: E741
        super().__init__(m, n, l, work, is_valid)
        self.row0, self.row_end = row0, row_end
        self.unit_start, self.unit_end = unit_start, unit_end

    @property
    def cursor(self) -> tuple:
        return (self.l, self.row0, self.row_end, self.unit_start, self.unit_end)

    def rows_left(self, tile_m: int) -> Any:
        """The group's rows from this tile's first row on (<= 0: the tile stores nothing)."""
        return self.row_end - (self.row0 + self.m * tile_m)

    def _ints(self) -> tuple:
        return (self.m, self.n, self.l, self.work, self.row0, self.row_end, self.unit_start,
                self.unit_end)  # fmt: skip

    def __new_from_mlir_values__(self, values: list) -> GroupWorkTile:
        *ints, valid = values
        ints = [cutlass.Int32(v) for v in ints]
        m, n, l, work, row0, row_end, start, end = ints  # noqa: E741
        return GroupWorkTile(m, n, l, work, cutlass.Boolean(valid), row0, row_end, start, end)

    def __repr__(self) -> str:
        return (f"GroupWorkTile(group={self.l}, m={self.m}, n={self.n}, rows=[{self.row0}, "
                f"{self.row_end}), valid={self.is_valid})")  # fmt: skip


def _group_cursor(offs, g, num_groups, rows, row0, unit_start, tile_m, cluster_m, clusters_n):
    """(g, row0, row_end, unit_start, unit_end) of group ``g``, which starts at row ``row0``
    and unit ``unit_start``; past the last group the end unit is :data:`_NO_END`."""
    end = offs[cutlass.min(g, num_groups - 1)]
    row_end = cutlass.min(cutlass.max(end, row0), rows)
    units = _ceil_div(_ceil_div(row_end - row0, tile_m), cluster_m) * clusters_n
    unit_end = _select(g < num_groups, unit_start + units, _NO_END)
    return g, row0, row_end, unit_start, unit_end


@cute.jit
def _seek_device(offs, num_groups, rows, tile_m: cutlass.Constexpr, cluster_m: cutlass.Constexpr,
                 clusters_n, cursor, work):  # fmt: skip
    """The cursor moved forward to the group holding unit ``work`` (on the GPU)."""
    g, row0, row_end, unit_start, unit_end = cursor
    while work >= unit_end:
        g, row0, row_end, unit_start, unit_end = _group_cursor(
            offs, g + 1, num_groups, rows, row_end, unit_end, tile_m, cluster_m, clusters_n
        )
    return g, row0, row_end, unit_start, unit_end


class RaggedMScheduler:
    """Static persistent schedule of a ragged-M grouped GEMM for one CTA (module docstring).

    ``offs``: the groups' end rows (a list on the host, an int32 tensor on the GPU);
    ``num_groups``, ``rows`` (A's and C's rows), ``clusters_n`` (cluster columns of C):
    run-time values; ``tile_m`` and ``cluster_mn`` static; ``rows_per_group``,
    ``num_clusters``, ``cluster_idx``, ``cta_in_cluster_mn`` as for
    ``scheduler.GroupedTileScheduler``.
    """

    def __init__(self, offs, num_groups, rows, clusters_n, tile_m: int, cluster_mn: tuple,
                 rows_per_group, num_clusters, cluster_idx, cta_in_cluster_mn):  # fmt: skip
        self.offs = offs
        self.tile_m, self.cluster_mn = tile_m, cluster_mn
        self.num_groups, self.rows, self.clusters_n = num_groups, rows, clusters_n
        self.group_clusters = rows_per_group
        self.num_clusters, self.cluster_idx = num_clusters, cluster_idx
        self.cta_m, self.cta_n = cta_in_cluster_mn

    _DYNAMIC = ("num_groups", "rows", "clusters_n", "group_clusters", "num_clusters",
                "cluster_idx", "cta_m", "cta_n")  # fmt: skip

    # Let the scheduler be passed to @cute.jit roles (the offsets tensor travels with it).
    def __extract_mlir_values__(self) -> list:
        ints = [cutlass.Int32(getattr(self, f)).ir_value() for f in self._DYNAMIC]
        return ints + list(self.offs.__extract_mlir_values__())

    def __new_from_mlir_values__(self, values: list) -> RaggedMScheduler:
        new = object.__new__(RaggedMScheduler)
        new.tile_m, new.cluster_mn = self.tile_m, self.cluster_mn
        count = len(self._DYNAMIC)
        for field, value in zip(self._DYNAMIC, values[:count], strict=True):
            setattr(new, field, cutlass.Int32(value))
        new.offs = self.offs.__new_from_mlir_values__(values[count:])
        return new

    def _first_cursor(self) -> tuple:
        return _group_cursor(self.offs, 0 * self.num_groups, self.num_groups, self.rows,
                             0 * self.rows, 0 * self.rows, self.tile_m, self.cluster_mn[0],
                             self.clusters_n)  # fmt: skip

    def _seek(self, cursor: tuple, work: Any) -> tuple:
        if isinstance(work, int):  # the host's replay
            while work >= cursor[4]:
                g, _, row_end, _, unit_end = cursor
                cursor = _group_cursor(self.offs, g + 1, self.num_groups, self.rows, row_end,
                                       unit_end, self.tile_m, self.cluster_mn[0],
                                       self.clusters_n)  # fmt: skip
            return cursor
        return _seek_device(self.offs, self.num_groups, self.rows, self.tile_m,
                            self.cluster_mn[0], self.clusters_n, cursor, work)  # fmt: skip

    def _tile(self, cursor: tuple, work: Any) -> GroupWorkTile:
        g, row0, row_end, unit_start, unit_end = self._seek(cursor, work)
        cluster_m, cluster_n = self.cluster_mn
        clusters_m = _ceil_div(_ceil_div(row_end - row0, self.tile_m), cluster_m)
        # a cursor past the last group has no rows: its coordinates are never used
        cm, cn, _ = grouped_cluster_coord(work - unit_start, cutlass.max(clusters_m, 1),
                                          self.clusters_n, self.group_clusters)  # fmt: skip
        return GroupWorkTile(cm * cluster_m + self.cta_m, cn * cluster_n + self.cta_n, g, work,
                             g < self.num_groups, row0, row_end, unit_start, unit_end)  # fmt: skip

    def initial_work_tile(self, skip: int = 0) -> GroupWorkTile:
        """The first unit, or the ``skip``-th one (ping-pong's second consumer starts at 1)."""
        return self._tile(self._first_cursor(), self.cluster_idx + skip * self.num_clusters)

    def next_work_tile(self, tile: GroupWorkTile, steps: int = 1) -> GroupWorkTile:
        """The unit ``steps`` turns after ``tile`` (its cursor only moves forward)."""
        return self._tile(tile.cursor, tile.work + steps * self.num_clusters)


def ragged_unit_order(
    ends: list[int],
    rows: int,
    num_n: int,
    tile_m: int,
    group: int,
    num_ctas: int,
    cluster: tuple[int, int] = (1, 1),
) -> list[list[GroupWorkTile]]:
    """Host replay of the grouped kernel's schedule: for each launched CTA (launch-grid order,
    as ``scheduler.unit_order``), the units it runs. ``ends``: the groups' end rows (``offs``);
    ``num_n``: tiles along N; ``group``: the raster group in m-tiles; ``num_ctas``: the CTAs
    that may be resident."""
    cluster_m, cluster_n = cluster
    clusters_n = _ceil_div(num_n, cluster_n)
    bound = unit_bound(rows, len(ends), tile_m, cluster_m, clusters_n)
    launched = persistent_cluster_count(bound, num_ctas // (cluster_m * cluster_n))
    rows_per_group = group_rows(group, cluster_m)
    return replay(launched, cluster, lambda cluster_idx, cta_mn: RaggedMScheduler(
        list(ends), len(ends), rows, clusters_n, tile_m, cluster, rows_per_group, launched,
        cluster_idx, cta_mn,
    ))  # fmt: skip


class RaggedSchedule:
    """The ragged-M schedule of one launch replayed on the host once for all its CTAs: what
    :func:`ragged_unit_order` answers (every CTA walking its own :class:`RaggedMScheduler`),
    from the same arithmetic, each piece computed once (the arguments are
    :func:`ragged_unit_order`'s).

    Every CTA's cursor walks one chain, group after group from the first (``_first_cursor``,
    then ``_group_cursor`` of the next group from the current one's end row and end unit):
    :attr:`cursors` holds it, ending with the cursor past the last group. A CTA's seek stops at
    the first cursor of the chain whose end unit is past the unit (the end units never
    decrease, and a CTA's units increase): a bisection here (:meth:`seek`). A unit's cluster
    coordinates are the kernel's ``grouped_cluster_coord`` of the unit's index in its group,
    cached per (the group's cluster rows, that index). Cluster ``c`` of the :attr:`launched`
    runs units ``c, c + P, ...`` (``initial_work_tile``, ``next_work_tile``) while they are
    below :attr:`units` (past it the cursor is past the last group: not valid), each on every
    CTA of the cluster (:meth:`works`, :meth:`cluster_ctas`)."""

    def __init__(self, ends: list[int], rows: int, num_n: int, tile_m: int, group: int,
                 num_ctas: int, cluster: tuple[int, int] = (1, 1)):  # fmt: skip
        cluster_m, cluster_n = cluster
        self.tile_m, self.cluster = tile_m, cluster
        self.num_groups, self.rows = len(ends), rows
        self.clusters_n = clusters_n = _ceil_div(num_n, cluster_n)
        bound = unit_bound(rows, len(ends), tile_m, cluster_m, clusters_n)
        self.launched = persistent_cluster_count(bound, num_ctas // (cluster_m * cluster_n))
        self.rows_per_group = group_rows(group, cluster_m)
        offs = list(ends)
        cursor = _group_cursor(offs, 0, len(ends), rows, 0, 0, tile_m, cluster_m, clusters_n)
        cursors = [cursor]
        for g in range(1, len(ends) + 1):  # (as RaggedMScheduler._seek steps)
            _, _, row_end, _, unit_end = cursor
            cursor = _group_cursor(offs, g, len(ends), rows, row_end, unit_end, tile_m,
                                   cluster_m, clusters_n)  # fmt: skip
            cursors.append(cursor)
        self.cursors = cursors
        self._unit_ends = [c[4] for c in cursors]
        #: The units the schedule runs: the first unit of the cursor past the last group.
        self.units = cursors[-1][3]
        self._coords: dict[tuple[int, int], tuple[Any, Any]] = {}

    def seek(self, work: int) -> tuple:
        """The cursor a CTA's walk holds at unit ``work``."""
        return self.cursors[bisect_right(self._unit_ends, work)]

    def works(self, cluster_idx: int) -> range:
        """The units cluster ``cluster_idx`` runs, in order (each of its CTAs runs them all)."""
        return range(cluster_idx, self.units, self.launched)

    def cluster_ctas(self, cluster_idx: int) -> list[tuple[int, tuple[int, int]]]:
        """(CTA index in launch-grid order, (cta_m, cta_n)) of cluster ``cluster_idx``'s CTAs,
        as ``scheduler.replay`` orders them (x fastest)."""
        cluster_m, cluster_n = self.cluster
        first = cluster_idx * cluster_m * cluster_n
        return [(first + cta_n * cluster_m + cta_m, (cta_m, cta_n))
                for cta_n in range(cluster_n) for cta_m in range(cluster_m)]  # fmt: skip

    def tile(self, work: int, cta_mn: tuple[int, int]) -> GroupWorkTile:
        """The tile CTA ``cta_mn`` of unit ``work``'s cluster runs (``RaggedMScheduler._tile``)."""
        g, row0, row_end, unit_start, unit_end = self.seek(work)
        cluster_m, cluster_n = self.cluster
        clusters_m = _ceil_div(_ceil_div(row_end - row0, self.tile_m), cluster_m)
        key = (clusters_m, work - unit_start)
        coord = self._coords.get(key)
        if coord is None:
            cm, cn, _ = grouped_cluster_coord(key[1], cutlass.max(clusters_m, 1), self.clusters_n,
                                              self.rows_per_group)  # fmt: skip
            coord = self._coords[key] = (cm, cn)
        cm, cn = coord
        return GroupWorkTile(cm * cluster_m + cta_mn[0], cn * cluster_n + cta_mn[1], g, work,
                             g < self.num_groups, row0, row_end, unit_start, unit_end)  # fmt: skip

    def order(self) -> list[list[GroupWorkTile]]:
        """:func:`ragged_unit_order`'s answer: for each launched CTA, the units it runs."""
        out = []
        for cluster_idx in range(self.launched):
            works = self.works(cluster_idx)
            for _, cta_mn in self.cluster_ctas(cluster_idx):
                out.append([self.tile(w, cta_mn) for w in works])
        return out


# ----------------------------------------------------------------------------------- ragged K


def group_k_span(offs: Any, g: Any, num_groups: Any, k_total: Any, tile_k: int) -> tuple:
    """(start, extent, k_tiles) of group ``g`` of a ragged-K grouped GEMM (the 2D x 2D form:
    group ``g`` sums over K's ``[end[g - 1], end[g])``, ``end[-1] = 0``). Its loads start at
    element ``start`` of K and read ``k_tiles`` k-tiles through a TMA descriptor whose K extent
    is ``extent``: every element at or past the group's end reads as zero. Ends are read
    defensively, each on its own: ``lo = clamp(end[g - 1], 0, K)``, ``hi = clamp(end[g], lo,
    K)``, so bad offsets garble groups, never reach outside the operands. An empty group
    (``hi == lo``) still takes one k-tile, loaded from ``start = extent`` past the extent: all
    zeros, so its tile is zero (every unit keeps at least one k-tile, as a dense one does)."""
    last = num_groups - 1  # a unit past the schedule may name a group past the last: clamped
    prev = offs[cutlass.min(cutlass.max(g - 1, 0), last)]
    lo = _select(g > 0, cutlass.min(cutlass.max(prev, 0), k_total), 0)
    hi = cutlass.min(cutlass.max(offs[cutlass.min(g, last)], lo), k_total)
    extent = cutlass.max(hi, 1)
    start = _select(hi > lo, lo, extent)
    return start, extent, cutlass.max(_ceil_div(hi - lo, tile_k), 1)


class KGroupWorkTile(WorkTile):
    """A ``WorkTile`` of the ragged-K schedule: ``l`` is the group (C's batch), ``[k_begin,
    k_end)`` = ``[0, k_tiles)`` its k-tiles, and ``k_start``, ``k_extent`` where its loads start
    in K and the K extent of the descriptor they go through (:func:`group_k_span`)."""

    __slots__ = ("k_start", "k_extent")

    def __init__(self, m, n, l, work, is_valid, k_start, k_extent, k_tiles):  # noqa: E741
        super().__init__(m, n, l, work, is_valid, None, 0 * k_tiles, k_tiles)
        self.k_start, self.k_extent = k_start, k_extent

    def _ints(self) -> tuple:
        return (self.m, self.n, self.l, self.work, self.k_start, self.k_extent, self.k_end)

    def __new_from_mlir_values__(self, values: list) -> KGroupWorkTile:
        *ints, valid = values
        m, n, l, work, start, extent, k_tiles = [cutlass.Int32(v) for v in ints]  # noqa: E741
        return KGroupWorkTile(m, n, l, work, cutlass.Boolean(valid), start, extent, k_tiles)

    def __repr__(self) -> str:
        return (f"KGroupWorkTile(m={self.m}, n={self.n}, group={self.l}, "
                f"k_start={self.k_start}, k_extent={self.k_extent}, k_tiles={self.k_end}, "
                f"valid={self.is_valid})")  # fmt: skip


class RaggedKScheduler:
    """Static persistent schedule of a ragged-K grouped GEMM for one CTA: the dense schedule
    (``scheduler.GroupedTileScheduler``) over ``(num_m, num_n, groups)`` output tiles, since the
    host knows the output's tiles (``groups`` of ``M x N``); only each unit's K range comes from
    ``offs`` (:func:`group_k_span`: two reads per unit). ``k_total``: A's and B's K (a run-time
    value); ``tile_k`` static; the other arguments as ``GroupedTileScheduler``'s."""

    def __init__(self, offs, k_total, tile_k: int, num_tiles_mnl: tuple, cluster_mn: tuple,
                 rows_per_group, num_clusters, cluster_idx, cta_in_cluster_mn):  # fmt: skip
        self.offs, self.k_total, self.tile_k = offs, k_total, tile_k
        self.num_groups = num_tiles_mnl[2]
        self.dense = GroupedTileScheduler(num_tiles_mnl, cluster_mn, rows_per_group,
                                          num_clusters, cluster_idx, cta_in_cluster_mn)  # fmt: skip

    # Let the scheduler be passed to @cute.jit roles (the offsets tensor travels with it).
    def __extract_mlir_values__(self) -> list:
        ints = [cutlass.Int32(v).ir_value() for v in (self.k_total, self.num_groups)]
        return (ints + self.dense.__extract_mlir_values__()
                + list(self.offs.__extract_mlir_values__()))  # fmt: skip

    def __new_from_mlir_values__(self, values: list) -> RaggedKScheduler:
        new = object.__new__(RaggedKScheduler)
        new.tile_k = self.tile_k
        new.k_total, new.num_groups = (cutlass.Int32(v) for v in values[:2])
        count = 2 + len(self.dense._fields())
        new.dense = self.dense.__new_from_mlir_values__(values[2:count])
        new.offs = self.offs.__new_from_mlir_values__(values[count:])
        return new

    def work_tile(self, work: Any) -> KGroupWorkTile:
        tile = self.dense.work_tile(work)
        start, extent, k_tiles = group_k_span(self.offs, tile.l, self.num_groups, self.k_total,
                                              self.tile_k)  # fmt: skip
        return KGroupWorkTile(tile.m, tile.n, tile.l, work, tile.is_valid, start, extent, k_tiles)

    def initial_work_tile(self, skip: int = 0) -> KGroupWorkTile:
        """The first unit, or the ``skip``-th one (ping-pong's second consumer starts at 1)."""
        return self.work_tile(self.dense.cluster_idx + skip * self.dense.num_clusters)

    def next_work_tile(self, tile: KGroupWorkTile, steps: int = 1) -> KGroupWorkTile:
        return self.work_tile(tile.work + steps * self.dense.num_clusters)


def ragged_k_unit_order(
    ends: list[int],
    k_total: int,
    num_m: int,
    num_n: int,
    tile_k: int,
    group: int,
    num_ctas: int,
    cluster: tuple[int, int] = (1, 1),
) -> list[list[KGroupWorkTile]]:
    """Host replay of the ragged-K grouped kernel's schedule (as :func:`ragged_unit_order`):
    for each launched CTA, the units it runs. ``ends``: the groups' end offsets along K."""
    cluster_m, cluster_n = cluster
    groups = len(ends)
    clusters_m, clusters_n = cluster_tile_counts(num_m, num_n, cluster_m, cluster_n)
    launched = persistent_cluster_count(clusters_m * clusters_n * groups,
                                        num_ctas // (cluster_m * cluster_n))  # fmt: skip
    rows_per_group = group_rows(group, cluster_m)
    return replay(launched, cluster, lambda cluster_idx, cta_mn: RaggedKScheduler(
        ends, k_total, tile_k, (num_m, num_n, groups), cluster, rows_per_group, launched,
        cluster_idx, cta_mn,
    ))  # fmt: skip
