"""``python -m wsgemm`` as a user meets it, CPU only: options a run would silently ignore,
malformed values, files that cannot be read or written, and where each error goes (exit code
2, one line that says what is wrong) rather than a traceback or a wasted run."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from test_cli import run

from wsgemm import cli
from wsgemm.bench import cli as bench_cli

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "tests" / "data" / "bench_h200.json"


def usage_error(capsys, *argv) -> str:
    """An argparse error: exit 2 and the message on stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ----------------------------------------------------------------------------- explain


@pytest.mark.parametrize(
    "extra, named",
    [
        (("--batch", "4"), "--batch"),
        (("--layout", "TN"), "--layout"),  # even the default, given, is refused
        (("--accumulate", "fp16", "--layout", "NN"), "--layout, --accumulate"),
    ],
)
def test_explain_groups_refuses_the_dense_options_it_would_ignore(no_gpu, capsys, extra, named):
    code, out, err = run(capsys, "explain", "--shape", "256,256,256", "--groups", "100,100",
                         *extra)  # fmt: skip
    assert code == 2 and not out
    assert err.strip() == (
        f"explain: --groups explains grouped_mm's 2D x 3D form (fp32 accumulation): no {named}"
    )


def test_explain_groups_and_dense_defaults_still_run(no_gpu, capsys):
    code, out, _ = run(capsys, "explain", "--shape", "256,256,256", "--groups", "100,100")
    assert code == 0 and out.startswith("wsgemm.grouped_mm of 2 groups, 256x256x256, fp16")
    code, out, _ = run(capsys, "explain", "--shape", "64,64,64")
    assert code == 0 and out.startswith("wsgemm.matmul of 64x64x64, fp16 TN, on a stand-in")
    assert "float32 accumulate" in out


@pytest.mark.parametrize("cc", ["-1.0", "9.0.1", "9", "9.-1", "nine"])
def test_explain_cc_wants_two_non_negative_integers(capsys, cc):
    err = usage_error(capsys, "explain", "--shape", "64,64,64", f"--cc={cc}")
    assert f"argument --cc: '{cc}': want MAJOR.MINOR of non-negative integers, e.g. 9.0" in err


@pytest.mark.parametrize("shape", ["\u00b2,2,3", "1,2", "1.5,2,3", "-1,4,4"])
def test_explain_shape_errors_say_what_a_shape_is(capsys, shape):
    err = usage_error(capsys, "explain", f"--shape={shape}")
    assert "want one shape M,N,K of three non-negative integers" in err
    assert "invalid" not in err  # argparse's own 'invalid _one_shape value' (int() raised)


def test_explain_on_a_gpu_fills_what_cc_and_sm_count_leave_out(monkeypatch, capsys):
    """On an A100 (sm_80, 108 SMs), ``--sm-count 100`` asks about that GPU with fewer SMs, not
    about a stand-in H200; ``--cc 9.0`` alone keeps its 108 SMs."""
    props = types.SimpleNamespace(major=8, minor=0, multi_processor_count=108, name="A100")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    code, out, _ = run(capsys, "explain", "--shape", "64,64,64")
    assert code == 0 and "on A100 (sm_80, 108 SMs):" in out.splitlines()[0]
    code, out, _ = run(capsys, "explain", "--shape", "64,64,64", "--sm-count", "100")
    assert code == 0 and "on a stand-in sm_80 GPU with 100 SMs:" in out.splitlines()[0]
    code, out, _ = run(capsys, "explain", "--shape", "64,64,64", "--cc", "9.0")
    assert code == 0 and "on a stand-in sm_90 GPU with 108 SMs:" in out.splitlines()[0]


