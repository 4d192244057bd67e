"""scripts/tune_menu.py's plan, on the CPU (the run itself needs an sm_90 GPU)."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from script_modules import load

from wsgemm.bench import suites
from wsgemm.host import choosing

tune_menu = load("tune_menu")


def test_plan_times_what_the_policy_can_choose_and_the_shipped_baseline():
    shapes = tune_menu.shapes_to_tune()
    assert {s.label for s in shapes} >= {s.label for s in suites.suite("llm")}
    assert {s.label for s in shapes} >= {s.label for s in suites.suite("midsize")}
    assert [s.flop for s in shapes] == sorted(s.flop for s in shapes)  # decode first
    planned = tune_menu.plan(shapes, choosing.MENU, 132)
    for s, cands in planned:
        names = {(c.entry.name, c.split) for c in cands}
        assert len(names) == len(cands)
        for e in choosing.MENU:
            if choosing.fits(e, s.m, s.n):
                want = choosing.split_candidates(e, s.m, s.n, s.k, 1, 132)
                assert {split for name, split in names if name == e.name} == set(want)
            elif e.shipped:
                assert (e.name, 1) in names  # the baseline, though the policy never picks it
            else:
                assert all(name != e.name for name, _ in names)
    variants = tune_menu.variants(planned)
    # one unsplit variant per entry, one split variant per entry that may split
    kk, fp16 = ("k", "k"), "float16"
    want = {(e.name, False, kk, fp16) for e in choosing.MENU}
    assert set(variants) == want | {(e.name, True, kk, fp16) for e in choosing.MENU if e.splits}
    for (name, split, _, _), v in variants.items():
        assert (v.c_dtype, v.acc_dtype, v.a_major, v.b_major) == ("float16", "float32", "k", "k")
        assert v.config == choosing.entry(name).variant_config(split=split)


@pytest.mark.parametrize(
    "layout, plain, swapped",
    [
        ("TN", ("k", "k"), ("k", "k")),  # x @ W.T: both K-major
        ("NT", ("m", "n"), ("m", "n")),  # x stored (K, M), W^T stored (K, N)
        ("NN", ("m", "k"), ("k", "n")),
        ("TT", ("k", "n"), ("m", "k")),
    ],
)
def test_own_layouts_time_the_kernel_variant_that_layout_runs(layout, plain, swapped):
    """--layouts own: a shape is timed in its suite's layout, on the kernel variant that reads
    its operands as they lie (swap-AB: W is the kernel's A, x its B)."""
    assert tune_menu.kernel_majors(layout, swap_ab=False) == plain
    assert tune_menu.kernel_majors(layout, swap_ab=True) == swapped
    shape = suites.Shape(16, 4096, 1000, "s", "g", layout)
    assert tune_menu.tuned_layout(shape, own=False) == "TN"
    [(_, cands)] = tune_menu.plan([shape], choosing.MENU, 132, own_layouts=True)
    for c in cands:
        assert c.majors == (swapped if c.entry.swap_ab else plain)
    for (_, _, majors, _), v in tune_menu.variants([(shape, cands)]).items():
        assert (v.a_major, v.b_major) == majors


@pytest.mark.parametrize("rows_unit", [False, True])
def test_operands_and_kernel_views_have_16_byte_strides(rows_unit):
    import torch

    gen = torch.Generator().manual_seed(0)
    t = tune_menu.operand(torch, 37, 29, rows_unit, "cpu", gen)
    assert t.shape == (37, 29) and t.stride(0 if rows_unit else 1) == 1
    v = tune_menu.kernel_view(t)
    assert v.shape == (37, 29, 1) and torch.equal(v[:, :, 0], t)
    assert all(s == 1 or s % 8 == 0 for s in v.stride())


def test_a_models_draw_is_tuned_each_problem_in_its_drawn_dtype(capsys):
    """--draw SEED:FAMILIES:COUNT: the models suite's seeded draw (the oracle's shapes), each
    problem's candidates and variants in the dtype it was drawn with."""
    from wsgemm.bench import models

    shapes, dtypes = tune_menu.drawn_shapes(5, "heldout", 40)
    draws = models.draw(5, models.HELDOUT_FAMILIES, 40)
    assert sorted(s.label for s in shapes) == sorted(d.label for d in draws)
    assert {s.group for s in shapes} <= set(models.HELDOUT_FAMILIES)
    assert set(dtypes.values()) == {"float16", "bfloat16"}
    planned = tune_menu.plan(shapes, choosing.MENU, 132, dtypes=dtypes)
    for s, cands in planned:
        assert cands and {c.dtype for c in cands} == {dtypes[s.label]}
    for key, v in tune_menu.variants(planned).items():
        assert v.ab_dtype == v.c_dtype == key[3]
    assert tune_menu.main(["--dry-run", "--draw", "5:gemma2+yi:12"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("12 shapes")
    assert [suites.token_band(m) for m in (1, 16, 17, 128, 129, 1024, 1025)] == [
        "1-16", "1-16", "17-128", "17-128", "129-1024", "129-1024", ">1024"
    ]  # fmt: skip


def test_dry_run_prints_the_plan(capsys):
    assert tune_menu.main(["--dry-run", "--with-dropped"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    entries = choosing.MENU + tune_menu.DROPPED
    assert last.endswith(f"{len(entries) + sum(e.splits for e in entries)} variants")


def test_shapes_are_timed_as_given_in_their_dtype(capsys, monkeypatch):
    """--shapes M,N,K;...: those problems (TN), fewest FLOP first, each in --dtype."""
    planned = {}
    real_plan = tune_menu.plan

    def spy(shapes, entries, sm_count, own_layouts=False, dtypes=None):
        planned["shapes"], planned["dtypes"] = shapes, dtypes
        return real_plan(shapes, entries, sm_count, own_layouts, dtypes)

    monkeypatch.setattr(tune_menu, "plan", spy)
    argv = ["--dry-run", "--shapes", "1311,4608,3072; 391,1024,2304;", "--dtype", "bfloat16"]
    assert tune_menu.main(argv) == 0
    assert [(s.m, s.n, s.k) for s in planned["shapes"]] == [(391, 1024, 2304), (1311, 4608, 3072)]
    assert set(planned["dtypes"].values()) == {"bfloat16"}
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 shapes")
    with pytest.raises(SystemExit):
        tune_menu.main(["--dry-run", "--shapes", "1311,4608"])


def test_entries_keeps_only_the_entries_of_its_patterns(capsys):
    """--entries: the decode entries and their cluster splits only (what the cluster split's
    price is fitted on); a pattern matching nothing is a usage error."""
    argv = ["--dry-run", "--draw", "5:fit:40", "--with-cluster-split", "--m-range", "1:32"]
    assert tune_menu.main([*argv, "--entries", "swap-pingpong-*,cs*"]) == 0
    plan_lines = capsys.readouterr().out.splitlines()[:-1]
    named = {c.split("/")[0] for line in plan_lines for c in line.split(": ", 1)[1].split()}
    assert named and all(n.startswith(("swap-pingpong-", "cs")) for n in named)
    assert any(n.startswith("cs4-") for n in named)
    with pytest.raises(SystemExit):
        tune_menu.main([*argv, "--entries", "no-such-entry*"])
    assert "matches no entry" in capsys.readouterr().err


def test_merge_rebuilds_a_csvs_points_into_a_copy_of_the_shipped_table(tmp_path, capsys):
    """--merge: the CSV's shapes replace the table's points of the same labels, from the rows of
    menu entries only; the other points stay; what it writes loads as a policy table."""
    repo = Path(__file__).parents[2]
    source = repo / "docs" / "data" / "tune_menu_midsize_2026-12-01g.csv"
    shipped = repo / "wsgemm" / "host" / "choosing" / "data" / "sm90_h200.json"
    table = tmp_path / "sm90_h200.json"
    shutil.copy(shipped, table)
    assert tune_menu.main(["--merge", str(source), "--into", str(table)]) == 0
    assert "24 points" in capsys.readouterr().out

    with source.open(newline="") as f:
        rows = list(csv.DictReader(f))
    before, after = json.loads(shipped.read_text()), json.loads(table.read_text())
    labels = {r["label"] for r in rows}
    assert len(labels) == 24
    menu = {e.name for e in choosing.MENU}
    merged = {p["label"]: p for p in after["points"]}
    for label in labels:
        want = [(r["entry"], int(r["split"]), float(r["ratio"])) for r in rows
                if r["label"] == label and r["entry"] in menu and r["status"] == "ok"]  # fmt: skip
        got = [(q["entry"], q["split"], q["ratio"]) for q in merged[label]["ratios"]]
        assert got == want and want  # menu entries only: the CSV's sk- rows are left out
    kept = [p for p in before["points"] if p["label"] not in labels]
    assert [p for p in after["points"] if p["label"] not in labels] == kept
    assert len(after["points"]) == len(kept) + 24
    assert after["source"].startswith(before["source"])
    assert "tune_menu_midsize_2026-12-01g.csv" in after["source"]
    assert len(choosing.load_table(table).points) == len(after["points"])


def test_merge_needs_both_arguments(capsys):
    with pytest.raises(SystemExit):
        tune_menu.main(["--merge", "x.csv"])
    assert "--merge CSV and --into TABLE go together" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["TN", "NT", "NN", "TT"])
def test_a_shape_is_timed_in_its_own_layout_on_the_kernels_majors(layout, monkeypatch):
    """_measure_shape on the CPU, every kernel a float64 stand-in that checks it is handed
    operands of the majors its variant was compiled for (swap-AB included), and a timer stub:
    each unsplit candidate is checked against the reference and timed; the point records the
    layout."""
    import argparse

    import torch

    from wsgemm.bench import check
    from wsgemm.bench.measure import Sample, interleaved

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    shape = suites.Shape(16, 40, 24, f"s {layout}", "midsize", layout)
    [(_, cands)] = tune_menu.plan([shape], choosing.MENU, 132, own_layouts=True)
    cands = [c for c in cands if c.split == 1]
    assert any(c.entry.swap_ab for c in cands) and any(not c.entry.swap_ab for c in cands)

    def stand_in(majors):
        def kernel(a, b, c, clusters):
            assert a.stride(1 if majors[0] == "k" else 0) == 1
            assert b.stride(1 if majors[1] == "k" else 0) == 1
            c.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype))

        return kernel

    kernels = {c.variant_key: (stand_in(c.majors), 1) for c in cands}

    class Timer:
        def estimate(self, fn):
            return None

        def measure(self, fn, reps, estimate):
            fn()
            return Sample(ms=1.0)

    args = argparse.Namespace(layouts="own", rounds=1, reps=1)
    logged = []
    point, rows = tune_menu._measure_shape(
        shape, cands, kernels, Timer(), args, torch.device("cpu"), torch, check, interleaved,
        logged.append,
    )  # fmt: skip
    assert not [line for line in logged if "WRONG" in line]
    assert point["layout"] == layout and {r["layout"] for r in rows} == {layout}
    assert all(r["status"] == "ok" and r["ratio"] == 1.0 for r in rows)
    assert len(point["ratios"]) == len(cands)


def test_the_wide_swap_candidates_tile_the_tokens_and_the_decode_ones_take_them_whole():
    wide = [e for e in (*choosing.MENU, *tune_menu.DROPPED) if e.swap_ab and e.tile_n >= 64]
    assert {e.tile_n for e in wide} >= {96, 112, 144, 160, 176, 192, 208, 240}
    # the dropped ping-pong ones keep their split variants (timed, entry 51); the cooperative
    # ones run unsplit, on the menu or off it
    assert all(e.splits == (e.config["schedule"] == "pingpong") for e in wide)
    for e in wide:  # 266 tokens: several token tiles, the weights' 4096 rows the CTAs
        assert choosing.fits(e, 266, 4096)
        assert e.kernel_mn(266, 4096) == (4096, 266)
    decode = choosing.entry("swap-pingpong-64x32-c1x1")
    assert choosing.fits(decode, 32, 4096) and not choosing.fits(decode, 33, 4096)
    shape = suites.Shape(266, 32768, 6144, "band", "t", "TN")
    ((_, cands),) = tune_menu.plan([shape], choosing.MENU + tune_menu.DROPPED, 132)
    names = {c.entry.name for c in cands}
    assert {e.name for e in wide} <= names
    assert all(c.majors == tune_menu.kernel_majors("TN", True) for c in cands if c.entry.swap_ab)


def test_m_range_keeps_the_band(capsys):
    assert tune_menu.main(["--dry-run", "--draw", "1:fit:250", "--m-range", "129:1024"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " TN:" in line]
    ms = [int(line.split(" TN:")[0].split()[-1].split("x")[0]) for line in lines]
    assert lines and all(129 <= m <= 1024 for m in ms)


def test_launcher_wraps_a_split_candidate_only():
    """``launcher`` (tune_menu's and bench_fixup's): a split candidate through split_launcher,
    an unsplit one as compiled."""
    kernel = object()
    e = tune_menu.entry("cooperative-128x128-c1x2")
    plain, split = tune_menu.Candidate(e, 1), tune_menu.Candidate(e, 2)
    kernels = {plain.variant_key: (kernel, 66), split.variant_key: (kernel, 66)}
    assert tune_menu.launcher(plain, kernels, None) == (kernel, 66)
    fn, clusters = tune_menu.launcher(split, kernels, None)
    assert fn is not kernel and hasattr(fn, "bind") and clusters == 66


def test_cluster_split_candidates_are_planned_only_where_every_rank_has_k():
    """``--with-cluster-split``: the menu's 1x1-cluster split entries with K split 2 and 4 ways
    over a cluster, each only where its receive buffers leave the ring two stages, timed
    unsplit (their ways are in the config) and never where K has fewer k-tiles than ways (a
    rank without one would wait forever)."""
    names = [e.name for e in tune_menu.CLUSTER_SPLIT]
    assert "cs2-swap-pingpong-64x16x128-c1x1" in names
    assert "cs4-pingpong-64x256-c1x1" not in names  # three 64 KB tiles do not fit
    for e in tune_menu.CLUSTER_SPLIT:
        config = e.variant_config()
        assert config.cluster_split in (2, 4) and config.cluster_size == config.cluster_split
        assert tune_menu.entry(e.name) is e
    long_k, short_k = (suites.Shape(16, 4096, k, f"k{k}", "g", "TN") for k in (4096, 256))
    planned = dict(tune_menu.plan([long_k, short_k], tune_menu.CLUSTER_SPLIT, 132))
    fit = {e.name for e in tune_menu.CLUSTER_SPLIT if choosing.fits(e, 16, 4096)}
    assert fit and {c.entry.name for c in planned[long_k]} == fit
    assert all(c.split == 1 for c in planned[long_k])
    # K = 256: two 128-deep k-tiles, so no 4-way split of the 128-deep tiles
    short = {c.entry.name for c in planned[short_k]}
    assert "cs4-swap-pingpong-64x16x128-c1x1" not in short
    assert "cs2-swap-pingpong-64x16x128-c1x1" in short
    assert short == fit - {"cs4-swap-pingpong-64x16x128-c1x1"}
