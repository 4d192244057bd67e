"""The public-model table, its layer GEMMs under tensor parallelism, the seeded draw and the
``--suite models`` options (CPU only)."""

import argparse
import math

import pytest
import torch

from wsgemm.bench import cli, models
from wsgemm.bench.models import BY_NAME, MODELS, Model, draw, gemms


def _gemms(name: str, tp: int) -> dict[str, tuple[int, int]]:
    return {g.layer: (g.n, g.k) for g in gemms(BY_NAME[name], tp)}


def _key(d: models.Draw) -> tuple:
    return (d.model, d.layer, d.tp, d.tokens, d.dtype, d.n, d.k)


# ------------------------------------------------------------------------------ the table


def test_table_covers_enough_models_and_families_with_unique_names():
    assert len(MODELS) >= 25 and len(models.FAMILIES) >= 10
    assert len(BY_NAME) == len(MODELS)
    assert {m.family for m in MODELS} == set(models.FAMILIES)


def test_fit_and_heldout_are_disjoint_and_cover_every_model():
    fit, held = set(models.FIT_FAMILIES), set(models.HELDOUT_FAMILIES)
    assert not fit & held
    assert fit | held == set(models.FAMILIES)
    assert len(models.FIT_FAMILIES) == len(fit) and len(models.HELDOUT_FAMILIES) == len(held)


@pytest.mark.parametrize("side", [models.FIT_FAMILIES, models.HELDOUT_FAMILIES])
def test_each_side_has_dense_and_moe_and_small_and_large_hidden_sizes(side):
    chosen = models.family_models(side)
    assert any(m.moe for m in chosen) and any(not m.moe for m in chosen)
    hidden = [m.hidden for m in chosen]
    assert min(hidden) <= 2048 and max(hidden) >= 7168


def test_every_model_has_attention_or_says_it_is_left_out():
    for m in MODELS:
        if m.heads is None:
            assert m.family == "deepseek", m.name  # multi-head latent attention
        else:
            assert m.heads % m.kv_heads == 0, m.name


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(heads=12, kv_heads=5, head_dim=64, intermediate=1024), "do not group"),
        (dict(heads=12, intermediate=1024), "none of them"),
        (dict(intermediate=0), "positive int"),
        (dict(expert_intermediate=512, experts=8, experts_per_token=9), "MoE model needs"),
        (dict(experts=8, experts_per_token=2, intermediate=1024), "MoE model needs"),
        (dict(), "dense model needs"),
        (dict(intermediate=1024, shared_intermediate=512), "dense model needs"),
    ],
)
def test_model_rejects_inconsistent_sizes(fields, message):
    with pytest.raises(ValueError, match=message):
        Model("bad", "test", hidden=1024, vocab=32000, **fields)


# ------------------------------------------------------------------- layer GEMMs per tp


def test_llama_3_1_8b_at_tp_1_is_the_published_layer():
    assert _gemms("llama-3.1-8b", 1) == {
        "qkv": (6144, 4096),  # (32 + 2 x 8) heads x 128
        "o": (4096, 4096),
        "gate_up": (28672, 4096),  # 2 x 14336
        "down": (4096, 14336),
        "lm_head": (128256, 4096),
    }


