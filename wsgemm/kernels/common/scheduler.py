"""Persistent tile scheduling with grouped (L2-friendly) rasterization.

A persistent kernel launches ``min(work clusters, max active clusters)`` clusters; cluster ``c``
takes work units ``c, c + P, c + 2P, ...`` (``P`` = clusters launched). A work unit is one
*cluster tile*: ``cluster_m x cluster_n`` adjacent output tiles, one per CTA of the cluster, so
the CTAs of a cluster always agree on how many units they run (they share multicast loads and
must leave the loop together).

Rasterization order (``grouped_cluster_coord``): within a batch, cluster tiles are cut into
groups of ``group`` cluster-rows along M. Inside a group the walk goes *down a column first*
(``group`` consecutive m-tiles at the same n), then to the next n; after the last n the next
group of rows starts. The last group takes the rows that are left (it may be shorter). Batches
follow one another. Concurrent CTAs thus share a few rows of A and a band of columns of B in L2.

Split-K (``splits``, a launch value): a work unit is then one cluster tile *and* one split
``s`` of K: unit ``u`` is split ``u % splits`` of cluster tile ``u // splits``, so the splits of
one tile are adjacent in the walk (they run at the same time and the last of them, which sums
the partials, finishes soon after the others). Split ``s`` covers k-tiles ``[s * T // splits,
(s + 1) * T // splits)`` of the ``T`` k-tiles (``split_k_range``: lengths differ by at most
one, in order, covering K once); every CTA of a cluster takes the same unit, so they walk
identical k-ranges. ``effective_splits`` clamps the count so that no unit is empty.

The index arithmetic is written once and runs on plain Python ints (host tests, ``tile_order``)
and on CuTe DSL ``Int32`` values (inside the kernel) alike: it only uses ``+ - * // %``, ``<``
and ``cutlass.min``, which both kinds of value understand.
"""

from __future__ import annotations

from typing import Any, Protocol

import cutlass

__all__ = [
    "GroupedTileScheduler",
    "TileScheduler",
    "WorkTile",
    "MAX_SPLITS",
    "cluster_tile_counts",
    "effective_splits",
    "group_rows",
    "grouped_cluster_coord",
    "persistent_cluster_count",
    "split_k_range",
    "tile_order",
    "unit_order",
]

#: The most splits a launch runs: ``(split + 1) * k_tiles`` stays within Int32 for any K below
#: 2^31 / MAX_SPLITS * tile_k, and no realistic problem wants more (the policy picks <= 8).
MAX_SPLITS = 64


def _ceil_div(a: Any, b: Any) -> Any:
    return (a + b - 1) // b


def cluster_tile_counts(num_m_tiles: Any, num_n_tiles: Any, cluster_m: int, cluster_n: int):
    """Cluster tiles along M and N. A ragged edge gets a whole cluster whose surplus CTAs work on
    tiles past the end (TMA zero-fills their loads and drops their stores)."""
    return _ceil_div(num_m_tiles, cluster_m), _ceil_div(num_n_tiles, cluster_n)


def persistent_cluster_count(total_work: Any, max_active_clusters: Any) -> Any:
    """Clusters to launch: one per work unit, but never more than can be resident at once."""
    return cutlass.min(total_work, max_active_clusters)


def effective_splits(requested: Any, k_tiles: Any) -> Any:
    """The split count a launch runs: ``requested`` clamped to [1, min(k_tiles, MAX_SPLITS)], so
    every split has at least one k-tile (no empty unit) and the k-range arithmetic cannot
    overflow. The host sizes the workspace with the same function."""
    return cutlass.max(cutlass.min(cutlass.min(requested, k_tiles), MAX_SPLITS), 1)


def split_k_range(split: Any, splits: Any, k_tiles: Any) -> tuple[Any, Any]:
    """[k_begin, k_end) in k-tiles of split ``split`` of ``splits``: as even as possible (the
    lengths differ by at most one), in order, together covering [0, k_tiles) exactly once, and
    none empty while ``splits <= k_tiles``."""
    return split * k_tiles // splits, (split + 1) * k_tiles // splits


def grouped_cluster_coord(work: Any, clusters_m: Any, clusters_n: Any, group: int):
    """(cluster_m_idx, cluster_n_idx, batch) of linear work unit ``work`` in grouped order.

    ``group`` is the number of cluster-rows walked down one column before moving to the next
    column (see the module docstring). ``work`` must be below ``clusters_m * clusters_n * L``.
    """
    per_batch = clusters_m * clusters_n
    batch = work // per_batch
    in_batch = work - batch * per_batch
    per_group = group * clusters_n
    group_idx = in_batch // per_group
    first_m = group_idx * group
    # The last group of rows may be shorter than `group`.
    rows = cutlass.min(clusters_m - first_m, group)
    in_group = in_batch - group_idx * per_group
    return first_m + in_group % rows, in_group // rows, batch


