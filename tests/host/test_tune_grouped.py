"""scripts/tune_grouped.py on the CPU: its candidates and the train/held-out summary (the
timing itself needs an sm_90 GPU)."""

import pytest
from script_modules import load

from wsgemm import host
from wsgemm.bench import moe

tune_grouped = load("tune_grouped")


def test_candidates_are_grouped_variants_whose_clusters_never_span_two_groups_wider():
    cands = tune_grouped.candidates()
    assert len({c.name for c in cands}) == len(cands) == len(tune_grouped.CANDIDATES)
    shipped = [c for c in cands if c.config is None]
    assert {c.backend for c in shipped} == set(host.GROUPED_BACKENDS)
    for c in cands:
        assert c.backend in host.GROUPED_BACKENDS
        if c.config is not None:  # its name says its tile and cluster
            cfg = c.config
            assert f"{cfg.tile_m}x{cfg.tile_n}c{cfg.cluster_m}x{cfg.cluster_n}" in c.name
    assert set(tune_grouped.TRAIN) < set(moe.MODELS)  # some models stay held out
    with pytest.raises(SystemExit, match="unknown candidate"):
        tune_grouped.candidates(["pp64x128c1x1", "nope"])


def _row(model, label, candidate, ratio, t=512):
    return dict(model=model, label=label, candidate=candidate, ratio=ratio, tokens_per_expert=t)


def test_summary_picks_on_the_training_models_and_judges_on_the_others():
    rows = [
        _row("deepseek-v3", "d1", "a", 1.2), _row("deepseek-v3", "d1", "b", 1.0),
        _row("deepseek-v3", "d2", "a", 1.1), _row("deepseek-v3", "d2", "b", 1.05),
        # held out: b would have won there, the pick is still a
        _row("mixtral-8x7b", "m1", "a", 0.9), _row("mixtral-8x7b", "m1", "b", 1.0),
        _row("mixtral-8x7b", "m2", "a", 1.0), _row("mixtral-8x7b", "m2", "b", None),
    ]  # fmt: skip
    lines = tune_grouped.summary(rows, ("deepseek-v3",))
    assert lines[0].startswith("t/e=512: fitted on deepseek-v3: a 1.149, b 1.025")
    # held-out: a's geomean over m1, m2 = sqrt(0.9); the oracle takes b on m1, a on m2
    assert "pick a: held-out 0.949x" in lines[1] and "oracle 1.000x, 2 problems" in lines[1]


@pytest.mark.parametrize(
    "rows, groups, name",
    [(2048, 256, "pp64x128c1x1"), (16384, 256, "pp128x128c1x2"), (65536, 128, "coop128x256c2x1")],
)
def test_the_shipped_rules_pick_is_named_among_the_candidates(rows, groups, name):
    # 8, 64 and 512 rows a group: the three tiles of ``host.grouped_config``'s rule
    assert tune_grouped.shipped_pick(rows, groups, tune_grouped.candidates()) == name
    others = [c for c in tune_grouped.candidates() if c.name != name]
    assert tune_grouped.shipped_pick(rows, groups, others) is None


def test_summary_judges_the_shipped_rule_on_the_held_out_models():
    rows = [
        _row("deepseek-v3", "d1", "a", 1.2), _row("deepseek-v3", "d1", "b", 1.0),
        _row("mixtral-8x7b", "m1", "a", 0.9), _row("mixtral-8x7b", "m1", "b", 1.1),
    ]  # fmt: skip
    for r in rows:
        r["shipped"] = "b"
    lines = tune_grouped.summary(rows, ("deepseek-v3",))
    assert "pick a: held-out 0.900x" in lines[1]
    assert lines[2] == "t/e=512: the shipped rule runs b: held-out 1.100x geomean"
