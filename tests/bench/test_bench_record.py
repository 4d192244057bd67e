"""The benchmark record end to end on the CPU: the runner (with a scripted timer), the schema,
and the table, CSV, Markdown and plot drawn from a record.

The record comes from running the real runner on CPU tensors with stand-in backends, so the
check-then-time logic is exercised without a GPU. When the H200 fixture
``tests/data/bench_h200.json`` (a real run, committed by the lead) exists, every rendering test
also runs on it; every committed record (``docs/data/*.json``, schema version 1) must still load
and render.
"""

import argparse
import copy
import csv
import json
from pathlib import Path

import pytest
import torch

from wsgemm.bench import cli, plot, report, roofline, runner, schema
from wsgemm.bench.backends import Contender, Unavailable, cublas
from wsgemm.bench.hardware import peak_tflops
from wsgemm.bench.measure import Estimate, Sample
from wsgemm.bench.suites import Shape

FIXTURE = Path(__file__).parents[1] / "data" / "bench_h200.json"
COMMITTED = sorted((Path(__file__).parents[2] / "docs" / "data").glob("*.json"))
SHAPES = [Shape(64, 96, 128, label="64x96x128", group="custom"), Shape(33, 65, 17, group="ragged")]
OPTIONS = runner.Options(dtype="fp16", accumulate="fp32", layout="TN", rounds=4, target_ms=2.0)


class ScriptedTimer:
    """Times each call as its ``fake_ms`` (1 ms for cuBLAS), drifting per measurement like a
    moving clock, and logs which backend it timed, in order."""

    def __init__(self):
        self.log: list[str] = []

    def estimate(self, fn):
        ms = getattr(fn, "fake_ms", 1.0)
        return Estimate(gpu_ms=ms, host_ms=0.01, cycle_ms=ms + 0.1)

    def measure(self, fn, reps, estimate):
        fn()
        self.log.append(getattr(fn, "fake_name", "cublas"))
        drift = 1.0 + 0.05 * (len(self.log) % 3)
        return Sample(getattr(fn, "fake_ms", 1.0) * drift, 1980.0 / drift, 650.0)


def stand_in(name, ms, *, corrupt=False, raises=None, skip=None):
    """A backend that computes the right product (or corrupts it, or raises); counts calls."""
    calls = []

    def make(problem, out):
        def call():
            calls.append(name)
            if raises is not None:
                raise raises
            torch.matmul(problem.a, problem.b, out=out)
            if corrupt:
                out[0, 0] += 100.0

        call.fake_ms, call.fake_name = ms, name
        return call

    return Contender(name, make, skip or (lambda problem: None)), calls


def h200_header(options: runner.Options, backends: list[str]) -> dict:
    return {
        "gpu": "NVIDIA H200 (synthetic)",
        "compute_capability": "9.0",
        "sm_count": 132,
        "l2_bytes": 62914560,
        "flop_per_clock_per_sm": 4096,
        **roofline.header_fields("NVIDIA H200 (synthetic)", 132, 4096, 1980.0),
        "driver": "580.159.04",
        "cuda": "13.0",
        "torch": torch.__version__,
        "cutlass_dsl": "4.8.1",
        "triton": "3.6.0",
        "quack": None,
        "wsgemm": "0.1.0",
        "python": "3.12.3",
        "clocks": {
            "sm_max_mhz": 1980.0,
            "mem_max_mhz": 3201.0,
            "sm_at_start_mhz": 345.0,
            "power_limit_w": 700.0,
            "sm_observed_mhz": [1650.0, 1980.0],
        },
        "date": "2026-11-30T00:00:00+00:00",
        "command": "python -m wsgemm bench --shapes '64,96,128;33,65,17'",
        "options": options.to_dict("custom", backends),
        "method": {
            "l2_flush_bytes": 256 * 2**20,
            "hold_gpu": True,
            "order": "rotated",
            "clock_source": "nvml",
            "cublas_reduced_precision_reduction": False,
        },
        "notes": ["quack: import failed: ModuleNotFoundError: No module named 'quack'"],
    }


