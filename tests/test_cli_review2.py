"""``python -m wsgemm`` as a user meets it, CPU only, second review: an ``--out`` folder that
cannot be made (refused before anything is recorded, and a recording not lost when the folder
goes away while it runs), what trace's ``--dtype`` help says it takes, and shape lists with
digits that are not ASCII (one line that says what a shape is, not ``int()``'s complaint)."""

from __future__ import annotations

import argparse
import pathlib
import re
import tempfile
from pathlib import Path

import pytest
from test_cli import run
from test_cli_review import no_gpu, usage_error  # noqa: F401 (no_gpu: a fixture, by name)

from wsgemm import cli
from wsgemm.bench import suites
from wsgemm.bench.cli import stderr_console
from wsgemm.tracing import cli as trace_cli
from wsgemm.tracing.timeline import Timeline

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "tests" / "data" / "trace_sm80_2048.npz"


@pytest.fixture
def recording():
    return Timeline.from_raw(RAW)


# ----------------------------------------------------------------------------- trace --out


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_trace_out_that_cannot_be_made_is_a_usage_error(capsys):
    err = usage_error(capsys, "trace", "--from-raw", str(RAW), "--out", "/proc/foo")
    assert err.splitlines()[-1] == (
        "python -m wsgemm trace: error: argument --out: cannot make /proc/foo: No such file or "
        "directory"
    )
    assert "Traceback" not in err


def test_trace_out_is_tried_before_recording(monkeypatch, tmp_path, capsys):
    """A folder the OS refuses (mkdir raises, whatever os.access said) stops the command when
    its arguments are read: no GPU check, no recording."""
    real = pathlib.Path.mkdir
    refused = tmp_path / "refused"

    def mkdir(self, *args, **kwargs):
        if self == refused:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    def record(*_):
        raise AssertionError("recorded despite an unusable --out")

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(trace_cli, "_no_gpu_reason", lambda: None)
    monkeypatch.setattr(trace_cli, "_record", record)
    out = refused / "sub"
    err = usage_error(capsys, "trace", "--shape", "256,256,256", "--out", str(out))
    assert err.splitlines()[-1].endswith(
        f"error: argument --out: cannot make {out}: Permission denied"
    )


@pytest.mark.usefixtures("no_gpu")
def test_trace_out_check_leaves_no_folder_behind(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "out"
    code, _, err = run(capsys, "trace", "--shape", "256,256,256", "--out", str(out))
    assert code == trace_cli.EXIT_NO_GPU and "no CUDA GPU" in err
    assert not (tmp_path / "a").exists()
    code, _, err = run(capsys, "trace", "--from-raw", str(RAW), "--out", str(out))
    assert code == 0 and sorted(p.name for p in out.iterdir()) == sorted(trace_cli.FILES.values())


def test_a_recording_whose_out_went_away_is_kept(recording, monkeypatch, tmp_path, capsys):
    """--out was fine when parsed, but when the recording is done a file stands in its way:
    exit 1, a line saying why, and the recording saved elsewhere, where the message says."""
    gone = tmp_path / "gone"
    out = gone / "out"
    keep = tmp_path / "tmp"
    keep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(keep))

    def record(*_):
        gone.write_text("")  # the folder cannot be made any more
        return recording

    monkeypatch.setattr(trace_cli, "_no_gpu_reason", lambda: None)
    monkeypatch.setattr(trace_cli, "_record", record)
    code, _, err = run(capsys, "trace", "--shape", "2048,2048,2048", "--out", str(out))
    assert code == trace_cli.EXIT_FAILED
    lines = err.strip().splitlines()
    assert lines[0] == f"trace: cannot make {out}: Not a directory"
    found = re.fullmatch(r"trace: the recording is kept in (\S+) \(--from-raw re-renders it\)",
                         lines[-1])  # fmt: skip
    assert found, lines[-1]
    kept = Path(found[1])
    assert kept.parent.parent == keep and kept.name == "raw.npz"
    assert Timeline.from_raw(kept).summary() == recording.summary()
    assert "Traceback" not in err


def test_a_re_render_whose_out_went_away_fails_in_one_line(recording, tmp_path, capsys):
    """--from-raw: the recording is the file given, nothing to keep; exit 1 and why."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    args = argparse.Namespace(from_raw=recording, out=blocked / "out", sms=None)
    assert trace_cli._render(recording, args, stderr_console()) == trace_cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"trace: cannot make {blocked / 'out'}: Not a directory"]


# ----------------------------------------------------------------------------- trace --dtype


def test_trace_dtype_help_names_what_it_takes(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["trace", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_ = text.split("--dtype float16|bfloat16 ", 1)[1].split(" --out-dtype", 1)[0]
    assert help_.startswith("operand dtype: float16 (the default; also fp16 or half) or bfloat16")
    assert "bf16" in help_ and "fp32" not in help_ and "float32" not in help_
    err = usage_error(
        capsys, "trace", "--shape", "8,8,8", "--dtype", "fp32", "--out", str(tmp_path)
    )
    assert "float16 (fp16, half), bfloat16 (bf16), got 'fp32'" in err


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("shapes", ["\u00b2,2,3", "1,2,\u0663", "8,8,8;\u00b9,1,1"])
@pytest.mark.usefixtures("no_gpu")
def test_bench_shapes_with_other_digits_say_what_a_shape_is(capsys, shapes):
    code, out, err = run(capsys, "bench", "--shapes", shapes)
    item = shapes.split(";")[-1]
    assert code == 2 and not out
    assert err.strip() == f"bench: bad shape {item!r}: expected three positive integers M,N,K"


@pytest.mark.usefixtures("no_gpu")
def test_bench_tokens_with_other_digits_say_what_they_are(capsys):
    code, _, err = run(capsys, "bench", "--suite", "llm", "--tokens", "1,\u00b2")
    assert code == 2
    assert err.strip() == (
        "bench: expected a comma-separated list of positive integers, got '1,\u00b2'"
    )


def test_trace_shape_with_other_digits_says_what_a_shape_is(tmp_path, capsys):
    err = usage_error(capsys, "trace", "--shape", "\u00b2,2,3", "--out", str(tmp_path))
    assert "argument --shape: bad shape '\u00b2,2,3': expected three positive integers" in err
    assert "invalid literal" not in err


def test_parse_shapes_still_takes_ascii_digits():
    assert [(s.m, s.n, s.k) for s in suites.parse_shapes("1,2,3; 4x5x6")] == [(1, 2, 3), (4, 5, 6)]
    assert suites.parse_int_list("1, 16,128") == (1, 16, 128)