@pytest.mark.parametrize(
    "name, tp, layer, nk",
    [
        ("llama-3.1-70b", 8, "qkv", ((64 // 8 + 2 * 1) * 128, 8192)),  # 8 KV heads, 1 a rank
        ("llama-3.1-70b", 8, "o", (8192, 64 * 128 // 8)),
        ("llama-3.1-405b", 8, "down", (16384, 53248 // 8)),
        ("qwen2.5-3b", 4, "qkv", ((16 // 4 + 2) * 128, 2048)),  # 2 KV heads replicated
        ("gemma-2-9b", 1, "qkv", ((16 + 2 * 8) * 256, 3584)),  # head_dim 256: q != hidden
        ("gemma-2-9b", 1, "o", (3584, 16 * 256)),
        ("phi-3-mini", 2, "qkv", ((16 + 2 * 16) * 96, 3072)),
        ("qwen2.5-72b", 4, "lm_head", (152064 // 4, 8192)),
        ("mixtral-8x7b", 2, "expert_gate_up", (14336, 4096)),
        ("qwen3-30b-a3b", 8, "expert_down", (2048, 768 // 8)),
        ("deepseek-v3", 8, "expert_gate_up", (2 * 2048 // 8, 7168)),
        ("deepseek-v3", 1, "gate_up", (2 * 18432, 7168)),
        ("deepseek-v2-lite", 2, "shared_down", (2048, 2816 // 2)),
    ],
)
def test_tensor_parallel_slices(name, tp, layer, nk):
    assert _gemms(name, tp)[layer] == nk


@pytest.mark.parametrize(
    "name, tp, missing",
    [
        ("qwen2.5-0.5b", 4, {"qkv", "o"}),  # 14 query heads
        ("phi-3-medium", 4, {"qkv", "o"}),  # 10 KV heads: neither split nor replicated evenly
        ("falcon3-10b", 8, {"qkv", "o"}),  # 12 query heads
        ("deepseek-v3", 1, {"qkv", "o"}),  # attention left out
        ("mixtral-8x7b", 1, {"gate_up", "down"}),  # no dense MLP layer
    ],
)
def test_slices_that_do_not_divide_are_left_out(name, tp, missing):
    layers = set(_gemms(name, tp))
    assert layers and not layers & missing


@pytest.mark.parametrize("tp", models.TP_DEGREES)
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_every_gemm_is_a_slice_of_the_config(model, tp):
    """Column-parallel layers read the hidden state and split their outputs, row-parallel ones
    split their inputs and write the hidden state; the slices add back up to the config."""
    found = {g.layer: (g.n, g.k) for g in gemms(model, tp)}
    assert found, "every model has some GEMM at every tp"
    for layer, (n, k) in found.items():
        assert isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0, layer
    widths = {"": model.intermediate, "shared_": model.shared_intermediate,
              "expert_": model.expert_intermediate}  # fmt: skip
    for prefix, width in widths.items():
        if width is None or width % tp:
            assert f"{prefix}gate_up" not in found and f"{prefix}down" not in found
        else:
            assert found[f"{prefix}gate_up"] == (2 * width // tp, model.hidden)
            assert found[f"{prefix}down"] == (model.hidden, width // tp)
    if model.vocab % tp == 0:
        assert found["lm_head"] == (model.vocab // tp, model.hidden)
    if "qkv" in found:
        n, k = found["qkv"]
        q = model.heads * model.head_dim
        kv = max(model.kv_heads, tp) * model.head_dim  # replicated when fewer than the ranks
        assert (n * tp, k) == (q + 2 * kv, model.hidden)
        assert found["o"] == (model.hidden, q // tp)
    elif model.heads is not None:
        kv_even = model.kv_heads % tp == 0 or tp % model.kv_heads == 0
        assert model.heads % tp or not kv_even


def test_gemms_rejects_an_unknown_tp():
    with pytest.raises(ValueError, match="tp must be one of"):
        gemms(MODELS[0], 3)


# ------------------------------------------------------------------------------- the draw

# The first draws of seed 0: the draw must not move under anyone's feet, since a held-out
# report names its seed (docs/benchmarking.md).
SEED_0 = [
    ("olmo-2-32b", "o", 2, 142, "fp16", 5120, 2560),
    ("olmo-2-7b", "gate_up", 2, 6717, "bf16", 11008, 4096),
    ("qwen3-235b-a22b", "o", 4, 6824, "bf16", 4096, 2048),
    ("olmo-2-32b", "down", 2, 6139, "bf16", 5120, 13824),
    ("gemma-2-2b", "down", 2, 7044, "bf16", 2304, 4608),
]


def test_draw_is_reproducible_and_seed_0_is_pinned():
    first = draw(0)
    assert [_key(d) for d in first] == [_key(d) for d in draw(0)]
    assert len(first) == models.DEFAULT_COUNT
    assert [_key(d) for d in first[: len(SEED_0)]] == SEED_0
    # A longer draw starts with the shorter one: count only says where to stop.
    assert [_key(d) for d in draw(0, count=200)][: len(first)] == [_key(d) for d in first]


def test_different_seeds_draw_different_problems():
    drawn = {tuple(_key(d) for d in draw(seed, count=16)) for seed in range(5)}
    assert len(drawn) == 5


def test_draws_are_distinct_gemms_of_their_model():
    drawn = draw(11, count=1000)
    assert len({_key(d) for d in drawn}) == len(drawn)
    for d in drawn:
        model = BY_NAME[d.model]
        assert d.family == model.family and d.m == d.tokens
        assert models.Gemm(d.layer, d.n, d.k) in gemms(model, d.tp)
        assert d.label == f"{d.model} {d.layer} tp={d.tp} t={d.tokens}"
    assert {d.dtype for d in drawn} == set(models.DTYPES) == {"fp16", "bf16"}
    assert {d.tp for d in drawn} == set(models.TP_DEGREES)
    assert {d.family for d in drawn} == set(models.FAMILIES)


def test_token_counts_are_log_uniform_integers_in_range():
    tokens = [d.tokens for d in draw(7, count=4000)]
    assert all(isinstance(t, int) and 1 <= t <= models.MAX_TOKENS for t in tokens)
    powers = [t for t in tokens if t & (t - 1) == 0]
    assert len(powers) < len(tokens) / 4  # integers, not a ladder of powers of two
    # Log-uniform: as many below sqrt(16384) = 128 as above, and each octave about as full.
    below = sum(t <= 128 for t in tokens) / len(tokens)
    assert below == pytest.approx(math.log(129) / math.log(16385), abs=0.03)
    octaves = [sum(2**o <= t < 2 ** (o + 1) for t in tokens) for o in range(4, 14)]
    assert max(octaves) < 1.5 * min(octaves)


def test_families_filter_and_ignore_their_order():
    drawn = draw(5, families=["yi", "olmoe"], count=50)
    assert {d.family for d in drawn} == {"yi", "olmoe"}
    assert [_key(d) for d in drawn] == [_key(d) for d in draw(5, ("olmoe", "yi"), 50)]
    held = draw(5, families=models.HELDOUT_FAMILIES, count=300)
    assert {d.family for d in held} == set(models.HELDOUT_FAMILIES)
    fit = draw(5, families=models.FIT_FAMILIES, count=300)
    assert {d.family for d in fit} == set(models.FIT_FAMILIES)


@pytest.mark.parametrize(
    "families, count, message",
    [
        (("yi", "llama"), 5, "unknown model family 'llama'; choose from llama3, qwen2.5"),
        (("a", "b"), 5, "unknown model families 'a', 'b'"),
        ((), 5, "no model families given"),
        (None, 0, r"count must be an int in \[1, 10000\]"),
        (None, models.MAX_COUNT + 1, "count must be"),
    ],
)
def test_draw_rejects_bad_arguments(families, count, message):
    with pytest.raises(ValueError, match=message):
        draw(0, families, count)


# ---------------------------------------------------------------- python -m wsgemm bench


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_plans_a_draw_without_a_gpu():
    args = parse("--suite", "models", "--seed", "3", "--families", "yi, olmoe", "--count", "40")
    shapes, options, suite = cli._plan(args)
    assert suite == "models" and options.seed == 3 and options.dtype == "fp16"
    expected = [d for d in draw(3, ("yi", "olmoe"), 40) if d.dtype == "fp16"]
    assert [(s.label, s.m, s.n, s.k, s.group) for s in shapes] == [
        (d.label, d.m, d.n, d.k, d.family) for d in expected
    ]
    assert all(s.layout == "" for s in shapes) and options.layout == "TN"


def test_the_fp16_and_bf16_runs_of_a_seed_measure_the_whole_draw():
    labels = {}
    for dtype in models.DTYPES:
        shapes, _, _ = cli._plan(parse("--suite", "models", "--seed", "9", "--dtype", dtype))
        labels[dtype] = [s.label for s in shapes]
    assert not set(labels["fp16"]) & set(labels["bf16"])
    drawn = draw(9)
    assert sorted(labels["fp16"] + labels["bf16"]) == sorted(d.label for d in drawn)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "models", "--families", "yi,gpt"], "choose from llama3, qwen2.5"),
        (["--suite", "square", "--families", "yi"], "apply to the models suite"),
        (["--suite", "llm", "--count", "5"], "apply to the models suite"),
        (["--shapes", "1,2,3", "--count", "5"], "not --shapes"),
        (["--suite", "models", "--models", "8b"], "llm and decode"),
    ],
)
def test_cli_reports_bad_models_options_as_usage_errors(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # usage errors come first
    assert cli.run(parse(*argv)) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("count", ["0", "-3", "x", str(models.MAX_COUNT + 1)])
def test_parser_rejects_a_bad_count(count, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--suite", "models", "--count", count)
    assert exc.value.code == 2


def test_without_a_gpu_the_models_suite_plans_then_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ("--suite", "models", "--seed", "3", "--families", ",".join(models.FIT_FAMILIES))
    assert cli.run(parse(*argv)) == cli.EXIT_NO_GPU
    assert "no CUDA GPU" in capsys.readouterr().err


def test_a_hugging_face_config_becomes_the_same_model_as_the_table():
    """``from_config`` reads config.json's keys: Llama-3.1-8B's and DeepSeek-V3's give the
    table's layer GEMMs."""
    llama = models.from_config({"hidden_size": 4096, "vocab_size": 128256,
                                "num_attention_heads": 32, "num_key_value_heads": 8,
                                "intermediate_size": 14336}, "llama")  # fmt: skip
    table = next(m for m in models.MODELS if m.name == "llama-3.1-8b")
    for tp in models.TP_DEGREES:
        assert models.gemms(llama, tp) == models.gemms(table, tp)
    ds = models.from_config({"hidden_size": 7168, "vocab_size": 129280,
                             "num_attention_heads": 128, "kv_lora_rank": 512,
                             "intermediate_size": 18432, "moe_intermediate_size": 2048,
                             "n_routed_experts": 256, "n_shared_experts": 1,
                             "num_experts_per_tok": 8, "first_k_dense_replace": 3})  # fmt: skip
    layers = {g.layer: (g.n, g.k) for g in models.gemms(ds, 1)}
    assert "qkv" not in layers  # multi-head latent attention: not these GEMMs
    assert layers["gate_up"] == (36864, 7168) and layers["expert_down"] == (7168, 2048)
    assert layers["shared_gate_up"] == (4096, 7168)
    with pytest.raises(ValueError, match="needs hidden_size and vocab_size"):
        models.from_config({"hidden_size": 4096})
    with pytest.raises(ValueError, match="not a config this reads"):  # a MoE without a width
        models.from_config({"hidden_size": 64, "vocab_size": 64, "num_local_experts": 8})
    with pytest.raises(ValueError, match="a JSON object"):
        models.from_config([1, 2])
    llama4 = {"hidden_size": 5120, "vocab_size": 202048, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "num_local_experts": 128,
              "num_experts_per_tok": 1, "interleave_moe_layer_step": 2}  # fmt: skip
    llama4 = models.from_config(llama4, "llama4")
    layers = {g.layer: (g.n, g.k) for g in models.gemms(llama4, 1)}
    assert layers["gate_up"] == (32768, 5120) and layers["expert_gate_up"] == (16384, 5120)