@pytest.fixture(scope="module")
def run_result():
    fast, fast_calls = stand_in("fast", 0.5)
    broken, broken_calls = stand_in("broken", 0.1, corrupt=True)
    crash, _ = stand_in("crash", 0.1, raises=RuntimeError("kernel exploded\nmore detail"))
    refuse, _ = stand_in("refuse", 0.1, raises=ValueError("K must be a multiple of 8"))
    picky, picky_calls = stand_in("picky", 0.1, skip=lambda p: "needs fp16 accumulation")
    timer = ScriptedTimer()
    unavailable = [Unavailable("quack", "import failed: ModuleNotFoundError")]
    output = runner.run(
        SHAPES,
        [cublas(), fast, broken, crash, refuse, picky],
        unavailable,
        OPTIONS,
        timer,
        "cpu",
        lambda clock: peak_tflops(132, 4096, clock),
    )
    names = ["cublas", "fast", "broken", "crash", "refuse", "picky", "quack"]
    rec = schema.record(h200_header(OPTIONS, names), output.rows)
    calls = {"fast": fast_calls, "broken": broken_calls, "picky": picky_calls}
    return rec, output, timer, calls


@pytest.fixture(scope="module")
def synthetic(run_result):
    return run_result[0]


def _row(rec, label, backend):
    (row,) = [r for r in rec["results"] if r["label"] == label and r["backend"] == backend]
    return row


def test_a_shape_with_its_own_layout_runs_and_is_recorded_in_it():
    seen = []

    def make(problem, out):
        def call():
            seen.append((problem.a.stride(), problem.b.stride()))
            torch.matmul(problem.a, problem.b, out=out)

        return call

    shapes = [Shape(24, 40, 16, layout="NT"), Shape(24, 40, 16)]
    output = runner.run(
        shapes, [cublas(), Contender("probe", make, lambda p: None)], [], OPTIONS,
        ScriptedTimer(), "cpu", lambda clock: None,
    )  # fmt: skip
    rows = [r for r in output.rows if r["backend"] == "probe"]
    assert [r["layout"] for r in rows] == ["NT", "TN"] and {r["status"] for r in rows} == {"ok"}
    # NT: A stored column-major (its M mode contiguous), B row-major (its N mode contiguous)
    assert seen[0] == ((1, 24), (40, 1))
    assert seen[-1] == ((16, 1), (1, 16))


def test_every_shape_gets_a_row_per_backend(synthetic):
    assert len(synthetic["results"]) == len(SHAPES) * 7
    assert report.backends_in_order(synthetic)[0] == "cublas"


def test_wrong_backend_is_reported_and_never_timed(run_result):
    rec, _, timer, calls = run_result
    for shape in SHAPES:
        row = _row(rec, shape.label, "broken")
        assert row["status"] == "wrong"
        assert "> tolerance" in row["note"]
        assert row["median_ms"] is None and row["round_ms"] == [] and row["ratio_to_cublas"] is None
        assert row["error"]["peak"] > row["error"]["tol_peak"]
    assert len(calls["broken"]) == len(SHAPES)  # the checking call only
    assert "broken" not in timer.log


def test_failures_and_refusals_are_reported_not_timed(run_result):
    rec, _, timer, calls = run_result
    row = _row(rec, "64x96x128", "crash")
    assert row["status"] == "error" and row["note"] == "RuntimeError: kernel exploded"
    row = _row(rec, "64x96x128", "refuse")
    assert row["status"] == "skipped" and "unsupported: ValueError: K must be" in row["note"]
    row = _row(rec, "64x96x128", "picky")
    assert row["status"] == "skipped" and row["note"] == "needs fp16 accumulation"
    assert calls["picky"] == []
    row = _row(rec, "64x96x128", "quack")
    assert row["status"] == "skipped" and "import failed" in row["note"]
    assert set(timer.log) == {"cublas", "fast"}


def test_ratios_are_paired_with_cublas_per_round(synthetic):
    for shape in SHAPES:
        base = _row(synthetic, shape.label, "cublas")
        assert base["ratio_to_cublas"] == {"median": 1.0, "min": 1.0, "max": 1.0}
        fast = _row(synthetic, shape.label, "fast")
        r = fast["ratio_to_cublas"]
        assert 1.5 < r["min"] <= r["median"] <= r["max"] < 2.5
        assert len(fast["round_ms"]) == OPTIONS.rounds
        assert fast["tflops"] == pytest.approx(shape.flop / (fast["median_ms"] * 1e9))
        assert 0 < fast["pct_of_peak"] and fast["sm_clock_mhz"] and fast["power_w"] == 650.0
        assert fast["error"]["rel"] <= fast["error"]["tol_rel"]


