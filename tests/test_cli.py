"""``python -m wsgemm`` on the CPU: ``warm`` (with a stand-in compiler), ``cache info|clear``,
``inspect``'s messages and progress, a fast ``--help``, and warm's worker processes."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from wsgemm import cli, inspection
from wsgemm.host.compiling import cache, disk, fingerprint, library, warming

REPO = Path(__file__).resolve().parents[1]
FP = "fedcba9876543210"


def _env():
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )


class Compiled:
    def __init__(self, key):
        self.key = key

    def export_to_c(self, path, function_name):
        Path(path).write_bytes(b"OBJ " + function_name.encode() + self.key.encode())


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A private cache in tmp_path, a fixed fingerprint, a compiler that takes no time (and
    fails for the keys in ``fail``), and no linker."""
    for name in ("WSGEMM_DISK_CACHE", "WSGEMM_CACHE_SHARED"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "cache"
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(root))
    monkeypatch.setattr(fingerprint, "fingerprint", lambda: FP)
    monkeypatch.setattr(fingerprint, "toolchain", lambda: {
        "cutlass_dsl": "4.8.1", "dsl_flavour": "cu13", "dsl_cuda": "13.4", "tvm_ffi": "0.1.15",
        "python": "3.11", "dsl_settings": {"CUTE_DSL_LINEINFO": "1"},
    })  # fmt: skip
    fail: set[str] = set()
    compiled: list[str] = []

    def compile_variant(variant, keep=False):
        if variant.key() in fail:
            raise RuntimeError("ptxas: out of registers\nmore")
        compiled.append(variant.key())
        return Compiled(variant.key())

    monkeypatch.setattr(cache, "compile_variant", compile_variant)
    # its objects are no ELF a C linker takes: as in tests/host/test_cache.py's world, this
    # machine has no linker (else each test warned that linking failed; test_cache.py tests
    # the link, and that warning, with a linker that works)
    monkeypatch.setattr(library, "why_not_linkable", lambda: "no linker in the test world")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cache.reset()
    yield root, fail, compiled
    cache.reset()


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


WARM_80 = ("warm", "--arch", "sm_80", "--backend", "sm80-multistage", "--jobs", "1")


def test_warm_fills_the_cache_then_finds_it_full(stand_in, capsys):
    root, _, compiled = stand_in
    code, _, err = run(capsys, *WARM_80)
    assert code == 0, err
    assert "warm: 36 compiled, 0 already cached, 0 failed" in err
    assert len(list((root / FP).glob("*.o"))) == 36 == len(compiled)
    cache.reset()
    code, _, err = run(capsys, *WARM_80)
    assert code == 0 and "warm: 0 compiled, 36 already cached, 0 failed" in err
    assert len(compiled) == 36


def test_warm_compiles_the_sm90_menu_and_says_which(stand_in, capsys):
    """For sm_90a, warm's sm90 variants are the policy's menu (choosing.menu_variants): the
    shipped two backends plus the other entries, 36 variants each, the entries that split
    24 more each (their split-K variant, fp32 accumulators), and nothing else."""
    from wsgemm.host import choosing

    _, _, compiled = stand_in
    code, _, err = run(capsys, "warm", "--arch", "sm_90a", "--backend", "sm90-pingpong",
                       "--jobs", "1")  # fmt: skip
    entries = [e for e in choosing.MENU if e.backend == "sm90-pingpong"]
    assert code == 0, err
    assert f"warm: the sm90 menu (docs/policy.md): {', '.join(e.name for e in entries)}" in err
    count = 36 * len(entries) + 24 * sum(e.splits for e in entries)
    assert len(compiled) == count == len(set(compiled))
    assert f"warm: {count} compiled, 0 already cached, 0 failed" in err
    assert set(compiled) == {v.key() for v in choosing.menu_variants("sm_90a", tuple(entries))}


