"""The cost model the sm90 policy chooses with (``wsgemm.host.choosing.cost``): its shipped
constants, its arithmetic on the grid and the bytes, and that the shipped constants are what
``scripts/fit_cost_model.py`` makes of the shipped measurements."""

import json
import math
from pathlib import Path

import pytest
from script_modules import load

from wsgemm.host import choosing
from wsgemm.host.choosing import cost
from wsgemm.support import ACTIVATIONS

REPO = Path(__file__).parents[2]
SHIPPED = REPO / "wsgemm" / "host" / "choosing" / "data" / "cost" / "sm90_h200.json"


def model() -> cost.CostModel:
    found = cost.cost_model_for(132, (9, 0))
    assert found is not None and found.name == SHIPPED.name
    return found


def test_every_menu_entry_has_constants_and_only_those():
    m = model()
    assert set(m.entries) == {e.name for e in choosing.MENU}
    for e in choosing.MENU:
        c = m.entries[e.name]
        assert c.per_k_tile > 0 and c.dram_tb_s > 0
        if not e.splits:
            assert c.per_split_unit == 0  # never measured: an entry without a split variant
    assert m.cc == (9, 0) and m.sm_count == 132 and 0 < m.q and m.l2_tb_s > 0


def test_other_gpus_have_no_model():
    assert cost.cost_model_for(108, (8, 0)) is None
    assert cost.cost_model_for(78, (9, 0)) is model()  # another sm_90 part: the nearest


@pytest.mark.parametrize(
    "name, split, m, n, k, units, waves, k_tiles",
    [
        ("sm90", 1, 4096, 4096, 4096, 512, 4, 64),  # 32 x 16 tiles; 132 SMs in 66 clusters
        ("sm90", 1, 100, 4096, 4096, 32, 1, 64),  # 1 m-tile and its cluster partner, x 16
        ("cooperative-128x128-c1x2", 4, 128, 4096, 4100, 128, 1, 17),  # 65 k-tiles in 4
        ("swap-pingpong-64x8x128-c1x1", 1, 3, 4096, 4096, 64, 1, 32),  # N along the rows
        ("cooperative-256x160-c1x2", 1, 8192, 8192, 8192, 1664, 13, 128),
    ],
)
def test_features_count_the_grid(name, split, m, n, k, units, waves, k_tiles):
    f = cost.features(choosing.entry(name), split, m, n, k, 1, 132)
    assert (f.units, f.waves, f.k_tiles) == (units, waves, k_tiles)
    assert f.dram_bytes >= 2 * (m * k + n * k + m * n)


def test_a_fused_activation_costs_its_mufu_work_where_nothing_hides_it():
    """``epilogue_us``: 2 MUFU an element on the cooperative 128x256 tile is 4 of its 64-deep
    k-tiles (about +6% at K = 4096, entry 43 measured +5.5%), whatever K; on a ping-pong tile
    only what passes the other warpgroup's mainloop; nothing without MUFU work."""
    m_ = model()
    coop = choosing.entry("sm90")
    assert coop.config["schedule"] == "cooperative" and (coop.tile_m, coop.tile_n) == (128, 256)
    k_tile = m_.entries["sm90"].per_k_tile  # the reference tile's
    for k in (256, 4096):
        f = cost.features(coop, 1, 4096, 4096, k, 1, 132)
        assert math.isclose(cost.epilogue_us(m_, coop, f, 2), 4 * k_tile)
        assert cost.epilogue_us(m_, coop, f, 0) == 0
        plain, fused = (cost.predict(m_, coop, f, mufu).us for mufu in (0, 2))
        assert fused > plain
    ping = choosing.entry("sm90-pingpong")
    assert ping.config["schedule"] == "pingpong"
    long_k = cost.features(ping, 1, 4096, 4096, 4096, 1, 132)
    short_k = cost.features(ping, 1, 4096, 4096, 64, 1, 132)  # one k-tile: 3 of 4 exposed
    assert cost.epilogue_us(m_, ping, long_k, 2) == 0
    one = m_.entries["sm90-pingpong"].per_k_tile * short_k.volume
    assert math.isclose(cost.epilogue_us(m_, ping, short_k, 2), 3 * one)
    # once per call the last epilogue whole: nothing follows it (ping-pong), no other unit
    # shares it (split); the cooperative unsplit tile has charged all of it already
    whole = 4 * m_.entries["sm90-pingpong"].per_k_tile * long_k.volume
    added = cost.predict(m_, ping, long_k, 2).compute_us - cost.predict(m_, ping, long_k).compute_us
    assert math.isclose(added, whole)
    split = choosing.entry("cooperative-128x128-c1x2")
    f2 = cost.features(split, 2, 128, 4096, 8192, 1, 132)
    share = cost.epilogue_us(m_, split, f2, 2)
    added = cost.predict(m_, split, f2, 2).compute_us - cost.predict(m_, split, f2).compute_us
    assert math.isclose(added, f2.waves * share + share)  # each unit half, the last one whole
    assert set(cost.EPILOGUE_MUFU) == set(ACTIVATIONS)