def test_rounds_interleave_backends_in_rotated_order(run_result):
    _, _, timer, _ = run_result
    per_shape = 2 * OPTIONS.rounds
    first_shape = timer.log[:per_shape]
    rounds = [first_shape[i : i + 2] for i in range(0, per_shape, 2)]
    assert rounds == [["cublas", "fast"], ["fast", "cublas"]] * (OPTIONS.rounds // 2)


def test_clocks_seen_are_collected(run_result):
    _, output, _, _ = run_result
    assert output.aborted is None
    assert min(output.clocks_mhz) == pytest.approx(1980.0 / 1.1)


def test_runner_wants_cublas_first():
    with pytest.raises(ValueError, match="baseline"):
        runner.run(SHAPES, [], [], OPTIONS, ScriptedTimer(), "cpu", lambda c: None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "fp8"}, "dtype"),
        ({"dtype": "bf16", "accumulate": "fp16"}, "fp16 inputs"),
        ({"layout": "XX"}, "layout"),
        ({"rounds": 0}, "rounds"),
        ({"min_reps": 5, "max_reps": 2}, "min_reps"),
    ],
)
def test_options_validate(kwargs, message):
    with pytest.raises(ValueError, match=message):
        runner.Options(**kwargs)


# ---- the schema ----------------------------------------------------------------------------


def test_record_round_trips_through_json(synthetic, tmp_path):
    path = tmp_path / "r.json"
    schema.write_json(synthetic, path)
    assert schema.load(path) == json.loads(json.dumps(synthetic))


def _break(rec, how):
    rec = copy.deepcopy(rec)
    ok = next(r for r in rec["results"] if r["status"] == "ok")
    wrong = next(r for r in rec["results"] if r["status"] == "wrong")
    if how == "version":
        rec["version"] = 99
    elif how == "header":
        del rec["header"]["gpu"]
    elif how == "status":
        ok["status"] = "great"
    elif how == "ok-without-time":
        ok["median_ms"] = None
    elif how == "wrong-with-time":
        wrong["median_ms"] = 1.0
    elif how == "wrong-without-errors":
        wrong["error"] = None
    elif how == "ratio-order":
        ok["ratio_to_cublas"] = {"median": 1.0, "min": 1.2, "max": 1.3}
    elif how == "bool-count":
        ok["reps"] = True
    elif how == "nested-type":
        rec["header"]["clocks"]["sm_max_mhz"] = "fast"
    elif how == "wrong-with-bandwidth":
        wrong["tbps"] = 1.0
    elif how == "bound-not-bool":
        ok["memory_bound"] = 1
    elif how == "cublas-not-str":
        rec["header"]["cublas"] = 12
    return rec


@pytest.mark.parametrize(
    "how, where",
    [
        ("version", "version"),
        ("header", "header: missing gpu"),
        ("status", ".status"),
        ("ok-without-time", ".median_ms"),
        ("wrong-with-time", "carries no timing"),
        ("wrong-without-errors", ".error"),
        ("ratio-order", ".ratio_to_cublas"),
        ("bool-count", ".reps"),
        ("nested-type", "header.clocks.sm_max_mhz"),
        ("wrong-with-bandwidth", "carries no bandwidth"),
        ("bound-not-bool", ".memory_bound"),
        ("cublas-not-str", "header.cublas"),
    ],
)
def test_validation_names_the_bad_field(synthetic, how, where):
    with pytest.raises(schema.RecordError, match=where.replace(".", r"\.")):
        schema.validate(_break(synthetic, how))


def test_the_cublas_version_is_optional_in_a_record(synthetic):
    """Records before it (no ``header.cublas``) stay valid; a later one names it or null."""
    rec = copy.deepcopy(synthetic)
    rec["header"].pop("cublas", None)
    schema.validate(rec)
    for value in (None, "12.9.1.4"):
        rec["header"]["cublas"] = value
        schema.validate(rec)


