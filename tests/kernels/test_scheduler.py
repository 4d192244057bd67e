"""The persistent tile schedule, replayed on the host with the kernel's own index arithmetic."""

import builtins
import collections
import itertools

import cutlass
import pytest

from wsgemm.kernels.common.scheduler import (
    MAX_SPLITS,
    STREAM_K_MIN_K_TILES,
    GroupedTileScheduler,
    effective_splits,
    group_rows,
    grouped_cluster_coord,
    persistent_cluster_count,
    split_k_range,
    stream_k_layout,
    stream_k_slots,
    stream_k_team,
    tile_order,
    unit_order,
)

pytestmark = pytest.mark.usefixtures("python_min_max")
# the DSL's own, whatever the fixture does to ``cutlass.min``/``max`` (read at import)
DSL_MIN, DSL_MAX = cutlass.min, cutlass.max


def test_the_dsl_min_max_of_ints_are_pythons():
    """What the ``python_min_max`` fixture (conftest.py) relies on."""
    values = [-(2**40), -7, -1, 0, 1, 2, 3, 64, 131, 132, 2**40]
    for dsl, python in ((DSL_MIN, builtins.min), (DSL_MAX, builtins.max)):
        for args in itertools.chain(
            itertools.product(values, repeat=2), itertools.product(values[::3], repeat=3)
        ):
            got = dsl(*args)
            assert type(got) is int and got == python(*args), (python, args)


# (num_m, num_n, L): square, ragged, one row, one column, one tile, batched.
PROBLEMS = [(1, 1, 1), (7, 5, 1), (16, 16, 1), (1, 9, 2), (9, 1, 3), (13, 11, 2), (4, 6, 5)]
GROUPS = [1, 2, 4, 8]
CTAS = [1, 2, 3, 8, 132]
CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2)]


def _reference_order(clusters_m, clusters_n, num_l, group):
    """The specified grouped order, written the obvious way: per batch, per group of `group`
    cluster-rows, each column walked down the group's rows, columns left to right."""
    order = []
    for batch in range(num_l):
        for first in range(0, clusters_m, group):
            rows = range(first, min(first + group, clusters_m))
            for n in range(clusters_n):
                order.extend((m, n, batch) for m in rows)
    return order


