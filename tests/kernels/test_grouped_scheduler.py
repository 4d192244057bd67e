"""The grouped kernels' schedules (``kernels.common.grouped_scheduler``), replayed on the host:
every tile of every group runs exactly once, on one CTA; a cluster never straddles two groups;
the launch bound holds for any group sizes; ends that decrease or overrun are clamped; the
replay once for all CTAs (``RaggedSchedule``, explain's tile map) is every CTA's own walk. The
ragged-K schedule (2D x 2D): each unit's K slice, an empty group's one all-zero k-tile."""

import math
import random

import pytest

from wsgemm.kernels.common.grouped_scheduler import (
    RaggedSchedule,
    group_k_span,
    ragged_k_unit_order,
    ragged_unit_order,
    unit_bound,
)

# the replays call the DSL's min/max on Python ints many thousand times (conftest.py)
pytestmark = pytest.mark.usefixtures("python_min_max")


def _clamped(ends: list[int], rows: int) -> list[tuple[int, int]]:
    """Each group's [first, end) rows as the kernel reads the ends."""
    out, prev = [], 0
    for e in ends:
        hi = min(max(e, prev), rows)
        out.append((prev, hi))
        prev = hi
    return out


def _fields(order) -> list[list[tuple]]:
    """Each CTA's units as plain values: every field of each ``GroupWorkTile``."""
    return [[(*map(int, u._ints()), bool(u.is_valid)) for u in units] for units in order]