def test_a_record_carries_its_settings(synthetic):
    """A run's header says which wsgemm.config switches it ran under (``env.settings``); older
    records without the field stay valid; a field of the wrong type is named."""
    rec = copy.deepcopy(synthetic)
    rec["header"].pop("settings", None)
    schema.validate(rec)
    rec["header"]["settings"] = {"batch_invariant": True, "autotune": False}
    schema.validate(rec)
    rec["header"]["settings"] = {"batch_invariant": "yes", "autotune": False}
    with pytest.raises(schema.RecordError, match=r"header\.settings\.batch_invariant"):
        schema.validate(rec)
    rec["header"]["settings"] = {"batch_invariant": False, "autotune": False, "race_torch": True}
    schema.validate(rec)
    rec["header"]["settings"]["race_torch"] = "yes"
    with pytest.raises(schema.RecordError, match=r"header\.settings\.race_torch"):
        schema.validate(rec)


def test_load_rejects_non_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(schema.RecordError, match="not JSON"):
        schema.load(path)


def test_result_rejects_keys_outside_the_schema():
    with pytest.raises(schema.RecordError, match="outside the schema"):
        schema.result(
            SHAPES[0], dtype="fp16", layout="TN", accumulate="fp32", backend="x", status="ok",
            speed=1,
        )  # fmt: skip


# ---- renderings, on the synthetic record and on the H200 fixture when it exists -------------

RECORDS = ["synthetic"] + (["h200-fixture"] if FIXTURE.exists() else [])


@pytest.fixture(params=RECORDS)
def any_record(request, synthetic):
    return synthetic if request.param == "synthetic" else schema.load(FIXTURE)


def test_csv_has_a_row_per_result(any_record, tmp_path):
    path = tmp_path / "r.csv"
    schema.write_csv(any_record, path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(any_record["results"])
    assert tuple(rows[0]) == schema.CSV_COLUMNS
    for row, result in zip(rows, any_record["results"], strict=True):
        assert row["backend"] == result["backend"] and row["status"] == result["status"]
        if result["status"] == "ok":
            assert float(row["tflops"]) == pytest.approx(result["tflops"])


def test_table_shows_header_every_backend_and_the_summary(any_record):
    text = report.render_text(any_record, width=200)
    header = any_record["header"]
    # a long command wraps at the table's width: compare without whitespace
    flat = "".join(text.split())
    assert header["gpu"] in text and "".join(header["command"].split()) in flat
    assert "SM clock MHz" in text and "tensor peak" in text
    for backend in report.backends_in_order(any_record):
        assert backend in text
    for r in any_record["results"]:
        if r["status"] == "wrong":
            assert "wrong:" in text
    assert "per backend" in text and "geomean" in text


def test_table_marks_the_synthetic_failures(synthetic):
    text = report.render_text(synthetic, width=220)
    assert "wrong: relative error" in text
    assert "error: RuntimeError: kernel exploded" in text
    assert "note: quack: import failed" in text


def test_markdown_table(any_record):
    text = report.markdown(any_record)
    lines = text.splitlines()
    backends = report.backends_in_order(any_record)
    assert lines[0] == "| shape | M x N x K | " + " | ".join(backends) + " |"
    bound = report.memory_bound_shapes(any_record)
    bandwidth_table = 1 + len(bound) if bound else 0
    assert len([ln for ln in lines if ln.startswith("| ")]) == (
        1 + len(report.shapes_in_order(any_record)) + bandwidth_table + 1 + len(backends)
    )


def test_a_row_at_another_clock_than_cublas_is_marked():
    """H200, 2026-12-01: the 1-token 70B qkv row's rounds ran at 1665 MHz, cuBLAS's at 1935."""
    rec = schema.load(FIXTURE.parents[2] / "docs" / "data" / "llm_auto_2026-12-01c.json")
    skews = report.clock_skews(rec)
    assert skews[("70b qkv t=1", "wsgemm:auto")] == pytest.approx(1665 / 1935 - 1)
    assert all(abs(v) > report.CLOCK_SKEW for v in skews.values())
    assert ("70b qkv t=16", "wsgemm:auto") not in skews  # 1965 MHz both
    text = report.render_text(rec, width=220)
    assert "*clock -14%" in text and "ran at an SM clock more than 5%" in text
    md = report.markdown(rec)
    assert "(0.87x) *clock -14%" in md and "ran at an SM clock more than 5%" in md


def test_summary_geomean(synthetic):
    rows = {s["backend"]: s for s in report.summary(synthetic)}
    assert rows["cublas"]["geomean_ratio"] == pytest.approx(1.0)
    assert 1.5 < rows["fast"]["geomean_ratio"] < 2.5
    assert rows["broken"]["counts"] == {"ok": 0, "wrong": 2, "skipped": 0, "error": 0}
    assert rows["broken"]["geomean_ratio"] is None


def test_plot_writes_a_png(any_record, tmp_path):
    path = tmp_path / "r.png"
    plot.plot(any_record, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_cli_renders_a_recorded_json_without_a_gpu(any_record, tmp_path, capsys):
    source = tmp_path / "in.json"
    schema.write_json(any_record, source)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    outputs = {ext: tmp_path / f"out.{ext}" for ext in ("csv", "png", "md", "json")}
    args = parser.parse_args(
        ["--from-json", str(source), "--csv", str(outputs["csv"]), "--plot", str(outputs["png"]),
         "--markdown", str(outputs["md"]), "--json", str(outputs["json"])]
    )  # fmt: skip
    assert cli.run(args) == cli.EXIT_OK
    assert all(p.stat().st_size > 0 for p in outputs.values())
    assert schema.load(outputs["json"]) == schema.load(source)
    assert any_record["header"]["gpu"] in capsys.readouterr().out


def test_cli_refuses_a_bad_record(tmp_path):
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"schema": "something else"}))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--from-json", str(source)])) == cli.EXIT_USAGE