def test_with_epilogue_moves_a_choice_only_where_the_model_says_so():
    f16 = ("float16", "float16", "float32")
    short = (3858, 2048, 352)  # a cooperative tile's epilogue is a third of its unit
    long = (4096, 4096, 4096)
    for shape, moves in ((short, True), (long, False)):
        plain = choosing.choose(*shape, 1, *f16, 132, (9, 0))
        got = choosing.with_epilogue(plain, 2, *shape, 1, *f16, 132, (9, 0))
        assert (got is not plain) == moves, shape
        assert choosing.with_epilogue(plain, 0, *shape, 1, *f16, 132, (9, 0)) is plain
    assert got.menu_entry == plain.menu_entry  # the long problem's stays
    plain = choosing.choose(*short, 1, *f16, 132, (9, 0))
    moved = choosing.with_epilogue(plain, 2, *short, 1, *f16, 132, (9, 0))
    assert moved.menu_entry.config["schedule"] == "pingpong" and moved.source == "model"
    assert moved.reason.startswith(plain.reason) and "MUFU" in moved.reason
    # the move is the model's fastest, its activation priced in
    assert moved.predictions[0][:2] == (moved.menu_entry.name, moved.split)
    # a tuned choice was timed with its epilogue; batch invariance keeps one tile for every M
    tuned = choosing.Choice(plain.menu_entry, plain.split, "timed", "tuned")
    assert choosing.with_epilogue(tuned, 2, *short, 1, *f16, 132, (9, 0)) is tuned
    assert choosing.with_epilogue(plain, 2, *short, 1, *f16, 132, (9, 0),
                                  batch_invariant=True) is plain  # fmt: skip


def test_predictions_grow_with_the_work():
    m_ = model()

    def us(name, split, m, n, k, batch=1):
        e = choosing.entry(name)
        return cost.predict(m_, e, cost.features(e, split, m, n, k, batch, 132)).us

    for name in ("sm90", "pingpong-64x128-c1x2", "swap-pingpong-64x16x128-c1x1"):
        assert us(name, 1, 16, 4096, 4096) < us(name, 1, 16, 4096, 8192)  # more K
        assert us(name, 1, 16, 4096, 4096) < us(name, 1, 16, 4096, 4096, batch=8)
    # 8 whole waves of the large tile, then 2 more n-tiles start a ninth: ~9/8 the time
    eight, nine = us("sm90", 1, 4096, 8448, 4096), us("sm90", 1, 4096, 8704, 4096)
    assert nine > eight * 1.08
    assert cost.predict(m_, choosing.entry("sm90"), cost.features(
        choosing.entry("sm90"), 1, 8, 8, 8, 1, 132)).us >= m_.launch_us  # fmt: skip


