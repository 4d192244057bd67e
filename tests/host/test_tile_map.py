"""``explain``'s tile map of a grouped call (``host.grouped.tile_map``): the schedule replayed
once for all CTAs (``kernels.common.grouped_scheduler.RaggedSchedule``) draws the map the
per-CTA replay drew (``slow_tile_map``: the map as it was drawn before, every CTA walking its
own ``RaggedMScheduler``), for random offsets; the map names every tile of every group once;
a call of thousands of groups is explained (the per-CTA replay took ~16 ms a group)."""

import random

import pytest
import torch
from op_helpers import tile_map_tiles

import wsgemm
from wsgemm.host.grouped import BACKENDS, GROUPED_BACKENDS, grouped_config, tile_map
from wsgemm.kernels.common.grouped_scheduler import ragged_unit_order
from wsgemm.kernels.sm90.config import DEFAULT_RASTER_GROUP
from wsgemm.support import int_ranges


def slow_tile_map(backend: str, ends: list[int], rows: int, n: int, sm_count: int,
             shown: int = 8) -> list[str]:  # fmt: skip
    """The tile map as ``host.grouped.tile_map`` drew it before ``RaggedSchedule`` (kept as
    it was): every CTA's own walk of its ``RaggedMScheduler`` (``ragged_unit_order``), each
    of its tiles counted."""
    name, config = grouped_config(backend, rows, len(ends))
    cfg = config or BACKENDS[name].config()
    num_n = -(-n // cfg.tile_n)
    order = ragged_unit_order(list(ends), rows, num_n, cfg.tile_m,
                              DEFAULT_RASTER_GROUP[cfg.schedule], sm_count,
                              (cfg.cluster_m, cfg.cluster_n))  # fmt: skip
    ctas: dict[int, set[int]] = {}
    idle: dict[int, int] = {}  # a group's tiles past its rows or N: a cluster's surplus
    units = busiest = 0
    for cta, work in enumerate(order):
        busiest = max(busiest, len(work))
        units += len(work)
        for u in work:
            g = int(u.l)
            ctas.setdefault(g, set()).add(cta)
            if u.rows_left(cfg.tile_m) <= 0 or int(u.n) >= num_n:
                idle[g] = idle.get(g, 0) + 1
    lines = []
    written = 0
    prev = 0
    for g, end in enumerate(ends):
        lo, hi = prev, min(max(end, prev), rows)
        prev = hi
        size = hi - lo
        written += size * n
        if g >= shown:
            continue
        if not size:
            lines.append(f"  group {g}: no rows, no tiles")
            continue
        m_tiles = -(-size // cfg.tile_m)
        last = size - (m_tiles - 1) * cfg.tile_m
        surplus = ""
        if g in idle:
            surplus = f" (+{idle[g]} computed and not stored: its clusters' surplus)"
        lines.append(
            f"  group {g}: rows {lo}-{hi - 1} ({size}): {m_tiles} x {num_n} tiles{surplus}, its "
            f"last m-tile {last}/{cfg.tile_m} rows; CTAs {int_ranges(sorted(ctas.get(g, ())))}"
        )
    if len(ends) > shown:
        lines.append(f"  ... {len(ends) - shown} more groups")
    computed = units * cfg.tile_m * cfg.tile_n
    padded = 1 - written / computed if computed else 0.0
    head = (
        f"tile map (offs read on the host, from a CPU tensor): {units} tiles of "
        f"{cfg.tile_m}x{cfg.tile_n} computed over {len(order)} CTAs, the busiest running "
        f"{busiest}; {padded:.0%} of the computed elements are padding (each group's last "
        "m-tile and n-tile, a cluster's surplus tiles)"
    )
    return [head, *lines]


def _random_ends(rng: random.Random, groups: int, mean: int) -> tuple[list[int], int]:
    """``groups`` ends of about ``mean`` rows a group (empty groups among them, now and then
    ends the host cannot check: decreasing, negative, past the rows) and the rows."""
    sizes = [rng.choice([0, 1, mean, rng.randint(0, 3 * mean)]) for _ in range(groups)]
    ends = [sum(sizes[: i + 1]) for i in range(groups)]
    rows = ends[-1] + rng.choice([0, 0, 5, 300])
    if rng.random() < 0.25:
        ends = [e + rng.choice([0, 0, 0, -100, -(10**6), 10**6]) for e in ends]
    return ends, rows


@pytest.mark.usefixtures("python_min_max")  # (the per-CTA replay: the DSL's min/max, ~30 us)
@pytest.mark.parametrize("backend", GROUPED_BACKENDS)
def test_the_map_is_the_per_cta_replays_for_random_offsets(backend):
    """Every tile (64x128 c1x1, 128x128 c1x2, 128x256 c2x1 and the rest: the mean group picks
    the tile) and launch (down to fewer SMs than a cluster: none launched), every count shown
    or not: the same lines."""
    rng = random.Random(backend)
    for _ in range(30):
        ends, rows = _random_ends(rng, rng.randint(1, 48), rng.choice([8, 30, 100, 300, 900]))
        n = rng.choice([1, 100, 512, 1000, 4096])
        sm_count, shown = rng.choice([1, 3, 16, 114, 132]), rng.choice([0, 1, 8, 100])
        args = (backend, ends, rows, n, sm_count, shown)
        assert tile_map(*args) == slow_tile_map(*args), args


def test_the_map_is_the_per_cta_replays_with_the_dsls_own_min_max():
    """As above, the DSL's min/max (not the tests' Python stand-ins) in both replays."""
    for backend, ends, rows, n in (("sm90", [5, 5, 700, 701, 2000], 2003, 1000),
                                   ("sm90-pingpong", [10, 3, 40, 90], 95, 300)):  # fmt: skip
        assert tile_map(backend, ends, rows, n, 16) == slow_tile_map(backend, ends, rows, n, 16)


@pytest.mark.usefixtures("python_min_max")
@pytest.mark.parametrize("backend", GROUPED_BACKENDS)
def test_the_map_names_every_tile_of_every_group_once_for_random_offsets(backend):
    """Every group shown: its lines' tiles are the head's, and every group with rows names
    CTAs, the map's CTAs all launched."""
    rng = random.Random(f"cover{backend}")
    for _ in range(20):
        ends, rows = _random_ends(rng, rng.randint(1, 300), rng.choice([8, 100, 1000]))
        lines = tile_map(backend, ends, rows, rng.choice([128, 1000, 7168]), 132, len(ends))
        assert f" {tile_map_tiles(lines)} tiles of " in lines[0]
        groups = [line for line in lines[1:] if line.startswith("  group ")]
        assert len(groups) == len(ends)
        assert all("CTAs none" not in line for line in groups if "no tiles" not in line)


def test_thousands_of_groups_are_explained():
    """2000 groups of a mixture of experts' few hundred tokens each, through ``explain``
    (the per-CTA replay took half a minute): the map's head, its first groups and a count of
    the rest; every group's tiles in the head's count."""
    rng = random.Random(2000)
    sizes = [rng.choice([0, rng.randint(1, 400)]) for _ in range(2000)]
    ends = [sum(sizes[: i + 1]) for i in range(2000)]
    a = torch.empty(ends[-1], 256, dtype=torch.bfloat16, device="meta")
    b = torch.empty(2000, 256, 1024, dtype=torch.bfloat16, device="meta")
    text = wsgemm.explain(a, b, offs=torch.tensor(ends, dtype=torch.int32))
    head = next(line for line in text.splitlines() if line.startswith("tile map"))
    assert "  group 7: " in text and "... 1992 more groups" in text
    lines = tile_map("auto", ends, ends[-1], 1024, 132, shown=2000)
    assert lines[0] == head and f" {tile_map_tiles(lines)} tiles of " in head
    assert sum(line.startswith("  group ") for line in lines) == 2000
