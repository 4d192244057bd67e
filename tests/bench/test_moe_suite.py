"""The moe suite (issue #26) on the CPU: its configs and routing draws, the grouped contenders
against the fp64 reference, the runner and the record with a scripted timer, and the CLI."""

import argparse
import copy
import csv
import dataclasses
import math

import pytest
import torch
from test_bench_record import h200_header

import wsgemm
from wsgemm.bench import check, cli, moe, report, roofline, runner, schema, suites
from wsgemm.bench.measure import Estimate, Sample

SMALL = moe.GroupedShape(
    24, 40, (3, 0, 17, 5, 0), "skewed", 5, label="small t/e=5 skewed", group="small"
)
WGRAD = moe.GroupedShape(
    24, 40, (3, 0, 17, 5, 0), "skewed", 5, label="small wgrad", group="small", direction="wgrad"
)


class ScriptedTimer:
    """Every call takes 1 ms; logs nothing, measures nothing real."""

    def estimate(self, fn):
        return Estimate(gpu_ms=1.0, host_ms=0.01, cycle_ms=1.1)

    def measure(self, fn, reps, estimate):
        fn()
        return Sample(1.0, 1980.0, 650.0)


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def _without_grouped_mm(monkeypatch):
    """wsgemm as it is before the lead's grouped_mm lands, whatever this checkout has."""
    monkeypatch.delattr(wsgemm, "grouped_mm", raising=False)
    public = {k: v for k, v in wsgemm._PUBLIC.items() if k != "grouped_mm"}
    monkeypatch.setattr(wsgemm, "_PUBLIC", public)


# ---- configs and draws ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, experts, hidden, width, top_k",
    [
        ("deepseek-v3", 256, 7168, 2048, 8),
        ("qwen3-30b-a3b", 128, 2048, 768, 8),
        ("qwen3-235b-a22b", 128, 4096, 1536, 8),
        ("mixtral-8x7b", 8, 4096, 14336, 2),
    ],
)
def test_model_configs_and_their_gemms(name, experts, hidden, width, top_k):
    model = moe.MODELS[name]
    assert (model.experts, model.hidden, model.intermediate, model.top_k) == (
        experts, hidden, width, top_k,
    )  # fmt: skip
    assert model.projections() == (("gate_up", 2 * width, hidden), ("down", hidden, width))


def test_the_suite_is_every_model_projection_tokens_and_routing():
    shapes = suites.suite("moe")
    assert len(shapes) == len(moe.MODELS) * 2 * len(moe.TOKENS_PER_EXPERT) * len(moe.ROUTINGS)
    for shape in shapes:
        model = moe.MODELS[shape.group]
        assert len(shape.sizes) == model.experts
        assert shape.m == shape.tokens_per_expert * model.experts
        assert shape.flop == 2 * sum(shape.sizes) * shape.n * shape.k
        assert shape.layout == "TN" and shape.routing in shape.label


@pytest.mark.parametrize("total, groups", [(2048, 256), (1000, 7), (5, 8), (64, 8)])
def test_balanced_counts_are_equal_with_the_remainder_spread(total, groups):
    sizes = moe.balanced(total, groups)
    assert len(sizes) == groups and sum(sizes) == total
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)  # the remainder goes to the first ones


def test_skewed_draws_are_reproducible_from_the_seed():
    model = moe.MODELS["qwen3-30b-a3b"]
    first = moe.group_sizes(model, 64, "skewed", seed=3)
    moe.skewed.cache_clear()
    assert moe.group_sizes(model, 64, "skewed", seed=3) == first
    assert moe.group_sizes(model, 64, "skewed", seed=4) != first
    assert sum(first) == 64 * model.experts