class WorkTile:
    """One CTA's work unit: output tile indices ``m``, ``n``, batch ``l``, the linear work unit
    it came from, and ``is_valid`` (False once the schedule is exhausted). Under split-K also
    the unit's ``split`` and its k-tiles ``[k_begin, k_end)``; None without split-K (the
    unsplit kernel carries nothing more through its loops than before split-K existed)."""

    __slots__ = ("m", "n", "l", "work", "is_valid", "split", "k_begin", "k_end")

    def __init__(
        self,
        m: Any,
        n: Any,
        l: Any,  # noqa: E741
        work: Any,
        is_valid: Any,
        split: Any = None,
        k_begin: Any = None,
        k_end: Any = None,
    ):
        self.m, self.n, self.l, self.work, self.is_valid = m, n, l, work, is_valid
        self.split, self.k_begin, self.k_end = split, k_begin, k_end

    @property
    def coord_mnl(self) -> tuple:
        return (self.m, self.n, self.l)

    @property
    def is_split(self) -> bool:
        return self.split is not None

    def _ints(self) -> tuple:
        ints = (self.m, self.n, self.l, self.work)
        return ints + ((self.split, self.k_begin, self.k_end) if self.is_split else ())

    # Let a WorkTile be carried through dynamic (scf) loops in the DSL.
    def __extract_mlir_values__(self) -> list:
        ints = [cutlass.Int32(v).ir_value() for v in self._ints()]
        return [*ints, cutlass.Boolean(self.is_valid).ir_value()]

    def __new_from_mlir_values__(self, values: list) -> WorkTile:
        *ints, valid = values
        ints = [cutlass.Int32(v) for v in ints]
        m, n, l, work = ints[:4]  # noqa: E741
        return WorkTile(m, n, l, work, cutlass.Boolean(valid), *ints[4:])

    def __repr__(self) -> str:
        split = f", split={self.split}, k=[{self.k_begin}, {self.k_end})" if self.is_split else ""
        return f"WorkTile(m={self.m}, n={self.n}, l={self.l}{split}, valid={self.is_valid})"


class TileScheduler(Protocol):
    """What a kernel role needs from a scheduler."""

    def initial_work_tile(self, skip: int = 0) -> WorkTile: ...

    def next_work_tile(self, tile: WorkTile, steps: int = 1) -> WorkTile: ...


class GroupedTileScheduler:
    """Static persistent schedule in grouped order for one CTA of one cluster.

    ``num_tiles_mnl``: output tiles along M, N and the batch count. ``cluster_mn``: the static
    cluster shape. ``rows_per_group``: cluster rows per raster group (>= 1; :func:`group_rows`
    turns a raster group in m-tiles into it). ``num_clusters``: clusters launched
    (``persistent_cluster_count``). ``cluster_idx``: this CTA's cluster. ``cta_in_cluster_mn``:
    this CTA's (m, n) position inside its cluster. ``split_k``: None (no split-K: the schedule
    of tiles, unchanged) or ``(k_tiles, splits)``, the k-tiles of the problem and the split
    count (``effective_splits``): the work units are then (cluster tile, split) pairs (module
    docstring). All values but ``cluster_mn`` may be Python ints or DSL ``Int32`` (launch
    arguments set the raster group and the split count).
    """

    def __init__(
        self,
        num_tiles_mnl: tuple,
        cluster_mn: tuple[int, int],
        rows_per_group: Any,
        num_clusters: Any,
        cluster_idx: Any,
        cta_in_cluster_mn: tuple,
        split_k: tuple | None = None,
    ):
        self.cluster_mn = cluster_mn
        self.group_clusters = rows_per_group
        self.clusters_m, self.clusters_n = cluster_tile_counts(
            num_tiles_mnl[0], num_tiles_mnl[1], *cluster_mn
        )
        self.total_work = self.clusters_m * self.clusters_n * num_tiles_mnl[2]
        self.num_clusters = num_clusters
        self.cluster_idx = cluster_idx
        self.cta_m, self.cta_n = cta_in_cluster_mn
        self.is_split = split_k is not None
        if self.is_split:
            self.k_tiles, self.splits = split_k
            self.total_work = self.total_work * self.splits

    # Run-time fields; the cluster shape and whether K is split are static.
    _DYNAMIC = (
        "group_clusters",
        "clusters_m",
        "clusters_n",
        "total_work",
        "num_clusters",
        "cluster_idx",
        "cta_m",
        "cta_n",
    )

    _DYNAMIC_SPLIT = ("k_tiles", "splits")

    def _fields(self) -> tuple:
        return self._DYNAMIC + (self._DYNAMIC_SPLIT if self.is_split else ())

    # Let the scheduler be referenced inside dynamic (scf) loops in the DSL.
    def __extract_mlir_values__(self) -> list:
        return [cutlass.Int32(getattr(self, f)).ir_value() for f in self._fields()]

    def __new_from_mlir_values__(self, values: list) -> GroupedTileScheduler:
        new = object.__new__(GroupedTileScheduler)
        new.cluster_mn = self.cluster_mn
        new.is_split = self.is_split
        for field, value in zip(self._fields(), values, strict=True):
            setattr(new, field, cutlass.Int32(value))
        return new

    def work_tile(self, work: Any) -> WorkTile:
        """This CTA's unit of linear work unit ``work`` (meaningless when invalid)."""
        tile_work, split = work, None
        if self.is_split:
            tile_work = work // self.splits
            split = work - tile_work * self.splits
        cm, cn, batch = grouped_cluster_coord(
            tile_work, self.clusters_m, self.clusters_n, self.group_clusters
        )
        m = cm * self.cluster_mn[0] + self.cta_m
        n = cn * self.cluster_mn[1] + self.cta_n
        if not self.is_split:
            return WorkTile(m, n, batch, work, work < self.total_work)
        k_begin, k_end = split_k_range(split, self.splits, self.k_tiles)
        return WorkTile(m, n, batch, work, work < self.total_work, split, k_begin, k_end)

    def initial_work_tile(self, skip: int = 0) -> WorkTile:
        """The first tile, or the ``skip``-th one (ping-pong's second consumer starts at 1)."""
        return self.work_tile(self.cluster_idx + skip * self.num_clusters)

    def next_work_tile(self, tile: WorkTile, steps: int = 1) -> WorkTile:
        """The tile ``steps`` turns after ``tile`` (ping-pong consumers step by 2)."""
        return self.work_tile(tile.work + steps * self.num_clusters)


