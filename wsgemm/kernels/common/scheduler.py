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

A cluster split (``split_rank``, with ``split_k = (k_tiles, ways)``): the cluster's CTAs all
take the cluster's units (plain tiles, as unsplit) and CTA ``r`` of the cluster split ``r`` of
each, its k-tiles as ``split_k_range`` gives them; the partial sums meet in the cluster's
shared memory (``kernels/sm90/cluster_split.py``), not in a workspace.

Stream-K (``stream_k``, a compile-time mode of the split kernel; ``stream_k_layout``): the
launch takes every cluster it may (``P``), and the first ``D`` of the ``W`` cluster tiles run
whole, as above: all ``W // P`` full waves when they are all there is, else all but the last
(``D = (W // P - 1) * P``, so that the shared part holds at least a wave). The k-tiles of the
``r = W - D`` tiles left, ``I = r * T`` of them in tile order, are cut into ``P_sk``
contiguous ranges of (nearly) equal length, one per cluster: a cluster's range may end inside
one tile and the next cluster's begin there. A range's piece inside one tile is a work unit
(tile, K range): cluster ``c`` runs its data-parallel tiles ``c, c + P, ...``, then its
pieces, each the next ``P``-th unit (so the walk stays ``c, c + P, c + 2P, ...`` and every
role steps through it as before). A tile's pieces are its *parts* ``0, 1, ..., parts - 1`` in
K order (parts 1: a tile that one cluster covers whole); the finishing unit sums the parts in
that order, so the bits are fixed by the layout, never by arrival. ``P_sk`` keeps at least
``STREAM_K_MIN_K_TILES`` k-tiles per range. The partial sums live in slots ``slot0 + part``:
``J`` slots per stream-K tile and CTA of the cluster (``stream_k_slots``).

The index arithmetic is written once and runs on plain Python ints (host tests, ``tile_order``)
and on CuTe DSL ``Int32`` values (inside the kernel) alike: it only uses ``+ - * // %``, ``<``,
``cutlass.min``/``max``, which both kinds of value understand, and ``_select``.
"""

from __future__ import annotations

from typing import Any, Protocol

import cutlass

__all__ = [
    "STREAM_K_MIN_K_TILES",
    "GroupedTileScheduler",
    "TileScheduler",
    "WorkTile",
    "MAX_SPLITS",
    "cluster_tile_counts",
    "effective_splits",
    "group_rows",
    "grouped_cluster_coord",
    "persistent_cluster_count",
    "replay",
    "split_k_range",
    "stream_k_layout",
    "stream_k_slots",
    "stream_k_team",
    "tile_order",
    "unit_order",
]

#: The most splits a launch runs: ``(split + 1) * k_tiles`` stays within Int32 for any K below
#: 2^31 / MAX_SPLITS * tile_k, and no realistic problem wants more (the policy picks <= 8).
MAX_SPLITS = 64


#: The fewest k-tiles a stream-K range holds (fewer ranges otherwise): each costs a fix-up of
#: about a microsecond (docs/perf.md entry 20), which a few k-tiles of mainloop should repay.
STREAM_K_MIN_K_TILES = 4


def _ceil_div(a: Any, b: Any) -> Any:
    return (a + b - 1) // b


def _select(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b`` (integers): a Python choice for Python values, an
    ``Int32`` select on the GPU for DSL ones."""
    if isinstance(cond, bool):
        return a if cond else b
    return cutlass.Int32(cutlass.select_(cond, a, b))


def stream_k_layout(work_tiles: Any, k_tiles: Any, max_clusters: Any, team: Any = 1) -> tuple:
    """(P, D, P_sk, I) of a stream-K launch of ``work_tiles`` cluster tiles with ``k_tiles``
    k-tiles each (module docstring): the clusters to launch, the data-parallel tiles (whole
    waves), the teams sharing the rest and the k-tiles they share. At most ``max_clusters``,
    and no more than give each range ``STREAM_K_MIN_K_TILES`` (a tile too short to split runs
    whole). ``team`` (``stream_k_team``): clusters a team, 1 without teams; with teams the
    shared k-tiles are those of the shared *columns* (``team`` tiles each), D a multiple of
    the team (else 0: every tile shared), and P_sk counts teams."""
    # work_tiles is clamped before the product, so it stays below max_clusters * k_tiles
    ranges = cutlass.min(work_tiles, max_clusters) * k_tiles // STREAM_K_MIN_K_TILES
    launched = cutlass.max(cutlass.min(max_clusters, cutlass.max(work_tiles, ranges)), 1)
    # The partial wave shares the k-tiles of one whole wave too, so that every range spans at
    # least a tile's k-tiles and a tile has at most three parts (a partial wave of one tile
    # would otherwise be cut into `launched` parts, summed one after another by one CTA).
    waves = work_tiles // launched
    whole = _select(work_tiles - waves * launched == 0, waves, waves - 1)
    dp_tiles = cutlass.max(whole, 0) * launched
    if _one(team):  # (a team of one compiles to the plain layout's arithmetic, unchanged)
        teams, shared = launched, (work_tiles - dp_tiles) * k_tiles
    else:
        # teams share whole columns: the data-parallel tiles must end on one
        dp_tiles = _select(dp_tiles % team == 0, dp_tiles, 0)
        teams, shared = launched // team, (work_tiles - dp_tiles) // team * k_tiles
    sk_teams = cutlass.max(cutlass.min(teams, shared // STREAM_K_MIN_K_TILES), 1)
    return launched, dp_tiles, sk_teams, shared


def _one(value: Any) -> bool:
    """Whether ``value`` is the Python int 1 (known when the kernel is built, not a DSL value)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == 1


def stream_k_team(clusters_m: Any, rows_per_group: Any, launched: Any) -> Any:
    """Clusters a stream-K team (``Sm90Config.stream_k_teams``, module docstring): the cluster
    rows, which share each B column block, where one raster group holds them all (the walk then
    goes down whole columns, so a column's tiles are consecutive units) and the ``launched``
    clusters make at least one team; else 1."""
    team = _select(rows_per_group >= clusters_m, clusters_m, 1)
    return _select(team <= launched, team, 1)


def stream_k_slots(work_tiles: Any, k_tiles: Any, max_clusters: Any, team: Any = 1) -> tuple:
    """(stream-K tiles, slots per tile and CTA ``J``): the workspace a stream-K launch needs is
    ``tiles * cluster size * J`` partial tiles. A range holds at least ``L = I // P_sk``
    k-tiles, so a tile's T k-tiles meet at most ``T // L + 2`` ranges (with teams: a column's,
    each member's tile of it cut where the column is)."""
    _, dp_tiles, sk_teams, shared = stream_k_layout(work_tiles, k_tiles, max_clusters, team)
    return work_tiles - dp_tiles, _slots_per_tile(k_tiles, sk_teams, shared)


def _slots_per_tile(k_tiles: Any, sk_clusters: Any, shared: Any) -> Any:
    return k_tiles // cutlass.max(shared // sk_clusters, 1) + 2


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

    __slots__ = ("m", "n", "l", "work", "is_valid", "split", "k_begin", "k_end", "parts", "slot0")

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
        parts: Any = None,
        slot0: Any = None,
    ):
        self.m, self.n, self.l, self.work, self.is_valid = m, n, l, work, is_valid
        self.split, self.k_begin, self.k_end = split, k_begin, k_end
        # stream-K only: the tile's part count and the workspace slot of its part 0
        self.parts, self.slot0 = parts, slot0

    @property
    def coord_mnl(self) -> tuple:
        return (self.m, self.n, self.l)

    @property
    def is_split(self) -> bool:
        return self.split is not None

    @property
    def is_stream_k(self) -> bool:
        return self.parts is not None

    @property
    def has_k_range(self) -> bool:
        """Whether the unit names its own k-tiles ``[k_begin, k_end)`` (split-K, stream-K, a
        ragged-K grouped unit) rather than all of K."""
        return self.k_begin is not None

    def _ints(self) -> tuple:
        ints = (self.m, self.n, self.l, self.work)
        if self.is_split:
            ints += (self.split, self.k_begin, self.k_end)
        return ints + ((self.parts, self.slot0) if self.is_stream_k else ())

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
        if self.is_stream_k:
            split += f", parts={self.parts}, slot0={self.slot0}"
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
    arguments set the raster group and the split count). ``stream_k`` (static, with
    ``split_k``): the stream-K schedule instead (module docstring); ``num_clusters`` must then
    be what ``stream_k_layout`` launches, and the split count is not used.
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
        stream_k: bool = False,
        split_rank: Any = None,
        stream_k_teams: bool = False,
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
        self.is_stream_k = bool(stream_k)
        self.is_stream_k_teams = self.is_stream_k and bool(stream_k_teams)
        # A cluster split: every CTA of a cluster runs the cluster's tiles, each its own split
        self.is_cluster_split = split_rank is not None
        if self.is_stream_k and not self.is_split:
            raise ValueError("stream_k needs split_k: (k_tiles, splits)")
        if self.is_cluster_split and (not self.is_split or self.is_stream_k):
            raise ValueError("split_rank needs split_k: (k_tiles, ways), and no stream_k")
        if self.is_cluster_split:
            self.k_tiles, self.splits = split_k
            self.split_rank = split_rank
        elif self.is_split:
            self.k_tiles, self.splits = split_k
            if self.is_stream_k:
                self.team = 1  # (a Python 1 without teams: the plain layout's code)
                if self.is_stream_k_teams:
                    self.team = stream_k_team(self.clusters_m, rows_per_group, num_clusters)
                _, self.dp_tiles, self.sk_clusters, self.shared = stream_k_layout(
                    self.total_work, self.k_tiles, num_clusters, self.team
                )
                self.slots = _slots_per_tile(self.k_tiles, self.sk_clusters, self.shared)
                self.rank = self.cta_n * cluster_mn[0] + self.cta_m
            else:
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
    _DYNAMIC_STREAM_K = ("dp_tiles", "sk_clusters", "shared", "slots", "rank")
    _DYNAMIC_TEAMS = ("team",)  # a run-time team size: only with stream_k_teams
    _DYNAMIC_CLUSTER_SPLIT = ("split_rank",)

    def _fields(self) -> tuple:
        fields = self._DYNAMIC + (self._DYNAMIC_SPLIT if self.is_split else ())
        fields += self._DYNAMIC_CLUSTER_SPLIT if self.is_cluster_split else ()
        fields += self._DYNAMIC_STREAM_K if self.is_stream_k else ()
        return fields + (self._DYNAMIC_TEAMS if self.is_stream_k_teams else ())

    # Let the scheduler be referenced inside dynamic (scf) loops in the DSL.
    def __extract_mlir_values__(self) -> list:
        return [cutlass.Int32(getattr(self, f)).ir_value() for f in self._fields()]

    def __new_from_mlir_values__(self, values: list) -> GroupedTileScheduler:
        new = object.__new__(GroupedTileScheduler)
        new.cluster_mn = self.cluster_mn
        new.is_split = self.is_split
        new.is_stream_k = self.is_stream_k
        new.is_stream_k_teams = self.is_stream_k_teams
        new.is_cluster_split = self.is_cluster_split
        if new.is_stream_k and not new.is_stream_k_teams:
            new.team = 1
        for field, value in zip(self._fields(), values, strict=True):
            setattr(new, field, cutlass.Int32(value))
        return new

    def work_tile(self, work: Any) -> WorkTile:
        """This CTA's unit of linear work unit ``work`` (meaningless when invalid)."""
        if self.is_stream_k:
            return self._stream_k_tile(work)
        tile_work, split = work, None
        if self.is_cluster_split:
            split = self.split_rank
        elif self.is_split:
            tile_work = work // self.splits
            split = work - tile_work * self.splits
        m, n, batch = self._coord(tile_work)
        if not self.is_split:
            return WorkTile(m, n, batch, work, work < self.total_work)
        k_begin, k_end = split_k_range(split, self.splits, self.k_tiles)
        return WorkTile(m, n, batch, work, work < self.total_work, split, k_begin, k_end)

    def _coord(self, tile_work: Any) -> tuple:
        """This CTA's (m, n, batch) output tile of cluster tile ``tile_work`` (grouped order)."""
        cm, cn, batch = grouped_cluster_coord(
            tile_work, self.clusters_m, self.clusters_n, self.group_clusters
        )
        return cm * self.cluster_mn[0] + self.cta_m, cn * self.cluster_mn[1] + self.cta_n, batch

    def _stream_k_tile(self, work: Any) -> WorkTile:
        """Unit ``work`` of the stream-K walk: a data-parallel tile while ``work < D``, else
        piece ``q`` of this cluster's range (module docstring); with teams, of its team's range
        over the shared columns, in its own row of each column."""
        clusters, k_tiles = self.num_clusters, self.k_tiles
        sk_teams, shared, team = self.sk_clusters, self.shared, self.team
        cluster = work % clusters
        piece = work // clusters - self.dp_tiles // clusters
        crew, member = cluster, 0  # this cluster's team, and its row in each column
        if not _one(team):
            crew = cluster // team
            member = cluster - crew * team
        # This team's range [first_k, end_k) of the shared k-tiles (empty past sk_teams).
        first_k = cutlass.min(crew, sk_teams) * shared // sk_teams
        end_k = cutlass.min(crew + 1, sk_teams) * shared // sk_teams
        column = first_k // k_tiles + piece
        lo = cutlass.max(first_k, column * k_tiles)
        hi = cutlass.min(end_k, column * k_tiles + k_tiles)
        # The teams whose ranges hold the column's first and last k-tiles: its tiles' parts.
        whole = cutlass.max(shared, 1)
        first = ((column * k_tiles + 1) * sk_teams - 1) // whole
        last = ((column * k_tiles + k_tiles) * sk_teams - 1) // whole
        sk_tile = column if _one(team) else column * team + member
        # For a data-parallel unit the stream-K values above are meaningless (and may wrap in
        # int32 on the GPU for huge W * T): every one of them is selected away below, and
        # slot0 is never read (parts = 1: no fix-up).
        is_dp = work < self.dp_tiles
        m, n, batch = self._coord(_select(is_dp, work, self.dp_tiles + sk_tile))
        cluster_size = self.cluster_mn[0] * self.cluster_mn[1]
        return WorkTile(
            m,
            n,
            batch,
            work,
            _select(is_dp, 1, hi - lo) > 0,
            _select(is_dp, 0, crew - first),
            _select(is_dp, 0, lo - column * k_tiles),
            _select(is_dp, k_tiles, hi - column * k_tiles),
            _select(is_dp, 1, last - first + 1),
            (sk_tile * cluster_size + self.rank) * self.slots,
        )

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
    stream_k: bool = False,
    cluster_split: int = 1,
    stream_k_teams: bool = False,
) -> list[list[WorkTile]]:
    """:func:`tile_order` with the whole work units: for each launched CTA, the work units
    (``WorkTile``) it runs, in order. ``split_k``: None or ``(k_tiles, requested splits)``; the
    count is clamped as the kernel clamps it (``effective_splits``). ``stream_k`` (with
    ``split_k``): the stream-K schedule, launched as the kernel launches it (``stream_k_teams``:
    in teams). ``cluster_split``
    (with ``split_k = (k_tiles, cluster_split)`` and no other cluster): clusters of that many
    CTAs, CTA r of each its split r of the cluster's tiles (launch order: rank fastest)."""
    if cluster_split > 1:
        if cluster != (1, 1) or stream_k or split_k is None or split_k[1] != cluster_split:
            raise ValueError(
                "a cluster split replays with cluster (1, 1), no stream_k and split_k = "
                f"(k_tiles, {cluster_split})"
            )
        problem = (num_m, num_n, num_l)
        total = num_m * num_n * num_l
        launched = persistent_cluster_count(total, num_ctas // cluster_split)
        rows = group_rows(group, 1)
        # the launch grid's x is the rank: replay's cta_m
        return replay(launched, (cluster_split, 1), lambda cluster_idx, cta_mn: (
            GroupedTileScheduler(problem, (1, 1), rows, launched, cluster_idx, (0, 0), split_k,
                                 split_rank=cta_mn[0])
        ))  # fmt: skip
    cluster_m, cluster_n = cluster
    per_cluster = cluster_m * cluster_n
    rows = group_rows(group, cluster_m)
    if split_k is not None:
        split_k = (split_k[0], effective_splits(split_k[1], split_k[0]))
    problem = (num_m, num_n, num_l)
    # the units to launch for: split units, or (stream-K) the cluster tiles the layout shares
    total = GroupedTileScheduler(problem, cluster, rows, 1, 0, (0, 0), split_k, stream_k).total_work
    clusters = num_ctas // per_cluster
    if stream_k:
        launched = stream_k_layout(total, split_k[0], clusters)[0]
    else:
        launched = persistent_cluster_count(total, clusters)
    return replay(launched, cluster, lambda cluster_idx, cta_mn: GroupedTileScheduler(
        problem, cluster, rows, launched, cluster_idx, cta_mn, split_k, stream_k,
        stream_k_teams=stream_k_teams,
    ))  # fmt: skip


def replay(launched: int, cluster: tuple[int, int], scheduler: Any) -> list[list[WorkTile]]:
    """For each CTA of ``launched`` clusters of shape ``cluster`` (launch-grid order, x
    fastest), the units its schedule walks: ``scheduler(cluster_idx, (cta_m, cta_n))`` makes
    that CTA's scheduler (host values)."""
    order = []
    for cluster_idx in range(launched):
        for cta_n in range(cluster[1]):
            for cta_m in range(cluster[0]):
                sched = scheduler(cluster_idx, (cta_m, cta_n))
                units = []
                unit = sched.initial_work_tile()
                while unit.is_valid:
                    units.append(unit)
                    unit = sched.next_work_tile(unit)
                order.append(units)
    return order