def test_an_entry_off_the_model_is_not_predicted():
    dropped = load("tune_menu").DROPPED[0]
    assert cost.predict(model(), dropped, cost.features(dropped, 1, 64, 4096, 4096, 1, 132)) is None


def test_load_cost_model_checks_its_input(tmp_path):
    good = json.loads(SHIPPED.read_text())
    bad = [
        ("not json", "{"),
        ("schema", json.dumps(good | {"schema": 99})),
        ("missing", json.dumps({k: v for k, v in good.items() if k != "q"})),
        ("negative", json.dumps(good | {"l2_tb_s": -1.0})),
        ("nan", json.dumps(good | {"launch_us": float("nan")})),
    ]
    for name, text in bad:
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ValueError, match="cost model"):
            cost.load_cost_model(path)


def _source_csvs(part: str) -> list[str]:
    """The CSVs one fit of a model's ``source`` names ("... on a.csv, b.csv, date, git sha")."""
    csvs = [str(REPO / "docs" / "data" / name.strip())
            for name in part.split(" on ")[1].split(",")[:-2]]  # fmt: skip
    assert len(csvs) >= 1 and all(Path(c).exists() for c in csvs), csvs
    return csvs


def test_the_shipped_constants_are_the_fit_of_the_shipped_measurements(tmp_path):
    """scripts/fit_cost_model.py on the CSVs the shipped model names (its ``source``: the fit,
    then each ``--extend`` of it, in order) gives the shipped constants again, and the choice
    quality it recorded."""
    pytest.importorskip("scipy")
    fit = load("fit_cost_model")
    shipped = json.loads(SHIPPED.read_text())
    base, *extensions = shipped["source"].split("; extended by ")
    out = tmp_path / "refit.json"
    assert fit.main([*_source_csvs(base), "--out", str(out), "--no-cv"]) == 0
    in_sample = json.loads(out.read_text())["fit"]["in_sample"]
    for i, part in enumerate(extensions):
        extended = tmp_path / f"extended{i}.json"
        assert fit.main([*_source_csvs(part), "--extend", str(out), "--out", str(extended),
                         "--no-cv"]) == 0  # fmt: skip
        out = extended
    refit = json.loads(out.read_text())
    for key in ("launch_us", "l2_tb_s", "q", "per_extra_split"):
        assert math.isclose(refit[key], shipped[key], rel_tol=0.02, abs_tol=0.02), key
    assert set(refit["entries"]) == set(shipped["entries"])
    for name, constants in shipped["entries"].items():
        for key, value in constants.items():
            got = refit["entries"][name][key]
            assert math.isclose(got, value, rel_tol=0.02, abs_tol=0.02), (name, key, got)
    assert in_sample == shipped["fit"]["in_sample"]
    if extensions:
        got = [f["in_sample"] for f in refit["fit"]["extended"]]
        assert got == [f["in_sample"] for f in shipped["fit"]["extended"]]


def test_the_gated_constants_are_the_fit_of_the_recorded_gated_calls(monkeypatch):
    """scripts/fit_gated_cost.py on the records it names (``SHIPPED_FIT``) gives the shipped
    gated-road constants again, and with them the road choice on its both-roads rows is within
    1.01x of the faster road (geomean) and never 1.10x off it (docs/perf.md entry 76)."""
    pytest.importorskip("scipy")
    monkeypatch.chdir(REPO)
    fit = load("fit_gated_cost")
    kernel_only = {p: int(n) for p, _, n in (s.rpartition(":") for s in fit.SHIPPED_KERNEL_ONLY)}
    rows = fit.read_rows(fit.SHIPPED_FIT, kernel_only)
    costs, us, tb_s = fit.fit(rows)
    # the small row tile's constants come from its own forced rows (``fit_small_tile``)
    costs.update(fit.fit_small_tile())
    assert set(costs) == set(cost.GATED_KERNEL_COSTS)
    for name, shipped in cost.GATED_KERNEL_COSTS.items():
        for key in ("per_k_tile", "per_unit", "dram_tb_s"):
            got, want = getattr(costs[name], key), getattr(shipped, key)
            assert math.isclose(got, want, rel_tol=0.01, abs_tol=1e-3), (name, key, got)
    assert math.isclose(us, cost.GATING_PASS_US, rel_tol=0.01)
    assert math.isclose(tb_s, cost.GATING_PASS_TB_S, rel_tol=0.01)
    quality = fit.judge(fit.read_rows(fit.SHIPPED_FIT))
    assert quality["rows"] >= 50
    assert quality["over_best_geomean"] <= 1.01 and quality["over_best_max"] <= 1.10, quality


