"""The sm90 tile menu and shape policy (the choosing room, ``wsgemm.host.choosing``): the menu's
configs, the rules, the choices against the shipped table and against the recorded choices
(``tests/data/policy_choices.json``), the cost model's choices, batch invariance, explain(); the
dropped new tiles' compiles behind the ``sweep`` marker (the menu's kernels compile in
tests/kernels/test_menu_sass.py); on the GPU, the claim that every entry sums in one order."""

import ast
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load

from wsgemm import host
from wsgemm.bench import suites
from wsgemm.host import choosing
from wsgemm.host.choosing import menu, rules
from wsgemm.host.choosing.table import tables
from wsgemm.kernels.sm90.config import SHIPPED_CONFIGS, Sm90Config

tune_menu = load("tune_menu")  # the entries measured and left off the menu: tune_menu.DROPPED

H200 = dict(sm_count=132, cc=(9, 0))
FP16 = ("float16", "float16", "float32")
LLM = suites.suite("llm", tokens=(1, 16, 64, 128, 256, 1024, 4096, 16384))


def choose(m, n, k, batch=1, dtypes=FP16, sm_count=132, **kw):
    return choosing.choose(m, n, k, batch, *dtypes, sm_count, (9, 0), **kw)


@pytest.fixture(autouse=True)
def fresh_environment(monkeypatch):
    """Each test reads the environment it sets (the policy reads it once per process)."""
    monkeypatch.delenv(choosing.ENV_BATCH_INVARIANT, raising=False)
    monkeypatch.delenv(choosing.ENV_TABLE, raising=False)
    rules._environment.cache_clear()
    yield
    rules._environment.cache_clear()


@pytest.fixture
def empty_table(tmp_path, monkeypatch):
    """No measured point anywhere: every choice is the cost model's."""
    path = tmp_path / "empty.json"
    path.write_text(
        json.dumps(dict(schema=1, device="none", sm_count=132, cc=[9, 0], source="test", points=[]))
    )
    monkeypatch.setenv(choosing.ENV_TABLE, str(path))
    rules._environment.cache_clear()


# ----------------------------------------------------------------------------- the menu


