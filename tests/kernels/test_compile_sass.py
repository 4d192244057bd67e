"""Every kernel compiles without a GPU, and its SASS shows the hardware path it was written for,
with no local-memory spills.

The default run compiles one representative variant of every kernel for its arch (plus the
sm80 kernel for Hopper), each once per session (the ``compiled`` fixture); the exhaustive sweep
over every shipped variant is marked ``sweep`` (``python -m pytest -m sweep``,
docs/architecture.md).
"""

import collections
import concurrent.futures
import dataclasses
import functools
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

import pytest
from sass_checks import assert_clean, assert_sm80_path, assert_wgmma_pipelined

from wsgemm import host, sass, support
from wsgemm import inspection as insp
from wsgemm.host import choosing
from wsgemm.support import Epilogue

SM90 = host.shipped_backends("sm90")
SM80 = host.shipped_backends("sm80")
#: The representative variant of each kernel (fp16 in and out, fp32 accumulate, K-major A, B).
REPRESENTATIVE = {
    **{b: host.Variant(b, "sm_90a") for b in SM90},
    **{b: host.Variant(b, "sm_80") for b in SM80},
}
#: The specialized sm80 kernel built for Hopper, with an M-major A (the transposed ldmatrix path).
SM80_ON_HOPPER = host.Variant("sm80", "sm_90a", a_major="m")

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


def test_every_backend_is_shipped():
    assert sorted(SM90 + SM80) == sorted(host.BACKENDS)


@pytest.mark.parametrize("backend", SM90)
def test_sm90_kernels_compile_to_wgmma_and_tma(compiled, backend):
    r = compiled(REPRESENTATIVE[backend]).report
    for op, why in SM90_NEEDS.items():
        assert r.sass[op] > 0, f"{backend}: no {op} in SASS ({why})"
    assert r.sass["HMMA"] == 0 and r.sass["LDGSTS"] == 0
    # the inspect table's column: the HGMMAs waited for before the next issues (few: pipelined)
    assert r.sass["HGMMA_WAITED"] == sass.waited_wgmmas(r.sass_text)[0] < r.sass["HGMMA"] / 2
    assert_clean(r)


@pytest.mark.parametrize("backend", SM80)
def test_sm80_kernels_compile_to_cp_async_and_mma_sync(compiled, backend):
    v = REPRESENTATIVE[backend]
    r = compiled(v).report
    assert r.sass["HGMMA"] == 0
    # Ampere has no mbarrier.try_wait: a waiting thread polls.
    assert "TRYWAIT" not in r.sass_text
    mma_threads = v.kernel_config().mma_threads
    assert_sm80_path(r, v.acc_dtype, mma_threads, specialized=backend == "sm80")
    assert_clean(r)


def test_sm80_kernel_waits_in_hardware_on_hopper(compiled):
    v = SM80_ON_HOPPER
    r = compiled(v).report
    # On sm_90a a waiting thread is suspended in hardware until the phase flips.
    assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in r.sass_text
    assert r.sass["HGMMA"] == 0 and r.sass["USETMAXREG"] == 0
    assert_sm80_path(r, v.acc_dtype, v.kernel_config().mma_threads, specialized=True)
    assert_clean(r)


def test_inspect_json_reports_each_kernel(compiled, monkeypatch, capsys):
    """``python -m wsgemm inspect --json`` (in process, reading the session's compiles)."""
    from wsgemm import cli

    monkeypatch.setattr(insp, "inspect_variant", lambda v, compiled_fn=None: compiled(v).report)
    assert cli.main(["inspect", "--arch", "sm_80", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["kernel"] for r in rows} == set(SM80)
    for r in rows:
        assert set(r) == {
            "kernel",
            "arch",
            "config",
            "variant",
            "registers",
            "smem_bytes",
            "spill_bytes",
            "sass",
        }
        assert r["arch"] == "sm_80" and r["sass"]["HMMA"] > 0 and r["spill_bytes"] == 0
        assert r["config"] == dataclasses.asdict(REPRESENTATIVE[r["kernel"]].kernel_config())


@pytest.mark.parametrize(
    "backend, params",
    # the address entry: token, three addresses, M, N, K, L, six strides, max_active_clusters,
    # raster_group; sm90: then split-K's count, workspace and semaphores (None when unsplit)
    # and the fused epilogue's bias, alpha, beta and C (None without)
    [("sm80", 16), ("sm90", 23)],
)
def test_a_kernel_loaded_from_disk_takes_the_launch_defaults(compiled, backend, params):
    """The disk cache's path: an exported kernel keeps no Python defaults and takes every
    launch argument; wrapped, it takes the call without the trailing launch arguments like the
    in-process one (the call then fails on the fake operands, after the argument count was
    accepted)."""
    import cutlass.cute as cute

    v = REPRESENTATIVE[backend]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "k.o")
        compiled(v).fn.export_to_c(path, function_name="k")
        raw = cute.runtime.load_module(path, enable_tvm_ffi=True).k
    first = [None] * 4 + [1] * 10 + [1]  # token, addresses, sizes and strides, clusters
    with pytest.raises(TypeError, match=f"Expects {params} parameters"):
        raw(*first)
    with pytest.raises(TypeError, match="Mismatched type on argument #0"):
        host.compiling.compile.with_launch_defaults(raw, v)(*first)


