"""The benchmark's arithmetic: statistics, peaks, tolerances, clock sampling (CPU only)."""

import math
import time

import pytest
import torch

from wsgemm.bench import backends, check, hardware, measure, triton_matmul
from wsgemm.bench.measure import Sample
from wsgemm.bench.nvml import ClockSampler


def test_reps_cover_the_target_within_bounds():
    assert measure.reps_for(1.0, 10.0, 3, 100) == 10
    assert measure.reps_for(0.001, 10.0, 3, 100) == 100
    assert measure.reps_for(50.0, 10.0, 3, 100) == 3
    assert measure.reps_for(0.0, 10.0, 3, 100) == 100
    assert measure.reps_for(float("nan"), 10.0, 3, 100) == 100


def test_the_hold_covers_the_whole_queue():
    """The GPU is held while the host queues every call of a measurement, not just the first:
    a host that slows mid-queue (a busier thread, a slower call path) must not leave the GPU
    waiting with the next call's launch inside its events. A host faster than the GPU gets
    the same hold (its calls run back to back after it either way)."""
    fast_host = measure.Estimate(gpu_ms=0.1, host_ms=0.03, cycle_ms=0.2)
    slow_host = measure.Estimate(gpu_ms=0.1, host_ms=0.5, cycle_ms=0.2)
    for est in (fast_host, slow_host):
        hold = measure.hold_for(est, 20)
        assert hold >= 21 * est.host_ms  # every call's queueing time, and the first's again
        assert hold <= measure.HOLD_MARGIN * 21 * est.host_ms
    assert measure.hold_for(measure.Estimate(1.0, 50.0, 1.0), 20) == measure.MAX_HOLD_MS


def test_rotation_puts_every_backend_in_every_slot():
    names = ["cublas", "a", "b", "c"]
    orders = [measure.rotated(names, r) for r in range(len(names))]
    for slot in range(len(names)):
        assert sorted(order[slot] for order in orders) == sorted(names)
    assert measure.rotated(names, 5) == measure.rotated(names, 1)
    assert measure.rotated([], 3) == []


def _peak_at(clock):
    return hardware.peak_tflops(132, 4096, clock)


def test_summary_pairs_ratios_round_by_round():
    # The clock drifts between rounds and moves both backends alike: per-round ratios stay
    # at 1.25 although the medians of the raw times come from different rounds.
    cublas = [Sample(1.0, 1980, 700), Sample(2.0, 1200, 650), Sample(1.2, 1900, 690)]
    other = [Sample(0.8, 1980, 700), Sample(1.6, 1200, 650), Sample(0.96, 1900, 690)]
    s = measure.summarize(other, cublas, flop=10**12, peak_tflops_at=_peak_at)
    assert s.median_ms == pytest.approx(0.96)
    assert s.ratio == pytest.approx((1.25, 1.25, 1.25))
    assert s.round_ms == (0.8, 1.6, 0.96)
    assert s.sm_clock_mhz == 1900 and s.power_w == 690
    # % of peak is taken against each round's own clock, then the median.
    pcts = [100 * 1e12 / (x.ms * 1e9) / _peak_at(x.sm_clock_mhz) for x in other]
    assert s.pct_of_peak == pytest.approx(sorted(pcts)[1])


def test_summary_ratio_spread_and_missing_pieces():
    base = [Sample(1.0), Sample(1.0), Sample(1.0)]
    s = measure.summarize([Sample(0.5), Sample(1.0), Sample(2.0)], base, 10**9, lambda c: None)
    assert s.ratio == pytest.approx((1.0, 0.5, 2.0))
    assert s.pct_of_peak is None and s.sm_clock_mhz is None and s.power_w is None
    assert measure.summarize([Sample(1.0)], None, 1, lambda c: None).ratio is None


def test_tflops():
    assert measure.tflops(2 * 4096**3, 0.2) == pytest.approx(687.19, rel=1e-4)