def _check(ends, rows, num_n, tile_m, group, num_ctas, cluster):
    order = ragged_unit_order(ends, rows, num_n, tile_m, group, num_ctas, cluster)
    # the replay once for all CTAs is every CTA's own walk, unit for unit
    fast = RaggedSchedule(ends, rows, num_n, tile_m, group, num_ctas, cluster).order()
    assert _fields(fast) == _fields(order)
    spans = _clamped(ends, rows)
    seen = {}
    for cta, units in enumerate(order):
        for u in units:
            g = int(u.l)
            first, end = spans[g]
            assert (int(u.row0), int(u.row_end)) == (first, end)
            assert u.rows_left(tile_m) > -tile_m * cluster[0]  # at most a ragged cluster's surplus
            assert int(u.n) < -(-num_n // cluster[1]) * cluster[1]
            if u.rows_left(tile_m) > 0 and int(u.n) < num_n:  # else a ragged cluster's surplus
                key = (g, int(u.m), int(u.n))
                assert key not in seen, f"tile {key} runs on CTAs {seen[key]} and {cta}"
                seen[key] = cta
    want = {
        (g, m, n)
        for g, (first, end) in enumerate(spans)
        for m in range(-(-(end - first) // tile_m))
        for n in range(num_n)
    }
    assert set(seen) == want
    # the CTAs of a cluster (consecutive in launch order) run the same units of one group
    size = cluster[0] * cluster[1]
    for c in range(0, len(order), size):
        cluster_units = [[(int(u.work), int(u.l)) for u in order[c + i]] for i in range(size)]
        assert all(units == cluster_units[0] for units in cluster_units)
    return order


@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("tile_m", [64, 128])
def test_every_tile_of_every_group_runs_once(cluster, tile_m):
    rng = random.Random(f"{cluster}{tile_m}")
    for _ in range(12):
        groups = rng.choice([1, 2, 7, 33])
        sizes = [rng.choice([0, 1, 5, tile_m, tile_m + 1, 3 * tile_m - 7]) for _ in range(groups)]
        ends = [sum(sizes[: i + 1]) for i in range(groups)]
        rows = ends[-1] + rng.choice([0, 3])  # rows past the last group stay unwritten
        num_n = rng.choice([1, 3, 4])
        _check(ends, rows, num_n, tile_m, rng.choice([1, 2, 4]) * cluster[0], 16, cluster)


def test_empty_groups_and_no_rows():
    assert all(units == [] for units in ragged_unit_order([0, 0, 0], 0, 2, 128, 8, 8))
    order = _check([0, 10, 10], 10, 2, 128, 8, 8, (1, 1))
    assert sum(len(u) for u in order) == 2


def test_ends_that_decrease_or_overrun_are_clamped():
    """The host cannot check the offsets (they are on the GPU): a decreasing end is an empty
    group, an end past the rows stops at the rows; no tile reaches past them."""
    order = _check([50, 20, 400, 300], 120, 2, 64, 8, 8, (1, 1))
    groups = {int(u.l) for units in order for u in units}
    assert groups == {0, 2}
    assert all(int(u.row_end) <= 120 for units in order for u in units)


@pytest.mark.parametrize("cluster_m", [1, 2])
def test_the_launch_bound_covers_any_group_sizes(cluster_m):
    rng = random.Random(cluster_m)
    for _ in range(200):
        groups, tile_m = rng.randint(1, 40), rng.choice([64, 128])
        sizes = [rng.choice([0, 1, rng.randint(0, 3 * tile_m)]) for _ in range(groups)]
        rows, clusters_n = sum(sizes), rng.randint(1, 5)
        tiles = [math.ceil(s / tile_m) for s in sizes]
        units = sum(math.ceil(t / cluster_m) for t in tiles) * clusters_n
        assert units <= unit_bound(rows, groups, tile_m, cluster_m, clusters_n)


def test_a_cta_walks_its_groups_forward():
    """Each CTA's units are in increasing work order and group order: its cursor only moves
    forward (one read of each group's end per CTA at most)."""
    ends = [3, 200, 200, 260, 900]
    for units in ragged_unit_order(ends, 900, 3, 64, 8, 5):
        works = [int(u.work) for u in units]
        groups = [int(u.l) for u in units]
        assert works == sorted(works) and groups == sorted(groups)


@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
def test_the_schedule_replayed_once_is_every_ctas_walk(cluster):
    """``RaggedSchedule`` (the tile map's replay: the cursor chain once, a unit's group by
    bisection, its coordinates cached) gives each CTA the units its own ``RaggedMScheduler``
    walks (``ragged_unit_order``): random ends, sorted or not, past the rows or negative,
    empty groups, and launches of a few CTAs (fewer than a cluster: none launched) to more
    than the units."""
    rng = random.Random(f"once{cluster}")
    for _ in range(40):
        groups, tile_m = rng.randint(1, 40), rng.choice([64, 128])
        sizes = [rng.choice([0, 0, 1, tile_m - 1, tile_m, rng.randint(0, 6 * tile_m)])
                 for _ in range(groups)]  # fmt: skip
        ends = [sum(sizes[: i + 1]) for i in range(groups)]
        if rng.random() < 0.3:  # ends the host cannot check: decreasing, negative, overrunning
            ends = [e + rng.choice([0, 0, -tile_m, -10 * tile_m, 7 * tile_m]) for e in ends]
        rows = max(ends[-1], 0) + rng.choice([0, 3, 200])
        num_n = rng.randint(1, 9)
        group = rng.choice([1, 2, 8]) * cluster[0]
        num_ctas = rng.choice([1, 2, 5, 16, 132])
        args = (ends, rows, num_n, tile_m, group, num_ctas, cluster)
        schedule = RaggedSchedule(*args)
        order = ragged_unit_order(*args)
        assert _fields(schedule.order()) == _fields(order)
        assert schedule.launched * cluster[0] * cluster[1] == len(order)
        assert sum(len(schedule.works(c)) for c in range(schedule.launched)) * cluster[0] * (
            cluster[1]
        ) == sum(map(len, order))  # fmt: skip


# ----------------------------------------------------------------------------- ragged K (2D x 2D)


class _Offs(list):
    """The offsets as the GPU holds them: an index outside [0, len) is a fault, not Python's
    wrap-around (a missing clamp at group 0 would read offs[-1])."""

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"offs[{i}] read outside the {len(self)} entries")
        return super().__getitem__(i)


def _k_span(ends: list[int], g: int, k_total: int) -> tuple[int, int]:
    """Group g's [lo, hi) of K as the ragged-K kernel reads the ends: each on its own."""
    lo = min(max(ends[g - 1], 0), k_total) if g else 0
    return lo, min(max(ends[g], lo), k_total)


@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
def test_ragged_k_runs_every_output_tile_of_every_group_once(cluster):
    """The ragged-K schedule is the dense one over (groups, M tiles, N tiles): each tile on one
    CTA, a cluster's CTAs on one group together, and each unit's loads start at its group's
    first k, read k-tiles that cover its slice, and stop being real at its end."""
    rng = random.Random(f"k{cluster}")
    for _ in range(12):
        groups, tile_k = rng.choice([1, 2, 7, 23]), rng.choice([64, 128])
        sizes = [rng.choice([0, 1, 7, tile_k, tile_k + 1, 5 * tile_k - 3]) for _ in range(groups)]
        ends = [sum(sizes[: i + 1]) for i in range(groups)]
        k_total = ends[-1] + rng.choice([0, 9])
        num_m, num_n = rng.randint(1, 5), rng.randint(1, 4)
        order = ragged_k_unit_order(_Offs(ends), k_total, num_m, num_n, tile_k, cluster[0], 16,
                                    cluster)  # fmt: skip
        seen = {}
        for cta, units in enumerate(order):
            for u in units:
                key = (int(u.l), int(u.m), int(u.n))
                lo, hi = _k_span(ends, key[0], k_total)
                if hi > lo:
                    assert (u.k_start, u.k_extent) == (lo, hi)
                    assert u.k_end * tile_k >= hi - lo > (u.k_end - 1) * tile_k
                else:  # one k-tile wholly past the extent: zeros
                    assert u.k_end == 1 and u.k_start >= u.k_extent >= 1
                assert u.k_begin == 0 and u.has_k_range and not u.is_split
                if key[1] < num_m and key[2] < num_n:  # else a ragged cluster's surplus
                    assert key not in seen, f"tile {key} runs on CTAs {seen[key]} and {cta}"
                    seen[key] = cta
        assert set(seen) == {(g, m, n) for g in range(groups) for m in range(num_m)
                             for n in range(num_n)}  # fmt: skip
        size = cluster[0] * cluster[1]
        for c in range(0, len(order), size):
            cluster_units = [[(int(u.work), int(u.l)) for u in order[c + i]] for i in range(size)]
            assert all(units == cluster_units[0] for units in cluster_units)


def test_ragged_k_reads_bad_ends_inside_k():
    """Ends that decrease or overrun K garble groups, never reach outside [0, K): every read
    is clamped, and no unit past the schedule reads an offset past the last."""
    ends = [50, 20, 400, -5, 300]
    for units in ragged_k_unit_order(_Offs(ends), 120, 2, 2, 64, 1, 8):
        for u in units:
            assert 0 <= u.k_start <= 120 and 1 <= u.k_extent <= 120
            assert u.k_start + (u.k_end - 1) * 64 < max(u.k_extent, u.k_start + 1) or (
                u.k_end == 1 and u.k_start >= u.k_extent
            )
    # a schedule's unit past the last group (its index clamped, not read past the tensor)
    span = group_k_span(_Offs(ends), 7, len(ends), 120, 64)
    assert span == (120, 120, 1) or span[0] >= span[1]