@pytest.mark.skipif(not FIXTURE.exists(), reason="tests/data/bench_h200.json not committed yet")
def test_h200_fixture_is_a_real_h200_run():
    rec = schema.load(FIXTURE)
    h = rec["header"]
    assert "H200" in h["gpu"] and h["compute_capability"] == "9.0"
    assert h["sm_count"] == 132 and h["flop_per_clock_per_sm"] == 4096
    assert h["torch"] and h["driver"]
    for r in rec["results"]:
        if r["backend"] == "cublas":
            assert r["status"] == "ok", r
            assert r["ratio_to_cublas"]["median"] == pytest.approx(1.0)
        if r["status"] == "ok" and r["pct_of_peak"] is not None:
            assert 0 < r["pct_of_peak"] <= 100.0, r


def test_a_shape_that_fails_outside_a_backend_keeps_the_rows_before_and_after(monkeypatch):
    """One shape whose operands cannot be made (out of memory on a GPU) errors its own rows;
    the rows measured before it and the shapes after it are kept."""
    real = runner.make_operands
    doomed = Shape(40, 40, 40, group="custom")

    def make_operands(layout, m, n, k, *args):
        if (m, n, k) == (40, 40, 40):
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 TiB")
        return real(layout, m, n, k, *args)

    monkeypatch.setattr(runner, "make_operands", make_operands)
    fast, _ = stand_in("fast", 0.5)
    shapes = [SHAPES[0], doomed, SHAPES[1]]
    output = runner.run(
        shapes, [cublas(), fast], [], OPTIONS, ScriptedTimer(), "cpu", lambda clock: None
    )
    assert output.aborted is None
    by_shape = {(r["m"], r["n"], r["k"]): r for r in output.rows if r["backend"] == "fast"}
    assert by_shape[(64, 96, 128)]["status"] == "ok" and by_shape[(33, 65, 17)]["status"] == "ok"
    failed = by_shape[(40, 40, 40)]
    assert failed["status"] == "error" and "out of memory" in failed["note"]
    schema.validate(schema.record(h200_header(OPTIONS, ["cublas", "fast"]), output.rows))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target_ms": float("inf")}, "target_ms"),
        ({"target_ms": float("nan")}, "target_ms"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"rounds": 10**9}, "rounds"),
        ({"max_reps": 10**9}, "max_reps"),
    ],
)
def test_options_reject_out_of_range_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        runner.Options(**kwargs)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xe9t\xe9 {}", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
    ids=["latin-1", "deep nesting"],
)
def test_from_json_refuses_unreadable_files_without_a_traceback(tmp_path, capsys, content, message):
    source = tmp_path / "in.json"
    source.write_bytes(content)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--from-json", str(source)])) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("observed", [["x", "y"], [1500], [1500, 1400], [1, 2, 3]])
