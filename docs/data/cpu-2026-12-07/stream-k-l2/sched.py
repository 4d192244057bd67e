"""Work-unit schedules for the L2 simulation.

A schedule is a list over clusters; each cluster's list holds units
    Unit(cm, n, k0, k1, tile, part, parts)
where cm is the cluster-row (the cluster's CTAs run m = cm*cluster_m + r), n the n-tile,
[k0, k1) the k-tiles, tile a key of the cluster tile, part/parts its stream-K part numbering.

`existing(...)` replays the kernel's own scheduler (wsgemm.kernels.common.scheduler.unit_order,
imported read-only from the checkout this folder sits in); the others are the alternatives this study evaluates.
"""

from __future__ import annotations

import sys
from collections import namedtuple

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from wsgemm.kernels.common.scheduler import (  # noqa: E402
    grouped_cluster_coord,
    stream_k_layout,
    unit_order,
)

Unit = namedtuple("Unit", "cm n k0 k1 tile part parts")


def cdiv(a, b):
    return -(-a // b)


class Problem:
    def __init__(self, M, N, K, tile=(128, 256, 64), cluster_m=2, sms=132):
        self.M, self.N, self.K = M, N, K
        self.tm, self.tn, self.tk = tile
        self.cluster_m = cluster_m
        self.sms = sms
        self.num_m = cdiv(M, self.tm)
        self.num_n = cdiv(N, self.tn)
        self.T = cdiv(K, self.tk)
        self.cms = cdiv(self.num_m, cluster_m)  # cluster rows
        self.W = self.cms * self.num_n  # cluster tiles
        self.P = sms // cluster_m  # clusters resident at once

    def __str__(self):
        return f"{self.M}x{self.N}x{self.K}"


def existing(p: Problem, group_mtiles=16, stream_k=False):
    """The kernel's own schedule (unit_order), converted to per-cluster unit lists."""
    split = (p.T, 1) if stream_k else None
    order = unit_order(p.num_m, p.num_n, 1, group_mtiles, p.sms, (p.cluster_m, 1), split, stream_k)
    clusters = []
    for c in range(len(order) // p.cluster_m):
        members = order[c * p.cluster_m:(c + 1) * p.cluster_m]
        units = []
        for step in zip(*members, strict=True):
            u0 = step[0]
            assert len({(u.n, u.k_begin, u.k_end, u.work) for u in step}) == 1
            assert [u.m for u in step] == [u0.m + r for r in range(p.cluster_m)]
            cm = u0.m // p.cluster_m
            if stream_k:
                k0, k1, part, parts = u0.k_begin, u0.k_end, u0.split, u0.parts
            else:
                k0, k1, part, parts = 0, p.T, 0, 1
            units.append(Unit(cm, u0.n, k0, k1, (cm, u0.n), part, parts))
        clusters.append(units)
    return clusters


def _dp_prefix(p: Problem, dp_tiles, group_rows, launched):
    """Cluster c's whole tiles c, c+P, ... below dp_tiles, grouped raster."""
    clusters = [[] for _ in range(launched)]
    for w in range(dp_tiles):
        cm, n, _ = grouped_cluster_coord(w, p.cms, p.num_n, group_rows)
        clusters[w % launched].append(Unit(cm, n, 0, p.T, (cm, n), 0, 1))
    return clusters


def even_tail(p: Problem, s, group_rows=8, dp_waves=None):
    """(i) Data-parallel waves, then the tiles of the last (partial) wave -- or, with
    dp_waves given, every tile from wave dp_waves on -- split into s equal k-parts. Units in
    the order (tile group of the raster, part, tile): the s parts of the tiles that share a B
    column run at the same time on neighbouring clusters, and parts of one k-range of one
    column are read together. Units are dealt round-robin (unit u -> cluster u % P)."""
    P = p.P
    waves = p.W // P if dp_waves is None else dp_waves
    dp = waves * P
    clusters = _dp_prefix(p, dp, group_rows, P)
    rest = list(range(dp, p.W))
    coords = [grouped_cluster_coord(w, p.cms, p.num_n, group_rows)[:2] for w in rest]
    # column blocks in raster order: tiles sharing n
    cols = []
    for cm, n in coords:
        if not cols or cols[-1][0] != n:
            cols.append((n, []))
        cols[-1][1].append(cm)
    units = []
    for n, cms in cols:
        for part in range(s):
            k0, k1 = part * p.T // s, (part + 1) * p.T // s
            for cm in cms:
                units.append(Unit(cm, n, k0, k1, (cm, n), part, s))
    # deal round-robin after the DP tiles, so cluster c keeps its walk c, c+P, ...
    nclus = max(P, 1)
    out = clusters + [[] for _ in range(nclus - len(clusters))]
    for i, u in enumerate(units):
        out[i % nclus].append(u)
    return out


def _ranges_to_units(tiles, T, ranges):
    """Stream-K: the k-tiles of `tiles` (a list of (cm, n)) laid end to end, cut at
    `ranges` (list of [lo, hi) per cluster). Returns per-range unit lists with part numbers."""
    bounds_per_tile = {}
    per_range = []
    for lo, hi in ranges:
        units = []
        k = lo
        while k < hi:
            t = k // T
            e = min(hi, (t + 1) * T)
            units.append([t, k - t * T, e - t * T])
            bounds_per_tile.setdefault(t, []).append(k - t * T)
            k = e
        per_range.append(units)
    out = []
    for units in per_range:
        lst = []
        for t, k0, k1 in units:
            starts = sorted(bounds_per_tile[t])
            cm, n = tiles[t]
            lst.append(Unit(cm, n, k0, k1, (cm, n), starts.index(k0), len(starts)))
        out.append(lst)
    return out


def aligned_stream_k(p: Problem, group_rows=8, share="B"):
    """(ii) Stream-K in teams: the shared tiles are grouped by the operand they share --
    share="B": the tiles of one B column block (one n, the g cluster rows the raster runs
    together); share="A": the tiles of one A row block (one cluster row, its n-tiles; the
    swap-AB case, where A is the weights) -- a team is g clusters, and the groups' k-tiles
    (group-major, then k) are cut into one contiguous range per team. Member r of a team runs
    tile r of each group its range crosses, so the g clusters that share an operand slice
    read it at the same step. Same D (data-parallel whole waves) as the kernel's
    stream_k_layout. A group with fewer than g tiles (a ragged edge) leaves the surplus
    members idle for that piece."""
    launched, dp_tiles, sk_clusters, shared = stream_k_layout(p.W, p.T, p.P)
    clusters = _dp_prefix(p, dp_tiles, group_rows, launched)
    rest = [grouped_cluster_coord(w, p.cms, p.num_n, group_rows)[:2] for w in range(dp_tiles, p.W)]
    groups = {}
    for cm, n in rest:
        groups.setdefault(n if share == "B" else cm, []).append((cm, n))
    groups = list(groups.values())
    g = max(len(t) for t in groups)
    teams = launched // g
    S = len(groups) * p.T
    teams = max(1, min(teams, S // 4))
    ranges = [(t * S // teams, (t + 1) * S // teams) for t in range(teams)]
    keys = [(i, 0) for i in range(len(groups))]  # unit.cm carries the group index
    team_units = _ranges_to_units(keys, p.T, ranges)
    for t, units in enumerate(team_units):
        for r in range(g):
            c = t * g + r
            for u in units:
                tiles = groups[u.cm]
                if r < len(tiles):
                    cm, n = tiles[r]
                    clusters[c].append(u._replace(cm=cm, n=n, tile=(cm, n)))
    return clusters


def dp_plus_sk_tail(p: Problem, group_rows=8, row_major_tail=True):
    """(iv) Whole waves data-parallel (all of them), then stream-K over the partial wave's
    tiles only (equal ranges over all P clusters). row_major_tail: the tail tiles in row-major
    order (a row of the tail is cut into P/rows ranges, so ranges line up in k across rows when
    P is a multiple of the rows); else the raster's column-first order."""
    P = p.P
    dp = (p.W // P) * P
    clusters = _dp_prefix(p, dp, group_rows, P)
    rest = [grouped_cluster_coord(w, p.cms, p.num_n, group_rows)[:2] for w in range(dp, p.W)]
    if row_major_tail:
        rest.sort()
    S = len(rest) * p.T
    n_ranges = max(1, min(p.P, S // 4))
    ranges = [(c * S // n_ranges, (c + 1) * S // n_ranges) for c in range(n_ranges)]
    units = _ranges_to_units(rest, p.T, ranges)
    clusters += [[] for _ in range(p.P - len(clusters))]
    for c, us in enumerate(units):
        clusters[c] += us
    return clusters


def check(p: Problem, clusters):
    """Every cluster tile's k-tiles covered exactly once, parts numbered in K order."""
    cov = {}
    for units in clusters:
        for u in units:
            cov.setdefault(u.tile, []).append(u)
    assert len(cov) == p.W, (len(cov), p.W)
    for tile, us in cov.items():
        us.sort(key=lambda u: u.k0)
        assert us[0].k0 == 0 and us[-1].k1 == p.T, (tile, us)
        for a, b in zip(us, us[1:]):
            assert a.k1 == b.k0, (tile, us)
        assert [u.part for u in us] == list(range(len(us))), (tile, us)
        assert all(u.parts == len(us) for u in us), (tile, us)