def test_filtering_never_changes_a_problem():
    everything = {s.label: s.sizes for s in moe.problems(seed=1, tokens=(8, 64))}
    some = moe.problems(seed=1, models=("mixtral-8x7b", "deepseek-v3"), tokens=(64,),
                        routings=("skewed",))  # fmt: skip
    assert len(some) == 4
    for shape in some:
        assert shape.sizes == everything[shape.label]
    gate_up, down = (s for s in some if s.group == "deepseek-v3")
    assert gate_up.sizes == down.sizes  # one layer's two GEMMs see the same routing


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_skewed_routing_is_heavy_headed_and_leaves_experts_empty_at_few_tokens(seed):
    model = moe.MODELS["deepseek-v3"]
    sizes = moe.group_sizes(model, 8, "skewed", seed)
    assert sum(sizes) == 8 * model.experts
    assert max(sizes) > 20 * 8  # the Zipf head: about a quarter of all rows
    assert sizes.count(0) > 0


def test_the_busiest_expert_is_drawn_too():
    model = moe.MODELS["deepseek-v3"]
    busiest = set()
    for seed in range(5):
        sizes = moe.group_sizes(model, 8, "skewed", seed)
        busiest.add(sizes.index(max(sizes)))
    assert len(busiest) > 1  # the Zipf ranks are shuffled over the experts per seed


def test_offs_are_the_cumulative_group_ends():
    for shape in moe.problems(seed=0, models=("deepseek-v3",), tokens=(8,)):
        offs = shape.offs
        assert len(offs) == len(shape.sizes) and offs[-1] == shape.m
        assert all(b >= a for a, b in zip([0, *offs], offs, strict=False))
        assert [b - a for a, b in zip([0, *offs], offs, strict=False)] == list(shape.sizes)
        if shape.routing == "skewed":  # empty groups: an end repeats
            assert len(set(offs)) < len(offs)
    problem = moe.workload(SMALL, torch.float16, "cpu")
    assert problem.offs.dtype == torch.int32 and problem.offs.tolist() == [3, 3, 20, 25, 25]
    assert problem.a.shape == (25, 40) and problem.b.shape == (5, 40, 24)
    assert problem.b.stride(1) == 1  # K-major weights: [G, N, K] stored, passed transposed


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"models": ("8b",)}, "unknown MoE model '8b'"),
        ({"routings": ("uniform",)}, "unknown routing 'uniform'"),
    ],
)
def test_bad_selections_name_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        moe.problems(**kwargs)


# ---- contenders and the check ---------------------------------------------------------------


def _run_contender(contender, problem, shape):
    out = torch.empty(shape.out_shape, dtype=problem.a.dtype)
    check.poison(out)
    produced = contender.make(problem, out)()
    return produced if contender.returns_output else out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_loop_matches_the_fp64_reference(dtype):
    gen = torch.Generator().manual_seed(0)
    problem = moe.workload(SMALL, dtype, "cpu", gen)
    out = _run_contender(moe.loop(), problem, SMALL)
    name = "fp16" if dtype == torch.float16 else "bf16"
    tolerance = check.model_tolerance(name, "fp32", SMALL.k)
    errors = moe.errors(out, problem)
    assert errors.finite and tolerance.verdict(errors) is None
    # the check sees a wrong group, and a row no contender wrote
    bad = out.clone()
    bad[3:20] = bad[3:20].flip(0)
    assert "tolerance" in tolerance.verdict(moe.errors(bad, problem))
    bad = out.clone()
    bad[-1] = float("nan")
    assert not moe.errors(bad, problem).finite