def test_warm_grouped_adds_the_grouped_kernels(stand_in, capsys):
    """``--grouped``: grouped_mm's variants of the chosen backends (``host.grouped_variants``:
    ragged M and ragged K), besides the menu; none for an arch without a grouped kernel."""
    from wsgemm import host
    from wsgemm.host import choosing

    _, _, compiled = stand_in
    code, _, err = run(capsys, "warm", "--arch", "sm_90a", "--backend", "sm90-pingpong",
                       "--jobs", "1", "--grouped")  # fmt: skip
    assert code == 0, err
    entries = tuple(e for e in choosing.MENU if e.backend == "sm90-pingpong")
    grouped = {v.key() for v in host.grouped_variants("sm_90a") if v.backend == "sm90-pingpong"}
    groupings = {k.rsplit("grouping=", 1)[1] for k in grouped}
    assert groupings == {"m", "k"}  # the ragged-M kernels and the ragged-K (2D x 2D) ones
    assert set(compiled) == grouped | {v.key() for v in choosing.menu_variants("sm_90a", entries)}
    code, _, err = run(capsys, *WARM_80, "--grouped")
    assert code == 0 and "no grouped kernel builds for sm_80" in err


def test_warm_without_a_gpu_needs_an_arch(stand_in, capsys):
    code, _, err = run(capsys, "warm")
    assert code == 2 and "no CUDA GPU" in err and "pass --arch" in err


def test_warm_uses_the_local_gpus_arch(stand_in, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 6))
    code, _, err = run(capsys, "warm", "--backend", "sm80-multistage", "--jobs", "1")
    assert code == 0 and "variants for sm_86" in err


def test_warm_names_the_arch_a_backend_needs(stand_in, capsys):
    code, _, err = run(capsys, "warm", "--arch", "sm_80", "--backend", "sm90")
    assert code == 2 and "sm90 needs --arch sm_90a" in err and "sm80-multistage" in err


def test_warm_with_the_cache_off_refuses(stand_in, capsys, monkeypatch):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "off")
    code, _, err = run(capsys, *WARM_80)
    assert code == 2 and "nothing to warm" in err


