"""Suites, shape strings and operand layouts of the benchmark (CPU only)."""

import pytest
import torch

from wsgemm.bench import suites
from wsgemm.bench.layouts import LAYOUTS, Layout, make_operands
from wsgemm.bench.suites import Shape


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


def test_square_suite_spans_1k_to_16k():
    shapes = suites.suite("square")
    assert [(s.m, s.n, s.k) for s in shapes] == [(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)]
    assert shapes[0].label == "1024^3"


@pytest.mark.parametrize(
    "model, proj, n, k",
    [
        ("8b", "qkv", 6144, 4096),  # 32 q heads + 2 x 8 kv heads, 128 each
        ("8b", "o", 4096, 4096),
        ("8b", "gate_up", 28672, 4096),
        ("8b", "down", 4096, 14336),
        ("70b", "qkv", 10240, 8192),  # 64 q heads + 2 x 8 kv heads
        ("70b", "o", 8192, 8192),
        ("70b", "gate_up", 57344, 8192),
        ("70b", "down", 8192, 28672),
    ],
)
def test_llm_suite_has_every_projection_at_every_token_count(model, proj, n, k):
    shapes = suites.suite("llm")
    found = {s.m for s in shapes if s.label.startswith(f"{model} {proj} ") and (s.n, s.k) == (n, k)}
    assert found == set(suites.LLM_TOKENS)
    assert min(found) == 1 and max(found) == 16384


def test_llm_suite_size_and_overrides():
    assert len(suites.suite("llm")) == 2 * 4 * len(suites.LLM_TOKENS)
    shapes = suites.suite("llm", tokens=(7, 4096), models=("70b",))
    assert len(shapes) == 4 * 2
    assert {s.m for s in shapes} == {7, 4096}
    assert {s.group for s in shapes} == {"70b"}


def test_decode_suite_is_small_m_of_the_llm_projections():
    shapes = suites.suite("decode")
    assert {s.m for s in shapes} == {1, 16, 64, 128}
    assert len(shapes) == 2 * 4 * 4
    llm_nk = {(s.n, s.k) for s in suites.suite("llm")}
    assert {(s.n, s.k) for s in shapes} == llm_nk


def test_ragged_suite_is_primes_and_non_tile_multiples():
    shapes = suites.suite("ragged")
    primes = [s for s in shapes if all(_is_prime(v) for v in (s.m, s.n, s.k))]
    aligned = [s for s in shapes if s not in primes]
    assert len(primes) >= 4 and len(aligned) >= 2
    for s in aligned:
        # 16-byte rows (multiples of 8 halves), but no tile edge (16, 32, 64, 128, 256) divides.
        assert all(v % 8 == 0 and v % 16 != 0 for v in (s.m, s.n, s.k)), s


def test_quick_suite_is_two_squares_and_one_llm_shape():
    shapes = suites.suite("quick")
    assert [(s.m, s.n, s.k) for s in shapes] == [
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (4096, 28672, 4096),
    ]


def test_suite_rejects_unknown_names_and_misplaced_overrides():
    with pytest.raises(ValueError, match="unknown suite"):
        suites.suite("huge")
    with pytest.raises(ValueError, match="llm and decode"):
        suites.suite("square", tokens=(1,))
    with pytest.raises(ValueError, match="unknown model"):
        suites.suite("llm", models=("405b",))


def test_models_suite_is_the_seeded_draw_of_layer_gemms():
    from wsgemm.bench import models

    shapes = suites.suite("models", seed=4, count=30)
    drawn = models.draw(4, count=30)
    assert [(s.m, s.n, s.k, s.label, s.group) for s in shapes] == [
        (d.tokens, d.n, d.k, d.label, d.family) for d in drawn
    ]
    assert len({s.label for s in shapes}) == len(shapes)
    assert all(s.layout == "" for s in shapes)  # the run's --layout: TN unless told otherwise
    assert [s.label for s in suites.suite("models", seed=4, count=30)] == [s.label for s in shapes]
    assert [s.label for s in suites.suite("models", seed=5, count=30)] != [s.label for s in shapes]
    assert len(suites.suite("models")) == models.DEFAULT_COUNT


def test_models_suite_keeps_the_draws_of_the_runs_dtype():
    from wsgemm.bench import models

    drawn = models.draw(2, families=("olmoe",), count=40)
    for dtype in models.DTYPES:
        shapes = suites.suite("models", seed=2, families=("olmoe",), count=40, dtype=dtype)
        assert [s.label for s in shapes] == [d.label for d in drawn if d.dtype == dtype]
        assert {s.group for s in shapes} == {"olmoe"}
    first = drawn[0]
    other = next(d for d in models.DTYPES if d != first.dtype)
    with pytest.raises(ValueError, match=f"have none in {other}"):
        suites.suite("models", seed=2, families=("olmoe",), count=1, dtype=other)