def test_tensor_peaks_reproduce_the_datasheets():
    h100 = hardware.peak_tflops(132, hardware.flop_per_clock_per_sm((9, 0)), 1830)
    a100 = hardware.peak_tflops(108, hardware.flop_per_clock_per_sm((8, 0)), 1410)
    assert h100 == pytest.approx(989.4, rel=1e-3)
    assert a100 == pytest.approx(312.0, rel=1e-2)
    assert hardware.flop_per_clock_per_sm((8, 9)) is None
    assert hardware.flop_per_clock_per_sm(None) is None
    assert hardware.peak_tflops(132, None, 1830) is None
    assert hardware.peak_tflops(132, 4096, None) is None
    assert hardware.pct_of_peak(500.0, 1000.0) == 50.0
    assert hardware.pct_of_peak(None, 1000.0) is None


def _product(m, n, k, dtype=torch.float16):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    return a, b, check.reference(a, b)


def test_a_correct_product_passes_and_sets_the_tolerance():
    a, b, ref = _product(64, 96, 256)
    out = torch.matmul(a, b)
    e = check.errors(out, ref)
    model = check.model_tolerance("fp16", "fp32", 256)
    assert e.finite and e.rel < model.rel and e.peak < model.peak
    tol = check.tolerance(model, e)
    assert tol.rel >= model.rel and tol.peak >= model.peak
    assert tol.verdict(e) is None


def test_one_wrong_element_fails_on_peak_error():
    a, b, ref = _product(4096, 4096, 8)
    out = torch.matmul(a, b)
    out[17, 33] += float(ref.norm()) / math.sqrt(ref.numel())  # one rms off, one element
    e = check.errors(out, ref)
    tol = check.model_tolerance("fp16", "fp32", 8)
    assert e.rel < tol.rel  # invisible in the Frobenius norm...
    assert "peak error" in tol.verdict(e)  # ...but not in the peak


def test_unwritten_elements_fail_as_nan():
    a, b, ref = _product(32, 32, 32)
    out = torch.empty(32, 32, dtype=torch.float16)
    check.poison(out)
    out[:, :31] = torch.matmul(a, b)[:, :31]  # the last column is never written
    e = check.errors(out, ref)
    assert not e.finite
    assert "NaN" in check.model_tolerance("fp16", "fp32", 32).verdict(e)


def test_a_wrong_product_fails_on_relative_error():
    a, b, ref = _product(64, 128, 128)
    e = check.errors(torch.matmul(a, b.t().contiguous()), ref)  # B transposed: a layout bug
    assert "relative error" in check.model_tolerance("fp16", "fp32", 128).verdict(e)


def test_fp16_accumulation_gets_a_k_dependent_model():
    short = check.model_tolerance("fp16", "fp16", 256)
    long = check.model_tolerance("fp16", "fp16", 16384)
    assert long.rel > short.rel > check.model_tolerance("fp16", "fp32", 256).rel
    assert long.rel < 0.1  # still far below a wrong result (rel ~ 1)
    assert check.model_tolerance("bf16", "fp32", 1).rel == 2.0**-8


def test_tolerance_ignores_a_broken_baseline():
    model = check.model_tolerance("fp16", "fp32", 64)
    assert check.tolerance(model, None) == model
    assert check.tolerance(model, check.Errors(math.inf, math.inf, False)) == model


class FakeNvml:
    def __init__(self):
        self.clock = 1980.0

    def sm_clock_mhz(self):
        self.clock -= 10
        return self.clock

    def power_w(self):
        return 700.0


def test_clock_sampler_reports_medians_of_readings_while_running():
    sampler = ClockSampler(FakeNvml(), period_s=0.001)
    sampler.start()
    time.sleep(0.03)
    clock, power = sampler.stop()
    assert power == 700.0
    assert 1000 < clock < 1980


def test_clock_sampler_without_nvml():
    sampler = ClockSampler(None)
    sampler.start()
    assert sampler.stop() == (None, None)