def test_from_json_refuses_an_observed_clock_range_it_cannot_print(
    synthetic, tmp_path, capsys, observed
):
    rec = copy.deepcopy(synthetic)
    rec["header"]["clocks"]["sm_observed_mhz"] = observed
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rec))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--from-json", str(source)])) == cli.EXIT_USAGE
    assert "sm_observed_mhz" in capsys.readouterr().err


# ---- wsgemm:auto first; bandwidth of memory-bound shapes; old records -----------------------


def test_auto_row_comes_right_after_cublas_in_every_table():
    """Whatever order the backends ran in, tables list cuBLAS, wsgemm:auto, then the rest."""
    named, _ = stand_in("wsgemm:sm90", 0.5)
    auto, _ = stand_in("wsgemm:auto", 0.4)
    output = runner.run(
        SHAPES, [cublas(), named, auto], [Unavailable("triton", "import failed: X")], OPTIONS,
        ScriptedTimer(), "cpu", lambda clock: None,
    )  # fmt: skip
    names = ["cublas", "wsgemm:sm90", "wsgemm:auto", "triton"]
    rec = schema.record(h200_header(OPTIONS, names), output.rows)
    order = ["cublas", "wsgemm:auto", "wsgemm:sm90", "triton"]
    assert report.backends_in_order(rec) == order
    assert [s["backend"] for s in report.summary(rec)] == order
    md = report.markdown(rec).splitlines()
    assert md[0] == "| shape | M x N x K | " + " | ".join(order) + " |"
    summary_rows = [ln.split(" | ")[0][2:] for ln in md if ln.startswith(("| cublas", "| wsgemm"))]
    assert summary_rows == order[:3]
    lines = report.render_text(rec, width=220).splitlines()
    for shape in SHAPES:
        start = next(i for i, ln in enumerate(lines) if shape.label in ln)
        rows = lines[start : start + len(order)]
        assert [next(b for b in order if f" {b} " in ln) for ln in rows] == order, rows


def _h200_row(m, n, k, ms, *, backend="cublas", status="ok"):
    shape = Shape(m, n, k, label=f"{m}x{n}x{k}", group="custom")
    timing = {}
    if status == "ok":
        timing = {"median_ms": ms, "tflops": shape.flop / (ms * 1e9), "round_ms": [ms]}
    return schema.result(
        shape, dtype="fp16", layout="TN", accumulate="fp32", backend=backend, status=status,
        note="" if status == "ok" else "why", **timing,
    )  # fmt: skip


def test_bandwidth_and_pct_of_hbm_of_a_known_shape():
    # 1 x 4096 x 4096 fp16 in 20 us: reads A (1*4096) and B (4096*4096) and writes C (1*4096),
    # 2 bytes each: (4096 + 16777216 + 4096) * 2 = 33570816 bytes -> 1.6785 TB/s, 34.97% of 4.8.
    header = h200_header(OPTIONS, ["cublas"])
    rows = [
        _h200_row(1, 4096, 4096, 0.020),
        _h200_row(1, 4096, 4096, 0, backend="x", status="error"),
    ]
    rec = schema.record(header, rows)
    ok, failed = rec["results"]
    assert roofline.bytes_moved(1, 4096, 4096, 2, 2) == 33570816
    assert ok["memory_bound"] is True and failed["memory_bound"] is True
    assert ok["tbps"] == pytest.approx(1.6785408)
    assert ok["pct_of_hbm"] == pytest.approx(100 * 1.6785408 / 4.8)
    assert failed["tbps"] is None and failed["pct_of_hbm"] is None
    csv_row = schema.csv_rows(rec)[0]
    assert csv_row["memory_bound"] is True and csv_row["tbps"] == pytest.approx(1.6785408)
    md = report.markdown(rec)
    assert "ridge point of 223 FLOP/byte" in md and "| 1.68 (35%) |" in md
    text = report.render_text(rec, width=220)
    assert "HBM peak 4.8 TB/s, ridge point 223 FLOP/byte" in text
    assert " 1.68 " in text and " 35.0 " in text