def test_explain_help_says_the_defaults(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0
    for default in ("(default 1: 2-D operands)", "accumulator dtype (default fp32)",
                    "(default auto: what it picks)", "(default: this GPU's; without one 9.0)",
                    "(default: this GPU's; without one 132)"):  # fmt: skip
        assert default in text


# ----------------------------------------------------------------------------- tune


@pytest.fixture
def shapes_file(tmp_path):
    path = tmp_path / "shapes.txt"
    path.write_text("256,256,256\n")
    return path


@pytest.mark.parametrize(
    "extra, named", [(("--tokens", "5"), "--tokens"), (("--tp", "2"), "--tp"),
                     (("--tokens", "1", "--tp", "1"), "--tokens, --tp")],
)  # fmt: skip
def test_tune_shapes_refuses_the_model_options(shapes_file, capsys, extra, named):
    code, out, err = run(capsys, "tune", "--shapes", str(shapes_file), "--dry-run", *extra)
    assert code == 2 and not out
    assert (
        err.strip() == f"tune: {named}: only for --model's layers, not --shapes (a file of M,N,K)"
    )


def test_tune_model_defaults_still_apply(tmp_path, capsys):
    config = tmp_path / "tiny.json"
    config.write_text('{"hidden_size": 64, "vocab_size": 128, "num_attention_heads": 2, '
                      '"intermediate_size": 256}')  # fmt: skip
    code, out, _ = run(capsys, "tune", "--model", str(config), "--dry-run")
    assert code == 0 and {line.split()[1] for line in out.splitlines()[:-1]} == {
        "t=1", "t=16", "t=128", "t=1024", "t=4096"
    }  # fmt: skip
    code, _, err = run(capsys, "tune", "--model", str(config), "--tokens", "", "--dry-run")
    assert code == 2 and "positive integers" in err


def test_tune_file_errors_name_the_file(tmp_path, capsys):
    bad_json = tmp_path / "config.json"
    bad_json.write_text("not json\n")
    code, _, err = run(capsys, "tune", "--model", str(bad_json), "--dry-run")
    assert code == 2 and err.startswith(f"tune: {bad_json}: not JSON (Expecting value")
    binary = tmp_path / "shapes.bin"
    binary.write_bytes(b"\xff\xfe1,2,3\n")
    code, _, err = run(capsys, "tune", "--shapes", str(binary), "--dry-run")
    assert code == 2 and err.startswith(f"tune: {binary}: not a text file")
    missing = tmp_path / "nope.txt"
    code, _, err = run(capsys, "tune", "--shapes", str(missing), "--dry-run")
    assert code == 2 and err.strip() == f"tune: cannot read {missing}: No such file or directory"
    code, _, err = run(capsys, "tune", "--shapes", str(tmp_path), "--dry-run")
    assert code == 2 and err.strip() == f"tune: cannot read {tmp_path}: Is a directory"


# ----------------------------------------------------------------------------- cache


def test_cache_clear_with_the_cache_off_fails_on_stderr(monkeypatch, capsys):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "off")
    code, out, err = run(capsys, "cache", "clear")
    assert code == 2 and not out and "nothing to clear" in err and err.startswith("cache: off")
    code, out, err = run(capsys, "cache", "info")  # info is no failure: it says so on stdout
    assert code == 0 and out.startswith("cache: off") and not err


# ----------------------------------------------------------------------------- bench


def test_bench_from_json_refuses_the_measuring_options(no_gpu, tmp_path, capsys):
    code, out, err = run(capsys, "bench", "--from-json", str(RECORD), "--quick", "--dtype",
                         "bf16", "--pass", "wgrad")  # fmt: skip
    assert code == 2 and not out
    assert err.strip() == (
        "bench: --from-json renders a recorded run as it was measured: no --quick, --pass, --dtype"
    )
    md = tmp_path / "run.md"  # its output options, and a default spelled out, are fine
    code, _, err = run(capsys, "bench", "--from-json", str(RECORD), "--markdown", str(md),
                       "--dtype", "float16", "--no-progress")  # fmt: skip
    assert code == 0 and md.read_text().startswith("|") and f"wrote {md}" in err


def test_bench_host_overhead_refuses_what_it_would_ignore(no_gpu, tmp_path, capsys):
    code, _, err = run(capsys, "bench", "--host-overhead", "--suite", "llm", "--json",
                       str(tmp_path / "h.json"))  # fmt: skip
    assert code == 2 and "writes no file: no --suite, --json" in err
    code, _, err = run(capsys, "bench", "--host-overhead", "--rounds", "3", "--device", "cuda")
    assert code == bench_cli.EXIT_NO_GPU and "no CUDA GPU" in err


@pytest.mark.parametrize("flag", ["--json", "--csv", "--markdown", "--plot"])
def test_bench_checks_its_output_files_before_measuring(no_gpu, tmp_path, capsys, flag):
    missing = tmp_path / "no" / "such" / "run.out"
    code, _, err = run(capsys, "bench", "--quick", flag, str(missing))
    assert code == 2 and err.strip() == f"bench: {flag} {missing}: no directory {missing.parent}"
    code, _, err = run(capsys, "bench", "--quick", flag, str(tmp_path))
    assert code == 2 and err.strip() == f"bench: {flag} {tmp_path}: is a directory"
    code, _, err = run(capsys, "bench", "--quick", flag, str(tmp_path / "ok.out"))
    assert code == bench_cli.EXIT_NO_GPU  # a writable file: on to the GPU check


def test_bench_plot_without_matplotlib_is_refused_before_measuring(no_gpu, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code, _, err = run(capsys, "bench", "--quick", "--plot", "run.png")
    assert code == 2 and "--plot needs matplotlib" in err and "no CUDA GPU" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--shapes", ""), "bench: no shapes in ''"),
        (("--backends", ""), "bench: --backends '' names no backend; choose from all, cublas"),
        (("--backends", ","), "bench: --backends ',' names no backend"),
        (
            ("--suite", "moe", "--backends", " "),
            "bench: --backends ' ' names no backend; choose from all, torch, loop",
        ),
    ],
)
def test_bench_empty_lists_are_usage_errors(no_gpu, capsys, argv, message):
    code, _, err = run(capsys, "bench", *argv)
    assert code == 2 and err.startswith(message) and "no CUDA GPU" not in err


# ----------------------------------------------------------------------------- end to end


def test_a_refused_option_is_one_line_and_no_traceback():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wsgemm", "bench", "--from-json", str(RECORD), "--shapes", "1,2,3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and not proc.stdout and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "bench: --from-json renders a recorded run as it was measured: no --shapes"
    ]