def test_the_gated_swap_scale_is_the_fit_of_the_recorded_decode_calls(monkeypatch):
    """scripts/fit_gated_swap.py on the records it names (``SHIPPED_SWAP_FIT``) gives the shipped
    ``GATED_SWAP_SCALE`` again, one per tile width, and with it the road choice on those rows is
    within 1.01x of the faster road (geomean) and never 1.05x off it (docs/perf.md entry 85)."""
    monkeypatch.chdir(REPO)
    fit = load("fit_gated_swap")
    rows = fit.read_rows(fit.SHIPPED_SWAP_FIT)
    assert {cost.gated_swap_tile_n(r["m"]) for r in rows} == set(cost.GATED_SWAP_TILE_N)
    assert fit.fit(rows) == cost.GATED_SWAP_SCALE
    quality = fit.judge(rows)
    assert quality["rows"] >= 25
    assert quality["over_best_geomean"] <= 1.01 and quality["over_best_max"] <= 1.05, quality


def test_the_swap_tile_s_held_out_rows_are_judged_on_that_tile(monkeypatch):
    """A bench_epilogue record whose ``kernel`` ran the swap tile (``kernel_tile``) is judged on
    it by both fit scripts and left out of the row tiles' fit (docs/perf.md entry 86: seed
    379700's 14 decode rows)."""
    monkeypatch.chdir(REPO)
    held_out = "docs/data/gpu-2026-12-06j/gated-heldout.json"
    swap = load("fit_gated_swap")
    rows = swap.read_rows([held_out])
    assert len(rows) == 14 and all(r["m"] <= cost.GATED_SWAP_MAX_ROWS for r in rows)
    assert swap.judge(rows)["over_best_max"] <= 1.05
    gated = load("fit_gated_cost")
    marked = [r for r in gated.read_rows([held_out]) if r.swap]
    assert len(marked) == 14


def test_the_swap_scale_multiplies_the_proxy_price():
    """The gated swap tile's price is its proxy's times the width's scale; the road's is not
    scaled."""
    model = choosing.cost_model_for(132, (9, 0))
    product = choosing.choose(8, 28672, 4096, 1, "float16", "float32", "float32", 132, (9, 0),
                              batch_invariant=False).menu_entry  # fmt: skip
    one = cost.gated_roads(model, product, 1, 8, 28672, 4096, 132, "silu", swap_tile_n=8,
                           swap_scale=1.0)  # fmt: skip
    shipped = cost.gated_roads(model, product, 1, 8, 28672, 4096, 132, "silu", swap_tile_n=8)
    assert math.isclose(shipped.fused_us, one.fused_us * cost.GATED_SWAP_SCALE[8])
    assert shipped.unfused_us == one.unfused_us