def test_memory_bound_is_intensity_below_the_ridge_point():
    # H200 ridge: 132 SMs x 4096 FLOP/clock x 1.98 GHz = 1070.5 TFLOP/s over 4.8 TB/s = 223.
    header = h200_header(OPTIONS, ["cublas"])
    assert header["ridge_flop_per_byte"] == pytest.approx(132 * 4096 * 1.98e9 / 4.8e12)
    # 128 tokens of an 8B QKV projection: 121.7 FLOP/byte; 4096 tokens: 1755; 1024^3: 341.3
    assert roofline.intensity(128, 6144, 4096, 2, 2) == pytest.approx(121.66, abs=0.01)
    rows = [_h200_row(128, 6144, 4096, 0.023), _h200_row(4096, 6144, 4096, 0.27),
            _h200_row(1024, 1024, 1024, 0.005)]  # fmt: skip
    rec = schema.record(header, rows)
    assert [r["memory_bound"] for r in rec["results"]] == [True, False, False]
    assert all(r["tbps"] > 0 for r in rec["results"])  # in the record for every ok row
    text = report.render_text(rec, width=220)
    (compute_bound,) = [ln for ln in text.splitlines() if "4096x6144x4096" in ln]
    assert f"{rec['results'][1]['tbps']:.2f}" not in compute_bound  # the table shows it not
    assert report.memory_bound_shapes(rec) == [("128x6144x4096", 128, 6144, 4096)]


def test_an_unknown_gpu_gets_bandwidth_but_no_pct_of_hbm_and_no_verdict():
    header = h200_header(OPTIONS, ["cublas"])
    gpu = "Some Future GPU"
    header.update(gpu=gpu, **roofline.header_fields(gpu, 99, None, None))
    rec = schema.record(header, [_h200_row(1, 4096, 4096, 0.020)])
    (row,) = rec["results"]
    assert row["tbps"] == pytest.approx(1.6785408)
    assert row["pct_of_hbm"] is None and row["memory_bound"] is None
    assert "HBM peak unknown" in report.render_text(rec)
    assert "Memory-bound" not in report.markdown(rec)


@pytest.mark.parametrize(
    "name, tbps",
    [("NVIDIA H200", 4.8), ("NVIDIA H200 NVL", 4.8), ("NVIDIA H100 80GB HBM3", 3.35),
     ("NVIDIA H100 PCIe", 2.0), ("NVIDIA A100-SXM4-80GB", None), (None, None)],
)  # fmt: skip
def test_hbm_peaks_by_product_name(name, tbps):
    from wsgemm.bench import hardware

    assert hardware.hbm_tbps(name) == tbps


@pytest.mark.parametrize("path", COMMITTED + [FIXTURE], ids=lambda p: p.name)
def test_a_committed_record_loads_as_the_current_version_and_renders(path, tmp_path, capsys):
    """The records committed so far are version 1 from the H200: read as version 2, with the
    H200's HBM peak and ridge point (223 FLOP/byte at 1980 MHz) and each row's bandwidth."""
    raw = json.loads(path.read_text())
    rec = schema.load(path)
    assert rec["version"] == schema.VERSION == 2
    assert [r["label"] for r in rec["results"]] == [r["label"] for r in raw["results"]]
    h = rec["header"]
    if raw["version"] == 1 and "H200" in h["gpu"] and h["clocks"]["sm_max_mhz"] == 1980:
        assert h["hbm_tbps"] == 4.8 and h["ridge_flop_per_byte"] == pytest.approx(223.03, abs=0.01)
    for r in rec["results"]:
        moved = roofline.bytes_moved(r["m"], r["n"], r["k"], 2, 2)
        intensity = 2 * r["m"] * r["n"] * r["k"] / moved
        ridge = h["ridge_flop_per_byte"]
        assert r["memory_bound"] == (None if ridge is None else intensity < ridge)
        if r["status"] == "ok":
            assert r["tbps"] == pytest.approx(moved / (r["median_ms"] * 1e9))
    assert report.backends_in_order(rec)[0] == "cublas"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    md = tmp_path / "out.md"
    assert cli.run(parser.parse_args(["--from-json", str(path), "--markdown", str(md)])) == 0
    assert h["gpu"] in capsys.readouterr().out and md.read_text().startswith("| shape |")


def test_the_llm_fixture_is_memory_bound_at_128_tokens_and_below():
    rec = schema.load(FIXTURE)
    bound = {r["label"]: r["memory_bound"] for r in rec["results"]}
    assert {label for label, b in bound.items() if b} == {
        f"8b {p} t=128" for p in ("qkv", "o", "gate_up", "down")
    }


