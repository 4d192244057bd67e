"""Every shipped kernel compiles for its targets without a GPU, and its SASS shows the hardware
path it was written for, with no local-memory spills. Also: the ``inspect`` command's JSON."""

import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from wsgemm import host
from wsgemm import inspection as insp

SM90 = host.shipped_backends("sm90")
SM80 = host.shipped_backends("sm80")

# opcode -> why it must be there
SM90_NEEDS = {
    "HGMMA": "consumers issue warpgroup MMA",
    "UTMALDG": "the producer loads tiles with TMA",
    "UTMASTG": "the epilogue stores with TMA",
    "USETMAXREG": "the producer gives registers to the consumers",
    "SYNCS": "roles meet on mbarriers",
}
SM80_NEEDS = {
    "HMMA": "mma.sync",
    "LDGSTS": "16-byte cp.async loads",
    "LDSM": "ldmatrix fragment loads",
}

_reports: dict = {}


def report(variant: host.Variant) -> insp.Report:
    if variant not in _reports:
        _reports[variant] = insp.inspect_variant(variant)
    return _reports[variant]


def assert_clean(r: insp.Report):
    assert r.spill_bytes == 0, f"{r.kernel} {r.arch}: {r.spill_bytes} bytes of local memory"
    assert r.sass["LDL"] == 0 and r.sass["STL"] == 0, f"{r.kernel} {r.arch}: spills in SASS"
    assert 0 < r.registers <= 255


def test_every_backend_is_shipped():
    assert sorted(SM90 + SM80) == sorted(host.BACKENDS)


@pytest.mark.parametrize("backend", SM90)
@pytest.mark.parametrize(
    "ab, c, acc, a_major, b_major",
    [
        ("float16", "float16", "float32", "k", "k"),
        ("bfloat16", "float32", "float32", "m", "n"),
        ("float16", "bfloat16", "float16", "k", "n"),
    ],
)
def test_sm90_kernels_compile_to_wgmma_and_tma(backend, ab, c, acc, a_major, b_major):
    r = report(host.Variant(backend, "sm_90a", ab, c, acc, a_major, b_major))
    for op, why in SM90_NEEDS.items():
        assert r.sass[op] > 0, f"{backend}: no {op} in SASS ({why})"
    assert r.sass["HMMA"] == 0 and r.sass["LDGSTS"] == 0
    assert_clean(r)


@pytest.mark.parametrize("backend", SM80)
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a"])
def test_sm80_kernels_compile_to_cp_async_and_mma_sync(backend, arch):
    r = report(host.Variant(backend, arch))
    for op, why in SM80_NEEDS.items():
        assert r.sass[op] > 0, f"{backend} {arch}: no {op} in SASS ({why})"
    assert r.sass["HGMMA"] == 0
    assert_clean(r)


def _summary(variant: host.Variant) -> tuple[str, int, dict]:
    """(key, spill bytes, SASS opcode counts) of one variant (runs in a worker process)."""
    r = insp.inspect_variant(variant)
    return variant.key(), r.spill_bytes, dict(r.sass)


def _compile_all(variants: list) -> list:
    workers = max(1, min(8, os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(_summary, variants))


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, archs, count, needs",
    [
        ("sm80", ("sm_80", "sm_90a"), 144, SM80_NEEDS),
        ("sm90", ("sm_90a",), 72, SM90_NEEDS),
    ],
)
def test_every_shipped_variant_compiles_spill_free(family, archs, count, needs):
    """Every shipped variant (kernels x dtypes x accumulators x four layouts x targets),
    compiled in parallel worker processes: no local memory, and the hardware path."""
    variants = [
        v
        for arch in archs
        for backend in host.shipped_backends(family)
        for v in insp.variants(arch, backend, everything=True)
    ]
    assert len(variants) == count
    rows = _compile_all(variants)
    spills = [(key, b) for key, b, ops in rows if b or ops["LDL"] or ops["STL"]]
    assert not spills, f"local-memory spills: {spills}"
    for op, why in needs.items():
        missing = [key for key, _, ops in rows if not ops[op]]
        assert not missing, f"no {op} ({why}) in {missing}"


@pytest.mark.parametrize("arch, mbarrier_op", [("sm_80", "ARRIVES"), ("sm_90a", "SYNCS")])
def test_specialized_sm80_meets_on_mbarriers_and_the_baseline_does_not(arch, mbarrier_op):
    ws = report(host.Variant("sm80", arch))
    base = report(host.Variant("sm80-multistage", arch))
    # cp.async completion is signalled on the stage's mbarrier (ARRIVES on sm_80, SYNCS on sm_90)
    assert ws.sass[mbarrier_op] > 0, "the producer/consumer pipeline lives on mbarriers"
    assert base.sass["ARRIVES"] == 0 and base.sass["SYNCS"] == 0
    assert base.sass["DEPBAR"] > 0, "the baseline waits on cp.async groups"


def test_specialized_sm80_waits_in_hardware_on_hopper():
    """On sm_90a a waiting producer or consumer uses try_wait (the thread is suspended until
    the phase flips); sm_80 has only the polling test_wait."""
    from wsgemm import sass

    texts = {
        arch: sass.disassemble(
            host.compile_variant(host.Variant("sm80", arch), keep=True).artifacts.CUBIN
        )
        for arch in ("sm_90a", "sm_80")
    }
    assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in texts["sm_90a"]
    assert "TRYWAIT" not in texts["sm_80"]


def test_inspect_json_lists_both_sm80_kernels():
    proc = subprocess.run(
        [sys.executable, "-m", "wsgemm", "inspect", "--arch", "sm_80", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(proc.stdout)
    assert {r["kernel"] for r in rows} == set(SM80)
    assert any("multistage" in r["kernel"] for r in rows)
    for r in rows:
        assert set(r) >= {
            "kernel",
            "arch",
            "config",
            "registers",
            "smem_bytes",
            "spill_bytes",
            "sass",
        }
        assert r["arch"] == "sm_80" and r["sass"]["HMMA"] > 0 and r["spill_bytes"] == 0