@pytest.mark.parametrize(
    "ctas, cluster",
    [(c, cl) for c in CTAS for cl in CLUSTERS if c >= cl[0] * cl[1]],
)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_tile_exactly_once(problem, group, ctas, cluster):
    num_m, num_n, num_l = problem
    cm, cn = cluster
    group *= cm  # the raster group counts m-tiles and must hold whole clusters
    order = tile_order(num_m, num_n, num_l, group, ctas, cluster)
    assert len(order) % (cm * cn) == 0 and len(order) <= ctas
    visited = [t for per_cta in order for t in per_cta]
    inside = [(m, n, b) for m, n, b in visited if m < num_m and n < num_n]
    expected = set(itertools.product(range(num_m), range(num_n), range(num_l)))
    assert len(inside) == len(set(inside)) == len(expected)
    assert set(inside) == expected
    # Tiles past the edge only come from clusters overhanging a ragged edge.
    for m, n, b in visited:
        assert b < num_l
        assert m < -(-num_m // cm) * cm and n < -(-num_n // cn) * cn
    # The CTAs of one cluster run the same number of tiles (they leave the loop together),
    # on adjacent tiles of one cluster tile.
    for c in range(len(order) // (cm * cn)):
        members = order[c * cm * cn : (c + 1) * cm * cn]
        assert len({len(tiles) for tiles in members}) == 1
        for step in zip(*members, strict=True):
            bases = {(m - i % cm, n - i // cm, b) for i, (m, n, b) in enumerate(step)}
            assert len(bases) == 1
            base_m, base_n, _ = bases.pop()
            assert base_m % cm == 0 and base_n % cn == 0


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_grouped_order_is_the_specified_one(problem, group):
    num_m, num_n, num_l = problem
    (single,) = tile_order(num_m, num_n, num_l, group, 1)
    assert single == _reference_order(num_m, num_n, num_l, group)


@pytest.mark.parametrize("group", [2, 4])
def test_clusters_follow_the_grouped_order_in_cluster_units(group):
    num_m, num_n, num_l, cluster = 7, 5, 2, (2, 1)
    per_cta = tile_order(num_m, num_n, num_l, group, 2, cluster)
    leader = [(m // 2, n, b) for m, n, b in per_cta[0]]
    assert leader == _reference_order(4, 5, 2, group // 2)


def test_persistent_ctas_take_turns_in_order():
    # With P clusters, work unit w goes to cluster w % P: CTA 0 takes units 0, P, 2P, ...
    order = tile_order(4, 4, 1, 2, 3)
    reference = _reference_order(4, 4, 1, 2)
    for cta, tiles in enumerate(order):
        assert tiles == reference[cta::3]


def test_grid_is_min_of_work_and_resident_clusters():
    assert persistent_cluster_count(10, 132) == 10
    assert persistent_cluster_count(1000, 132) == 132
    assert len(tile_order(3, 3, 1, 1, 132)) == 9
    assert len(tile_order(3, 3, 1, 2, 132, (2, 1))) == 2 * 2 * 3


def test_last_group_may_be_short():
    # 5 rows in groups of 2: rows 4 alone form the last group, walked along n.
    coords = [grouped_cluster_coord(w, 5, 3, 2) for w in range(15)]
    assert coords[12:] == [(4, 0, 0), (4, 1, 0), (4, 2, 0)]


@pytest.mark.parametrize("group", [3, 0, -2, 2.0])
def test_raster_group_must_hold_whole_clusters(group):
    with pytest.raises(ValueError, match="multiple of cluster_m"):
        group_rows(group, 2)
    with pytest.raises(ValueError, match="multiple of cluster_m"):
        tile_order(4, 4, 1, group, 1, (2, 1))


def test_scheduler_takes_the_group_in_cluster_rows():
    sched = GroupedTileScheduler((4, 4, 1), (2, 1), group_rows(4, 2), 1, 0, (0, 0))
    assert sched.group_clusters == 2


# ---------------------------------------------------------------------------------------------
# Split-K: work units are (cluster tile, split) pairs, each with its own k-range


def test_split_ranges_are_even_ordered_and_cover_k_once():
    for k_tiles in (1, 2, 3, 7, 64, 100, 225):
        for requested in (1, 2, 3, 4, 5, 8, 64, 1000):
            splits = effective_splits(requested, k_tiles)
            assert 1 <= splits <= min(requested, k_tiles, MAX_SPLITS)
            ranges = [split_k_range(s, splits, k_tiles) for s in range(splits)]
            assert ranges[0][0] == 0 and ranges[-1][1] == k_tiles
            assert all(end == begin for (_, end), (begin, _) in itertools.pairwise(ranges))
            lengths = {end - begin for begin, end in ranges}
            assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


SPLIT_PROBLEMS = [(1, 1, 1), (1, 8, 1), (7, 5, 1), (1, 9, 2), (3, 4, 3)]
# (k_tiles, requested splits): divisible, not divisible, K shorter than splits x tile_k
SPLIT_K = [(16, 2), (7, 3), (10, 4), (3, 8), (1, 4), (225, 8), (5, 5)]


@pytest.mark.parametrize(
    "ctas, cluster",
    [(c, cl) for c in (1, 3, 132) for cl in CLUSTERS if c >= cl[0] * cl[1]],
)
@pytest.mark.parametrize("k_tiles, requested", SPLIT_K)
@pytest.mark.parametrize("problem", SPLIT_PROBLEMS)
def test_split_units_cover_each_tile_k_range_exactly_once(
    problem, k_tiles, requested, ctas, cluster
):
    num_m, num_n, num_l = problem
    cm, cn = cluster
    order = unit_order(num_m, num_n, num_l, 2 * cm, ctas, cluster, (k_tiles, requested))
    splits = effective_splits(requested, k_tiles)
    covered = {}
    for per_cta in order:
        for u in per_cta:
            assert u.k_end > u.k_begin, "an empty unit"
            assert (u.k_begin, u.k_end) == split_k_range(u.split, splits, k_tiles)
            if u.m < num_m and u.n < num_n:
                covered.setdefault(u.coord_mnl, []).extend(range(u.k_begin, u.k_end))
    tiles = set(itertools.product(range(num_m), range(num_n), range(num_l)))
    assert set(covered) == tiles
    for ks in covered.values():
        assert sorted(ks) == list(range(k_tiles)), "each k-tile of each tile exactly once"
    # The CTAs of a cluster run the same units: same split, same k-range, adjacent tiles.
    for c in range(len(order) // (cm * cn)):
        members = order[c * cm * cn : (c + 1) * cm * cn]
        assert len({len(units) for units in members}) == 1
        for step in zip(*members, strict=True):
            assert len({(u.split, u.k_begin, u.k_end, u.work) for u in step}) == 1


def _pingpong_walk(units):
    """Replays the kernel's ring for one ping-pong CTA: the producer fills one stage per k-tile,
    unit after unit; warpgroup w runs units w, w + 2, ..., starting past the k-tiles of the
    units before its first and skipping, after each of its units, the next unit's own k-tiles
    (``mma_and_epilogue``). Returns, per unit, the ring positions the consumer read."""
    produced, position = [], 0
    for u in units:
        produced.append(list(range(position, position + u.k_end - u.k_begin)))
        position += u.k_end - u.k_begin
    consumed = {}
    for wg in (0, 1):
        position = sum(u.k_end - u.k_begin for u in units[:wg])  # the first unit's, for wg 1
        for j in range(wg, len(units), 2):
            count = units[j].k_end - units[j].k_begin
            consumed[j] = list(range(position, position + count))
            position += count
            if j + 1 < len(units):
                position += units[j + 1].k_end - units[j + 1].k_begin
    return produced, consumed


@pytest.mark.parametrize("ctas", [1, 2, 5])
@pytest.mark.parametrize("k_tiles, requested", SPLIT_K)
def test_pingpong_warpgroups_read_the_stages_of_their_own_units(k_tiles, requested, ctas):
    """Units of one CTA have different k counts (the split is as even as possible, not even):
    each warpgroup must skip exactly the other's stages."""
    for per_cta in unit_order(3, 5, 2, 2, ctas, (1, 1), (k_tiles, requested)):
        produced, consumed = _pingpong_walk(per_cta)
        assert [consumed[j] for j in range(len(per_cta))] == produced


def test_unsplit_schedule_carries_no_k_range():
    (units,) = unit_order(2, 3, 1, 2, 1)
    assert all(not u.is_split and u.k_begin is None for u in units)
    assert [u.coord_mnl for u in units] == tile_order(2, 3, 1, 2, 1)[0]


# ----------------------------------------------------------------------------- stream-K

# (num_m, num_n, L, k_tiles, CTAs resident): partial waves of every size, fewer tiles than SMs,
# one tile, K of one k-tile, a batch, a small GPU.
STREAM_K = [
    (9, 8, 1, 64, 132),  # 72 tiles: all stream-K
    (23, 9, 1, 24, 132),  # 207 tiles: one wave whole, 75 tiles shared
    (35, 8, 1, 11, 132),  # 280 tiles: two waves whole, 16 shared
    (16, 16, 1, 64, 132),  # 256 tiles
    (12, 11, 1, 64, 132),  # exactly one wave: no stream-K tile
    (3, 3, 1, 100, 132),
    (1, 1, 1, 1, 132),  # too short to split
    (1, 1, 1, 3, 132),
    (40, 4, 1, 18, 132),
    (5, 7, 3, 9, 8),
    (13, 11, 2, 130, 7),
]


#: A raster group (in m-tiles) holding every cluster row of the STREAM_K problems: the walk
#: goes down whole columns, so stream-K's teams are the cluster rows (``stream_k_team``).
TALL_GROUP = 64


def _stream_k_units(problem, cluster, teams=False):
    num_m, num_n, num_l, k_tiles, ctas = problem
    cm, cn = cluster
    group = TALL_GROUP * cm if teams else 2 * cm
    return unit_order(num_m, num_n, num_l, group, ctas, cluster, (k_tiles, 1), stream_k=True,
                      stream_k_teams=teams)  # fmt: skip


@pytest.mark.parametrize("teams", [False, True], ids=["ranges", "teams"])
@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("problem", STREAM_K, ids=str)
def test_stream_k_units_cover_each_tile_k_range_once_in_numbered_parts(problem, cluster, teams):
    num_m, num_n, num_l, k_tiles, ctas = problem
    cm, cn = cluster
    order = _stream_k_units(problem, cluster, teams)
    clusters_m = -(-num_m // cm)
    work_tiles = clusters_m * -(-num_n // cn) * num_l
    launched = stream_k_layout(work_tiles, k_tiles, ctas // (cm * cn))[0]
    team = stream_k_team(clusters_m, TALL_GROUP, launched) if teams else 1
    sk_tiles, per_tile = stream_k_slots(work_tiles, k_tiles, ctas // (cm * cn), team)
    words = sk_tiles * cm * cn * per_tile  # partial tiles in the workspace
    parts, slots = {}, set()
    for per_cta in order:
        for u in per_cta:
            assert u.is_valid and 0 <= u.k_begin < u.k_end <= k_tiles, u
            parts.setdefault(u.coord_mnl, []).append(u)
            if u.parts > 1:  # stores a partial: its own slot, inside the workspace
                assert 0 <= u.slot0 and u.slot0 + u.parts <= words
                assert u.slot0 + u.split not in slots
                slots.add(u.slot0 + u.split)
    # every tile (those past a ragged cluster edge included), its parts 0..parts-1 in K order
    tiles = set(
        itertools.product(range(-(-num_m // cm) * cm), range(-(-num_n // cn) * cn), range(num_l))
    )
    assert set(parts) == tiles
    for units in parts.values():
        units.sort(key=lambda u: u.split)
        assert [u.split for u in units] == list(range(units[0].parts))
        assert {(u.parts, u.slot0) for u in units} == {(units[0].parts, units[0].slot0)}
        assert [u.k_begin for u in units] == [0] + [u.k_end for u in units[:-1]]
        assert units[-1].k_end == k_tiles
    # The CTAs of a cluster run the same units: same part, same k-range, adjacent tiles.
    for c in range(len(order) // (cm * cn)):
        members = order[c * cm * cn : (c + 1) * cm * cn]
        assert len({len(units) for units in members}) == 1
        for step in zip(*members, strict=True):
            assert len({(u.split, u.parts, u.k_begin, u.k_end, u.work) for u in step}) == 1


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("problem", STREAM_K, ids=str)
def test_a_stream_k_team_reads_one_column_at_one_k(problem, cluster):
    """``Sm90Config.stream_k_teams`` (docs/perf.md entry 105): the clusters that share a B
    column block (the cluster rows) take one range over the shared columns together, member r
    in row r, so at every step they run the same k-range of tiles of one column: a B slice is
    read by all of them at once, not at k-offsets a range apart. Past the teams (the clusters
    left over by the team size, or idle for want of k-tiles) a cluster runs its whole tiles
    only; the shared k-tiles are split within one k-tile of even over the teams."""
    num_m, num_n, num_l, k_tiles, ctas = problem
    cm, cn = cluster
    clusters_m = -(-num_m // cm)
    order = _stream_k_units(problem, cluster, teams=True)
    per_cluster = cm * cn
    launched = len(order) // per_cluster
    work_tiles = clusters_m * -(-num_n // cn) * num_l
    team = stream_k_team(clusters_m, TALL_GROUP, launched)
    assert team == (clusters_m if clusters_m <= launched else 1)
    got = stream_k_layout(work_tiles, k_tiles, ctas // per_cluster, team)
    assert got[0] == launched and got[1] % team == 0 and got[1] % launched == 0
    _, dp_tiles, sk_teams, shared = got
    assert shared == (work_tiles - dp_tiles) // team * k_tiles
    waves = dp_tiles // launched
    firsts = [order[c * per_cluster] for c in range(launched)]  # each cluster's first CTA
    for t in range(launched // team):
        members = firsts[t * team : (t + 1) * team]
        pieces = [[u for u in units[waves:]] for units in members]
        assert len({len(p) for p in pieces}) == 1
        for r, piece in enumerate(zip(*pieces, strict=True)):
            assert len({(u.split, u.parts, u.k_begin, u.k_end, u.n, u.l) for u in piece}) == 1
            if team > 1:  # (a team of one: the plain layout's cluster, any row)
                assert [u.m // cm for u in piece] == list(range(team)), (t, r, piece)
        load = sum(u.k_end - u.k_begin for u in pieces[0])
        if t < sk_teams:
            assert shared // sk_teams <= load <= -(-shared // sk_teams)
        else:
            assert load == 0
    for units in firsts[(launched // team) * team :]:
        assert len(units) == waves and all(u.parts == 1 for u in units)


@pytest.mark.parametrize("work_tiles, team", [(96, 3), (160, 5), (264, 2), (133, 7), (80, 4)])
@pytest.mark.parametrize("k_tiles", [4, 64, 700])
def test_a_team_layout_ends_its_whole_waves_on_a_column(work_tiles, team, k_tiles):
    """With teams the data-parallel tiles are whole waves that end on a whole column (else
    none: every tile shared), and the kernel's relaunch recomputes the same layout."""
    first = stream_k_layout(work_tiles, k_tiles, 66, team)
    launched, dp_tiles, sk_teams, shared = first
    assert stream_k_layout(work_tiles, k_tiles, launched, team) == first
    assert dp_tiles % launched == 0 and dp_tiles % team == 0
    assert shared == (work_tiles - dp_tiles) // team * k_tiles
    assert 1 <= sk_teams <= max(launched // team, 1)
    plain = stream_k_layout(work_tiles, k_tiles, 66)
    assert dp_tiles in (plain[1], 0)


def test_the_team_is_the_cluster_rows_when_one_raster_group_holds_them():
    assert stream_k_team(3, 8, 66) == 3 and stream_k_team(8, 8, 66) == 8
    assert stream_k_team(9, 8, 66) == 1  # the walk crosses columns before it finishes one
    assert stream_k_team(13, 64, 7) == 1  # fewer clusters than one team


@pytest.mark.parametrize("problem", STREAM_K, ids=str)
def test_stream_k_balances_the_k_tiles_over_the_clusters(problem):
    num_m, num_n, num_l, k_tiles, ctas = problem
    order = _stream_k_units(problem, (1, 1))
    loads = [sum(u.k_end - u.k_begin for u in units) for units in order]
    total = num_m * num_n * num_l * k_tiles
    assert sum(loads) == total
    launched, dp_tiles, sk_clusters, shared = stream_k_layout(num_m * num_n * num_l, k_tiles, ctas)
    assert len(order) == launched <= ctas
    # whole waves of tiles, then the shared k-tiles split within one k-tile of even
    waves = dp_tiles // launched
    for c, load in enumerate(loads):
        share = load - waves * k_tiles
        if c < sk_clusters:
            assert shared // sk_clusters <= share <= -(-shared // sk_clusters)
        else:
            assert share == 0
    # a range holds STREAM_K_MIN_K_TILES k-tiles, unless the whole problem has fewer
    if shared >= STREAM_K_MIN_K_TILES:
        assert shared // sk_clusters >= STREAM_K_MIN_K_TILES
    # the busiest cluster carries no more than the data-parallel schedule's busiest would
    assert max(loads) <= -(-(num_m * num_n * num_l) // launched) * k_tiles


@pytest.mark.parametrize("teams", [False, True], ids=["ranges", "teams"])
@pytest.mark.parametrize("problem", STREAM_K, ids=str)
def test_stream_k_validity_never_comes_back(problem, teams):
    """Ping-pong's consumers step by two units and the producer by one: once a unit is past
    the end, every later one must be too, or a warpgroup would run a unit the producer never
    loaded."""
    num_m, num_n, num_l, k_tiles, ctas = problem
    launched = stream_k_layout(num_m * num_n * num_l, k_tiles, ctas)[0]
    rows = TALL_GROUP if teams else 2
    for c in range(launched):
        sched = GroupedTileScheduler(
            (num_m, num_n, num_l), (1, 1), rows, launched, c, (0, 0), (k_tiles, 1),
            stream_k=True, stream_k_teams=teams,
        )  # fmt: skip
        tiles = [sched.work_tile(c + i * launched) for i in range(40)]
        valid = [t.is_valid for t in tiles]
        assert valid == sorted(valid, reverse=True)
        units = tiles[: valid.count(True)]
        produced, consumed = _pingpong_walk(units)
        assert [consumed[j] for j in range(len(units))] == produced


@pytest.mark.parametrize("work_tiles", [1, 5, 72, 131, 132, 133, 207, 264, 10_000])
@pytest.mark.parametrize("k_tiles", [1, 3, 4, 24, 700])
def test_stream_k_layout_is_what_the_kernel_relaunches(work_tiles, k_tiles):
    """The kernel recomputes the layout from the clusters it was launched with: the same."""
    first = stream_k_layout(work_tiles, k_tiles, 132)
    assert stream_k_layout(work_tiles, k_tiles, first[0]) == first
    launched, dp_tiles, sk_clusters, shared = first
    assert dp_tiles % launched == 0 and 0 <= work_tiles - dp_tiles < 2 * launched
    assert shared == (work_tiles - dp_tiles) * k_tiles and 1 <= sk_clusters <= launched
    if work_tiles % launched:  # a partial wave: it shares the k-tiles of a whole one too
        assert work_tiles - dp_tiles == work_tiles % launched + launched * (work_tiles > launched)
    else:
        assert dp_tiles == work_tiles and shared == 0


@pytest.mark.parametrize("work_tiles", [133, 134, 197, 265, 1000])
@pytest.mark.parametrize("k_tiles", [4, 64, 700])
def test_a_stream_k_tile_has_at_most_three_parts_past_one_wave(work_tiles, k_tiles):
    """One tile more than a wave must not be cut into a part per cluster (summed one after
    another by its finisher): the shared region holds a whole wave besides."""
    launched = stream_k_layout(work_tiles, k_tiles, 132)[0]
    parts = set()
    for c in range(launched):
        sched = GroupedTileScheduler(
            (work_tiles, 1, 1), (1, 1), 1, launched, c, (0, 0), (k_tiles, 1), stream_k=True
        )
        unit = sched.initial_work_tile()
        while unit.is_valid:
            parts.add(unit.parts)
            unit = sched.next_work_tile(unit)
    assert max(parts) <= 3


def test_stream_k_needs_the_split_path():
    with pytest.raises(ValueError, match="stream_k needs split_k"):
        GroupedTileScheduler((2, 2, 1), (1, 1), 1, 4, 0, (0, 0), None, stream_k=True)


@pytest.mark.parametrize("seed", range(12))
def test_cluster_split_units_cover_each_tile_k_range_once_in_rank_order(seed):
    """A cluster split (``split_rank``): for random grids, resident CTA counts, groups and
    ways, every (tile, k-tile) is run exactly once; the CTAs of one cluster walk the same tiles
    in the same order, rank r taking split r (so rank 0 holds part 0 and the sum runs in rank
    order); no CTA's k-range is empty while ways <= k-tiles."""
    import random

    rng = random.Random(seed)
    ways = rng.choice([2, 4])
    num_m, num_n, num_l = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 3)
    k_tiles = rng.randint(ways, 40)
    ctas = ways * rng.randint(1, 20)
    group = rng.choice([1, 2, 3, 8, 16])
    order = unit_order(num_m, num_n, num_l, group, ctas, split_k=(k_tiles, ways),
                       cluster_split=ways)  # fmt: skip
    seen = collections.Counter()
    for cluster in range(len(order) // ways):
        ranks = order[cluster * ways : (cluster + 1) * ways]
        tiles = [[u.coord_mnl for u in units] for units in ranks]
        assert all(t == tiles[0] for t in tiles), "a cluster's CTAs walk different tiles"
        for rank, units in enumerate(ranks):
            for u in units:
                assert u.split == rank and u.k_begin < u.k_end
                assert (u.k_begin, u.k_end) == split_k_range(rank, ways, k_tiles)
                for k in range(u.k_begin, u.k_end):
                    seen[(*u.coord_mnl, k)] += 1
    assert len(order) % ways == 0
    assert len(seen) == num_m * num_n * num_l * k_tiles and set(seen.values()) == {1}


def test_a_cluster_split_replays_only_as_its_kernel_launches():
    with pytest.raises(ValueError, match="cluster split"):
        unit_order(2, 2, 1, 8, 8, cluster=(2, 1), split_k=(8, 2), cluster_split=2)
    with pytest.raises(ValueError, match="cluster split"):
        unit_order(2, 2, 1, 8, 8, split_k=(8, 4), cluster_split=2)
    with pytest.raises(ValueError, match="split_rank needs split_k"):
        GroupedTileScheduler((2, 2, 1), (1, 1), 8, 4, 0, (0, 0), split_rank=1)