@pytest.mark.parametrize(
    "rows, half, tile",
    [
        (1024, 14336, "sm90-pingpong"),  # 8B: 448 cooperative tiles, 0.85 of 4 waves
        (1024, 9728, "sm90-pingpong"),  # qwen3-4b: 0.77 against 0.92
        (4096, 14336, "sm90"),  # both tiles fill 0.97 of their waves
        (1024, 28672, "sm90"),  # 70B
        (1024, 6912, "sm90"),  # both 0.82: the ping-pong tile's own cost decides
        (256, 28672, "sm90-pingpong"),  # few rows: the gated kernel's tile
        (37, 48, "sm90-pingpong"),
    ],
)
def test_the_dgated_tile_follows_the_wave_fill(rows, half, tile):
    """The dgated GEMM's row tile (``cost.dgated_kernel_entry``, docs/perf.md entry 107): the
    gated kernel's up to ``GATED_PINGPONG_MAX_ROWS`` rows, above it the ping-pong tile only
    where it fills its waves more than ``DGATED_PINGPONG_WAVE_MARGIN`` times as well."""
    assert cost.dgated_kernel_entry(rows, half, 132) == tile
    fills = [cost.wave_fill(cost.entry(e), rows, half, 132) for e in ("sm90-pingpong", "sm90")]
    assert all(0 < f <= 1 for f in fills)
    if rows > cost.GATED_PINGPONG_MAX_ROWS:
        wins = fills[0] > cost.DGATED_PINGPONG_WAVE_MARGIN * fills[1]
        assert (tile == "sm90-pingpong") is wins


@pytest.mark.parametrize(
    "rows, half, k, entry",
    [
        (512, 9216, 2304, "cooperative-256x160-c1x2"),  # gemma-2-2b: 0.88 of a wave vs 0.73
        (512, 10240, 7168, "cooperative-256x160-c1x2"),  # yi-1.5-34b/2: 0.97 vs 0.81
        (1024, 6912, 5120, "cooperative-128x224-c2x1"),  # qwen2.5-32b/4: 0.94 vs 0.82
        (4096, 14336, 4096, "sm90"),  # 256x160 fills 0.99 vs 0.97: within the margin
        (2048, 9216, 2304, "sm90-pingpong"),  # the plain tile fills no better (0.97)
        (200, 9216, 2304, "sm90-pingpong"),  # few rows: the gated kernel's tile
        # gemma-2-27b/2: 3 row tiles, 2x1 clusters leave a CTA past the edge; 1x2 ones fill
        (384, 18432, 4608, "cooperative-128x256-c1x2"),
    ],
)
def test_the_dgated_tile_follows_the_plain_tile_where_it_fills_its_waves(rows, half, k, entry):
    """``choosing.dgated_entry`` (docs/perf.md entry 110): the wave-fill rule's tile
    (``dgated_kernel_entry``), unless the plain product's unsplit cooperative row tile
    (``choose``'s) fills its waves more than ``DGATED_PLAIN_TILE_MARGIN`` times as well; on
    a GPU the cost model does not describe, the rule's tile alone."""
    got = choosing.dgated_entry(rows, half, k, "bfloat16", 132, (9, 0))
    assert got == entry
    plain = choosing.choose(rows, half, k, 1, "bfloat16", "bfloat16", "float32", 132, (9, 0),
                            batch_invariant=False)  # fmt: skip
    rule = cost.dgated_kernel_entry(rows, half, 132)
    if got != rule:
        assert got == plain.menu_entry.name and plain.split == 1
        fills = [cost.wave_fill(cost.entry(e), rows, half, 132) for e in (got, rule)]
        assert fills[0] > cost.DGATED_PLAIN_TILE_MARGIN * fills[1]
    assert choosing.dgated_entry(rows, half, k, "bfloat16", 46, (8, 9)) == cost.dgated_kernel_entry(
        rows, half, 46
    )


def test_the_dgated_tile_of_an_empty_product_and_a_list_capability():
    """An empty dh (I or K zero, ``explain``'s zero sizes) has a tile and no wave to fill; a
    capability given as a list (a stand-in's) is a tuple to the cache."""
    assert choosing.dgated_entry(4096, 0, 4096, "bfloat16", 132, (9, 0)) == "sm90"
    assert choosing.dgated_entry(4096, 14336, 0, "bfloat16", 132, (9, 0)) == "sm90"
    assert cost.wave_fill(cost.entry("sm90"), 4096, 0, 132) == 1.0
    assert choosing.dgated_entry(512, 9216, 2304, "bfloat16", 132, [9, 0]) == (
        "cooperative-256x160-c1x2"
    )