def test_torch_grouped_mm_matches_where_it_runs():
    problem = moe.workload(SMALL, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    if moe._torch_problem("cpu", "bf16"):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    out = _run_contender(moe.torch_grouped(), problem, SMALL)
    errors = moe.errors(out, problem)
    assert check.model_tolerance("bf16", "fp32", SMALL.k).verdict(errors) is None


def test_the_reference_in_chunks_is_the_reference_in_one_piece(monkeypatch):
    problem = moe.workload(SMALL, torch.float16, "cpu", torch.Generator().manual_seed(2))
    out = _run_contender(moe.loop(), problem, SMALL)
    out[7, 3] += 1.0  # a visible error, so rel and peak are not rounding noise
    whole = moe.errors(out, problem)
    monkeypatch.setattr(moe, "REFERENCE_CHUNK_BYTES", 8 * 40 * 2)  # two rows at a time
    chunked = moe.errors(out, problem)
    assert chunked.rel == pytest.approx(whole.rel, rel=1e-9)
    assert chunked.peak == pytest.approx(whole.peak, rel=1e-9)


def test_the_peak_error_is_each_groups_over_its_own_scale():
    """Groups of very different scale (a weight gradient's sum over each group's own tokens):
    a result rounded correctly in every group passes, an error small against the largest group
    but large against its own group does not."""
    problem = moe.workload(SMALL, torch.bfloat16, "cpu", torch.Generator().manual_seed(3))
    problem.a[: SMALL.sizes[0]] *= 1000.0  # group 0 a thousand times the others
    out = _run_contender(moe.loop(), problem, SMALL)
    tolerance = check.model_tolerance("bf16", "fp32", SMALL.k)
    assert tolerance.verdict(moe.errors(out, problem)) is None
    last = sum(SMALL.sizes[:3])  # the first row of group 3 (five rows)
    bad = out.clone()
    bad[last] += out[last].abs().max() * 0.5
    assert "tolerance" in tolerance.verdict(moe.errors(bad, problem))


def test_backend_names(monkeypatch):
    assert moe.expand(["all"]) == ["torch", "loop", "wsgemm:auto"]
    assert moe.expand(["wsgemm", "loop", "wsgemm:sm90"]) == ["wsgemm:auto", "loop", "wsgemm:sm90"]
    for bad in ("cublas", "triton", "wsgemm:"):
        with pytest.raises(ValueError, match="unknown backend"):
            moe.expand([bad])


def test_fp16_runs_against_the_loop_and_wsgemm_is_unavailable_without_grouped_mm(monkeypatch):
    _without_grouped_mm(monkeypatch)
    backends, missing, baseline = moe.resolve(["all"], "cpu", "fp16")
    assert baseline == "loop" and [b.name for b in backends] == ["loop"]
    reasons = {u.name: u.reason for u in missing}
    assert "bf16 only" in reasons["torch"]
    assert "wsgemm.grouped_mm is missing" in reasons["wsgemm:auto"]


def test_wsgemm_grouped_mm_is_called_with_offs_and_backend_and_returns_its_result(monkeypatch):
    calls = []

    def grouped_mm(a, b, offs=None, *, out=None, out_dtype=None, backend="auto"):
        calls.append(backend)
        assert out is None  # as a model calls it in torch's place: a fresh result
        out = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype)
        start = 0
        for g, end in enumerate(offs.tolist()):
            torch.mm(a[start:end], b[g], out=out[start:end])
            start = end
        return out

    monkeypatch.setattr(wsgemm, "grouped_mm", grouped_mm, raising=False)
    backends, missing, baseline = moe.resolve(["loop", "wsgemm:auto", "wsgemm:x"], "cpu", "fp16")
    assert [b.name for b in backends] == ["loop", "wsgemm:auto", "wsgemm:x"] and not missing
    problem = moe.workload(SMALL, torch.float16, "cpu", torch.Generator().manual_seed(3))
    out = _run_contender(backends[1], problem, SMALL)
    assert check.model_tolerance("fp16", "fp32", SMALL.k).verdict(moe.errors(out, problem)) is None
    _run_contender(backends[2], problem, SMALL)
    assert calls == ["auto", "x"]


# ---- the runner and the record --------------------------------------------------------------