def test_an_unsplit_sm90_kernel_compiles_as_before_split_k(compiled):
    """Split-K is a compile-time switch (``Sm90Config.split_k``): off, the shipped kernels
    compile to exactly the opcodes of the build before it existed (tests/data, made from that
    build's representative variants). Regenerate the file only for a deliberate kernel change."""
    data = Path(__file__).parents[1] / "data"
    golden = json.loads((data / "sm90_unsplit_opcodes.json").read_text())
    for backend in SM90:
        r = compiled(REPRESENTATIVE[backend]).report
        assert dict(collections.Counter(sass.opcodes(r.sass_text))) == golden[backend], backend


#: The split-K variants of the decode entries: a ping-pong and a cooperative schedule.
SPLIT = {
    name: host.Variant(
        choosing.entry(name).backend, "sm_90a", config=choosing.entry(name).variant_config(True)
    )
    for name in ("pingpong-64x128-c1x2", "cooperative-128x128-c1x2")
}


#: The sweep's: the largest cooperative tile (160 accumulators a thread, two bands each), split.
SPLIT_SWEEP = {
    "cooperative-256x160-c1x2": host.Variant(
        "sm90",
        "sm_90a",
        config=dataclasses.replace(
            choosing.entry("cooperative-256x160-c1x2").variant_config(), split_k=0
        ),
    ),
}


@pytest.mark.parametrize("name", SPLIT)
def test_split_k_kernels_compile_to_the_fixup(compiled, name):
    _assert_fixup(compiled, name, SPLIT[name])


@pytest.mark.sweep
@pytest.mark.parametrize("name", SPLIT_SWEEP)
def test_the_largest_split_tile_compiles_to_the_fixup(compiled, name):
    _assert_fixup(compiled, name, SPLIT_SWEEP[name])


def _assert_fixup(compiled, name, v):
    _assert_fixup_in(compiled(v).report, name, v)


def _assert_fixup_in(r, name, v, traced=False):
    """Spill-free, the hardware path, and the fix-up (split-K's, which stream-K shares): the
    ticket (one atomic add at gpu scope on the tile's arrival counter), the stored count (one
    release reduction, behind a gpu-scope fence), the finisher's acquire loads, one predicated
    fp32 store per accumulator value (a partial that does not finish; and a finisher's own
    part when it is third or later) plus the two counters' resets, and fp32 loads per value:
    one each where the finisher's own part is first or second, two where it is neither, one in
    the loop over the later parts (``split_k._sum_in_part_order``). The loads of a pass are
    issued together: a run of at least half a thread's values with no more than three other
    instructions between two loads (one load per round trip cost ~20 us per 64 values on the
    H100, docs/perf.md entry 45). ``traced``: a traced build's report, whose recorders add
    4-byte stores of their own (its header's count and end anchors) and read the timer."""
    for op, why in SM90_NEEDS.items():
        assert r.sass[op] > 0, f"{name}: no {op} in SASS ({why})"
    assert_clean(r)
    config = v.kernel_config()
    threads = 128 if config.pingpong else 256
    values = config.tile_m * config.tile_n // threads
    ops = collections.Counter(sass.opcodes(r.sass_text))
    assert ops["ATOMG.E.ADD.STRONG.GPU"] == 1, "the ticket"
    assert ops["REDG.E.ADD.STRONG.GPU"] == 1, "the stored count"
    assert ops["MEMBAR.ALL.GPU"] >= 1, "the stored count releases the partial's stores"
    assert ops["LDG.E.STRONG.GPU"] >= 1, "the finisher acquires the stored count"
    assert ops["LDG.E"] == 5 * values
    if traced:
        assert ops["STG.E"] > 2 * values + 2 and "SR_GLOBALTIMER" in r.sass_text
    else:
        assert ops["STG.E"] == 2 * values + 2
    assert _longest_run(r.sass_text, "LDG.E", gap=3) >= values // 2, "loads one at a time"