def test_warm_fails_at_once_when_nothing_can_be_written(stand_in, capsys, monkeypatch):
    _, _, compiled = stand_in

    def erofs(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(disk.tempfile, "mkstemp", erofs)
    code, _, err = run(capsys, *WARM_80)
    assert code == 1 and "Read-only file system" in err and compiled == []


def test_warm_into_a_path_that_is_a_file_fails(stand_in, capsys):
    root, _, _ = stand_in
    root.write_text("not a folder")
    with pytest.warns(disk.CacheWarning):
        code, _, err = run(capsys, *WARM_80)
    assert code == 1 and "cannot use the cache" in err


def test_a_failed_variant_is_one_line_and_a_non_zero_exit(stand_in, capsys):
    _, fail, _ = stand_in
    variants = inspection.variants("sm_80", "sm80-multistage", everything=True)
    fail.update(v.key() for v in variants[:3])
    code, _, err = run(capsys, *WARM_80)
    assert code == 1
    assert "33 compiled, 0 already cached, 3 failed" in err
    assert err.count("RuntimeError: ptxas: out of registers") == 1
    assert "more" not in err.replace("more than", "")


def test_ctrl_c_in_a_one_process_warm_is_one_line(stand_in, capsys, monkeypatch):
    """With --jobs 1 the compile runs in the command's own process, where Ctrl-C lands."""
    _, _, compiled = stand_in
    real = cache.compile_variant

    def interrupted_at_the_fourth(variant, keep=False):
        if len(compiled) == 3:
            raise KeyboardInterrupt
        return real(variant, keep)

    monkeypatch.setattr(cache, "compile_variant", interrupted_at_the_fourth)
    code, _, err = run(capsys, *WARM_80, "--no-progress")
    assert code == 130 and len(err.splitlines()) == 2, err
    assert err.splitlines()[1].startswith(
        "warm: interrupted after 3 of 36 variants (3 compiled); compiled ones are kept in "
    )


@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_warm_jobs_must_be_a_positive_integer(jobs, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["warm", "--arch", "sm_80", "--jobs", jobs])
    assert exc.value.code == 2


def test_warm_jobs_are_bounded_by_the_machine(stand_in, capsys, monkeypatch):
    monkeypatch.setattr(warming, "max_jobs", lambda: 1)
    code, _, err = run(capsys, *WARM_80[:-1], "100000")
    assert code == 0 and "--jobs 100000 is more than this machine holds" in err


def test_warm_in_a_log_prints_plain_progress_lines(stand_in, capsys):
    """Without a terminal (a log, a pipe, CI) there is no bar: a line each tenth of the
    variants instead, then the summary; ``--no-progress`` leaves the start and the summary."""
    code, _, err = run(capsys, *WARM_80)
    lines = err.splitlines()
    assert code == 0, err
    steps = [line for line in lines if " of 36 in " in line]
    assert [s.split(" of ")[0] for s in steps] == [f"warm: {n}" for n in range(4, 36, 4)]
    assert steps[-1].endswith("(32 compiled, 0 already cached, 0 failed)")
    assert lines[-1].startswith("warm: 36 compiled, 0 already cached, 0 failed in ")
    cache.reset()
    code, _, err = run(capsys, *WARM_80, "--no-progress")
    lines = err.splitlines()
    assert code == 0 and len(lines) == 2, err
    assert lines[0].startswith("warm: 36 variants for sm_80 into ")
    assert lines[1].startswith("warm: 0 compiled, 36 already cached, 0 failed in ")


def test_warm_on_a_terminal_draws_a_bar_not_lines(stand_in, capsys, monkeypatch):
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(cli, "_err_console", lambda: Console(
        file=screen, force_terminal=True, width=120, color_system=None, highlight=False
    ))  # fmt: skip
    assert run(capsys, *WARM_80)[0] == 0
    assert "36/36" in screen.getvalue() and " of 36 in " not in screen.getvalue()
    screen.seek(0)
    screen.truncate()
    cache.reset()
    assert run(capsys, *WARM_80, "--no-progress")[0] == 0
    assert "/36" not in screen.getvalue() and "36 already cached" in screen.getvalue()


def test_max_jobs_counts_cores_and_memory(monkeypatch):
    monkeypatch.setattr(warming, "_available_bytes", lambda: 3 * warming.WORKER_BYTES)
    assert 1 <= warming.max_jobs() <= 3
    monkeypatch.setattr(warming, "_available_bytes", lambda: 0)
    assert warming.max_jobs() == 1


def test_the_readme_counts_a_full_warm_as_the_code_does():
    text = " ".join((REPO / "README.md").read_text().split())
    found = re.search(r"A full sm_90a warm is (\d+) variants", text)
    assert found, "the README no longer says how many variants a full sm_90a warm compiles"
    everything = inspection.warm_variants("sm_90a", inspection.backends_for("sm_90a"))
    assert int(found[1]) == len(everything)


# ----------------------------------------------------------------------------- worker processes


def test_a_killed_worker_fails_the_rest_with_one_reason():
    from worker_tasks import die  # a task that kills its worker, from a module without torch

    variants = inspection.variants("sm_80", "sm80-multistage", everything=True)[:3]
    outcomes = warming.warm(variants, jobs=2, task=die)
    assert len(outcomes) == 3 and {o.status for o in outcomes} == {"failed"}
    assert {o.error for o in outcomes} == {"a compile worker died (killed, or out of memory?)"}


def test_workers_end_when_the_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import multiprocessing, os, time
        from concurrent.futures import ProcessPoolExecutor
        from wsgemm.host.compiling.warming import _end_with_parent

        if __name__ == "__main__":
            pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_end_with_parent, initargs=(os.getpid(),))
            print(pool.submit(os.getpid).result(), flush=True)
            pool.submit(time.sleep, 600)
            time.sleep(0.5)
            os._exit(0)  # dies like a killed parent: no pool shutdown
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=120
    )
    worker = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    alive = _alive(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the worker outlived its parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# A `python -m wsgemm warm` whose compiles after the first three take ten minutes, in two
# worker processes: it marks in $MARKS each worker that starts a slow one, and each of the
# three outcomes the parent has reported.
_SLOW_WARM = """
import os, signal, sys, time
from pathlib import Path

from wsgemm import cli, inspection
from wsgemm.host.compiling import fingerprint, warming

MARKS = Path(os.environ["MARKS"])
FAST = {v.key() for v in inspection.warm_variants("sm_80", ["sm80-multistage"])[:3]}


def compile_slowly(variant):
    if variant.key() not in FAST:
        (MARKS / f"worker.{os.getpid()}").touch()
        time.sleep(600)
    return warming.Outcome(variant.key(), "compiled", 0.0)


if __name__ == "__main__":
    # as a shell starts a command in the foreground, whatever started this test
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fingerprint.fingerprint = lambda: "fedcba9876543210"
    warming.max_jobs = lambda: 2
    real = warming.warm

    def warm(variants, jobs, on_outcome):
        def report(outcome):
            on_outcome(outcome)
            (MARKS / f"seen.{outcome.key}").touch()

        return real(variants, jobs, report, task=compile_slowly)

    warming.warm = warm
    sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "to_group, signum, code",
    [(True, signal.SIGINT, 130), (False, signal.SIGTERM, 143)],
    ids=["ctrl-c", "sigterm-to-warm-alone"],
)
def test_an_interrupted_warm_says_one_line_and_its_workers_stop(tmp_path, to_group, signum, code):
    """Ctrl-C at a terminal signals the whole process group, workers included; a SIGTERM
    reaches the parent alone. Either way: one line, no traceback, the shell's exit code, and
    no worker left compiling."""
    script, marks = tmp_path / "slow_warm.py", tmp_path / "marks"
    script.write_text(_SLOW_WARM)
    marks.mkdir()
    env = dict(_env(), MARKS=str(marks), WSGEMM_CACHE_DIR=str(tmp_path / "cache"))
    for name in ("WSGEMM_DISK_CACHE", "WSGEMM_CACHE_SHARED"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, str(script), "warm", "--arch", "sm_80", "--backend", "sm80-multistage",
         "--jobs", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            workers = [int(m.suffix[1:]) for m in marks.glob("worker.*")]
            if len(workers) == 2 and len(list(marks.glob("seen.*"))) == 3:
                break
            time.sleep(0.1)
        assert len(workers) == 2 and proc.poll() is None, proc.communicate(timeout=60)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=60)
        still = [w for w in workers if _alive(w)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert proc.returncode == code, err
    lines = err.splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    assert lines[0].startswith("warm: 36 variants for sm_80 into ")
    assert lines[1].startswith(
        "warm: interrupted after 3 of 36 variants (3 compiled); compiled ones are kept in "
    )
    assert still == [], "workers outlived the warm that started them"


# ----------------------------------------------------------------------------- cache info|clear


def test_cache_info_and_clear(stand_in, capsys):
    root, _, _ = stand_in
    assert run(capsys, *WARM_80)[0] == 0
    (root / "aaaaaaaaaaaaaaaa").mkdir()
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0
    assert f"location     {root}" in out and f"fingerprint  {FP}" in out
    assert "cutlass-dsl 4.8.1 (cu13, CUDA 13.4)" in out and "CUTE_DSL_LINEINFO=1" in out
    assert f"{FP}    36 entries" in out and "(this environment)" in out
    assert "total        36 entries" in out
    assert "autotune     0 tuned choice(s) for 0 GPU model(s)" in out
    from wsgemm.host.choosing import autotune

    store = autotune.TunedStore(root)
    store.put("NVIDIA H100 PCIe", 114, "m16-n64-k64-b1", "sm90", 1, {})
    times = {"sm90/1": 0.02, "sm90-pingpong/2": 0.025}
    store.put("NVIDIA H100 PCIe", 114, "m32-n64-k64-b1", "sm90", 1, times)
    store.put("NVIDIA L4", 58, "route-m8-n8-k8-b1", "torch", 1, {"torch": 0.01, "sm80": 0.03})
    code, out, _ = run(capsys, "cache", "info")
    assert "autotune     3 tuned choice(s) for 2 GPU model(s)" in out
    # each stored pick listed: the winner, and how it stood against the next
    assert "  NVIDIA H100 PCIe (114 SMs)  m16-n64-k64-b1: sm90 split 1 (no times kept)" in out
    assert "m32-n64-k64-b1: sm90 split 1 (2 timed, 1.25x the next)" in out
    assert "  NVIDIA L4 (58 SMs)  route-m8-n8-k8-b1: torch (2 timed, 3.00x the next)" in out
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 2 folder(s)" in out and "2 file(s) of tuned choices" in out
    assert not (root / FP).exists() and not (root / "autotune").exists()


def test_cache_info_when_off(monkeypatch, capsys):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "0")
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "off" in out


# ----------------------------------------------------------------------------- inspect


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arch", "sm_80", "--backend", "sm90"], "sm90 needs --arch sm_90a"),
        (["--arch", "sm_89", "--backend", "sm90", "--backend", "sm90-pingpong"], "need --arch"),
    ],
)
def test_inspect_names_the_arch_a_backend_needs(argv, message, capsys):
    code, _, err = run(capsys, "inspect", *argv)
    assert code == 2 and message in err and "choose from: sm80" in err


def test_inspect_opcode_columns_follow_the_family():
    sm80 = inspection.opcode_columns("sm_80", {"sm80"})
    assert "HGMMA" not in sm80 and "SYNCS" not in sm80
    assert {"HMMA", "LDGSTS", "LDSM", "ARRIVES", "DEPBAR", "BAR"} <= set(sm80)
    hopper = inspection.opcode_columns("sm_90a", {"sm80", "sm90"})
    assert {"HGMMA", "UTMALDG", "SYNCS", "USETMAXREG", "HMMA", "ARRIVES"} <= set(hopper)
    assert "HGMMA_WAITED" in hopper and "HGMMA_WAITED" not in sm80


def _fake_report(variant):
    time.sleep(0.3)
    return inspection.Report(variant.backend, variant.arch, {}, {}, 1, 2, 0, {"HMMA": 3})


def test_inspect_json_shows_progress_on_stderr(monkeypatch, capsys):
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(inspection, "inspect_variant", _fake_report)
    monkeypatch.setattr(
        cli, "_err_console", lambda: Console(file=screen, force_terminal=True, width=120)
    )
    code, out, _ = run(capsys, "inspect", "--arch", "sm_80", "--json")
    assert code == 0 and '"kernel": "sm80"' in out
    assert "inspect" in screen.getvalue() and "/2" in screen.getvalue()


def test_inspect_says_what_to_install_without_nvdisasm(monkeypatch, capsys):
    from wsgemm import sass

    def missing(cubin):
        raise sass.NvdisasmMissing("reading SASS needs CUDA's nvdisasm; install it with x")

    monkeypatch.setattr(inspection, "cubin", lambda variant: b"")
    monkeypatch.setattr(sass, "disassemble", missing)
    code, _, err = run(capsys, "inspect", "--arch", "sm_80", "--backend", "sm80")
    assert code == 1 and "nvdisasm" in err and "Traceback" not in err


def test_nvdisasm_missing_names_a_package_that_exists(monkeypatch):
    pytest.importorskip("cutlass")
    from cutlass.base_dsl import env_manager

    from wsgemm import sass

    def not_found():
        raise RuntimeError("SASS dumping requires the nvdisasm tool, but it was not found.")

    monkeypatch.setattr(env_manager, "_find_nvdisasm_binary", not_found)
    with pytest.raises(sass.NvdisasmMissing, match=r"nvidia-cutlass-dsl-libs-base\[sass\]"):
        sass.nvdisasm()


# ----------------------------------------------------------------------------- --help


def test_help_imports_neither_torch_nor_the_dsl():
    code = (
        "import sys, contextlib, io\n"
        "from wsgemm import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--help'])\n"
        "print(sorted(m for m in ('torch', 'cutlass') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv0, prog",
    [
        ("/venv/bin/wsgemm", "wsgemm"),  # the console script of pyproject's [project.scripts]
        ("/src/wsgemm/__main__.py", "python -m wsgemm"),  # what `python -m wsgemm` sets
        ("", "python -m wsgemm"),
    ],
)
def test_usage_names_the_program_as_it_was_run(argv0, prog, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [argv0])
    for argv in (["--help"], ["warm", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert capsys.readouterr().out.startswith(f"usage: {prog} {' '.join(argv[:-1])}".strip())


@pytest.mark.parametrize(
    "command, options, vocabulary",
    [
        ("explain --shape 8,8,8", ("dtype", "out_dtype", "accumulate"), "short"),
        ("bench", ("dtype", "accumulate"), "short"),
        ("trace --shape 8,8,8 --out OUT", ("dtype", "out_dtype", "accumulate"), "long"),
    ],
)
def test_every_dtype_option_takes_both_spellings(command, options, vocabulary, tmp_path, capsys):
    """One vocabulary across the commands: fp16 and float16 (and half), bf16 and bfloat16,
    fp32 and float32 wherever a dtype is asked; each command reads them in its own names."""
    from wsgemm.support import AB_DTYPES, ACC_DTYPES, C_DTYPES, short_name

    parser = cli.build_parser()
    base = command.replace("OUT", str(tmp_path)).split()
    own = short_name if vocabulary == "short" else (lambda d: d)
    allowed = {"dtype": AB_DTYPES, "out_dtype": C_DTYPES, "accumulate": ACC_DTYPES}
    for option in options:
        flag = "--" + option.replace("_", "-")
        for dtype in allowed[option]:
            for typed in {dtype, short_name(dtype), "half" if dtype == "float16" else dtype}:
                args = parser.parse_args([*base, flag, typed])
                assert getattr(args, option) == own(dtype), (flag, typed)
        with pytest.raises(SystemExit) as info:
            parser.parse_args([*base, flag, "fp8"])
        assert info.value.code == 2 and "expected one of" in capsys.readouterr().err


def test_a_reader_that_leaves_ends_the_command_quietly(monkeypatch, capsys):
    """`python -m wsgemm inspect --json | head`: a closed pipe is no traceback, and exit 141."""
    from wsgemm import cli

    parser = cli.build_parser()

    def closed_pipe(args):
        raise BrokenPipeError

    args = parser.parse_args(["cache", "info"])
    monkeypatch.setattr(cli, "build_parser", lambda: _Fixed(args, closed_pipe))
    saved = os.dup(1)
    try:
        assert cli.main(["cache", "info"]) == 141
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Fixed:
    def __init__(self, args, func):
        args.func = func
        self.args = args

    def parse_args(self, argv):
        return self.args


# ----------------------------------------------------------------------------- explain


def test_explain_a_shape_without_a_gpu_says_what_auto_runs_and_what_it_copies(capsys, monkeypatch):
    import torch

    from wsgemm.host import choosing

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a GPU-less machine
    code, out, err = run(capsys, "explain", "--shape", "608,3263,4259", "--layout", "TT")
    assert code == 0 and not err
    lines = out.splitlines()
    assert lines[0].startswith("wsgemm.matmul of 608x3263x4259, fp16 TT, on a stand-in sm_90 GPU")
    choice = choosing.choose(608, 3263, 4259, 1, "float16", "float16", "float32", 132, (9, 0))
    assert f"kernel: {choice.menu_entry.name} " in out
    assert lines[-1].startswith("operands: a copied on every call into a K-major buffer")
    code, out, _ = run(capsys, "explain", "--shape", "1,8192,8192", "--cc", "9.0",
                       "--sm-count", "114")  # fmt: skip
    assert code == 0 and "a stand-in sm_90 GPU with 114 SMs:" in out and "swap-AB" in out
    assert "for 114 SMs" in out  # the grid line counts the GPU asked about
    code, out, _ = run(capsys, "explain", "--shape", "64,64,64", "--batch", "3", "--cc", "8.0")
    assert code == 0 and "batch=3" in out and "sm80" in out
    # meta operands: any size, no memory (60 GB of operands here)
    code, out, _ = run(capsys, "explain", "--shape", "16384,28672,8192", "--batch", "64",
                       "--layout", "NT")  # fmt: skip
    assert code == 0 and out.splitlines()[-1] == (
        "operands: a read in place (M-major); b read in place (N-major); out written in place "
        "(N-major)"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--shape", "64,64"), "want one shape M,N,K of three non-negative integers"),
        (("--shape", "64,64,64", "--cc", "nine"), "want MAJOR.MINOR"),
    ],
)
def test_explain_refuses_a_malformed_argument(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_explain_says_why_a_call_would_be_refused(capsys):
    code, out, err = run(capsys, "explain", "--shape", "64,64,64", "--dtype", "bf16",
                         "--accumulate", "fp16")  # fmt: skip
    assert code == 2 and not out
    assert err.startswith("explain: accumulate=torch.float16 with torch.bfloat16 inputs")


# ----------------------------------------------------------------------------- tune


def test_tune_lists_a_models_dense_layers_at_each_token_count(tmp_path, capsys):
    config = tmp_path / "qwen3-moe.json"
    config.write_text('{"hidden_size": 2048, "vocab_size": 151936, "num_attention_heads": 32, '
                      '"num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, '
                      '"moe_intermediate_size": 768, "num_experts": 128, '
                      '"num_experts_per_tok": 8}')  # fmt: skip
    assert cli.main(["tune", "--model", str(config), "--tokens", "16,300", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "6 problems"  # qkv, o, lm_head (the experts' GEMMs are grouped_mm's)
    assert "qkv t=300" in out[1] and out[1].endswith("300x5120x2048")
    assert not any("expert" in line for line in out)


def test_tune_reads_a_shapes_file_and_names_a_bad_line(tmp_path, capsys):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# mine\n256,4096,4096\n1000 x 14336 x 4096  # gate/up\n")
    assert cli.main(["tune", "--shapes", str(shapes), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["line 2                           256x4096x4096",
                   "line 3                           1000x14336x4096", "2 problems"]  # fmt: skip
    shapes.write_text("256,4096\n")
    assert cli.main(["tune", "--shapes", str(shapes), "--dry-run"]) == cli.EXIT_USAGE
    assert f"{shapes}:1:" in capsys.readouterr().err
    shapes.write_text("0,8,8\n")
    assert cli.main(["tune", "--shapes", str(shapes), "--dry-run"]) == cli.EXIT_USAGE
    assert "sizes must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU answer")
def test_tune_without_a_gpu_says_so(tmp_path, capsys):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("256,4096,4096\n")
    assert cli.main(["tune", "--shapes", str(shapes)]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_tune_wants_shapes_or_a_model(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tune"])
    assert exc.value.code == 2 and "--shapes" in capsys.readouterr().err


def test_tune_runs_through_the_api_and_prints_each_pick(tmp_path, monkeypatch, capsys):
    """The whole command past --dry-run, on the stand-in H200 (a CPU dispatcher, a stand-in
    timer under which each later candidate is a little faster)."""
    from stand_ins import cpu_dispatcher

    from wsgemm.api import tuning as tune_module
    from wsgemm.host.choosing import autotune

    timed = []

    def time_call(fn):
        fn()
        timed.append(fn)
        return 3.0 - 0.1 * len(timed)

    d = cpu_dispatcher(tuned=autotune.TunedStore(tmp_path), time_call=time_call)
    monkeypatch.setattr(tune_module, "DISPATCHER", d)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("256,512,1024\n")
    assert cli.main(["tune", "--shapes", str(shapes)]) == 0
    out, err = capsys.readouterr()
    assert "[1/1] line 1 256x512x1024: model " in err and f"({len(timed)} timed)" in err
    assert out.startswith("1 problems: the tuned pick differs from the cost model's on ")
    assert "auto takes the stored picks while autotuning is on" in out
    count = len(timed)
    assert cli.main(["tune", "--shapes", str(shapes)]) == 0
    assert len(timed) == count and "(stored before)" in capsys.readouterr().err


def test_the_grouped_variant_count_the_docs_give_is_the_count():
    """README and ``warm --help`` say how many kernels ``--grouped`` adds on sm_90a."""
    from pathlib import Path

    from wsgemm import cli, host

    variants = host.grouped_variants("sm_90a")
    ragged_m = sum(v.grouping == "m" for v in variants)
    text = (Path(__file__).parents[1] / "README.md").read_text()
    assert f"({len(variants)} on sm_90a: {ragged_m} ragged-M, {len(variants) - ragged_m} " in text
    assert f"wsgemm.grouped_mm; {len(variants)} on sm_90a" in Path(cli.__file__).read_text()


def test_switched_runs_the_cli_with_registry_switches_on_for_that_run(monkeypatch, capsys):
    """``scripts/switched.py NAMES args``: the named ``host.registry`` family switches set to
    the fused kernels' families, then the CLI with the rest; a name that is no switch is a
    usage error and changes nothing."""
    from script_modules import load

    from wsgemm import cli
    from wsgemm.host import registry

    switched = load("switched")
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    seen = []
    monkeypatch.setattr(cli, "main", lambda argv: seen.append(
        (argv, registry.CLUSTER_SPLIT_FAMILIES)) or 0)  # fmt: skip
    assert switched.main(["CLUSTER_SPLIT_FAMILIES", "explain", "--shape", "5,1536,4096"]) == 0
    assert seen == [(["explain", "--shape", "5,1536,4096"], registry.EPILOGUE_FAMILIES)]
    assert "switched on: CLUSTER_SPLIT_FAMILIES" in capsys.readouterr().err
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    for bad in ("MENU", "NO_SUCH_FAMILIES"):
        assert switched.main([bad, "explain"]) == 2
        assert "is not a host.registry family switch" in capsys.readouterr().err
    assert registry.CLUSTER_SPLIT_FAMILIES == frozenset() and len(seen) == 1
    assert switched.main(["", "bench"]) == 0 and seen[-1][0] == ["bench"]


def test_switched_runs_a_script_with_the_switches_on(monkeypatch, tmp_path, capsys):
    """``--script PATH args``: the script runs as ``__main__`` with its own arguments and the
    switches on, and its exit status is the run's; afterwards the switch is off again."""
    from script_modules import load

    from wsgemm.host import registry

    switched = load("switched")
    monkeypatch.setattr(registry, "GATED_SWAP_BIAS_FAMILIES", frozenset())
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\nfrom wsgemm.host import registry\n"
        "print(sys.argv[1:], sorted(registry.GATED_SWAP_BIAS_FAMILIES))\n"
        "sys.exit(3 if sys.argv[1:] == ['--fail'] else 0)\n"
    )
    assert switched.main(["GATED_SWAP_BIAS_FAMILIES", "--script", str(script), "-x"]) == 0
    assert "['-x'] ['sm90']" in capsys.readouterr().out
    assert switched.main(["GATED_SWAP_BIAS_FAMILIES", "--script", str(script), "--fail"]) == 3
    assert registry.GATED_SWAP_BIAS_FAMILIES == frozenset()