def test_the_dgated_tile_is_chosen_anew_when_a_switch_it_reads_changes(monkeypatch):
    """The cache of ``dgated_entry`` keys what its answer reads: its margins and the cluster
    split's switch (``choose``'s memo keys it too)."""
    args = (1024, 6912, 5120, "bfloat16", 132, (9, 0))
    assert choosing.dgated_entry(*args) == "cooperative-128x224-c2x1"
    monkeypatch.setattr(cost, "DGATED_PLAIN_TILE_MARGIN", float("inf"))
    assert choosing.dgated_entry(*args) == cost.dgated_kernel_entry(1024, 6912, 132) == "sm90"


def test_wave_fill_counts_the_last_wave():
    """One full wave fills every slot; one tile more leaves the second wave 1/132 full."""
    e = cost.entry("sm90-pingpong")  # 128x128 tiles in 2x1 clusters: 66 clusters at once
    assert cost.wave_fill(e, 128 * 132, 128, 132) == 1.0
    assert math.isclose(cost.wave_fill(e, 128 * 134, 128, 132), 134 / 264)
    # 3 row tiles in 2x1 clusters: the second cluster's second CTA runs past the edge, idle
    assert math.isclose(cost.wave_fill(e, 3 * 128, 128 * 22, 132), 66 / 132)
    assert math.isclose(cost.wave_fill(cost.entry("cooperative-128x256-c1x2"), 384, 256 * 44, 132),
                        1.0)  # fmt: skip


def test_the_gated_kernel_is_priced_on_the_tile_it_runs():
    """Few rows run (and are priced on) the ping-pong 128x128 tile: a narrow product of a
    few rows takes that tile's one short wave, not the cooperative entry's."""
    assert (
        cost.gated_kernel_entry(256) == "sm90-pingpong" and cost.gated_kernel_entry(257) == "sm90"
    )
    model = cost.cost_model_for(132, (9, 0))
    product = choosing.choose(34, 2048, 2048, 1, "float16", "float32", "float32", 132, (9, 0),
                              batch_invariant=False)  # fmt: skip
    roads = cost.gated_roads(model, product.menu_entry, product.split, 34, 2048, 2048, 132, "silu")
    # measured on an H100 (gated-heldout.json, falcon3-1b tp=8): kernel 16.7 us, road 20.5
    assert not roads.unfused_wins and 14 < roads.fused_us < 20, roads


@pytest.mark.parametrize(
    "shape",
    [
        (256, 6144, 4096),  # 8b qkv t=256: the table's ping-pong pick hides the activation
        (1024, 28672, 4096),  # 8b gate_up t=1024: the activation costs the 128x256 tile more
        (64, 4096, 14336),  # 8b down t=64: split 2 or 4, the same ping-pong epilogue
    ],
)
def test_a_table_choice_moves_only_for_what_the_activation_costs(shape):
    """The table measured its pick against the model's: an activation moves it only where
    the activation itself costs the pick more than the candidate (found by a review: the first
    version let the model's plain disagreement with the table move 11 of its 71 cells)."""
    f16 = ("float16", "float16", "float32")
    plain = choosing.choose(*shape, 1, *f16, 132, (9, 0))
    assert plain.source == "table"
    assert choosing.with_epilogue(plain, 2, *shape, 1, *f16, 132, (9, 0)) is plain