@pytest.mark.parametrize(
    "path", sorted(Path(choosing.__file__).parent.glob("*.py")), ids=lambda p: p.name
)
def test_the_choosing_room_imports_neither_torch_nor_the_dsl(path):
    """At module level (the timing loop imports torch when it times)."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    assert not imported & {"torch", "cutlass", "cuda"}, imported


def test_the_policy_runs_in_a_process_without_torch_or_the_dsl():
    code = "import sys, wsgemm.host.choosing as c; c.explain(16, 4096, 4096, 1, 'float16', "
    code += "'float16', 'float32', 132, (9, 0)); print('cutlass' in sys.modules, "
    code += "'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


@pytest.mark.parametrize("e", choosing.MENU + tune_menu.DROPPED, ids=lambda e: e.name)
def test_menu_entries_are_valid_sm90_configs(e):
    config = Sm90Config(**e.config)  # validates every field
    fields = dataclasses.asdict(config)
    assert fields.pop("split_k") == 1, "an entry's own config never splits"
    # a cluster split is spelled out where an entry has one (1, off, is the default)
    entry = dict(e.config)
    assert fields.pop("cluster_split") == entry.pop("cluster_split", 1)
    assert fields.pop("stream_k_teams") is entry.pop("stream_k_teams", False)
    assert fields == entry, "every field spelled out"
    if e.splits:
        assert e.variant_config(split=True) == dataclasses.replace(config, split_k=0)
    else:
        with pytest.raises(ValueError, match="has no split-K variant"):
            e.variant_config(split=True)
    assert e.backend in host.BACKENDS and host.BACKENDS[e.backend].family == "sm90"
    assert (e.backend == "sm90-pingpong") == config.pingpong, "backend label matches schedule"
    if e.shipped:
        assert config == SHIPPED_CONFIGS[e.backend] and e.variant_config() is None
    else:
        # a stream-K entry compiles (and is cached) as the split kernel, split_k=0
        assert e.variant_config() == (config.compiled() if config.stream_k else config)
        assert config not in SHIPPED_CONFIGS.values()


def test_menu_is_small_named_once_and_always_has_a_fitting_entry():
    names = [e.name for e in choosing.MENU + tune_menu.DROPPED]
    assert len(names) == len(set(names))
    assert [tune_menu.entry(name).name for name in names] == names
    with pytest.raises(ValueError, match="no menu entry 'sk-pingpong-128x128-c2x1'"):
        choosing.entry("sk-pingpong-128x128-c2x1")  # the policy never looks at a dropped one
    # each entry costs 36 compiles in warm (60 with its split-K form): a bounded menu, each
    # entry kept for a measured win (docs/policy.md's rows; 9 -> 15 entries with the
    # wave-fitting tiles, perf.md entry 29: 708 menu variants; `warm` 780 in 101 s on 15 jobs;
    # 16 with the 32-wide swap-AB tile, entry 33: 768; 19 with the wide swap-AB tiles for
    # 129-1024 tokens, entry 51: 876)
    assert len(choosing.MENU) <= 22, "each entry costs 36 compiles in warm"
    assert [e.name for e in choosing.MENU if e.shipped] == ["sm90", "sm90-pingpong"]
    # A 1x1 cluster fits any problem, so fits() never leaves the policy empty-handed.
    assert any(e.cluster == (1, 1) for e in choosing.MENU)
    # Batch invariance rests on one accumulation order: every entry issues the same ascending
    # sequence of 16-deep WGMMA k-steps, so each tile_k is a whole number of them (the bits
    # themselves: test_gpu_every_menu_entry_gives_the_same_bits).
    assert all(e.tile_k % 16 == 0 for e in choosing.MENU)


def test_menu_variants_are_what_warm_compiles():
    from wsgemm import inspection

    variants = choosing.menu_variants()
    splitting = [e for e in choosing.MENU if e.splits]
    # 36 per entry (8 per wide swap-AB entry: MenuEntry.runs_dtypes), and 24 (fp32
    # accumulators only) per split variant
    wide = [e for e in choosing.MENU if e.wide_swap]
    assert not any(e.splits for e in wide)
    count = 36 * (len(choosing.MENU) - len(wide)) + 8 * len(wide) + 24 * len(splitting)
    assert len(variants) == count == len(set(variants))
    split = [v for v in variants if v.config is not None and v.config.split_k != 1]
    assert {v.config for v in split} == {e.variant_config(split=True) for e in splitting}
    assert {v.acc_dtype for v in split} == {"float32"}
    shipped = {v for v in variants if v.config is None}
    assert shipped == {
        v for b in ("sm90", "sm90-pingpong") for v in inspection.variants("sm_90a", b, True)
    }
    warmed = inspection.warm_variants("sm_90a", inspection.backends_for("sm_90a"))
    assert [v for v in warmed if host.BACKENDS[v.backend].family == "sm90"] == variants
    assert len(warmed) == len(variants) + 36 * len(host.shipped_backends("sm80"))
    assert not inspection.menu_entries("sm_80", ("sm90", "sm90-pingpong"))


# ----------------------------------------------------------------------------- rules


def test_clusters_need_two_tiles_along_their_mode():
    sm90, c12 = choosing.entry("sm90"), choosing.entry("pingpong-64x128-c1x2")
    assert not choosing.fits(sm90, 128, 4096) and choosing.fits(sm90, 129, 4096)
    assert not choosing.fits(c12, 16, 128) and choosing.fits(c12, 16, 129)
    for name in ("pingpong-64x64-c2x1", "pingpong-64x128-c2x1"):
        c21 = choosing.entry(name)
        assert not choosing.fits(c21, 64, 4096) and choosing.fits(c21, 65, 4096)


def test_work_units_count_whole_clusters():
    c21 = choosing.entry("pingpong-64x64-c2x1")
    assert c21.tiles(128, 4096, 1) == 2 * 64
    assert c21.tiles(129, 4096, 1) == 4 * 64  # 3 m-tiles run as two clusters of two
    assert c21.tiles(129, 4096, 3) == 3 * 4 * 64
    assert choosing.entry("sm90").tiles(129, 4097, 1) == 2 * 17  # 2x1: 2 m-tiles, 17 n-tiles


@pytest.mark.parametrize("shape", [s for s in LLM if s.m <= 128], ids=lambda s: s.label)
def test_an_m_cluster_runs_only_on_two_m_tiles(shape):
    """Decode (one M-tile of any entry) never runs an M-cluster; at 128 tokens the 64-row
    entries' two M-tiles may share a cluster (the weights' tile multicast to both)."""
    e = choose(shape.m, shape.n, shape.k).menu_entry
    if e.cluster[0] > 1:
        assert -(-e.kernel_mn(shape.m, shape.n)[0] // e.tile_m) >= e.cluster[0], e
    if shape.m <= menu.MIN_TILE_M:
        assert e.cluster[0] == 1, e


def test_split_candidates():
    e = choosing.entry("pingpong-64x128-c1x2")
    assert choosing.split_candidates(e, 16, 4096, 14336, 1, 132) == (1, 2, 4, 8)
    assert choosing.split_candidates(e, 16, 4096, 14336, 1, 132, "float16") == (1,)
    assert choosing.split_candidates(e, 16, 4096, 14336, 1, 132, batch_invariant=True) == (1,)
    # the kernel splits at k-tiles: any K, as long as every split keeps a k-tile
    assert choosing.split_candidates(e, 16, 4096, 1021, 1, 132) == (1, 2, 4, 8)
    assert choosing.split_candidates(e, 16, 4096, 3 * 64, 1, 132) == (1, 2)
    assert choosing.split_candidates(e, 16, 4096, 64, 1, 132) == (1,)
    # 32 tiles: 8 x 32 = 256 units fit two waves of 132, 16 x 32 would not
    assert choosing.split_candidates(e, 16, 4096, 14336, 1, 132)[-1] * 32 <= 2 * 132
    assert choosing.split_candidates(e, 16, 4096, 14336, 1, 66) == (1, 2, 4)
    assert choosing.split_candidates(choosing.entry("sm90"), 16384, 57344, 8192, 1, 132) == (1,)
    # the shipped entries have no split variant, even where their tiles are few
    for name in ("sm90", "sm90-pingpong"):
        assert choosing.split_candidates(choosing.entry(name), 256, 4096, 8192, 1, 132) == (1,)


# ----------------------------------------------------------------------------- the table


def _cell_best(table, m, n, k, allowed):
    """The best mean ratio among allowed candidates over the table points in (m, n, k)'s cell."""
    q = choosing.M_QUANTUM
    blocks = -(-m // q)
    scores = {}
    for p in table.points:
        if (-(-p.m // q), p.n, p.k) == (blocks, n, k):
            for name, s, r in p.ratios:
                if s in allowed.get(name, ()):
                    scores.setdefault((name, s), []).append(r)
    return max((sum(r) / len(r), key) for key, r in scores.items()) if scores else None


def test_shipped_table_loads_and_names_menu_entries_only():
    (table,) = tables(None)
    assert table.cc == (9, 0) and table.sm_count == 132 and table.source
    assert table.points
    names = {e.name for e in choosing.MENU}
    for p in table.points:
        assert all(name in names and s in menu.SPLITS and r > 0 for name, s, r in p.ratios)


#: The held-out acceptance draw (docs/perf.md entry 33: seed, families, count), README's record
HELD_OUT = (898362, ("gemma2", "phi", "deepseek", "falcon3", "olmo2", "olmoe", "yi"), 160)


def test_the_held_out_draw_is_judged_on_the_model_alone():
    """Issue #24's "the model alone (table off)": on the held-out families the table answers
    only where it measured a problem of the suites' own cell (a 5-token qkv of OLMo-2 at tp 2
    lies in the 8B qkv decode cell), and there it picks what the model picks, so the held-out
    record (entry 97) is the model's alone (docs/perf.md entry 120)."""
    from wsgemm.bench import models
    from wsgemm.support import dtype_name

    seed, families, count = HELD_OUT
    answered = 0
    for x in models.draw(seed, families, count):
        dtype = dtype_name(x.dtype)
        c = choose(x.tokens, x.n, x.k, 1, (dtype, dtype, "float32"))
        if c.source == "table":
            answered += 1
            assert (c.menu_entry.name, c.split) == c.predictions[0][:2], x
        else:
            assert c.source == "model", x
    # one shared decode cell (entry 120); more would mean a table grown over the held-out
    # families: tuning on the draw that judges the policy
    assert answered == 1


@pytest.mark.parametrize("point", tables(None)[0].points, ids=lambda p: p.label)
@pytest.mark.parametrize("invariant", [False, True])
def test_each_measured_problem_chooses_its_best_allowed_candidate(point, invariant):
    (table,) = tables(None)
    args = (point.m, point.n, point.k, point.batch, 132, "float32", invariant)
    entries = [e for e in choosing.MENU if choosing.fits(e, point.m, point.n)]
    if point.m <= rules.SWAP_ONLY_TOKENS and any(e.swap_ab for e in entries):
        # rule 1: decode is swap-AB's
        entries = [e for e in entries if e.swap_ab]
    allowed = {e.name: choosing.split_candidates(e, *args) for e in entries}
    best = _cell_best(table, point.m, point.n, point.k, allowed)
    choice = choose(point.m, point.n, point.k, point.batch, batch_invariant=invariant)
    assert choice.split in allowed[choice.menu_entry.name]
    model_pick = choice.predictions[0][:2]
    cell = table.cells[_cell_key(point)]
    measured = {(n, s) for p in cell for n, s, _ in p.ratios if s in allowed.get(n, ())}
    # a pick split over a cluster was never measured in that form: the cells timed the workspace
    in_cluster = choice.predictions[0][2].features.cluster_split
    if choice.source == "table":
        # the table corrects the model only where it measured the model's pick too
        assert best is not None and (choice.menu_entry.name, choice.split) == best[1]
        assert model_pick in measured and not in_cluster
    else:  # not measured here, or not the model's pick: the model stands
        assert choice.source == "model"
        assert (choice.menu_entry.name, choice.split) == model_pick
        assert best is None or model_pick not in measured or in_cluster


def _cell_key(point):
    from wsgemm.host.choosing import table

    return table._key(table.features(point.m, point.n, point.k, point.batch, 1.0))


def test_m_enters_only_through_blocks_of_m_quantum_rows():
    q = choosing.M_QUANTUM
    assert q == 8  # the 8-wide swap-AB entry's token columns; every other tile a multiple
    for n, k in ((6144, 4096), (8192, 28672), (1000, 3000)):
        for lo in (1, 9, 17, 49, 65, 129, 4081):
            hi = lo + q - 1
            assert len({choose(m, n, k) for m in range(lo, hi + 1, 3)} | {choose(hi, n, k)}) == 1


def _random_problem(rng: random.Random, point=None) -> tuple:
    """``rules._choose``'s arguments for a random problem (or a table point's, with random
    batch, dtypes, GPU and mode): token counts over 1-16384 and the wide swap-AB band,
    layer-like and random N and K."""
    m, n, k = (point.m, point.n, point.k) if point else (
        rng.choice([rng.randint(1, 16384), rng.randint(1, 2048), rng.randint(17, 300)]),
        rng.choice([rng.randint(1, 30000), rng.choice([896, 1024, 4096, 5120, 14336, 128256])]),
        rng.choice([rng.randint(1, 30000), rng.choice([896, 2048, 4096, 8192, 14336, 27648])]),
    )  # fmt: skip
    ab = rng.choice(["float16", "bfloat16"])
    acc = rng.choice(["float32", "float32", "float16"]) if ab == "float16" else "float32"
    batch = point.batch if point else rng.choice([1, 1, 1, 2, 3, 8])
    sm_count = 132 if point else rng.choice([132, 132, 114, 78, 16])
    return (menu.m_block(m), n, k, batch, ab, rng.choice([ab, ab, "float32"]), acc, sm_count,
            (9, 0), rng.random() < 0.15, None, host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip


def test_the_quick_path_picks_what_the_full_pricing_picks():
    """``choose``'s quick path (``rules._Plan``: the candidates in the order of a lower bound on
    their price, the pricing stopped where the bound passes the best) answers exactly as the
    full pricing (``rules._full``): the same entry, split, source, reason and predictions, on
    random problems, batches, dtypes, SM counts and modes, and on every problem of the shipped
    table (whose measured cells the full pricing answers)."""
    rng = random.Random(20261207)
    problems = [_random_problem(rng) for _ in range(1500)]
    problems += [_random_problem(rng, p) for p in tables(None)[0].points]
    quick = 0
    for args in problems:
        rules._choose.__wrapped__(*args)  # a shape's first new M: the full pricing, then a plan
        choice, full = rules._choose.__wrapped__(*args), rules._full(*args)
        quick += choice._explained is not None
        assert (choice.menu_entry, choice.split, choice.source) == (
            full.menu_entry, full.split, full.source), args  # fmt: skip
        assert choice == full  # the words too
    assert quick > 0.8 * len(problems)  # most problems take the quick path


def test_the_quick_epilogue_move_is_the_full_pricings():
    """``with_epilogue``'s quick path (``rules._epilogue_quick``: only the candidates whose plain
    price could leave room for the credit it asks) moves a choice exactly where pricing every
    candidate plain and with the activation (``rules._epilogue_full``) does, to the same
    entry and split, with the same words: on random problems, activations of 1-4 MUFU
    instructions an element, the model's choices and table-like ones (any allowed candidate)."""
    rng = random.Random(20261207)
    moved = 0
    for _ in range(600):
        m, n, k, batch, ab, c, _, sm_count, cc, *_ = _random_problem(rng)
        m = max(m, rules.SWAP_ONLY_TOKENS + 1)
        if rng.random() < 0.3:
            allowed = choosing.candidates(m, n, k, batch, ab, c, "float32", sm_count, cc,
                                          batch_invariant=False)  # fmt: skip
            if not allowed:
                continue
            e, split = rng.choice(allowed)
            choice = choosing.Choice(e, split, "a table's", "table")
        else:
            choice = choosing.choose(m, n, k, batch, ab, c, "float32", sm_count, cc,
                                     batch_invariant=False)  # fmt: skip
        for other in (m + 8, m + 16):  # the shape's plan: built at its second new M
            choosing.choose(other, n, k, batch, ab, c, "float32", sm_count, cc,
                            batch_invariant=False)  # fmt: skip
        args = (choice, rng.choice([1, 2, 2, 4]), m, n, k, batch, ab, c, "float32", sm_count, cc,
                host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip
        quick = rules._epilogue_quick(*args)
        assert quick is not None and quick == rules._epilogue_full(*args), args
        moved += quick is not choice
    assert moved > 10  # some choices move


def test_split_in_cluster_answers_for_the_switch_it_is_given():
    """``split_in_cluster`` (kept per switch setting) answers for the setting it is asked
    about, whatever the switch is now: the wording of a choice made under another setting
    prices its candidates in the form that setting runs."""
    e = choosing.entry("swap-pingpong-64x16x128-c1x1")
    assert rules.split_in_cluster(e, 2, 4096, "float16", frozenset({"sm90"}))
    rules._split_in_cluster.cache_clear()
    assert not rules.split_in_cluster(e, 2, 4096, "float16", frozenset())
    with host.registry.switches(CLUSTER_SPLIT_FAMILIES=frozenset()):
        assert rules.split_in_cluster(e, 2, 4096, "float16", frozenset({"sm90"}))
        assert not rules.split_in_cluster(e, 2, 4096, "float16")


def test_a_moved_choice_is_worded_for_the_switch_it_was_made_under():
    """A fused activation's move made with the cluster split's switch as shipped and read with
    it off gives the words of its own move (the switch keys the memo and the wording; the
    reviewer's case, docs/perf.md entry 118)."""
    rules.forget()
    on = host.registry.CLUSTER_SPLIT_FAMILIES
    choose(40, 1024, 4096), choose(48, 1024, 4096)  # (the shape's plan)
    choice = choosing.Choice(choosing.entry("pingpong-64x128-c1x2"), 1, "a table's", "table")
    moved = choosing.with_epilogue(choice, 2, 24, 1024, 4096, 1, *FP16, 132, (9, 0),
                                   batch_invariant=False)  # fmt: skip
    full = rules._epilogue_full(choice, 2, 24, 1024, 4096, 1, *FP16, 132, (9, 0), on)
    assert moved._explained is not None and moved is not choice
    with host.registry.switches(CLUSTER_SPLIT_FAMILIES=frozenset()):
        assert rules.EPILOGUE_MOVE in moved.reason  # worded now, with the switch off
    assert moved == full and moved.predictions[0][:2] == full.predictions[0][:2]
    rules.forget()


def test_the_quick_epilogue_move_follows_a_changed_margin(monkeypatch):
    """A split margin raised (a fit's, then ``rules.forget()``) is the plan's to bound with: the
    quick path moves the reviewer's choice where the full pricing does."""
    monkeypatch.setattr(rules, "SPLIT_MARGIN", 0.3)
    rules.forget()
    choice = choosing.Choice(choosing.entry("cooperative-128x128-c1x2"), 8, "x", "table")
    args = (choice, 4, 136, 896, 13320, 1, *FP16, 132, (9, 0),
            host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip
    choose(144, 896, 13320), choose(152, 896, 13320)  # (the shape's plan, with the margin)
    quick = rules._epilogue_quick(*args)
    assert quick is not None and quick == rules._epilogue_full(*args)
    assert quick is not choice  # it moves
    monkeypatch.undo()
    rules.forget()


def test_a_quick_choice_words_itself_when_read():
    """A quick-path choice prices the full menu for its reason and predictions only when they
    are read (``matmul`` reads neither); then it equals, hashes, pickles and prints as the full
    pricing's choice."""
    rules.forget()
    assert choose(2000, 4096, 4096)._explained is None  # the shape's first: the full pricing
    c = choose(3000, 4096, 4096)
    assert c._explained is not None and c.source == "model"
    full = rules._full(3000, 4096, 4096, 1, *FP16, 132, (9, 0), False, None,
                       host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip
    assert hash(c) == hash(full)
    assert c.reason == full.reason and c.reason.startswith("cost model: ")
    assert c._explained is None  # worded once
    assert c.predictions == full.predictions and c.predictions[0][:2] == (c.menu_entry.name, 1)
    assert c == full and pickle.loads(pickle.dumps(c)) == c and repr(c) == repr(full)


def test_a_quick_choice_is_worded_for_the_switch_it_was_made_under():
    """A choice made with the cluster split off and read after it is back on gives the reason
    and predictions of its own pick (the switch is part of what it was made from)."""
    rules.forget()
    with host.registry.switches(CLUSTER_SPLIT_FAMILIES=frozenset()):
        choose(32, 1024, 14336)  # (the shape's first M: its plan comes with the second)
        c = choose(24, 1024, 14336)
        full = rules._full(24, 1024, 14336, 1, *FP16, 132, (9, 0), False, None, frozenset())
    assert c._explained is not None and (c.menu_entry, c.split) == (full.menu_entry, full.split)
    assert c.predictions[0][:2] == (c.menu_entry.name, c.split)
    assert not any(p.features.cluster_split for _, _, p in c.predictions) and c == full


def test_the_quick_path_steps_aside_for_a_table_that_speaks_beyond_its_cells(monkeypatch):
    """With the table's reach widened (``table.MAX_TABLE_DISTANCE``, a tool's setting) the
    plans' list of measured cells no longer says where the table answers: the full pricing
    decides every M."""
    monkeypatch.setattr(choosing.table, "MAX_TABLE_DISTANCE", 1.5)
    rules.forget()
    for m in (136, 600, 3000):
        c = choose(m, 4096, 4096)
        assert c._explained is None
        assert c == rules._full(m, 4096, 4096, 1, *FP16, 132, (9, 0), False, None,
                                host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip
    rules.forget()


def test_forget_answers_anew_after_a_constant_changes(monkeypatch):
    """The memo and the plans key on the problem, not on the policy's constants: a test or a
    fit that changes one calls ``rules.forget()`` (here no split may run: one wave of split
    units at most, and zero allowed)."""
    rules.forget()
    assert choose(48, 4096, 14336).split > 1
    monkeypatch.setattr(rules, "SPLIT_MAX_WAVES", 0)
    rules.forget()
    assert choose(48, 4096, 14336).split == 1
    monkeypatch.undo()
    rules.forget()


def test_a_shape_asked_at_one_m_costs_no_plan():
    """The full pricing answers a layer shape's first new M (a shape asked at one M only, a
    fixed batch, costs what it did before the quick path); its second builds the plan, and
    the quick path answers from then on. ``forget`` starts over."""
    rules.forget()
    before = rules._plan.cache_info().currsize
    assert choose(1000, 5120, 8192)._explained is None
    assert rules._plan.cache_info().currsize == before  # no plan yet
    assert choose(1000, 5120, 8192)._explained is None  # (the memo: the same signature)
    assert choose(1008, 5120, 8192)._explained is not None
    assert rules._plan.cache_info().currsize == before + 1
    assert choose(2000, 5120, 8192)._explained is not None
    rules.forget()
    assert choose(3000, 5120, 8192)._explained is None


def test_the_quick_path_leaves_decode_and_the_tables_cells_to_the_full_pricing():
    """Up to ``SWAP_ONLY_TOKENS`` tokens (rule 1) and on the table's measured cells the full
    pricing answers (it words the table's correction); a plan knows which M blocks those are."""
    table = tables(None)[0]
    for p in table.points:
        if p.m <= rules.SWAP_ONLY_TOKENS:
            continue
        plan = rules._plan(p.n, p.k, p.batch, *FP16, 132, (9, 0), False, None,
                           host.registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip
        assert menu.m_block(p.m) in plan.measured and plan.pick(menu.m_block(p.m)) is None
    rules.forget()
    assert choose(8, 4096, 4096)._explained is None


def test_other_sm90_parts_get_a_choice_that_fits():
    # H100 PCIe and H20: the model counts their waves; a choice fits and splits only within
    # their own SM count.
    for sms in (114, 78):
        for s in LLM:
            c = choose(s.m, s.n, s.k, sm_count=sms)
            assert c.source == "model"  # the table's cells are the H200's, 132 SMs
            assert choosing.fits(c.menu_entry, s.m, s.n)
            assert c.split in choosing.split_candidates(c.menu_entry, s.m, s.n, s.k, 1, sms)


def test_load_table_checks_its_input(tmp_path):
    good = dict(schema=1, device="d", sm_count=132, cc=[9, 0], source="s", points=[])
    bad = [
        ("not json", "{"),
        ("schema", json.dumps(good | {"schema": 99})),
        ("missing", json.dumps({k: v for k, v in good.items() if k != "cc"})),
    ]
    for name, text in bad:
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ValueError, match="policy table"):
            choosing.load_table(path)
    point = dict(label="x", m=1, n=8, k=8, ratios=[
        dict(entry="no-such-entry", split=1, ratio=2.0), dict(entry="sm90", split=1, ratio=0.5)
    ])  # fmt: skip
    path = tmp_path / "old.json"
    path.write_text(json.dumps(good | {"points": [point]}))
    (p,) = choosing.load_table(path).points
    assert p.ratios == (("sm90", 1, 0.5),) and p.batch == 1


# ----------------------------------------------------------------------------- recorded choices


def test_choose_answers_as_recorded():
    """``choose`` on every ``llm`` (at the tuner's token counts) and ``midsize`` shape, fp16 and
    bf16, batch-invariant off and on, from the shipped table and from none (the heuristic), on
    the stand-in H200, against ``tests/data/policy_choices.json``: recorded from the code before
    the choosing room was split (the split changed no answer), it holds later work to the same
    answers. A deliberate policy change (a new table, menu entry or rule) regenerates it:
    ``python scripts/tune_menu.py --record-choices tests/data/policy_choices.json``; the file's
    diff is the change's list of new answers, to read before committing both."""
    path = Path(__file__).parents[1] / "data" / "policy_choices.json"
    recorded = json.loads(path.read_text())
    assert recorded["columns"] == list(tune_menu.CHOICE_COLUMNS)
    shapes = {tuple(row[1:4]) for row in recorded["rows"]}
    assert shapes >= {(s.m, s.n, s.k) for s in suites.suite("llm") + suites.suite("midsize")}
    now = tune_menu.policy_choices()
    changed = [(was, new) for was, new in zip(recorded["rows"], now, strict=False) if was != new]
    assert not changed, f"{len(changed)} answers changed, the first: {changed[:3]}"
    assert path.read_text() == tune_menu.choices_json(now)


# ----------------------------------------------------------------------------- the cost model


@pytest.mark.parametrize("shape", [s for s in LLM if s.m >= 4096], ids=lambda s: s.label)
def test_large_shapes_run_a_large_cooperative_tile_unsplit(shape, empty_table):
    choice = choose(shape.m, shape.n, shape.k)
    e = choice.menu_entry
    assert choice.source == "model" and choice.split == 1
    assert e.config["schedule"] == "cooperative" and e.tile_m * e.tile_n >= 128 * 160


@pytest.mark.parametrize("shape", LLM + suites.suite("midsize"), ids=lambda s: s.label)
def test_the_model_picks_the_fastest_prediction_among_the_allowed(shape, empty_table):
    """Without a table the choice is the model's fastest candidate, a split counted
    ``SPLIT_MARGIN`` slower than predicted (``CLUSTER_SPLIT_MARGIN`` where it runs over a
    cluster); ``predictions`` are in that order, each an allowed (entry, split) the rules let
    through, and the same on every ask."""
    c = choose(shape.m, shape.n, shape.k)
    assert c.source == "model" and c.predictions
    allowed = set(choosing.candidates(shape.m, shape.n, shape.k, 1, *FP16, **H200))
    margins = {False: rules.SPLIT_MARGIN, True: rules.CLUSTER_SPLIT_MARGIN}
    times = [p.us * (1 + margins[p.features.cluster_split] * (s > 1)) for _, s, p in c.predictions]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert c.predictions[0][:2] == (c.menu_entry.name, c.split)
    assert {(choosing.entry(n), s) for n, s, _ in c.predictions} <= allowed
    rules.forget()
    assert choose(shape.m, shape.n, shape.k) == c  # deterministic, not just memoized


def test_decode_picks_swap_ab_and_prefill_never_does(empty_table):
    for m in (1, 8, 16):
        assert choose(m, 8192, 28672).menu_entry.swap_ab
    for m in (33, 128, 1024, 16384):
        assert not choose(m, 8192, 28672).menu_entry.swap_ab


@pytest.mark.parametrize("shape", LLM + suites.suite("midsize"), ids=lambda s: s.label)
def test_batch_invariant_mode_never_splits(shape):
    choice = choose(shape.m, shape.n, shape.k, batch_invariant=True)
    assert choice.split == 1
    assert "batch-invariant" in choice.reason


def test_batch_invariant_from_the_environment(monkeypatch, empty_table):
    split = choose(16, 2048, 16384).split
    assert split > 1
    monkeypatch.setenv(choosing.ENV_BATCH_INVARIANT, "1")
    rules._environment.cache_clear()
    assert choose(16, 2048, 16384).split == 1
    assert choose(16, 2048, 16384, batch_invariant=False).split == split
    monkeypatch.setenv(choosing.ENV_BATCH_INVARIANT, "yes")
    rules._environment.cache_clear()
    with pytest.raises(ValueError, match="WSGEMM_BATCH_INVARIANT='yes'"):
        choose(16, 4096, 14336)


def test_fp16_accumulation_never_splits():
    for s in LLM:
        assert choose(s.m, s.n, s.k, dtypes=("float16", "float32", "float16")).split == 1


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((1.5, 8, 8, 1, *FP16, 132, (9, 0)), TypeError, "m must be an int"),
        ((-1, 8, 8, 1, *FP16, 132, (9, 0)), ValueError, "m=-1"),
        ((8, 8, 8, 1, "float32", "float16", "float32", 132, (9, 0)), ValueError, "ab_dtype"),
        ((8, 8, 8, 1, "bfloat16", "float16", "float16", 132, (9, 0)), ValueError, "fp16 inputs"),
        ((8, 8, 8, 1, *FP16, 0, (9, 0)), ValueError, "sm_count=0"),
        ((8, 8, 8, 1, *FP16, 108, (8, 0)), ValueError, "sm_90"),
    ],
)
@pytest.mark.parametrize("ask", [choosing.choose, choosing.candidates], ids=lambda f: f.__name__)
def test_choose_and_candidates_reject_bad_arguments(ask, args, error, message):
    with pytest.raises(error, match=message):
        ask(*args)
    with pytest.raises(TypeError, match="batch_invariant"):
        ask(8, 8, 8, 1, *FP16, 132, (9, 0), batch_invariant="yes")


def test_empty_problems_choose_without_measuring():
    for m, n, k, batch in ((0, 8, 8, 1), (8, 0, 8, 1), (8, 8, 0, 1), (8, 8, 8, 0)):
        assert choosing.choose(m, n, k, batch, *FP16, 132, (9, 0)).source == "empty"


def test_explain_says_kernel_split_and_why():
    choice = choosing.choose(16, 4096, 14336, 1, *FP16, 132, (9, 0))
    e = choice.menu_entry
    lines = choosing.explain(16, 4096, 14336, 1, *FP16, 132, (9, 0)).splitlines()
    assert lines[0] == (
        "problem: M=16 N=4096 K=14336 batch=1, float16 inputs, float16 output, float32 "
        "accumulate; sm_90 with 132 SMs"
    )
    assert lines[1] == f"kernel: {e.name} (backend {e.backend}: {e.describe()})"
    swap = "swap-AB (C^T = B^T A^T), " if e.swap_ab else ""
    assert e.describe() == "{}{} {}x{}x{} tile, cluster {}x{}".format(
        swap, e.config["schedule"], e.tile_m, e.tile_n, e.tile_k, *e.cluster
    )
    assert lines[2].startswith(f"split-K: {choice.split} ")
    tiles = e.tiles(16, 4096, 1)
    assert lines[3].startswith(f"grid: {tiles} tiles") and "for 132 SMs: one wave" in lines[3]
    # the model's pick, a split over a cluster, which the table's cells never timed
    assert lines[4].startswith("why (model): cost model: ") and "ranked first" in lines[4]
    assert lines[5] == "predicted (cost model, fastest first):"
    first = choice.predictions[0]
    assert lines[6].split() == [f"{first[2].us:.1f}", "us", first[0], "split", f"{first[1]}:",
                                *lines[6].split()[5:]]  # fmt: skip
    text = choosing.explain(16, 4096, 14336, 1, *FP16, 132, (9, 0), batch_invariant=True)
    assert "batch-invariant" in text.splitlines()[0] and "split-K: 1 (none)" in text


@pytest.mark.parametrize(
    "m, n, split, words",
    [
        (4472, 1928, 1, "288 tiles for 132 SMs: 2.18 waves, the last 18% full"),  # 36 x 8
        (8448, 1024, 1, "264 tiles for 132 SMs: 2 whole waves"),  # 66 x 4
        (16, 4096, 2, "32 tiles x 2 splits for 132 SMs: one wave"),  # 1 m-tile + its partner, x 16
    ],
)
def test_explain_counts_the_waves(m, n, split, words):
    e = choosing.entry("sm90")
    choice = choosing.Choice(e, split, "test", "test")
    assert words in choosing.describe(choice, m, n, 4096, 1, *FP16, 132, (9, 0))


def test_explain_of_a_stream_k_entry_says_it_shares_the_last_waves():
    choice = choosing.Choice(tune_menu.entry("sk-cooperative-128x256-c2x1"), 1, "test", "test")
    text = choosing.describe(choice, 4472, 1928, 680, 1, *FP16, 132, (9, 0))
    assert "grid: 288 tiles for 132 SMs, the last waves' k-tiles shared by all" in text


def test_explain_of_an_empty_problem_has_no_grid():
    assert "grid: none" in choosing.explain(0, 4096, 4096, 1, *FP16, 132, (9, 0))


# ----------------------------------------------------------------------------- compiles


# The tiles built without a GPU in entry 28 (docs/perf.md): widths (96, 160, 224) that make
# whole waves, and 256-row cooperative tiles; five on the menu since entry 29, two dropped.
NEW_TILES = (
    "cooperative-128x160-c2x1",
    "cooperative-128x192-c2x1",
    "cooperative-128x224-c2x1",
    "pingpong-64x96-c2x1",
    "pingpong-64x160-c2x1",
    "cooperative-256x128-c1x2",
    "cooperative-256x160-c1x2",
)


def _summary(variant):
    from wsgemm import inspection

    r = inspection.inspect_variant(variant)
    return variant.key(), r.spill_bytes + r.sass["LDL"] + r.sass["STL"], r.sass["HGMMA"]


@pytest.mark.sweep
def test_every_dropped_new_tile_compiles_spill_free():
    """The entries of NEW_TILES left off the menu, in all 36 variants each, so that the tuner
    can measure them again (the menu's variants: tests/kernels/test_menu_sass.py)."""
    new = tuple(e for e in map(tune_menu.entry, NEW_TILES) if e not in choosing.MENU)
    assert new and set(new) <= set(tune_menu.DROPPED)
    variants = choosing.menu_variants(entries=new)
    workers = max(1, min(8, os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        rows = list(pool.map(_summary, variants))
    assert not [key for key, spills, _ in rows if spills], "local-memory spills"
    assert all(hgmma for _, _, hgmma in rows)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_every_menu_entry_gives_the_same_bits():
    """Batch-invariant mode lets M pick any menu entry (no split): that is sound only if every
    entry sums each element in the same order. Same inputs through every entry, fp16 and fp32
    out; and a row computed alone (1 token) equals that row inside a large M."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator().manual_seed(11)
    m, n, k = 300, 1000, 1021
    x = torch.randn(m, -(-k // 8) * 8, generator=gen).half().cuda()[:, :k]
    w = torch.randn(n, -(-k // 8) * 8, generator=gen).half().cuda()[:, :k]

    def view(t):  # (rows, cols, 1), every non-unit stride 16-byte divisible, as the plan's
        return t.as_strided((*t.shape, 1), (t.stride(0), 1, t.shape[0] * t.stride(0)))

    for c_dtype, torch_dtype in (("float16", torch.float16), ("float32", torch.float32)):
        outs = {}
        for e in choosing.MENU:
            v = host.Variant(e.backend, "sm_90a", "float16", c_dtype, config=e.variant_config())
            fn = host.COMPILE_CACHE.get(v)
            clusters = sms // host.cluster_size(v.kernel_config())
            for rows in (m, 1):
                out = torch.full((rows, n), math.nan, dtype=torch_dtype, device="cuda")
                if not e.swap_ab:
                    fn(view(x[:rows]), view(w), view(out), clusters)
                elif choosing.fits(e, rows, n):  # C^T = W x^T, written M-major into out
                    ld = out.stride(0)
                    fn(view(w), view(x[:rows]), out.as_strided((n, rows, 1), (1, ld, rows * ld)),
                       clusters)  # fmt: skip
                else:
                    continue
                outs[e.name, rows] = out
        first = outs["sm90", m]
        assert not torch.isnan(first).any()
        for (name, rows), out in outs.items():
            assert torch.equal(out, first[:rows]), f"{name} with M={rows} differs ({c_dtype})"


def test_decode_says_only_swap_ab_entries_were_candidates():
    for m in (1, 8, 16):
        c = choose(m, 10240, 8192)
        assert c.menu_entry.swap_ab
        assert "up to 16 tokens only the swap-AB entries are candidates" in c.reason
    assert "only the swap-AB" not in choose(17, 10240, 8192).reason
    # from 17 tokens the 32-wide swap-AB tile competes with the 64-row tiles
    assert {e.swap_ab for e, _ in choosing.candidates(24, 10240, 8192, 1, *FP16, **H200)} == {
        True, False}  # fmt: skip


def test_the_wide_swap_tiles_run_only_where_they_were_measured():
    """129-1024 tokens, unbatched, fp32 accumulators, the inputs' dtype out (perf.md 51, 66):
    the cost model is not asked about them elsewhere."""
    wide = {e.name for e in choosing.MENU if e.swap_ab and e.tile_n > rules.SWAP_DECODE_MAX_N}
    assert {choosing.entry(name).tile_n for name in wide} == {96, 144, 160, 192, 208, 224}

    def names(m, n=11008, k=4096, batch=1, c="float16", acc="float32", ab="float16"):
        found = choosing.candidates(m, n, k, batch, ab, c, acc, 132, (9, 0))
        return {e.name for e, _ in found}

    assert wide <= names(300) and wide <= names(1024) and wide <= names(129, ab="bfloat16",
                                                                        c="bfloat16")  # fmt: skip
    for kw in (dict(m=128), dict(m=96), dict(m=1025), dict(m=300, batch=2),
               dict(m=300, c="float32"), dict(m=300, acc="float16")):  # fmt: skip
        assert not wide & names(**kw), kw
    # so warm compiles them only in those dtypes (their others also spill: the -m sweep run),
    # and every other entry in all 36
    for e in choosing.MENU:
        dtypes = {
            (v.ab_dtype, v.c_dtype, v.acc_dtype) for v in choosing.menu_variants("sm_90a", (e,))
        }
        if e.name in wide:
            assert dtypes == {
                ("float16", "float16", "float32"),
                ("bfloat16", "bfloat16", "float32"),
            }
        else:
            assert len(dtypes) == 9, e.name


def test_bench_choose_times_the_quick_and_the_full_path(tmp_path):
    """``scripts/bench_choose.py`` (docs/perf.md entry 116) runs on the CPU: one token count per
    ``M_QUANTUM`` block of its seeded draw, each a new signature, every column timed for every
    shape (no timing is asserted: speed belongs in the benchmark)."""
    bench = load("bench_choose")
    tokens = bench.draw(200, seed=3)
    assert tokens == bench.draw(200, seed=3) and len(tokens) == len(set(map(menu.m_block, tokens)))
    assert all(1 <= m <= 16384 for m in tokens)
    out = tmp_path / "choose.json"
    assert bench.main(["--rounds", "1", "--count", "60", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["shapes"]) == {f"{n}x{k}" for n, k in bench.SHAPES}
    for row in record["shapes"].values():
        assert set(row) == {"first", "cold_mean", "warm_median", "warm_mean", "full_median"}
        assert all(v > 0 for v in row.values())
    rules.forget()