def test_backend_names_expand_and_reject():
    assert backends._expand(["all"]) == ["cublas", "wsgemm:auto", "wsgemm", "triton", "quack"]
    assert backends._expand(["cublas", "wsgemm:sm90", "triton", "triton"]) == [
        "cublas",
        "wsgemm:sm90",
        "triton",
    ]
    for bad in (["cuda"], ["wsgemm:"], ["quack-fast"]):
        with pytest.raises(ValueError, match="unknown backend"):
            backends._expand(bad)


def test_quack_skips_fp16_accumulation():
    b = backends.quack_backend(tuned=False)
    problem = backends.Workload(a=None, b=None, accumulate=torch.float16, accumulate_name="fp16")
    assert "fp32 only" in b.skip(problem)
    assert backends.quack_backend(tuned=True).name == "quack-tuned"


def test_triton_matmul_validates_before_importing_triton():
    a = torch.empty(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="expected a"):
        triton_matmul.matmul(a, torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="fp16 or two bf16"):
        triton_matmul.matmul(a.float(), torch.empty(8, 4))
    with pytest.raises(ValueError, match="fp16 inputs"):
        triton_matmul.matmul(
            a.bfloat16(), torch.empty(8, 4, dtype=torch.bfloat16), accumulate=torch.float16
        )
    with pytest.raises(ValueError, match="out must be"):
        triton_matmul.matmul(
            a, torch.empty(8, 4, dtype=torch.float16), out=torch.empty(4, 5, dtype=torch.float16)
        )


def test_triton_matmul_offsets_and_pruning():
    t = torch.empty(3, 5).t()
    assert triton_matmul._max_offset(t) == 15

    class Cfg:
        def __init__(self, bm, bn):
            self.kwargs = {"BLOCK_M": bm, "BLOCK_N": bn}

    configs = [Cfg(*c[:2]) for c in triton_matmul.CONFIGS]
    decode = triton_matmul._prune(configs, {"M": 1, "N": 4096})
    assert {c.kwargs["BLOCK_M"] for c in decode} == {64}
    assert len(triton_matmul._prune(configs, {"M": 8192, "N": 8192})) == len(configs)
    tiny = triton_matmul._prune(configs, {"M": 1, "N": 1})
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in tiny] == [(64, 64)]


def test_resolve_puts_cublas_first_and_reports_what_cannot_run(monkeypatch):
    monkeypatch.setattr(backends, "_wsgemm_kernels", lambda device: (["sm90", "sm80"], None))
    monkeypatch.setattr(
        backends,
        "_import_problem",
        lambda module, attribute=None: "import failed: X" if module.startswith("quack") else None,
    )
    found, missing = backends.resolve(["all"], "cuda")
    assert [b.name for b in found] == [
        "cublas", "wsgemm:auto", "wsgemm:sm90", "wsgemm:sm80", "triton",
    ]  # fmt: skip
    assert [(m.name, m.reason) for m in missing] == [("quack", "import failed: X")]
    found, missing = backends.resolve(["wsgemm:sm90-pingpong", "wsgemm:auto"], "cuda")
    assert [b.name for b in found] == ["cublas", "wsgemm:auto"]
    assert missing[0].name == "wsgemm:sm90-pingpong"
    assert "available: sm90, sm80" in missing[0].reason


def test_resolve_survives_a_broken_wsgemm(monkeypatch):
    monkeypatch.setattr(backends, "_wsgemm_kernels", lambda device: ([], "it broke"))
    found, missing = backends.resolve(["cublas", "wsgemm"], "cuda")
    assert [b.name for b in found] == ["cublas"]
    # said once, under the first wsgemm row
    assert [(m.name, m.reason) for m in missing] == [("wsgemm:auto", "it broke")]


def test_import_problem_names_the_failure():
    assert backends._import_problem("json") is None
    assert backends._import_problem("json", attribute="no_such_thing").startswith(
        "import failed: AttributeError"
    )
    assert "ModuleNotFoundError" in backends._import_problem("no_such_module_xyz")


