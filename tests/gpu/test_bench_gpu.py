"""The benchmark on a real GPU: a tiny suite end to end, the wrong-result path, our Triton
matmul on every layout, and a sanity check of the timer. Skipped without a CUDA GPU."""

import argparse

import pytest
import torch

from wsgemm.bench import cli, hardware, report, runner, schema
from wsgemm.bench.backends import Contender, cublas, triton_backend
from wsgemm.bench.layouts import LAYOUTS
from wsgemm.bench.measure import CudaTimer
from wsgemm.bench.nvml import Nvml
from wsgemm.bench.suites import Shape, parse_shapes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TINY = "256,512,128;129,257,72"


def _has_triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _timer():
    device = torch.device("cuda", torch.cuda.current_device())
    nvml = Nvml.open(device.index)
    props = torch.cuda.get_device_properties(device)
    return device, CudaTimer(device, nvml, getattr(props, "L2_cache_size", None)), props


def _peak(props):
    fpc = hardware.flop_per_clock_per_sm((props.major, props.minor))
    return lambda clock: hardware.peak_tflops(props.multi_processor_count, fpc, clock)


def test_tiny_suite_end_to_end(tmp_path):
    out = {ext: tmp_path / f"bench.{ext}" for ext in ("json", "csv", "png", "md")}
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--shapes", TINY, "--backends", "all", "--rounds", "2", "--target-ms", "1",
         "--no-progress", "--json", str(out["json"]), "--csv", str(out["csv"]),
         "--plot", str(out["png"]), "--markdown", str(out["md"])]
    )  # fmt: skip
    code = cli.run(args)
    rec = schema.load(out["json"])
    assert all(p.stat().st_size > 0 for p in out.values())
    wrong = [r for r in rec["results"] if r["status"] == "wrong"]
    assert code == (cli.EXIT_FAILED if wrong else cli.EXIT_OK)
    assert rec["header"]["gpu"] == torch.cuda.get_device_name()
    assert rec["header"]["torch"] == torch.__version__
    names = rec["header"]["options"]["backends"]
    assert names[0] == "cublas"
    assert report.backends_in_order(rec)[:2] == ["cublas", "wsgemm:auto"]
    assert len(rec["results"]) == len(names) * 2
    hbm = hardware.hbm_tbps(torch.cuda.get_device_name())
    assert rec["header"]["hbm_tbps"] == hbm
    for r in rec["results"]:
        if r["backend"] == "cublas":
            assert r["status"] == "ok" and r["median_ms"] > 0
            assert r["ratio_to_cublas"]["median"] == pytest.approx(1.0)
            assert len(r["round_ms"]) == 2
        if r["status"] == "ok" and rec["header"]["flop_per_clock_per_sm"]:
            assert r["sm_clock_mhz"] is None or r["pct_of_peak"] > 0
        if r["status"] == "ok":
            # both shapes are far below any ridge point (73 and 39 FLOP/byte)
            assert r["tbps"] > 0 and r["memory_bound"] in (True, None)
            assert hbm is None or 0 < r["pct_of_hbm"] < 100


def test_a_broken_backend_is_reported_wrong_and_not_timed():
    device, timer, props = _timer()
    calls = []

    def make(problem, out):
        def call():
            calls.append(1)
            torch.matmul(problem.a, problem.b, out=out)
            out[3, 5] += 1.0  # one element off by about its own size: a ragged-edge bug

        return call

    broken = Contender("broken", make)
    shapes = parse_shapes(TINY)
    options = runner.Options(rounds=2, target_ms=1.0)
    output = runner.run(shapes, [cublas(), broken], [], options, timer, device, _peak(props))
    rows = {(r["label"], r["backend"]): r for r in output.rows}
    for shape in shapes:
        row = rows[(shape.label, "broken")]
        assert row["status"] == "wrong", row
        assert row["median_ms"] is None and row["round_ms"] == []
        assert rows[(shape.label, "cublas")]["status"] == "ok"
    assert len(calls) == len(shapes)  # checked once per shape, never timed


@pytest.mark.skipif(not _has_triton(), reason="needs triton")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "dtype, accumulate", [("fp16", "fp32"), ("bf16", "fp32"), ("fp16", "fp16")]
)
def test_triton_matmul_is_right_on_every_layout(layout, dtype, accumulate):
    device, timer, props = _timer()
    shapes = [Shape(1, 256, 512), Shape(129, 257, 72), Shape(512, 1024, 2048)]
    options = runner.Options(dtype=dtype, accumulate=accumulate, layout=layout, rounds=1)
    output = runner.run(
        shapes, [cublas(), triton_backend()], [], options, timer, device, _peak(props)
    )
    for row in output.rows:
        assert row["status"] == "ok", row


def test_timer_sees_twice_the_work_as_twice_the_time():
    device, timer, _ = _timer()
    a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    out = torch.empty_like(a)

    def once():
        torch.matmul(a, b, out=out)

    def twice():
        torch.matmul(a, b, out=out)
        torch.matmul(a, b, out=out)

    est = timer.estimate(once)
    t1 = timer.measure(once, 20, est).ms
    t2 = timer.measure(twice, 20, est).ms
    assert 1.6 < t2 / t1 < 2.4
    assert 0.05 < t1 < 5.0  # a 4096^3 fp16 GEMM is ~0.15-0.5 ms on any GPU this runs on