def _longest_run(sass_text: str, opcode: str, gap: int) -> int:
    """The most ``opcode`` instructions in a row, up to ``gap`` others allowed between two."""
    best = run = others = 0
    for op in sass.opcodes(sass_text):
        if op == opcode:
            run, others = run + 1, 0
            best = max(best, run)
        else:
            others += 1
            if others > gap:
                run = 0
    return best


def _stream_k(**fields):
    from wsgemm.kernels.sm90.config import Sm90Config

    config = Sm90Config(stream_k=True, **fields).compiled()
    return host.Variant("sm90-pingpong" if config.pingpong else "sm90", "sm_90a", config=config)


#: Stream-K (``Sm90Config.stream_k``): the split kernel on the stream-K schedule. The default
#: run compiles the smallest tile once each way (issue #23: <= 20 s of new default compiles;
#: a 128-row tile takes 7-9 s on 2 cores, this one 3-4): untraced over ranges (the ping-pong
#: consumers skip each other's units by their own k counts, and a cluster's two CTAs take
#: separate workspace slots), traced in teams (``stream_k_teams``: only the schedule's integer
#: arithmetic differs). The sweep compiles every tile both ways.
STREAM_K = {
    "pingpong-64x128-c1x2": _stream_k(tile_m=64, tile_n=128, cluster_n=2, schedule="pingpong"),
}
STREAM_K_TRACED = {
    "teams-pingpong-64x128-c1x2": _stream_k(tile_m=64, tile_n=128, cluster_n=2,
                                            schedule="pingpong", stream_k_teams=True),
}  # fmt: skip
STREAM_K_SWEEP = {
    **STREAM_K_TRACED,
    "pingpong-128x128-c2x1": _stream_k(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong"),
    "teams-cooperative-128x256-c2x1": _stream_k(tile_m=128, tile_n=256, cluster_m=2,
                                                stream_k_teams=True),
    "cooperative-128x256-c2x1": _stream_k(tile_m=128, tile_n=256, cluster_m=2),
    "cooperative-256x128-c1x2": _stream_k(tile_m=256, tile_n=128, cluster_n=2),
}  # fmt: skip
STREAM_K_TRACED_SWEEP = {name: v for name, v in {**STREAM_K, **STREAM_K_SWEEP}.items()
                         if name not in STREAM_K_TRACED}  # fmt: skip


@pytest.mark.parametrize("name", STREAM_K)
def test_stream_k_kernels_compile_to_the_fixup(compiled, name):
    _assert_fixup(compiled, name, STREAM_K[name])


@pytest.mark.sweep
@pytest.mark.parametrize("name", STREAM_K_SWEEP)
def test_every_stream_k_tile_compiles_to_the_fixup(compiled, name):
    _assert_fixup(compiled, name, STREAM_K_SWEEP[name])


@functools.cache
def _traced_report(v: host.Variant) -> insp.Report:
    """The traced build of ``v`` (``tracing.plan.compile_traced``), inspected; once per
    session."""
    from wsgemm.tracing import plan

    return insp.inspect_variant(v, plan.compile_traced(v, keep=True))


@pytest.mark.parametrize("name", STREAM_K_TRACED)
def test_traced_stream_k_kernels_compile_to_the_fixup(name):
    """The traced stream-K kernel (``wsgemm trace --stream-k``): spill-free, pipelined, with
    the fix-up as the untraced one has it; the sweep compiles the other tiles."""
    v = STREAM_K_TRACED[name]
    _assert_fixup_in(_traced_report(v), name, v, traced=True)


@pytest.mark.sweep
@pytest.mark.parametrize("name", STREAM_K_TRACED_SWEEP)
def test_every_traced_stream_k_tile_compiles_to_the_fixup(name):
    v = STREAM_K_TRACED_SWEEP[name]
    _assert_fixup_in(_traced_report(v), name, v, traced=True)


def _cluster_split(backend, ways, **fields):
    from wsgemm.kernels.sm90.config import Sm90Config

    return host.Variant(backend, "sm_90a", config=Sm90Config(**fields, cluster_split=ways))


#: name -> (variant, fp32 accumulator values a thread holds)
CLUSTER_SPLIT = {
    "swap-pingpong-64x16x128 x2": (
        _cluster_split("sm90-pingpong", 2, tile_m=64, tile_n=16, tile_k=128,
                       schedule="pingpong", swap_ab=True), 8),
    "pingpong-64x128 x2": (
        _cluster_split("sm90-pingpong", 2, tile_m=64, tile_n=128, schedule="pingpong"), 64),
}  # fmt: skip
CLUSTER_SPLIT_SWEEP = {
    "swap-pingpong-64x16x128 x4": (
        _cluster_split("sm90-pingpong", 4, tile_m=64, tile_n=16, tile_k=128,
                       schedule="pingpong", swap_ab=True), 8),
    "swap-pingpong-64x8x128 x4": (
        _cluster_split("sm90-pingpong", 4, tile_m=64, tile_n=8, tile_k=128,
                       schedule="pingpong", swap_ab=True), 4),
    "cooperative-128x64 x4": (_cluster_split("sm90", 4, tile_m=128, tile_n=64), 32),
}  # fmt: skip


def _assert_cluster_split(compiled, name, v, values):
    """Spill-free, the hardware path, and the cluster split's reduction
    (``kernels/sm90/cluster_split.py``): a sender's partial as 16-byte ``st.async`` stores into
    rank 0's shared memory (one per four values), rank 0's reads of each other rank's slot as
    16-byte shared loads and one fp32 add per value and rank, the cluster barrier after the
    mbarriers' init; and none of the workspace split's traffic: no global atomics, fp32 global
    stores or GPU-scope fences."""
    r = compiled(v).report
    for op, why in SM90_NEEDS.items():
        assert r.sass[op] > 0, f"{name}: no {op} in SASS ({why})"
    ops = collections.Counter(sass.opcodes(r.sass_text))
    ways = v.config.cluster_split
    assert ops["STAS.128"] == values // 4, ops
    assert ops["LDS.128"] == (ways - 1) * values // 4, ops
    assert ops["FADD"] >= (ways - 1) * values, ops
    # rank 0 releases the slots to every sender: one remote arrive per peer
    assert ops["SYNCS.ARRIVE.TRANS64.RED.A1T0"] == ways - 1, ops
    assert ops["UCGABAR_ARV"] >= 1 and ops["UCGABAR_WAIT"] >= 1, "no cluster barrier at init"
    assert not any(op.startswith(("ATOMG", "RED.", "MEMBAR.ALL.GPU", "MEMBAR.SC.GPU"))
                   for op in ops), ops  # fmt: skip
    _assert_reads_done_before_release(r.sass_text, (ways - 1) * values // 4)
    assert_clean(r)


def _assert_reads_done_before_release(text: str, loads: int) -> None:
    """Rank 0 lets the senders reuse their slots with a CTA-scoped remote arrive, which orders
    nothing: it is safe because every slot value is already in a register, consumed by an
    add, before the unit's barrier that precedes the arrive. Checked here for every release:
    exactly ``loads`` 16-byte slot reads between the previous release (or the start) and the
    barrier, each consumed before it, and none between the barrier and the arrive, so that a
    compiler that moved a read past the barrier would fail this test, not race on the GPU."""
    lines = [line.split("*/", 1)[-1].strip(" ;") for line in text.splitlines() if "*/" in line]
    arrives = [i for i, x in enumerate(lines) if x.startswith("SYNCS.ARRIVE.TRANS64.RED")]
    assert arrives, "no release"
    start, releases = 0, 0
    for arrive in arrives:
        barriers = [i for i in range(start, arrive) if lines[i].startswith("BAR.SYNC")]
        if not barriers:  # a second arrive of the same release (another peer)
            assert not any(lines[i].startswith("LDS.128") for i in range(start, arrive))
            start = arrive
            continue
        barrier = barriers[-1]
        reads = [i for i in range(start, barrier) if lines[i].startswith("LDS.128")]
        assert len(reads) == loads, f"{len(reads)} slot reads before release {releases}"
        late = [i for i in range(barrier, arrive) if lines[i].startswith("LDS.128")]
        assert not late, f"slot reads after the barrier of release {releases}: {late}"
        _assert_consumed(lines, reads, barrier)
        releases += 1
        start = arrive


def _assert_consumed(lines: list[str], reads: list[int], barrier: int) -> None:
    for i in reads:
        first = int(lines[i].split()[1].strip(",")[1:])
        for reg in range(first, first + 4):
            assert any(
                lines[j].startswith("FADD")
                and f"R{reg}" in [t.strip(",") for t in lines[j].split()[2:]]
                for j in range(i + 1, barrier)
            ), f"R{reg} of {lines[i]!r} is not consumed before the barrier at {barrier}"


@pytest.mark.parametrize("name", CLUSTER_SPLIT)
def test_cluster_split_kernels_compile_to_the_dsmem_reduction(compiled, name):
    _assert_cluster_split(compiled, name, *CLUSTER_SPLIT[name])


@pytest.mark.sweep
@pytest.mark.parametrize("name", CLUSTER_SPLIT_SWEEP)
def test_every_cluster_split_tile_compiles_to_the_dsmem_reduction(compiled, name):
    _assert_cluster_split(compiled, name, *CLUSTER_SPLIT_SWEEP[name])


# ---------------------------------------------------------------------------------------------
# The sweep: every shipped variant (python -m pytest -m sweep)


def _summary(variant: host.Variant) -> tuple[str, int, dict]:
    """(key, spill bytes, SASS opcode counts) of one variant (runs in a worker process)."""
    r = insp.inspect_variant(variant)
    return variant.key(), r.spill_bytes, dict(r.sass)


def _compile_all(variants: list) -> list:
    workers = max(1, min(8, os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(_summary, variants))


@pytest.mark.sweep
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


#: The targets the sm80 family claims (``support.TARGETS``), beyond the representative
#: variants' sm_80: the default run compiles what ``auto`` runs on the newest mma.sync GPUs
#: (sm_120a, RTX 50xx), the sweep every other (backend, target).
SM80_TARGET_DEFAULT = ("sm80", "sm_120a")
SM80_TARGET_SWEEP = [
    (backend, arch)
    for arch in host.BACKENDS["sm80"].archs()
    for backend in SM80
    if (backend, arch) != SM80_TARGET_DEFAULT and arch != REPRESENTATIVE[backend].arch
]


def test_the_sm80_targets_compiled_are_the_ones_the_table_claims():
    for backend in SM80:
        assert host.BACKENDS[backend].archs() == support.archs_from(8)
        compiled_for = {a for b, a in (*SM80_TARGET_SWEEP, SM80_TARGET_DEFAULT) if b == backend}
        assert compiled_for | {REPRESENTATIVE[backend].arch} == set(support.archs_from(8))


def test_sm80_kernel_compiles_for_sm_120a(compiled):
    _assert_sm80_target(compiled, *SM80_TARGET_DEFAULT)


@pytest.mark.sweep
@pytest.mark.parametrize("backend, arch", SM80_TARGET_SWEEP)
def test_sm80_kernels_compile_for_every_arch_of_the_family(compiled, backend, arch):
    _assert_sm80_target(compiled, backend, arch)


def _assert_sm80_target(compiled, backend, arch):
    """The mma.sync path (HMMA, cp.async, ldmatrix), spill-free, on ``arch``; the specialized
    kernel's waits are hardware try-waits from sm_90 on, polls before."""
    v = host.Variant(backend, arch)
    r = compiled(v).report
    assert r.arch == arch and r.sass["HMMA"] > 0 and r.sass["HGMMA"] == 0
    assert ("TRYWAIT" in r.sass_text) == (backend == "sm80" and support.has_mbarrier_try_wait(arch))
    assert_sm80_path(r, v.acc_dtype, v.kernel_config().mma_threads, backend == "sm80")
    assert_clean(r)


#: The fused epilogues (issue #25): the default run compiles none of its own, the residual's
#: variant below (``RESIDUAL``: a column bias and gelu_tanh besides C, on a tile whose threads
#: hold as many accumulators as the cooperative 128x256's) takes these checks too; the sweep
#: compiles every bias mode and activation on both schedules and on the swap-AB decode tile
#: (whose bias runs along the kernel's rows), the shipped cooperative kernel's
#: ``bias_col+gelu_tanh`` (the default run's until the residual's took its checks) among them.
FUSED_SWEEP = [
    host.Variant(backend, "sm_90a", config=config, epilogue=f"{bias}{act}".strip("+") or "none")
    for backend, config in (
        ("sm90", None),
        ("sm90-pingpong", None),
        ("sm90-pingpong", choosing.entry("swap-pingpong-64x32-c1x1").variant_config()),
    )
    for bias in ("", "bias_row+", "bias_col+")
    for act in ("", "relu", "relu2", "gelu", "gelu_tanh", "silu")
    if bias or act
]


def _assert_fused(r: insp.Report, epilogue: str) -> None:
    """A fused epilogue's SASS: clean (no spills), the sm90 path intact, no subroutine CALL
    (an IEEE division or libm call would be one), the bias read from global memory as 16-bit
    loads, and the logistic activations on the special-function unit."""
    assert_clean(r)
    ops = set(sass.opcodes(r.sass_text))
    for op, why in SM90_NEEDS.items():
        assert any(o.startswith(op) for o in ops), f"no {op}: {why}"
    assert not any(o.startswith("CALL") for o in ops), f"{epilogue}: a CALL in the kernel"
    if "bias_" in epilogue:
        assert "LDG.E.U16" in ops, f"{epilogue}: the bias is not read"
    # the cost model prices these activations' MUFU work (``cost.EPILOGUE_MUFU``: one EX2 and
    # one RCP an element) where no mainloop hides it
    if choosing.cost.EPILOGUE_MUFU[Epilogue.parse(epilogue).activation]:
        assert {"MUFU.EX2", "MUFU.RCP"} <= ops, f"{epilogue}: not on the SFU"


@pytest.mark.sweep
@pytest.mark.parametrize("variant", FUSED_SWEEP, ids=lambda v: f"{v.backend}-{v.epilogue}")
def test_every_fused_epilogue_compiles_without_calls_or_spills(compiled, variant):
    _assert_fused(compiled(variant).report, variant.epilogue)


#: The residual and alpha (``kernels/sm90/residual.py``) on the 128x128 ping-pong tile, whose
#: 128 accumulators a thread left least room (the first build, loading C per element, spilled
#: there), with a column bias and gelu_tanh: the default run's one compile of a fused epilogue
#: (``_assert_residual`` makes ``_assert_fused``'s checks first); the sweep adds the
#: cooperative tile (C's first loads under the mainloop), swap-AB (C M-major), a split variant
#: and the 8-wide tile (one subtile, one buffer).
RESIDUAL = host.Variant("sm90-pingpong", "sm_90a", epilogue="scale+residual+bias_col+gelu_tanh")
RESIDUAL_SWEEP = [
    host.Variant("sm90", "sm_90a", epilogue="residual"),
    host.Variant("sm90", "sm_90a", config=choosing.entry("swap-cooperative-128x160-c2x1")
                 .variant_config(), epilogue="scale+residual"),
    host.Variant("sm90-pingpong", "sm_90a", config=choosing.entry("swap-pingpong-64x16x128-c1x1")
                 .variant_config(split=True), epilogue="residual+bias_row"),
    host.Variant("sm90-pingpong", "sm_90a", config=choosing.entry("swap-pingpong-64x8x128-c1x1")
                 .variant_config(), epilogue="scale+residual"),
]  # fmt: skip


def _assert_residual(r: insp.Report, variant: host.Variant) -> None:
    """C's subtiles come by TMA into the epilogue buffers: one TMA load and one expect-tx
    arrival per subtile of a tile (beside the mainloop's one arrival), the load's descriptor
    prefetched with the others, C read back from shared memory per accumulator and never
    through 16-byte global loads; spill-free, no CALL."""
    _assert_fused(r, variant.epilogue)
    ops = sass.opcodes(r.sass_text)
    subtiles = variant.kernel_config().num_epi_subtiles
    assert ops.count("SYNCS.ARRIVE.TRANS64") == 1 + subtiles, sorted(set(ops))
    loads = sum(op.startswith("UTMALDG") for op in ops)
    assert loads >= 2 + subtiles, f"{loads} TMA loads for A, B and {subtiles} C subtiles"
    assert ops.count("UTMACCTL.PF") == 4, "the descriptors of A, B, the store and C's load"
    assert "LDS.U16" in ops and "LDG.E.128" not in ops, sorted(set(ops))


def test_the_residual_compiles_to_tma_loads_without_spills(compiled):
    _assert_residual(compiled(RESIDUAL).report, RESIDUAL)


@pytest.mark.sweep
@pytest.mark.parametrize("variant", RESIDUAL_SWEEP, ids=lambda v: f"{v.backend}-{v.epilogue}")
def test_every_residual_variant_compiles_to_tma_loads_without_spills(compiled, variant):
    _assert_residual(compiled(variant).report, variant)


#: The gated unit's gradient (``kernels/sm90/dgated.py``) on the shipped cooperative tile (the
#: gated kernel's above 256 rows), its pre-activation loaded by the producer warpgroup's loader
#: warp, in bf16, whose WGMMAs ptxas serialized while the store warp loaded from the subtile
#: loop (C7520, docs/perf.md entry 100): the default run's first dgated compile (its fp16
#: twin, the same code, under the sweep: issue #25's <= 20 s of new default compiles); the
#: sweep adds the other activations on both row tiles.
DGATED = host.Variant("sm90", "sm_90a", epilogue="dgated+silu")
DGATED_LOADER = host.Variant("sm90", "sm_90a", ab_dtype="bfloat16", c_dtype="bfloat16",
                             epilogue="dgated+silu")  # fmt: skip
#: The ping-pong tile, its whole tile's pre-activation buffered, in bf16 (serialized the same
#: way with its loads in the subtile loop): the default run's second.
DGATED_WHOLE = host.Variant("sm90-pingpong", "sm_90a", ab_dtype="bfloat16", c_dtype="bfloat16",
                            epilogue="dgated+silu")  # fmt: skip
DGATED_SWEEP = [
    DGATED,
    *(host.Variant(backend, "sm_90a", ab_dtype=ab, c_dtype=ab, epilogue=f"dgated+{act}")
    for backend in ("sm90", "sm90-pingpong")
    for act, ab in (
        ("gelu_tanh", "float16"),
        ("gelu", "bfloat16"),
        ("relu2", "float16"),
        ("relu", "bfloat16"),
        ("silu", "bfloat16"),
    )),
]  # fmt: skip


def _sass(*ops: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/    {op} ;" for i, op in enumerate(ops))


def test_waited_wgmmas_tells_a_serialized_mainloop_from_a_pipelined_one():
    hgmma = "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24, gsb0"
    pipelined = _sass("WARPGROUP.ARRIVE", *[hgmma] * 4, "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                      "SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4], RZ",
                      "WARPGROUP.ARRIVE", *[hgmma] * 4, "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                      "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100")  # fmt: skip
    assert sass.waited_wgmmas(pipelined) == (0, 8)
    serialized = _sass(*[op for _ in range(4) for op in
                         ("WARPGROUP.ARRIVE", hgmma, "WARPGROUP.DEPBAR.LE gsb0, 0x0")])  # fmt: skip
    assert sass.waited_wgmmas(serialized) == (3, 4)  # the last one's wait ends the k-tile
    report = insp.Report("k", "sm_90a", {}, {}, 168, 0, 0, {}, sass_text=serialized)
    with pytest.raises(AssertionError, match="3 of 4 HGMMAs"):
        assert_wgmma_pipelined(report)


def _assert_dgated(r: insp.Report, variant: host.Variant) -> None:
    """Per product subtile two C loads by TMA (the gate's and the up half's pre-activation),
    each with its expect-tx arrival, and two TMA stores (dgate, dup); no L2 prefetch (the
    one asked as the mainloop started is deleted: docs/perf.md entry 97); C read back from
    shared memory, never by 16-byte global loads; spill-free, its WGMMAs pipelined, no CALL
    (``_assert_fused``)."""
    _assert_fused(r, variant.epilogue)
    ops = sass.opcodes(r.sass_text)
    subtiles = variant.kernel_config().num_epi_subtiles
    assert ops.count("SYNCS.ARRIVE.TRANS64") == 1 + 2 * subtiles, sorted(set(ops))
    stores = sum(op.startswith("UTMASTG") for op in ops)
    assert stores == 2 * subtiles, f"{stores} TMA stores for {subtiles} product subtiles"
    ahead = sum(op.startswith("UTMAPF.L2") for op in ops)
    assert ahead == 0, f"{ahead} L2 prefetches"
    assert ops.count("UTMACCTL.PF") == 4, "the descriptors of A, B, the store and C's load"
    assert "LDS.U16" in ops and "LDG.E.128" not in ops, sorted(set(ops))


def test_the_loader_warp_dgated_epilogue_pipelines_its_wgmmas(compiled):
    """bf16 on the cooperative tile: paired TMA loads and stores, pipelined with the loader warp
    loading (``assert_clean``, through ``_assert_dgated``: one loop of 16 in the loader)."""
    _assert_dgated(compiled(DGATED_LOADER).report, DGATED_LOADER)


def test_the_whole_tile_dgated_epilogue_pipelines_its_wgmmas(compiled):
    """bf16 on the ping-pong tile: pipelined with all its loads at the epilogue's start
    (``_assert_dgated`` asserts it through ``assert_clean``)."""
    _assert_dgated(compiled(DGATED_WHOLE).report, DGATED_WHOLE)


@pytest.mark.sweep
@pytest.mark.parametrize(
    "variant",
    DGATED_SWEEP,
    ids=lambda v: f"{v.backend}-{v.epilogue}-{v.ab_dtype}",
)
def test_every_dgated_variant_compiles_to_paired_tma_loads_and_stores(compiled, variant):
    _assert_dgated(compiled(variant).report, variant)


#: An activation's gradient at its saved pre-activation (``Epilogue.dact``: a plain MLP's
#: ``dh · act'(pre)`` in the GEMM that computes ``dh``) on the shipped cooperative tile: the
#: default run's one dact compile; the sweep adds the ping-pong tile, the other activations
#: and two swap-AB tiles.
DACT = host.Variant("sm90", "sm_90a", epilogue="dact+gelu_tanh")
DACT_SWEEP = [
    host.Variant(backend, "sm_90a", ab_dtype=ab, c_dtype=ab, epilogue=f"dact+{act}")
    for backend in ("sm90", "sm90-pingpong")
    for act, ab in (
        ("gelu_tanh", "bfloat16"),
        ("gelu", "float16"),
        ("relu2", "bfloat16"),
        ("relu", "float16"),
        ("silu", "float16"),
    )  # fmt: skip
] + [
    # swap-AB (the result and the pre-activation M-major), a wide and the 8-wide decode tile
    host.Variant(backend, "sm_90a", config=choosing.entry(name).variant_config(),
                 epilogue="dact+gelu")
    for backend, name in (("sm90", "swap-cooperative-128x160-c2x1"),
                          ("sm90-pingpong", "swap-pingpong-64x8x128-c1x1"))
]  # fmt: skip


def _assert_dact(r: insp.Report, variant: host.Variant) -> None:
    """The residual's machinery with another combine: per output subtile one C load by TMA
    (the pre-activation's subtile) with its expect-tx arrival and a TMA store; C read back
    from shared memory, never by 16-byte global loads; spill-free, no CALL, the logistic
    forms on the SFU (``_assert_residual``'s checks, ``_assert_fused``'s first)."""
    _assert_residual(r, variant)
    ops = sass.opcodes(r.sass_text)
    subtiles = variant.kernel_config().num_epi_subtiles
    stores = sum(op.startswith("UTMASTG") for op in ops)
    # (a swap-AB tile's subtile loop is compiled twice, its plain epilogue's too)
    assert stores and stores % subtiles == 0, f"{stores} TMA stores for {subtiles} subtiles"


def test_the_dact_epilogue_compiles_to_a_tma_load_a_subtile(compiled):
    _assert_dact(compiled(DACT).report, DACT)


@pytest.mark.sweep
@pytest.mark.parametrize("variant", DACT_SWEEP, ids=lambda v: f"{v.backend}-{v.epilogue}")
def test_every_dact_variant_compiles_to_a_tma_load_a_subtile(compiled, variant):
    _assert_dact(compiled(variant).report, variant)


#: The gated kernel that also stores its product (``Epilogue.preact``, the fused training
#: step's forward) on the ping-pong tile with a bias: the default run's one preact compile.
PREACT = host.Variant("sm90-pingpong", "sm_90a", epilogue="bias_col+gated+preact+silu")
PREACT_SWEEP = [
    host.Variant("sm90", "sm_90a", epilogue="gated+preact+gelu_tanh"),
    # a plain MLP's up projection storing its pre-activation (``mlp.mlp``'s forward)
    host.Variant("sm90", "sm_90a", epilogue="bias_col+preact+gelu_tanh"),
    host.Variant("sm90", "sm_90a", ab_dtype="bfloat16", c_dtype="bfloat16",
                 config=choosing.entry("cooperative-128x192-c2x1").variant_config(),
                 epilogue="preact+gelu"),
    host.Variant("sm90", "sm_90a", ab_dtype="bfloat16", c_dtype="bfloat16",
                 epilogue="bias_col+gated+preact+silu"),
]  # fmt: skip


def test_the_preact_output_compiles_to_three_stores_a_subtile(compiled):
    _assert_preact(compiled(PREACT).report, PREACT)


@pytest.mark.sweep
@pytest.mark.parametrize("variant", PREACT_SWEEP, ids=lambda v: f"{v.backend}-{v.epilogue}")
def test_every_preact_variant_compiles_to_three_stores_a_subtile(compiled, variant):
    _assert_preact(compiled(variant).report, variant)


def _assert_preact(r: insp.Report, variant: host.Variant) -> None:
    """Per output subtile three TMA stores (h, then the product's gate and up halves), or two
    for a plain product (its pre-activation, then h), the pre-activation through a second
    store descriptor (prefetched with A's, B's and the output's); no C load; spill-free, no
    CALL."""
    _assert_fused(r, variant.epilogue)
    ops = sass.opcodes(r.sass_text)
    gated = Epilogue.parse(variant.epilogue).gated
    # (a gated output is half the product's width)
    out_subtiles = variant.kernel_config().num_epi_subtiles // (2 if gated else 1)
    stores = (3 if gated else 2) * out_subtiles
    assert sum(op.startswith("UTMASTG") for op in ops) == stores
    assert ops.count("UTMACCTL.PF") == 4, "A, B and the two stores"
    assert ops.count("SYNCS.ARRIVE.TRANS64") == 1, "no C load: only the mainloop's arrival"


def test_the_bias_launcher_passes_the_unsplit_launch_defaults():
    """``host.workspace.UNSPLIT_LAUNCH`` is the sm90 launch tail before the fused epilogue's,
    ``NO_EPILOGUE_LAUNCH`` that tail's defaults: the kernel class's own (kept in the host, which
    does not import the kernel class to call)."""
    from wsgemm.host.workspace import NO_EPILOGUE_LAUNCH, UNSPLIT_LAUNCH

    defaults = host.BACKENDS["sm90"].kernel_class().launch_defaults()
    assert (*UNSPLIT_LAUNCH, *NO_EPILOGUE_LAUNCH) == defaults