def test_cublas_rpr_allows_the_reduced_precision_reduction_around_its_call_only(monkeypatch):
    """``cublas-rpr`` runs torch.matmul with torch's default (the reduction in the inputs'
    dtype allowed), whatever the run's setting, and restores the run's setting after it."""
    assert backends._expand(["cublas-rpr", "wsgemm:auto"]) == ["wsgemm:auto", "cublas-rpr"]
    found, missing = backends.resolve(["cublas-rpr"], "cpu")
    assert [b.name for b in found] == ["cublas", "cublas-rpr"] and not missing
    assert found[1].error_factor == 4.0 and found[0].error_factor == 1.0
    m = torch.backends.cuda.matmul
    seen = []
    real = torch.matmul

    def spy(*args, **kw):
        seen.append((m.allow_fp16_reduced_precision_reduction,
                     m.allow_bf16_reduced_precision_reduction))  # fmt: skip
        return real(*args, **kw)

    monkeypatch.setattr(torch, "matmul", spy)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    out = torch.empty(4, 3)
    problem = backends.Workload(a=a, b=b, accumulate=torch.float32, accumulate_name="fp32")
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    try:
        m.allow_fp16_reduced_precision_reduction = False
        m.allow_bf16_reduced_precision_reduction = False
        found[1].make(problem, out)()
        after = (m.allow_fp16_reduced_precision_reduction,
                 m.allow_bf16_reduced_precision_reduction)  # fmt: skip
    finally:
        m.allow_fp16_reduced_precision_reduction = saved[0]
        m.allow_bf16_reduced_precision_reduction = saved[1]
    assert seen == [(True, True)] and after == (False, False)
    assert torch.equal(out, real(a, b))
    assert "no fused epilogue" in found[1].skip(
        backends.Workload(
            a=a, b=b, accumulate=torch.float32, accumulate_name="fp32", bias=torch.zeros(3)
        )  # fmt: skip
    )


def test_the_source_digest_names_the_code_a_record_ran(tmp_path):
    """``env.source_digest``: the package's sources' hash, the same for the same files, another
    for any change of a file's bytes or path, independent of anything outside the package."""
    import shutil
    from pathlib import Path

    from wsgemm.bench import env

    package = Path(env.__file__).resolve().parents[1]
    copy = tmp_path / "wsgemm"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    digest = env.source_digest(copy)
    assert digest == env.source_digest() and len(digest) == 64
    (tmp_path / "elsewhere.py").write_text("x = 1\n")  # outside the package: no change
    assert env.source_digest(copy) == digest
    target = copy / "bench" / "env.py"
    target.write_bytes(target.read_bytes() + b"\n")
    assert env.source_digest(copy) != digest
    target.write_bytes(target.read_bytes()[:-1])
    assert env.source_digest(copy) == digest
    target.rename(copy / "bench" / "env2.py")
    assert env.source_digest(copy) != digest


def test_a_record_says_which_settings_it_ran_under():
    """``env.settings``: the record's header carries wsgemm.config's switches as they are when
    the run begins (a batch-invariant held-out run says so)."""
    import wsgemm
    from wsgemm.bench import env

    with wsgemm.config.batch_invariant(True), wsgemm.config.autotune(False):
        said = {"batch_invariant": True, "autotune": False, "race_torch": False}
        assert env.settings() == said
    with wsgemm.config.batch_invariant(False), wsgemm.config.autotune(True):
        said = {"batch_invariant": False, "autotune": True, "race_torch": True}
        assert env.settings() == said
    # nothing set (WSGEMM_AUTOTUNE unset): the menu untuned, the race on off Hopper
    from wsgemm.host.choosing import autotune

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(autotune.ENV_AUTOTUNE, raising=False)
        autotune.environment.cache_clear()
        try:
            with wsgemm.config.batch_invariant(False), wsgemm.config.autotune(None):
                said = {"batch_invariant": False, "autotune": False, "race_torch": True}
                assert env.settings() == said
        finally:
            autotune.environment.cache_clear()