def group_rows(group: int, cluster_m: int) -> int:
    """Cluster rows per raster group of ``group`` m-tiles (a positive multiple of
    ``cluster_m``: a group holds whole clusters)."""
    if not isinstance(group, int) or group < 1 or group % cluster_m != 0:
        raise ValueError(
            f"raster group {group!r} must be a positive multiple of cluster_m {cluster_m}"
        )
    return group // cluster_m


def tile_order(
    num_m: int,
    num_n: int,
    num_l: int,
    group: int,
    num_ctas: int,
    cluster: tuple[int, int] = (1, 1),
) -> list[list[tuple[int, int, int]]]:
    """Host replay of the kernel's schedule: for each launched CTA, in launch-grid order (block
    ``(cta_m, cta_n, cluster)`` of grid ``(cluster_m, cluster_n, clusters)``, x fastest), the
    (m, n, l) tiles it runs, in order.

    ``num_ctas`` is how many CTAs may be resident (``max_active_clusters * cluster size``).
    Tiles past the problem edge that a ragged cluster runs are included as they are.
    """
    units = unit_order(num_m, num_n, num_l, group, num_ctas, cluster)
    return [[u.coord_mnl for u in per_cta] for per_cta in units]


def unit_order(
    num_m: int,
    num_n: int,
    num_l: int,
    group: int,
    num_ctas: int,
    cluster: tuple[int, int] = (1, 1),
    split_k: tuple[int, int] | None = None,
) -> list[list[WorkTile]]:
    """:func:`tile_order` with the whole work units: for each launched CTA, the work units
    (``WorkTile``) it runs, in order. ``split_k``: None or ``(k_tiles, requested splits)``; the
    count is clamped as the kernel clamps it (``effective_splits``)."""
    cluster_m, cluster_n = cluster
    per_cluster = cluster_m * cluster_n
    rows = group_rows(group, cluster_m)
    if split_k is not None:
        split_k = (split_k[0], effective_splits(split_k[1], split_k[0]))
    problem = (num_m, num_n, num_l)
    total = GroupedTileScheduler(problem, cluster, rows, 1, 0, (0, 0), split_k).total_work
    launched = persistent_cluster_count(total, num_ctas // per_cluster)
    order = []
    for cluster_idx in range(launched):
        for cta_n in range(cluster_n):
            for cta_m in range(cluster_m):
                sched = GroupedTileScheduler(
                    problem, cluster, rows, launched, cluster_idx, (cta_m, cta_n), split_k
                )
                units = []
                unit = sched.initial_work_tile()
                while unit.is_valid:
                    units.append(unit)
                    unit = sched.next_work_tile(unit)
                order.append(units)
    return order
