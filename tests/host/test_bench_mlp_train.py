"""``scripts/bench_mlp_train.py``'s model names (the timing itself needs a GPU)."""

import pytest
from script_modules import load

bench = load("bench_mlp_train")


def test_a_model_is_the_llm_suite_s_or_a_dense_model_of_the_models_suite():
    assert bench.mlp_dims("8b") == (4096, 14336) and bench.mlp_dims("70b") == (8192, 28672)
    assert bench.mlp_dims("qwen2.5-7b") == (3584, 18944)
    assert bench.mlp_dims("qwen2.5-32b/4") == (5120, 27648 // 4)  # one of four ranks' ffn


@pytest.mark.parametrize(
    "name, why",
    [
        ("gpt-5", "is not 8b, 70b or a dense model"),
        ("mixtral-8x7b", "is not 8b, 70b or a dense model"),  # MoE: no dense ffn
        ("qwen2.5-7b/5", "does not split 5 ways"),
        ("8b/2", "is not 8b, 70b or a dense model"),  # the suite's names take no TP
    ],
)
def test_a_bad_name_is_refused_before_any_run(name, why, capsys):
    with pytest.raises(SystemExit, match=why):
        bench.mlp_dims(name)
