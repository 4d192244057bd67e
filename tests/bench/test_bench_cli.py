"""``python -m wsgemm bench`` argument handling and its no-GPU behaviour (CPU only)."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wsgemm.bench import cli

REPO = Path(__file__).resolve().parents[2]


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults():
    args = parse()
    assert (args.dtype, args.accumulate, args.layout, args.backends) == (
        "fp16",
        "fp32",
        "TN",
        "all",
    )
    assert not args.quick and args.suite is None and args.shapes is None
    shapes, options, suite = cli._plan(args)
    assert suite == "square" and len(shapes) == 5
    assert options.rounds == cli.DEFAULT_ROUNDS and options.target_ms == cli.DEFAULT_TARGET_MS


def test_quick_is_three_shapes_three_rounds_fp16():
    shapes, options, suite = cli._plan(parse("--quick"))
    assert suite == "quick" and len(shapes) == 3
    assert options.rounds == 3 and options.dtype == "fp16" and options.target_ms == 5.0
    _, options, _ = cli._plan(parse("--quick", "--rounds", "7", "--dtype", "bf16"))
    assert options.rounds == 7 and options.dtype == "bf16"


def test_every_option_parses():
    args = parse(
        "--suite", "llm", "--tokens", "1,4096", "--models", "8b", "--dtype", "fp16",
        "--accumulate", "fp16", "--layout", "NT", "--backends", "cublas,wsgemm:sm90,triton",
        "--rounds", "9", "--target-ms", "2.5", "--min-reps", "2", "--max-reps", "40",
        "--seed", "3", "--device", "cuda:1", "--json", "r.json", "--csv", "r.csv",
        "--plot", "r.png", "--markdown", "r.md", "--no-progress",
    )  # fmt: skip
    shapes, options, suite = cli._plan(args)
    assert suite == "llm" and len(shapes) == 4 * 2 and {s.m for s in shapes} == {1, 4096}
    assert options.layout == "NT" and options.accumulate == "fp16" and options.seed == 3
    assert (options.rounds, options.target_ms, options.min_reps, options.max_reps) == (
        9,
        2.5,
        2,
        40,
    )
    assert args.device == "cuda:1" and args.no_progress


def test_custom_shapes():
    shapes, _, suite = cli._plan(parse("--shapes", "1,2,3;4,5,6"))
    assert suite == "custom" and [(s.m, s.n, s.k) for s in shapes] == [(1, 2, 3), (4, 5, 6)]


@pytest.mark.parametrize(
    "argv",
    [
        ["--quick", "--suite", "square"],
        ["--suite", "square", "--shapes", "1,1,1"],
        ["--dtype", "fp8"],
        ["--layout", "TX"],
        ["--accumulate", "bf16"],
        ["--rounds", "0"],
        ["--rounds", "1000000000"],
        ["--target-ms", "-1"],
        ["--target-ms", "inf"],
        ["--target-ms", "nan"],
        ["--seed", str(2**64)],
        ["--seed", "-1"],
        ["--max-reps", "1000000000"],
    ],
)
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "bf16", "--accumulate", "fp16"], "fp16 inputs"),
        (["--suite", "square", "--tokens", "1"], "llm and decode"),
        (["--shapes", "1,2"], "three positive integers"),
        (["--shapes", "0,0,0"], "three positive integers"),
        (["--backends", "foo"], "unknown backend 'foo'"),
        (["--shapes", "1,2,3", "--models", "8b"], "not --shapes"),
        (["--suite", "llm", "--tokens", "0"], "positive integers"),
        (["--min-reps", "9", "--max-reps", "3"], "min_reps"),
    ],
)
def test_run_reports_inconsistent_options_as_usage_errors(argv, message, capsys):
    assert cli.run(parse(*argv)) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_without_a_gpu_run_says_so_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.run(parse("--quick")) == cli.EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--from-json" in err


def test_cpu_device_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.run(parse("--quick", "--device", "cpu")) == cli.EXIT_NO_GPU
    assert "must be a CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_module_entry_point_without_a_gpu():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wsgemm.bench", "--quick", "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr
    assert "no CUDA GPU" in proc.stderr


def test_command_line_is_what_the_user_typed():
    from wsgemm.bench import env

    main = str(REPO / "wsgemm" / "__main__.py")
    assert env.command_line([main, "bench", "--shapes", "1,2,3;4,5,6"]) == (
        "python -m wsgemm bench --shapes '1,2,3;4,5,6'"
    )
    bench_main = "/home/me/wsgemm/wsgemm/bench/__main__.py"
    assert env.command_line([bench_main, "--quick"]) == "python -m wsgemm.bench --quick"
    assert env.command_line(["bench.py", "-x"]) == "bench.py -x"


def test_tuning_candidates_parse_into_config_overrides():
    from wsgemm.bench.backends import parse_candidate

    assert parse_candidate("sm90") == ("sm90", {})
    assert parse_candidate("sm90{cluster_m=1,raster_group=4}") == (
        "sm90",
        {"cluster_m": 1, "raster_group": 4},
    )
    assert parse_candidate("sm90-pingpong{schedule=pingpong}")[1] == {"schedule": "pingpong"}
    with pytest.raises(ValueError, match="name"):
        parse_candidate("sm90{cluster_m=1")


def test_usage_errors_come_before_the_gpu_check_and_name_no_internals(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.run(parse("--backends", "foo")) == cli.EXIT_USAGE
    assert cli.run(parse("--shapes", "0,0,0")) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown backend 'foo'" in err and "Shape." not in err and "no CUDA GPU" not in err


def test_error_text_is_not_wrapped_when_stderr_is_not_a_terminal():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wsgemm.bench", "--backends", "x" * 120],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == cli.EXIT_USAGE
    (line,) = [ln for ln in proc.stderr.splitlines() if "unknown backend" in ln]
    assert "x" * 120 in line and "choose from" in line


@pytest.mark.parametrize(
    "text, expanded",
    [
        # the default: cuBLAS, wsgemm's own choice, then every named wsgemm backend, then others
        ("all", ["cublas", "wsgemm:auto", "wsgemm", "triton", "quack"]),
        ("wsgemm", ["wsgemm:auto", "wsgemm"]),
        # wsgemm:auto goes first (after cuBLAS) whatever order it was typed in
        ("triton,wsgemm:sm90,wsgemm:auto,cublas",
         ["cublas", "wsgemm:auto", "triton", "wsgemm:sm90"]),
        ("wsgemm,wsgemm:auto", ["wsgemm:auto", "wsgemm"]),
        ("wsgemm:sm90{cluster_m=1,raster_group=4},wsgemm:sm90", [
            "wsgemm:sm90{cluster_m=1,raster_group=4}", "wsgemm:sm90"]),
    ],
)  # fmt: skip
def test_backend_selection_expands_with_auto_first(text, expanded):
    from wsgemm.bench.backends import _expand

    assert _expand(cli._selection(text)) == expanded


def test_default_selection_resolves_to_auto_then_the_named_backends(monkeypatch):
    from wsgemm.bench import backends

    monkeypatch.setattr(backends, "_wsgemm_kernels", lambda d: (["sm90", "sm90-pingpong"], None))
    monkeypatch.setattr(backends, "_import_problem", lambda module, attribute=None: None)
    found, missing = backends.resolve(cli._selection(parse().backends), "cuda")
    assert [b.name for b in found] == [
        "cublas", "wsgemm:auto", "wsgemm:sm90", "wsgemm:sm90-pingpong", "triton", "quack",
    ]  # fmt: skip
    assert missing == []