@pytest.fixture(scope="module")
def moe_record():
    mp = pytest.MonkeyPatch()
    _without_grouped_mm(mp)
    try:
        options = runner.Options(dtype="bf16", rounds=2, target_ms=1.0)
        shapes = [SMALL, moe.GroupedShape(16, 8, (4, 4), "balanced", 4, label="tiny", group="t")]
        backends, missing, baseline = moe.resolve(["all"], "cpu", "bf16")
    finally:
        mp.undo()
    output = runner.run(shapes, backends, missing, options, ScriptedTimer(), "cpu",
                        lambda clock: None, baseline=baseline)  # fmt: skip
    header = h200_header(options, [b.name for b in backends] + [u.name for u in missing])
    header["options"] = {**options.to_dict("moe", header["options"]["backends"]),
                         "baseline": baseline}  # fmt: skip
    return schema.record(header, output.rows), baseline


def test_a_moe_run_records_every_contender_against_its_baseline(moe_record):
    rec, baseline = moe_record
    expected = "loop" if moe._torch_problem("cpu", "bf16") else "torch"
    assert baseline == expected == report.baseline_of(rec)
    assert report.backends_in_order(rec)[0] == baseline
    ok = [r for r in rec["results"] if r["status"] == "ok"]
    assert {r["backend"] for r in ok} == ({"loop"} if baseline == "loop" else {"torch", "loop"})
    for r in ok:
        assert r["grouped"]["sizes"] and sum(r["grouped"]["sizes"]) == r["m"]
        assert r["error"]["rel"] <= r["error"]["tol_rel"]
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / (r["median_ms"] * 1e9))
        # the bandwidth reads each non-empty group's weights once
        weights = sum(s > 0 for s in r["grouped"]["sizes"])
        moved = (r["m"] * r["k"] + weights * r["n"] * r["k"] + r["m"] * r["n"]) * 2
        assert r["tbps"] == pytest.approx(moved / (r["median_ms"] * 1e9))
    (auto,) = {r["status"] + r["note"] for r in rec["results"] if r["backend"] == "wsgemm:auto"}
    assert "grouped_mm is missing" in auto