def test_the_reason_says_why_a_faster_predicted_split_was_not_taken():
    """A split predicted faster than the winner but within ``SPLIT_MARGIN`` ranks behind it;
    the reason says so instead of calling the winner the fastest."""
    from wsgemm.host.choosing.rules import SPLIT_MARGIN

    c = choosing.choose(34, 2048, 2048, 1, "float16", "float32", "float32", 132, (9, 0),
                        batch_invariant=False)  # fmt: skip
    (_, split, winner), (_, other, runner) = ((e, s, p.us) for e, s, p in c.predictions[:2])
    assert c.source == "model" and split == 1 and other > 1 and runner < winner
    assert runner * (1 + SPLIT_MARGIN) >= winner
    assert "ranked first of" in c.reason and "must be predicted 6% faster" in c.reason


def test_a_cluster_split_has_no_workspace_bytes_and_clusters_of_its_ways():
    e = choosing.entry("swap-pingpong-64x8x128-c1x1")
    workspace = cost.features(e, 4, 8, 8192, 8192, 1, 132)
    cluster = cost.features(e, 4, 8, 8192, 8192, 1, 132, cluster_split=True)
    assert cluster.cluster_split and not workspace.cluster_split
    # the fp32 partial tiles, stored and read back: 128 tiles x 64 x 8 x 4 bytes x 2 x 4 parts
    assert workspace.dram_bytes - cluster.dram_bytes == 128 * 64 * 8 * 4 * 2 * 4
    assert (cluster.units, cluster.k_tiles, cluster.l2_bytes) == (
        workspace.units, workspace.k_tiles, workspace.l2_bytes)  # fmt: skip
    # 512 units: 4 waves of 132 CTAs, but 5 of the 30 clusters of 4 (120 CTAs) a GH100 runs
    assert workspace.waves == 4 and cluster.waves == 5
    assert cost.clusters_at_once(132, 4) == 30 and cost.clusters_at_once(132, 2) == 66
    # 134 tiles x 4 = 536 units: 134 SMs run 134 CTAs at once, but only 33 clusters of 4
    assert cost.features(e, 4, 8, 134 * 64, 8192, 1, 134).waves == 4
    assert cost.features(e, 4, 8, 134 * 64, 8192, 1, 134, cluster_split=True).waves == 5
    assert not cost.features(e, 1, 8, 8192, 8192, 1, 132, cluster_split=True).cluster_split


def test_a_cluster_split_is_priced_by_its_own_constant_per_part_and_kb():
    """Each part beyond the first adds ``per_cluster_split`` per KB of its fp32 partial tile to
    a unit, in place of the workspace split's two terms; a model without the constant prices
    the cluster split as the workspace split (its bytes apart)."""
    import dataclasses

    m = model()
    assert m.per_cluster_split is not None and m.per_cluster_split > 0
    e = choosing.entry("swap-pingpong-64x16x128-c1x1")
    for ways in (2, 4):
        f = cost.features(e, ways, 16, 1280, 8192, 1, 132, cluster_split=True)
        kb = 64 * 16 * 4 / 1024
        got = cost.predict(m, e, f).compute_us
        free = cost.predict(dataclasses.replace(m, per_cluster_split=0.0), e, f).compute_us
        assert math.isclose(got - free, f.waves * m.per_cluster_split * kb * (ways - 1))
        c = m.entries[e.name]
        unfitted = cost.predict(dataclasses.replace(m, per_cluster_split=None), e, f).compute_us
        workspace = f.waves * (c.per_split_unit + m.per_extra_split * (ways - 1))
        assert math.isclose(unfitted - free, workspace)


def test_load_cost_model_reads_the_optional_cluster_split_constant(tmp_path):
    good = json.loads(SHIPPED.read_text())
    without = tmp_path / "without.json"
    without.write_text(json.dumps({k: v for k, v in good.items() if k != "per_cluster_split"}))
    assert cost.load_cost_model(without).per_cluster_split is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(good | {"per_cluster_split": -0.1}))
    with pytest.raises(ValueError, match="must be finite"):
        cost.load_cost_model(bad)