def test_an_epilogue_run_checks_every_backend_against_the_epilogues_reference():
    """``--epilogue bias_gelu_tanh``: cuBLAS's row is torch's unfused path and passes; a
    contender computing the epilogue passes; one that forgets it is caught as wrong; a
    contender without epilogues (triton's skip) is skipped, never timed."""
    import torch.nn.functional as F

    from wsgemm.bench.backends import triton_backend

    def fused(problem, out):
        def call():
            y = torch.addmm(problem.bias.float(), problem.a.float(), problem.b.float())
            out.copy_(F.gelu(y, approximate="tanh"))

        call.fake_ms, call.fake_name = 0.4, "fused"
        return call

    forgets, _ = stand_in("forgets", 0.3)
    options = runner.Options(dtype="fp16", rounds=2, target_ms=2.0, epilogue="bias_gelu_tanh")
    output = runner.run(
        SHAPES[:1],
        [cublas(), Contender("fused", fused), forgets, triton_backend()],
        [],
        options,
        ScriptedTimer(),
        "cpu",
        lambda clock: peak_tflops(132, 4096, clock),
    )
    status = {r["backend"]: r["status"] for r in output.rows}
    assert status == {"cublas": "ok", "fused": "ok", "forgets": "wrong", "triton": "skipped"}
    assert options.to_dict("custom", [])["epilogue"] == "bias_gelu_tanh"
    with pytest.raises(ValueError, match="epilogue must be one of"):
        runner.Options(epilogue="swish")


def test_a_residual_run_checks_the_in_place_update():
    """``--epilogue residual``: ``out`` holds C before the checked call, which adds a @ b to it
    in place: cuBLAS's row (``out.addmm_``) passes, a contender that overwrites C is caught,
    one without epilogues is skipped."""
    from wsgemm.bench.backends import triton_backend

    def overwrites(problem, out):
        def call():
            out.copy_(torch.matmul(problem.a.float(), problem.b.float()))

        call.fake_ms, call.fake_name = 0.3, "overwrites"
        return call

    options = runner.Options(dtype="fp16", rounds=2, target_ms=2.0, epilogue="residual")
    output = runner.run(
        SHAPES[:1],
        [cublas(), Contender("overwrites", overwrites), triton_backend()],
        [],
        options,
        ScriptedTimer(),
        "cpu",
        lambda clock: peak_tflops(132, 4096, clock),
    )
    status = {r["backend"]: r["status"] for r in output.rows}
    assert status == {"cublas": "ok", "overwrites": "wrong", "triton": "skipped"}


def test_a_gated_run_checks_the_half_wide_output():
    """``--epilogue swiglu``: every contender's output is act(y[:, :N/2]) * y[:, N/2:] of
    y = a @ b, (M, N/2): cuBLAS's row (torch's unfused unit) passes, a contender returning its
    own tensor (as gated_linear does) passes, one that applies silu to the whole product is
    caught, a named wsgemm kernel and triton are skipped."""
    import torch.nn.functional as F

    from wsgemm.bench.backends import triton_backend, wsgemm_backend

    def fused(problem, out):
        def call():
            y = torch.matmul(problem.a.float(), problem.b.float())
            half = y.shape[1] // 2
            return (F.silu(y[:, :half]) * y[:, half:]).to(out.dtype)

        call.fake_ms, call.fake_name = 0.4, "fused"
        return call

    def whole(problem, out):
        def call():
            out.copy_(F.silu(torch.matmul(problem.a.float(), problem.b.float()))[:, : out.shape[1]])

        call.fake_ms, call.fake_name = 0.3, "whole"
        return call

    options = runner.Options(dtype="fp16", rounds=2, target_ms=2.0, epilogue="swiglu")
    output = runner.run(
        SHAPES[:1],
        [cublas(), Contender("fused", fused, returns_output=True), Contender("whole", whole),
         wsgemm_backend("sm80"), triton_backend()],
        [],
        options,
        ScriptedTimer(),
        "cpu",
        lambda clock: peak_tflops(132, 4096, clock),
    )  # fmt: skip
    status = {r["backend"]: r["status"] for r in output.rows}
    assert status == {"cublas": "ok", "fused": "ok", "whole": "wrong", "wsgemm:sm80": "skipped",
                      "triton": "skipped"}  # fmt: skip