def test_a_moe_record_round_trips_and_renders(moe_record, tmp_path):
    rec, baseline = moe_record
    path = tmp_path / "moe.json"
    schema.write_json(rec, path)
    assert schema.load(path) == rec
    text = report.render_text(rec, width=220)
    assert f"vs {baseline}" in text and "5 groups, max 17, 2 empty" in text
    md = report.markdown(rec)
    assert f"geomean vs {baseline}" in md and "vs cuBLAS" not in md
    schema.write_csv(rec, tmp_path / "moe.csv")
    with open(tmp_path / "moe.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["label"] == SMALL.label]
    assert {(r["groups"], r["routing"], r["empty_groups"], r["max_group"]) for r in rows} == {
        ("5", "skewed", "2", "17")
    }


def test_a_moe_record_plots(moe_record, tmp_path):
    from wsgemm.bench import plot

    plot.plot(moe_record[0], tmp_path / "moe.png")
    assert (tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"


def test_a_grouped_row_whose_sizes_do_not_add_up_is_refused(moe_record):
    rec = copy.deepcopy(moe_record[0])
    rec["results"][0]["grouped"]["sizes"][0] += 1
    with pytest.raises(schema.RecordError, match="grouped"):
        schema.validate(rec)
    rec = copy.deepcopy(moe_record[0])
    rec["header"]["options"]["baseline"] = 3
    with pytest.raises(schema.RecordError, match="options.baseline"):
        schema.validate(rec)


def test_bytes_moved_counts_one_weight_per_group():
    dense = roofline.bytes_moved(64, 32, 16, 2, 2)
    assert roofline.bytes_moved(64, 32, 16, 2, 2, weights=8) == dense + 7 * 32 * 16 * 2
    assert math.isclose(
        roofline.intensity(64, 32, 16, 2, 2, weights=8),
        2 * 64 * 32 * 16 / roofline.bytes_moved(64, 32, 16, 2, 2, weights=8),
    )


# ---- the command line -----------------------------------------------------------------------


def test_cli_plans_the_moe_suite():
    shapes, options, suite = cli._plan(
        parse("--suite", "moe", "--models", "mixtral-8x7b,qwen3-30b-a3b", "--tokens", "8,64",
              "--routing", "skewed", "--dtype", "bf16", "--seed", "5")
    )  # fmt: skip
    assert suite == "moe" and options.dtype == "bf16" and len(shapes) == 2 * 2 * 2
    assert all(isinstance(s, moe.GroupedShape) and s.routing == "skewed" for s in shapes)
    assert shapes == moe.problems(5, ("mixtral-8x7b", "qwen3-30b-a3b"), (8, 64), ("skewed",))
    assert cli._selection("all", grouped=True) == ["all"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backends", "cublas"], "unknown backend 'cublas' for the moe suite"),
        (["--epilogue", "bias"], "--epilogue applies to the dense suites"),
        (["--accumulate", "fp16"], "accumulates in fp32"),
        (["--layout", "NT"], "runs TN"),
        (["--models", "8b"], "unknown MoE model '8b'"),
        (["--routing", "uniform"], "unknown routing 'uniform'"),
        (["--tokens", "0"], "positive integers"),
    ],
)
def test_moe_usage_errors(argv, message, capsys):
    assert cli.run(parse("--suite", "moe", "--models", "mixtral-8x7b", *argv)) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_routing_belongs_to_the_moe_suite(capsys):
    assert cli.run(parse("--suite", "llm", "--routing", "skewed")) == cli.EXIT_USAGE
    assert cli.run(parse("--shapes", "1,2,3", "--routing", "skewed")) == cli.EXIT_USAGE
    assert cli.run(parse("--suite", "llm", "--pass", "wgrad")) == cli.EXIT_USAGE
    assert capsys.readouterr().err.count("--routing/--pass apply to the moe suite") == 3


def test_without_a_gpu_the_moe_suite_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ("--suite", "moe", "--models", "mixtral-8x7b", "--backends", "loop,wsgemm")
    assert cli.run(parse(*argv)) == cli.EXIT_NO_GPU
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pass_", ["forward", "wgrad"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_moe_suite_end_to_end_on_a_gpu(dtype, pass_, tmp_path):
    """Both passes through the CLI: every row of its pass, the baseline, the loop and the
    grouped kernels (``wsgemm:sm90``) ok; a wrong row fails the run (none in the weight
    gradient's, whose kernel is wsgemm's only road there)."""
    path = tmp_path / "moe.json"
    code = cli.run(
        parse("--suite", "moe", "--pass", pass_, "--models", "qwen3-30b-a3b", "--tokens", "8",
              "--dtype", dtype, "--backends", "all,wsgemm:sm90", "--rounds", "2",
              "--target-ms", "1", "--no-progress", "--json", str(path))
    )  # fmt: skip
    rec = schema.load(path)
    baseline = rec["header"]["options"]["baseline"]
    assert baseline == ("loop" if dtype == "fp16" else baseline) and baseline in ("torch", "loop")
    rows = rec["results"]
    assert len({r["label"] for r in rows}) == 4  # 2 projections x 2 routings
    assert {r["grouped"].get("pass", "forward") for r in rows} == {pass_}
    checked = (baseline, "loop", "wsgemm:sm90")
    assert {r["status"] for r in rows if r["backend"] in checked} == {"ok"}
    wrong = [r for r in rows if r["status"] == "wrong"]
    assert not (wrong and pass_ == "wgrad")
    assert code == (cli.EXIT_FAILED if wrong else cli.EXIT_OK)


# ---- the weight gradient (2D x 2D) ----------------------------------------------------------


def test_the_weight_gradient_pass_is_the_same_layers_2d_x_2d_form():
    """``--pass wgrad``: each layer's dW = dY^T X per expert, K the tokens split by offs; the
    forward problems are unchanged, and a wgrad problem shares its layer's group sizes."""
    fwd = moe.problems(3, ("mixtral-8x7b",), (64,), ("skewed",))
    both = moe.problems(3, ("mixtral-8x7b",), (64,), ("skewed",), ("forward", "wgrad"))
    assert [s for s in both if s.direction == "forward"] == fwd
    wgrad = [s for s in both if s.direction == "wgrad"]
    assert len(wgrad) == len(fwd) == 2
    for f, w in zip(fwd, wgrad, strict=True):
        assert (w.n, w.k, w.sizes, w.flop) == (f.n, f.k, f.sizes, f.flop)
        assert w.out_shape == (len(w.sizes), w.n, w.k) and f.out_shape == (f.m, f.n)
        assert "wgrad" in w.label and w.grouped["pass"] == "wgrad" and "pass" not in f.grouped
    with pytest.raises(ValueError, match="unknown pass"):
        moe.problems(passes=("backward",))
    shapes, _, _ = cli._plan(parse("--suite", "moe", "--models", "mixtral-8x7b", "--tokens",
                                   "64", "--pass", "wgrad"))  # fmt: skip
    assert {s.direction for s in shapes} == {"wgrad"} and len(shapes) == 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_weight_gradient_loop_matches_the_fp64_reference(dtype):
    gen = torch.Generator().manual_seed(4)
    problem = moe.workload(WGRAD, dtype, "cpu", gen)
    assert problem.a.shape == (WGRAD.n, WGRAD.m) and problem.a.stride(0) == 1  # dY^T
    assert problem.b.shape == (WGRAD.m, WGRAD.k)
    out = _run_contender(moe.loop(), problem, WGRAD)
    assert out.shape == (5, 24, 40) and (out[1] == 0).all() and (out[4] == 0).all()
    name = "fp16" if dtype == torch.float16 else "bf16"
    tolerance = check.model_tolerance(name, "fp32", max(WGRAD.sizes))
    errors = moe.errors(out, problem)
    assert errors.finite and tolerance.verdict(errors) is None
    bad = out.clone()
    bad[2] = bad[2].flip(0)  # a wrong group is seen
    assert "tolerance" in tolerance.verdict(moe.errors(bad, problem))
    bad = out.clone()
    bad[4, 0, 0] = 1.0  # an empty group's gradient must be zero
    assert moe.errors(bad, problem).rel > 0
    # in chunks of the reference's rows, the same errors
    whole = moe.errors(bad, problem)
    mp = pytest.MonkeyPatch()
    mp.setattr(moe, "REFERENCE_CHUNK_BYTES", 8 * 40 * 3)  # 3 rows and 3 tokens at a time
    try:
        chunked = moe.errors(bad, problem)
    finally:
        mp.undo()
    assert chunked.rel == pytest.approx(whole.rel, rel=1e-9)


def test_a_one_token_groups_correctly_rounded_outer_product_passes():
    """A group of one token's weight gradient is an outer product: its largest elements are
    many times its RMS, so their output rounding alone would pass eight ``u_out`` of the RMS
    (the H200 run of docs/perf.md entry 61 called every backend wrong on such a draw). The
    rounding of each element is allowed; an error past it is not."""
    shape = moe.GroupedShape(256, 256, (1, 40), "skewed", 20, label="one token", group="t",
                             direction="wgrad")  # fmt: skip
    problem = moe.workload(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(5))
    problem.a[0, 0] = problem.b[0, 0] = 31.0  # 961, which bf16 rounds by 1: ~0.26 RMS
    out = _run_contender(moe.loop(), problem, shape)
    tolerance = check.model_tolerance("bf16", "fp32", 40)
    ref = problem.a[:, :1].double() @ problem.b[:1].double()
    rms = float(ref.square().mean().sqrt())
    assert float((out[0].double() - ref).abs().max()) / rms > tolerance.peak  # the old rule
    assert tolerance.verdict(moe.errors(out, problem)) is None
    bad = out.clone()
    bad[0, 3, 5] += 40 * tolerance.peak * rms
    assert "peak" in tolerance.verdict(moe.errors(bad, problem))


def _loop_record(shape) -> dict:
    """The record of ``shape`` run by the loop (scripted timer, an H200's header), validated."""
    options = runner.Options(dtype="fp16", rounds=2, target_ms=1.0)
    out = runner.run([shape], [moe.loop()], [], options, ScriptedTimer(), "cpu",
                     lambda clock: None, baseline="loop")  # fmt: skip
    header = h200_header(options, ["loop"])
    header["options"] = {**options.to_dict("moe", ["loop"]), "baseline": "loop"}
    return schema.record(header, out.rows)


def test_a_weight_gradient_row_records_and_moves_its_own_bytes():
    """A wgrad row: its ``grouped.pass``, validated; its bytes read dY and X once and write
    every group's N x K gradient."""
    rec = _loop_record(WGRAD)
    [row] = rec["results"]
    assert row["status"] == "ok" and row["grouped"]["pass"] == "wgrad"
    moved = (WGRAD.m * WGRAD.n + WGRAD.m * WGRAD.k + 5 * WGRAD.n * WGRAD.k) * 2
    assert row["tbps"] == pytest.approx(moved / (row["median_ms"] * 1e9))
    assert moved == roofline.bytes_moved(WGRAD.m, WGRAD.n, WGRAD.k, 2, 2, 5, wgrad=True)
    bad = copy.deepcopy(rec)
    bad["results"][0]["grouped"]["pass"] = "backward"
    with pytest.raises(schema.RecordError, match="grouped.pass"):
        schema.validate(bad)


def test_the_routed_pass_scales_each_row_by_its_router_weight(monkeypatch):
    """``--pass routed``: the forward product times each row's router weight; the loop scales
    its result after the products, wsgemm is called with ``row_scale``; the reference scales
    its rows, so an unscaled result is wrong."""
    routed = dataclasses.replace(SMALL, direction="routed", label="small routed")
    assert routed.out_shape == SMALL.out_shape and routed.grouped["pass"] == "routed"
    problem = moe.workload(routed, torch.float16, "cpu", torch.Generator().manual_seed(6))
    assert problem.row_scale.shape == (routed.m,) and problem.row_scale.dtype == torch.float32
    tolerance = check.model_tolerance("fp16", "fp32", routed.k)
    out = _run_contender(moe.loop(), problem, routed)
    assert tolerance.verdict(moe.errors(out, problem)) is None
    plain = dataclasses.replace(problem, row_scale=None)
    unscaled = _run_contender(moe.loop(), plain, SMALL)
    assert "tolerance" in tolerance.verdict(moe.errors(unscaled, problem))
    seen = []

    def grouped_mm(a, b, offs=None, *, backend="auto", row_scale=None):
        seen.append(row_scale)
        ends = offs.tolist()
        starts = [0, *ends[:-1]]
        out = torch.cat([a[starts[g] : ends[g]] @ b[g] for g in range(len(ends))])
        return out if row_scale is None else (out.float() * row_scale[:, None]).half()

    monkeypatch.setattr(wsgemm, "grouped_mm", grouped_mm, raising=False)
    out = _run_contender(moe.wsgemm_grouped("auto"), problem, routed)
    assert seen[-1] is problem.row_scale
    assert tolerance.verdict(moe.errors(out, problem)) is None
    shapes = moe.problems(models=("mixtral-8x7b",), tokens=(8,), passes=("routed",))
    assert shapes and all(s.direction == "routed" and " routed " in s.label for s in shapes)
    # its record validates (the schema knows the pass)
    rec = _loop_record(routed)
    schema.validate(rec)
    assert rec["results"][0]["grouped"]["pass"] == "routed" and rec["results"][0]["status"] == "ok"
