"""``scripts/grouped_tile_costs.py``: a grouped recording's units sorted into whole, ragged and
empty tiles by their group's rows, and their times summed per kind."""

import itertools

import pytest
from script_modules import load
from trace_fixture import pack, pingpong_meta, pingpong_run

from wsgemm.trace_format import Role
from wsgemm.tracing import decode

tile_costs = load("grouped_tile_costs")


def test_units_are_whole_ragged_or_empty_by_their_groups_rows():
    # two groups (B's batch is the group): rows [0, 200) and [200, 456), 128-row tiles
    recs = pingpong_run(tiles=(2, 3, 2))
    d = decode(pack(recs, meta=pingpong_meta(tiles=(2, 3, 2), groups=[200, 456])))
    units = d.units()
    kinds = tile_costs.unit_kinds(units, [200, 456], 128)
    for unit, kind in zip(units, kinds, strict=True):
        g, m = int(unit["tile_l"]), int(unit["tile_m"])
        ragged = (g, m) == (0, 1)  # 72 of group 0's rows; every other tile is whole
        assert tile_costs.KINDS[kind] == ("ragged" if ragged else "whole")
    # a group of 100 rows: tile 1 is past its rows (an empty CTA of a cluster row)
    assert list(tile_costs.unit_kinds(units[:0], [100], 128)) == []
    empty = units.copy()[:1]
    empty["tile_l"], empty["tile_m"] = 0, 1
    assert tile_costs.KINDS[tile_costs.unit_kinds(empty, [100], 128)[0]] == "empty"

    found = tile_costs.summarize(d)
    consumer_units = 2 * 3 * 2  # the producer's fetches are not counted
    assert found["whole"]["units"] + found["ragged"]["units"] == consumer_units
    assert found["ragged"]["units"] == 3  # tile (1, n, 0) for each of the 3 column tiles
    for v in found.values():
        assert v["unit_us"] > v["epilogue_us"] > 0
        assert v["tiles"] == v["units"]  # ping-pong: one warpgroup fetches a tile
    # a unit's time runs to its recorder's next fetch; a recorder's last unit has none and is
    # left out (not timed to the recorder's end)
    consumer = d.recorders["role"][units["rec"]] == int(Role.CONSUMER)
    expected = {"whole": 0.0, "ragged": 0.0}
    for rec in set(units["rec"][consumer].tolist()):
        mine = sorted((float(u["t"]), int(k)) for u, k in zip(units, kinds, strict=True)
                      if u["rec"] == rec)  # fmt: skip
        for (t, k), (t_next, _) in itertools.pairwise(mine):
            expected[tile_costs.KINDS[k]] += (t_next - t) / 1e3
    for kind, total in expected.items():
        assert found[kind]["unit_us_sum"] == pytest.approx(total)

    # a cooperative tile is fetched by both consumer warpgroups: tiles, not warpgroup-units
    meta = pingpong_meta(tiles=(2, 3, 2), groups=[200, 456], consumers_per_tile=2)
    halved = tile_costs.summarize(decode(pack(recs, meta=meta)))
    assert [v["tiles"] for v in halved.values()] == [v["units"] // 2 for v in halved.values()]


def test_the_probes_patterns_keep_the_rows_and_differ_where_groups_start_and_end():
    """``moe_skew_probe.patterns`` (which ``grouped_tile_costs`` traces too): every pattern
    holds the skewed draw's rows in as many groups, but ``aligned`` (rounded up to whole
    256-row cluster rows); ``shifted`` moves the starts off the 128-row grid with whole tiles,
    ``ragged`` ends every group but the last 64 rows into a tile."""
    skewed = (700, 100, 3000, 300)
    found = load("moe_skew_probe").patterns(skewed, 1025)
    assert found["skewed"] == skewed and found["sorted"] == (3000, 700, 300, 100)
    assert found["aligned"] == (768, 256, 3072, 512)
    for name in ("balanced", "shifted", "ragged"):
        assert len(found[name]) == 4 and sum(found[name]) == 4 * 1025
    assert found["balanced"] == (1025,) * 4
    assert found["shifted"] == (1089, 1025, 1025, 961)
    assert found["ragged"] == (961, 961, 961, 1217)