def test_the_cluster_split_constant_is_the_fit_of_its_recorded_timings():
    """``fit_cost_model.py --cluster-split`` on the records the shipped model names gives the
    shipped constant and the choice quality it recorded."""
    pytest.importorskip("scipy")
    fit = load("fit_cost_model")
    shipped = json.loads(SHIPPED.read_text())
    record = shipped["fit"]["cluster_split"]
    paths = _source_csvs(record["source"])
    base = cost.load_cost_model(SHIPPED)
    samples = fit.read_cluster_samples(paths, base.sm_count)
    value, anchored = fit.fit_cluster_split(samples, base, base.sm_count)
    assert math.isclose(value, shipped["per_cluster_split"], rel_tol=0.02, abs_tol=1e-3)
    assert sum(s.cluster_split for s in samples) == record["samples"]
    got = fit.split_choice_quality(base, anchored, base.sm_count, cluster=True)
    assert got == record["cluster"]


def test_fit_cluster_split_recovers_the_constant_it_was_made_with():
    """Times made by the model with a known ``per_cluster_split`` (and a workspace candidate
    beside each, timed 1.3x slow: the GPU's scale, which anchoring takes out) fit back to it."""
    pytest.importorskip("scipy")
    import dataclasses

    fit = load("fit_cost_model")
    base = dataclasses.replace(model(), per_cluster_split=None)
    truth = dataclasses.replace(base, per_cluster_split=0.07)
    samples = []
    for n, k in ((1280, 8192), (4096, 14336), (2048, 4096), (8192, 3584)):
        label = f"{n}x{k}"
        for ways, cluster in ((1, False), (2, True), (4, True)):
            s = fit.Sample(label, "g", 8, n, k, "float16", "swap-pingpong-64x8x128-c1x1", ways,
                           0.0, 10.0, cluster)  # fmt: skip
            us = fit._prediction(truth, s, 132).us * 1.3
            samples.append(dataclasses.replace(s, us=us))
    value, anchored = fit.fit_cluster_split(samples, base, 132)
    assert math.isclose(value, 0.07, rel_tol=0.02)
    assert all(math.isclose(a.us, s.us / 1.3) for a, s in zip(anchored, samples, strict=True))


def test_read_cluster_samples_reads_tuner_rows_and_bench_records(tmp_path):
    fit = load("fit_cost_model")
    header = "label,group,m,n,k,layout,dtype,entry,split,status,median_us,cublas_us\n"
    rows = [
        "a,g,8,4096,4096,TN,float16,swap-pingpong-64x8x128-c1x1,1,ok,20.0,21.0",
        "a,g,8,4096,4096,TN,float16,swap-pingpong-64x8x128-c1x1,2,ok,21.0,21.0",
        "a,g,8,4096,4096,TN,float16,cs2-swap-pingpong-64x8x128-c1x1,1,ok,19.0,21.0",
        "a,g,8,4096,4096,TN,float16,cs4-swap-pingpong-64x8x128-c1x1,1,failed,,21.0",
        "a,g,8,4096,4096,TN,float16,sm90,1,ok,30.0,21.0",  # no split variant: not read
    ]
    csv_path = tmp_path / "oracle.csv"
    csv_path.write_text(header + "\n".join(rows) + "\n")
    got = [
        (s.entry, s.split, s.cluster_split, s.us) for s in fit.read_cluster_samples([csv_path], 132)
    ]
    name = "swap-pingpong-64x8x128-c1x1"
    assert got == [(name, 1, False, 20.0), (name, 2, False, 21.0), (name, 2, True, 19.0)]
    record = REPO / "docs" / "data" / "gpu-2026-12-07" / "cluster-split-t1-16.json"
    samples = fit.read_cluster_samples([record], 132)
    rows = json.loads(record.read_text())["rows"]
    swap = [r for r in rows if r["tile"].startswith("swap-")]
    assert len(samples) == 5 * len(swap) and {s.split for s in samples} == {1, 2, 4}
    assert sum(s.cluster_split for s in samples) == 2 * len(swap)