def test_models_suite_options_belong_to_it():
    with pytest.raises(ValueError, match="apply to the models suite, not 'square'"):
        suites.suite("square", families=("yi",))
    with pytest.raises(ValueError, match="apply to the models suite, not 'llm'"):
        suites.suite("llm", count=3)
    with pytest.raises(ValueError, match="llm and decode suites, not 'models'"):
        suites.suite("models", tokens=(1,))
    with pytest.raises(ValueError, match="unknown model family 'gpt'; choose from llama3"):
        suites.suite("models", families=("gpt",))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096,4096,4096", [(4096, 4096, 4096)]),
        ("1,8192,8192; 127 , 255 ,511", [(1, 8192, 8192), (127, 255, 511)]),
        ("64x128x256;", [(64, 128, 256)]),
    ],
)
def test_parse_shapes(text, expected):
    shapes = suites.parse_shapes(text)
    assert [(s.m, s.n, s.k) for s in shapes] == expected
    assert all(s.group == "custom" and s.label == f"{s.m}x{s.n}x{s.k}" for s in shapes)


@pytest.mark.parametrize("text", ["", ";", "1,2", "1,2,3,4", "a,b,c", "0,1,1", "-1,2,3"])
def test_parse_shapes_rejects(text):
    with pytest.raises(ValueError):
        suites.parse_shapes(text)


def test_parse_int_list():
    assert suites.parse_int_list("1, 16,128") == (1, 16, 128)
    for bad in ("", "0", "1,x", "-4"):
        with pytest.raises(ValueError):
            suites.parse_int_list(bad)


def test_shape_validates_and_counts_flop():
    assert Shape(2, 3, 4).flop == 48
    with pytest.raises(ValueError, match="Shape.k"):
        Shape(1, 1, 0)
    with pytest.raises(ValueError, match="Shape.m"):
        Shape(True, 1, 1)


# Which stride of each operand is 1: A is (M, K) so stride (K, 1) is K-major; B is (K, N).
MAJORS = {"TN": ("K", "K"), "NN": ("M", "K"), "NT": ("M", "N"), "TT": ("K", "N")}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layouts_are_copy_free_views_with_the_documented_majors(layout, dtype):
    m, n, k = 5, 7, 9
    a, b = make_operands(Layout(layout), m, n, k, dtype, "cpu", torch.Generator().manual_seed(0))
    assert a.shape == (m, k) and b.shape == (k, n) and a.dtype == b.dtype == dtype
    a_major, b_major = MAJORS[layout]
    assert (Layout(layout).a_major, Layout(layout).b_major) == (a_major, b_major)
    assert a.stride() == ((k, 1) if a_major == "K" else (1, m))
    assert b.stride() == ((n, 1) if b_major == "N" else (1, k))
    # One allocation each, exactly the matrix: the view is the storage, no copy was made.
    assert a.untyped_storage().nbytes() == m * k * a.element_size()
    assert b.untyped_storage().nbytes() == k * n * b.element_size()


def test_tn_is_the_linear_layer_layout():
    a, b = make_operands(Layout("TN"), 4, 6, 8, torch.float32, "cpu")
    weight = b.t()  # (N, K) row-major, as nn.Linear stores it
    assert weight.is_contiguous() and a.is_contiguous()
    torch.testing.assert_close(torch.nn.functional.linear(a, weight), a @ b)


def test_layout_rejects_unknown_letters():
    with pytest.raises(ValueError, match="unknown layout"):
        Layout("TX")


def test_midsize_suite_is_fixed_ragged_and_mixed_layout():
    shapes = suites.suite("midsize")
    assert [(s.m, s.n, s.k, s.layout) for s in shapes] == list(suites.MIDSIZE)
    assert all(500 <= v <= 6000 for s in shapes for v in (s.m, s.n, s.k))
    assert {s.layout for s in shapes} == set(LAYOUTS)
    aligned = [s for s in shapes if all(v % 8 == 0 for v in (s.m, s.n, s.k))]
    assert 0 < len(aligned) < len(shapes)  # both 16-byte rows and ragged ones
    assert len({s.label for s in shapes}) == len(shapes)


def test_shape_layout_must_be_known():
    assert Shape(8, 8, 8).layout == ""
    with pytest.raises(ValueError, match="Shape.layout must be empty or one of"):
        Shape(8, 8, 8, layout="XY")


def test_on_the_h200_decode_shapes_are_memory_bound_and_large_ones_are_not():
    from wsgemm.bench import hardware, roofline

    ridge = hardware.ridge_flop_per_byte(132, 4096, 1980.0, hardware.hbm_tbps("NVIDIA H200"))
    assert ridge == pytest.approx(223.03, abs=0.01)

    def bound(s):
        return roofline.intensity(s.m, s.n, s.k, 2, 2) < ridge

    assert all(bound(s) for s in suites.suite("decode"))
    assert not any(bound(s) for s in suites.suite("square"))
    assert {s.m for s in suites.suite("llm") if bound(s)} == {1, 16, 128}
