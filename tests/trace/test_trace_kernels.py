"""The traced kernel variants (issue #13), without a GPU.

* traced builds compile spill-free and read the timer their arch uses;
* an untraced build is the kernel with its hooks compiled out: the same SASS opcode histogram
  as the kernel source with every ``trace.*`` hook statement deleted (compiled from copies of
  every kernel module that holds hooks, ``_without_hooks``), no timer reads and no trace stores;
* the untraced launch signature is today's, the traced one has the buffer last;
* the sm90 lanes loops (``kernels/sm90/traced.py``): their offsets and where their state comes
  from;
* the host's buffer planning and the recording checker, on synthetic rows.

The default run compiles one traced kernel per family (sm90 cooperative, sm80 specialized on
sm_80) and one hooks-deleted kernel (sm90); the rest is marked ``sweep``.
"""

import ast
import collections
import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch
from sass_checks import assert_clean

import wsgemm.tracing
from wsgemm import host, sass, support
from wsgemm import inspection as insp
from wsgemm.kernels.common.address import SIZE_AND_STRIDE_NAMES
from wsgemm.trace_format import (
    EVENT_WORDS,
    HEADER_FIELDS,
    HEADER_WORDS,
    Event,
    RawTrace,
    Role,
    Timer,
)
from wsgemm.tracing import plan as trace_plan

TIMER_READS = re.compile(r"SR_GLOBALTIMER|SR_CLOCK")
TRACED = {
    "sm90": ("sm_90a", "SR_GLOBALTIMER"),
    "sm80": ("sm_80", "SR_CLOCK"),
}
TRACED_SWEEP = {
    "sm90-pingpong": ("sm_90a", "SR_GLOBALTIMER"),
    "sm80-multistage": ("sm_80", "SR_CLOCK"),
}
# The module of each backend's kernel class; the modules it imports that hold hooks are found
# from it (``_hooked_modules``).
KERNEL_MODULES = {
    "sm90": "wsgemm.kernels.sm90.kernel",
    "sm90-pingpong": "wsgemm.kernels.sm90.kernel",
    "sm80": "wsgemm.kernels.sm80.specialized",
    "sm80-multistage": "wsgemm.kernels.sm80.multistage",
}


@pytest.fixture(scope="module")
def traced_report():
    done = {}

    def get(variant):
        if variant not in done:
            fn = trace_plan.compile_traced(variant, keep=True)
            done[variant] = (fn, insp.inspect_variant(variant, fn))
        return done[variant]

    return get


def _check_traced(report, backend, arch, timer_register):
    r = report
    assert_clean(r)
    assert timer_register in r.sass_text, f"{backend}: the traced kernel reads no {timer_register}"
    # two 16-byte stores per event
    assert "STG.E.128" in r.sass_text
    if backend.startswith("sm90"):
        # the traced producer's own budget (TRACED_PRODUCER_REGISTERS), the consumers' 224:
        # 128 x (48 + 2 x 224) fits the CTA's pool of 384 x 168 (232 would not: it hung)
        assert "USETMAXREG.DEALLOC.CTAPOOL 0x30 ;" in r.sass_text
        assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL UP\d, 0xe0 ;", r.sass_text)


@pytest.mark.parametrize("backend", TRACED)
def test_traced_variant_compiles_spill_free(traced_report, backend):
    arch, timer = TRACED[backend]
    _, r = traced_report(host.Variant(backend, arch))
    _check_traced(r, backend, arch, timer)


@pytest.mark.sweep
@pytest.mark.parametrize(
    "backend, arch, timer",
    [(b, *v) for b, v in TRACED_SWEEP.items()]
    + [("sm80", "sm_90a", "SR_GLOBALTIMER"), ("sm80-multistage", "sm_90a", "SR_GLOBALTIMER")],
)
def test_traced_variant_compiles_spill_free_sweep(traced_report, backend, arch, timer):
    _, r = traced_report(host.Variant(backend, arch))
    _check_traced(r, backend, arch, timer)


# ---------------------------------------------------------------------------------------------
# The untraced kernel is the kernel with its hooks compiled out


class _DeleteHooks(ast.NodeTransformer):
    """Delete every hook statement: ``trace.f(...)`` calls; ``x = trace.f(...)`` becomes
    ``x = None`` (what the hook returns untraced)."""

    @staticmethod
    def _is_hook(node) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "trace"
        )

    def visit_Expr(self, node):
        return ast.Pass() if self._is_hook(node.value) else node

    def visit_Assign(self, node):
        if self._is_hook(node.value):
            node.value = ast.Constant(None)
        return node


def _source_tree(module_name: str) -> ast.Module:
    with open(importlib.util.find_spec(module_name).origin) as f:
        return ast.parse(f.read())


def _hook_count(tree: ast.Module) -> int:
    return sum(
        isinstance(n, ast.Expr | ast.Assign) and _DeleteHooks._is_hook(n.value)
        for n in ast.walk(tree)
    )


def _kernel_imports(tree: ast.Module) -> set[str]:
    """The ``wsgemm.kernels`` modules a module imports (``from package import module``
    included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {
        name
        for name in found
        if name.startswith("wsgemm.kernels.") and _find_spec_or_none(name) is not None
    }


def _find_spec_or_none(name):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a name imported from a module, not a module
        return None


def _hooked_modules(root: str) -> list[str]:
    """``root`` and the ``wsgemm.kernels`` modules it imports, directly or through each other,
    that hold hook statements: every module whose hooks the kernel's code may run."""
    seen, todo, hooked = set(), [root], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = _source_tree(name)
        if _hook_count(tree):
            hooked.append(name)
        todo.extend(sorted(_kernel_imports(tree)))
    return sorted(hooked)


class _RedirectImports(ast.NodeTransformer):
    """Point imports of the hooked modules at their hook-free copies (``renamed``: module name
    -> the copy's top-level name)."""

    def __init__(self, renamed: dict[str, str]):
        self.renamed = renamed

    def visit_ImportFrom(self, node):
        if node.level or not node.module:
            return node
        if node.module in self.renamed:
            node.module = self.renamed[node.module]
            return node
        # ``from package import module``: the copied modules become plain imports
        copied = [a for a in node.names if f"{node.module}.{a.name}" in self.renamed]
        if not copied:
            return node
        kept = [a for a in node.names if a not in copied]
        out = [ast.ImportFrom(node.module, kept, 0)] if kept else []
        for a in copied:
            copy = self.renamed[f"{node.module}.{a.name}"]
            out.append(ast.Import([ast.alias(copy, a.asname or a.name)]))
        return out

    def visit_Import(self, node):
        for a in node.names:
            if a.name in self.renamed:
                assert a.asname, f"import {a.name} without 'as': not redirected"
                a.name = self.renamed[a.name]
        return node


@contextlib.contextmanager
def _without_hooks(root: str, folder: str):
    """Module ``root`` imported from copies, written to ``folder``, of it and of every kernel
    module it imports that holds hooks, with their hook statements deleted and their imports of
    each other redirected to the copies (the DSL reads its functions' source from real files).
    Yields (the module, the copied module names, the hook statements deleted)."""
    hooked = _hooked_modules(root)
    assert root in hooked, f"{root} holds no hook statements"
    renamed = {name: "_without_hooks_" + name.replace(".", "_") for name in hooked}
    deleted = 0
    for name in hooked:
        tree = _source_tree(name)
        deleted += _hook_count(tree)
        tree = _RedirectImports(renamed).visit(_DeleteHooks().visit(tree))
        assert _hook_count(tree) == 0
        with open(os.path.join(folder, renamed[name] + ".py"), "w") as f:
            f.write(ast.unparse(ast.fix_missing_locations(tree)))
    importlib.invalidate_caches()
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module(renamed[root]), hooked, deleted
    finally:
        sys.path.remove(folder)
        for copy in renamed.values():
            sys.modules.pop(copy, None)


def _hooks_compiled_out(variant):
    """The report of ``variant`` built from its kernel modules without hook statements."""
    backend = host.BACKENDS[variant.backend]
    with (
        tempfile.TemporaryDirectory() as folder,
        _without_hooks(KERNEL_MODULES[variant.backend], folder) as (module, hooked, deleted),
    ):
        assert deleted > 10, f"{variant.backend}: only {deleted} hook statements in {hooked}"
        dtypes = (variant.ab_dtype, variant.c_dtype, variant.acc_dtype)
        kernel = getattr(module, backend.cls)(
            variant.kernel_config(), *map(support.cutlass_dtype, dtypes), gpu_arch=variant.arch
        )
        args = host.fake_arguments(variant)
        fn = host.compiling.compile.compile_entry(kernel, args, variant.arch, keep=True)
        return insp.inspect_variant(variant, fn)


def _grouped_tiles():
    """The ragged-M grouped kernel's tiles ``grouped_mm`` runs (``host.grouped_config``: by the
    mean rows a group), as traced variants."""
    out = []
    for mean in (32, 200, 4000):
        backend, config = host.grouped_config("auto", 64 * mean, 64)
        out.append(host.Variant(backend, "sm_90a", config=config, grouping="m"))
    return out


GROUPED_TILES = _grouped_tiles()


@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=() if i == 2 else pytest.mark.sweep)
     for i, v in enumerate(GROUPED_TILES)],
    ids=lambda v: f"{v.backend}-{(v.config or host.BACKENDS[v.backend].config()).tile_m}",
)  # fmt: skip
def test_a_traced_grouped_kernel_compiles_spill_free(traced_report, variant):
    """The ragged-M grouped kernel (``grouped_mm``'s 2D x 3D form) traced, on each tile
    ``grouped_mm`` runs (the default run compiles the cooperative one): its tiles' fetches
    carry (tile in its group, n, group), so a recording says which tile ran which group; its
    epilogue is the grouped one (predicated stores past a group's end), whose span the role
    records (``wsgemm.tracing.trace_grouped`` records one)."""
    _, r = traced_report(variant)
    _check_traced(r, variant.backend, "sm_90a", "SR_GLOBALTIMER")


@pytest.mark.parametrize(
    "backend", ["sm90", pytest.param("sm90-pingpong", marks=pytest.mark.sweep)]
)
def test_a_traced_dgated_kernel_compiles_spill_free(traced_report, compiled, backend):
    """The dh GEMM with the gated unit's gradient in its epilogue (``Epilogue.dgated``) traced
    (``wsgemm.tracing.trace_gated_grad``), on the cooperative tile the gated kernels run above
    256 rows (the ping-pong one under -m sweep): its epilogue records its span, and it issues
    every TMA load the untraced kernel does (a review found the traced mainloop skipping the
    cooperative tile's first pre-activation loads, which the epilogue would wait for
    forever)."""
    # (B K-major; the cooperative tile's pre-activation loaded by its loader warp, the
    # ping-pong tile's whole tile at its epilogue's start: ``kernels/sm90/dgated.py``.) In
    # bf16, as tests/gpu/test_gpu_trace.py traces it: the untraced kernel is then
    # test_compile_sass.py's DGATED_LOADER (DGATED_WHOLE under -m sweep), which the session's
    # ``compiled`` fixture compiled already; an fp16 twin cost a compile of its own (~5 s).
    variant = host.Variant(backend, "sm_90a", ab_dtype="bfloat16", c_dtype="bfloat16",
                           epilogue="dgated+silu")  # fmt: skip
    _, r = traced_report(variant)
    _check_traced(r, backend, "sm_90a", "SR_GLOBALTIMER")
    assert r.sass["UTMALDG"] == compiled(variant).report.sass["UTMALDG"]


@pytest.mark.parametrize("seed", range(20))
def test_a_grouped_recording_s_units_are_the_kernel_s_schedule(seed, python_min_max):
    """``record.grouped_units`` (the tile set the checks require, the units the buffer is
    sized by) against the kernel's own schedule replayed on the host
    (``grouped_scheduler.ragged_unit_order``): random ends (unsorted, past the rows, empty
    groups), clusters along M and along N."""
    import random

    from wsgemm.kernels.common.grouped_scheduler import ragged_unit_order
    from wsgemm.kernels.sm90.config import Sm90Config
    from wsgemm.tracing.record import grouped_units

    rng = random.Random(seed)
    cm, cn = rng.choice([(1, 1), (2, 1), (1, 2)])
    config = Sm90Config(tile_m=rng.choice([64, 128]), tile_n=128, cluster_m=cm, cluster_n=cn,
                        schedule="pingpong")  # fmt: skip
    rows, n, groups = rng.randint(1, 3000), rng.randint(1, 700), rng.randint(1, 12)
    ends = sorted(rng.randint(0, rows + 50) for _ in range(groups))
    if seed % 4 == 0:
        rng.shuffle(ends)  # the kernel clamps an end below the one before it
    group_tiles, tiles_n, work, bound = grouped_units(ends, rows, n, config)
    num_ctas = 132
    order = ragged_unit_order(ends, rows, tiles_n, config.tile_m, 8, num_ctas, (cm, cn))
    units = [u for cta in order for u in cta if u.is_valid]
    assert len(units) == work * cm * cn  # every CTA of a cluster runs its cluster's unit
    assert len(order) == min(bound, num_ctas // (cm * cn)) * cm * cn
    seen = {(int(u.m), int(u.n), int(u.l)) for u in units}
    want = {(m, j, g) for g, t in enumerate(group_tiles) for m in range(t) for j in range(tiles_n)}
    assert want <= seen
    p = trace_plan.plan_trace("sm90-pingpong", config, (rows, n, 64, 1), num_ctas,
                              units=(max(work, 1), bound))  # fmt: skip
    assert p.ctas_launched == len(order)
    per_cta = max(sum(1 for u in cta if u.is_valid) for cta in order)
    assert per_cta <= p.tiles_per_cta


def test_a_ragged_k_kernel_is_not_traced():
    import cutlass

    from wsgemm.kernels.sm90.config import Sm90Config
    from wsgemm.kernels.sm90.grouped import Sm90KGroupedGemm

    f16, f32 = cutlass.Float16, cutlass.Float32
    with pytest.raises(ValueError, match="tracing with a ragged K"):
        Sm90KGroupedGemm(Sm90Config(), f16, f16, f32, trace=True)


def test_every_sm90_module_with_hooks_is_copied_without_them():
    """The hooks-deleted build covers each sm90 module that holds hooks: the kernel's own and
    the traced loops' (split-K's fix-up holds none)."""
    hooked = _hooked_modules(KERNEL_MODULES["sm90"])
    assert {"wsgemm.kernels.sm90.kernel", "wsgemm.kernels.sm90.traced"} <= set(hooked)
    family = os.path.dirname(importlib.util.find_spec("wsgemm.kernels.sm90").origin)
    for file in sorted(os.listdir(family)):
        name = "wsgemm.kernels.sm90." + file.removesuffix(".py")
        if file.endswith(".py") and name not in hooked:
            assert _hook_count(_source_tree(name)) == 0, f"{name} holds hooks the test misses"


def _check_untraced_equals_hooks_out(compiled, backend, arch):
    variant = host.Variant(backend, arch)
    untraced = compiled(variant).report
    without = _hooks_compiled_out(variant)
    assert not TIMER_READS.search(untraced.sass_text), "the untraced kernel reads a timer"
    mine = collections.Counter(sass.opcodes(untraced.sass_text))
    theirs = collections.Counter(sass.opcodes(without.sass_text))
    assert mine == theirs, (
        f"{backend}: untraced SASS differs from the hooks-deleted build: "
        f"{dict((mine - theirs) + (theirs - mine))}"
    )
    # No trace stores: the same global stores as the kernel without hooks (the sm90 epilogue
    # stores with TMA only).
    assert untraced.sass["STG"] == without.sass["STG"]
    if backend.startswith("sm90"):
        assert untraced.sass["STG"] == 0


def test_untraced_kernel_is_the_kernel_without_hooks(compiled):
    _check_untraced_equals_hooks_out(compiled, "sm90", "sm_90a")


@pytest.mark.sweep
@pytest.mark.parametrize(
    "backend, arch",
    [("sm90-pingpong", "sm_90a"), ("sm80", "sm_80"), ("sm80-multistage", "sm_80")],
)
def test_untraced_kernel_is_the_kernel_without_hooks_sweep(compiled, backend, arch):
    _check_untraced_equals_hooks_out(compiled, backend, arch)


def _exported_signature(fn) -> str:
    """The parameter list a compiled function, exported and loaded back, says it expects."""
    import cutlass.cute as cute

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "k.o")
        fn.export_to_c(path, function_name="k")
        raw = cute.runtime.load_module(path, enable_tvm_ffi=True).k
        with pytest.raises(TypeError) as err:
            raw()
    return str(err.value)


@pytest.mark.parametrize("backend", host.shipped_backends())
def test_call_signature_is_todays(backend):
    """The three host entries (``kernels.base.GemmKernel``): the contract's arguments, then the
    family's launch extras as a ``*launch`` tail (sm90: split-K's count and buffers, and the
    fused epilogue's bias, alpha, beta and residual C)."""
    cls = host.BACKENDS[backend].kernel_class()
    base = ["self", "mA", "mB", "mC", "max_active_clusters", "stream", "raster_group", "launch"]
    assert list(inspect.signature(cls.__call__).parameters) == base
    traced = list(inspect.signature(cls.traced).parameters)
    assert traced == [*base[:-1], "trace_buffer", "launch"]
    # the entry the host compiles: the operands as addresses, sizes and strides, then the same
    # launch arguments (kernels/common/address.py)
    by_address = inspect.signature(cls.by_address).parameters
    operands = ["majors", "token", "a", "b", "c", *SIZE_AND_STRIDE_NAMES]
    assert list(by_address) == ["self", *operands, *base[4:]]
    assert by_address["launch"].kind is inspect.Parameter.VAR_POSITIONAL
    split = ["split_count", "workspace", "semaphores", "bias", "alpha", "beta", "residual"]
    extras = split if host.BACKENDS[backend].family == "sm90" else []
    assert [name for name, _ in cls.LAUNCH_EXTRAS] == extras
    # what a kernel loaded from disk (or compiled here) is wrapped with: every run-time
    # argument by name, the trailing ones with defaults
    names, defaults = host.compiling.compile.launch_signature(host.Variant(backend, cls.arch))
    assert list(names) == [*operands[1:], "max_active_clusters", "raster_group", *extras]
    assert defaults == ((0, 1, *(None,) * 6) if extras else (0,))


def test_compiled_launch_signatures(compiled, traced_report):
    """The untraced kernel takes the address entry's run-time arguments; the traced one the
    tensor entry's and the buffer (the stream is the environment's in both)."""
    variant = host.Variant("sm90", "sm_90a")
    untraced = _exported_signature(compiled(variant).fn)
    # token, 3 addresses, 10 sizes and strides, 2 launch values, then split-K's three (an int
    # and two Nones when unsplit: kernels/__init__.py) and the fused epilogue's bias, alpha,
    # beta and residual C (None without)
    assert "Expects 23 parameters" in untraced and "trace_buffer" not in untraced
    traced = _exported_signature(traced_report(variant)[0])
    assert "Expects 13 parameters" in traced and "trace_buffer: Tensor" in traced


def test_a_traced_kernel_refuses_the_untraced_entry():
    variant = host.Variant("sm80", "sm_80")
    kernel = host.make_kernel(variant, trace=True)
    with pytest.raises(ValueError, match="launches through traced"):
        host.compiling.compile.compile_entry(kernel, host.fake_arguments(variant), "sm_80")


# ---------------------------------------------------------------------------------------------
# The sm90 lanes loops (kernels/sm90/traced.py)


@pytest.mark.parametrize("k_count", [1, 2, 31, 32, 33, 64, 65])
def test_lanes_offsets_follow_the_row_order(k_count):
    """Iteration j's events follow iteration j - 1's: the consumer's 3 + 6 (k - 1) staged
    events, the producer's 3 per k-tile, the epilogue's 2 per subtile, without gaps; the last
    flush writes a window of at most ``LANES`` items that starts on a multiple of it."""
    from wsgemm.kernels.common import trace

    issued = [trace.mma_issued_offset(j) for j in range(k_count)]
    released = [trace.mma_released_offset(j) for j in range(1, k_count)]
    slots = sorted(o + i for o in issued + released for i in range(3))
    assert slots == list(range(trace.mma_staged_events(k_count)))
    last = trace.last_window(k_count)
    assert last % trace.LANES == 0 and 0 < k_count - last <= trace.LANES
    assert trace.load_offset(k_count) == 3 * k_count
    assert [trace.store_wait_offset(e) for e in range(4)] == [0, 2, 4, 6]


@pytest.mark.parametrize("method", ["_load_lanes", "_mma_lanes", "_epilogue_lanes"])
def test_lanes_loops_write_from_the_writer_lanes_state(method):
    """Each lanes loop takes its recorder state through ``trace.warp_hot`` (the writer lane's
    registers, shuffled), never ``trace.hot`` (each lane's own read of the shared slot: on the
    H200 the other lanes read a count one or two events old, docs/perf.md entry 24)."""
    from wsgemm.kernels.sm90.kernel import Sm90Gemm

    source = textwrap.dedent(inspect.getsource(getattr(Sm90Gemm, method)))
    calls = {
        n.func.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    assert "warp_hot" in calls and "hot" not in calls


# ---------------------------------------------------------------------------------------------
# Host side: the buffer plan and the checker


def test_plan_traces_every_sm90_cta_with_room_for_every_event():
    config = host.BACKENDS["sm90"].config()
    p = trace_plan.plan_trace("sm90", config, (4096, 4096, 4096, 1), 132)
    # 32 x 16 tiles in 2x1 clusters: 256 cluster tiles over 66 clusters
    assert (p.ctas_launched, p.ctas_traced, p.recorders_per_cta) == (132, 132, 3)
    assert p.tiles_per_cta == 4 and p.k_tiles == 64
    consumer_events = 4 * (6 * 64 + trace_plan.EVENTS_PER_TILE) + trace_plan.EVENTS_PER_RECORDER
    assert p.capacity == consumer_events
    assert p.words % 8 == 0 and p.recorders == 396
    assert p.nbytes == 396 * (HEADER_WORDS + p.capacity * EVENT_WORDS) * 4


def test_plan_counts_split_k_units_and_their_fix_ups():
    from wsgemm.host import choosing

    e = choosing.entry("swap-pingpong-64x16x128-c1x1")
    config = e.variant_config(split=True)
    # the kernel's problem: N=4096 weights rows (M here), 16 tokens, K=14336: 64 tiles x 2 splits
    p = trace_plan.plan_trace("sm90-pingpong", config, (4096, 16, 14336, 1), 132, split=2)
    # K = 14336 is 112 k-tiles of 128, 56 per split
    assert p.ctas_launched == 128 and p.tiles_per_cta == 1 and p.k_tiles == 112
    per_unit = 6 * 56 + trace_plan.EVENTS_PER_TILE + trace_plan.EVENTS_PER_FIXUP
    assert p.capacity == per_unit + trace_plan.EVENTS_PER_RECORDER


@pytest.mark.parametrize("shape", [(2888, 2072, 1504, 1), (1128, 1968, 4056, 1),
                                   (300, 1000, 1021, 3)])  # fmt: skip
def test_plan_gives_a_stream_k_row_every_event_its_busiest_cta_writes(shape, python_min_max):
    """A stream-K launch (the shipped sm90 tile, 128x256 in 2x1 clusters, on 132 SMs): the
    planned grid is the clusters the kernel launches, and each row holds the events of the
    CTA that runs the most units and k-tiles in the kernel's own schedule (replayed:
    ``scheduler.unit_order``): per k-tile, per unit (its fetch, range and fix-up) and per
    recorder."""
    import dataclasses

    from wsgemm.kernels.common.scheduler import unit_order

    config = dataclasses.replace(host.BACKENDS["sm90"].config(), stream_k=True).compiled()
    p = trace_plan.plan_trace("sm90", config, shape, 132)
    m, n, k, batch = shape
    tiles = (-(-m // 128), -(-n // 256), batch)
    k_tiles = -(-k // 64)
    order = unit_order(*tiles, 2, 132, (2, 1), split_k=(k_tiles, 1), stream_k=True)
    assert p.ctas_launched == p.ctas_traced == len(order) and p.k_tiles == k_tiles
    units = max(len(cta) for cta in order)
    worked = max(sum(u.k_end - u.k_begin for u in cta) for cta in order)
    per_unit = (trace_plan.EVENTS_PER_TILE + trace_plan.EVENTS_PER_FIXUP
                + trace_plan.EVENTS_PER_UNIT_RANGE)  # fmt: skip
    need = trace_plan.EVENTS_PER_K_TILE * worked + per_unit * units
    assert need + trace_plan.EVENTS_PER_RECORDER <= p.capacity
    assert p.tiles_per_cta >= units


@pytest.mark.sweep
def test_a_traced_split_k_variant_compiles_spill_free(traced_report):
    """A second traced sm_90a kernel (split, cooperative 128x128): under ``-m sweep`` (the
    default run's traced sm90 kernel is the shipped cooperative one, unsplit)."""
    from wsgemm.kernels.sm90.config import Sm90Config

    cfg = Sm90Config(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2, split_k=0)
    variant = host.Variant("sm90", "sm_90a", config=cfg)
    _, r = traced_report(variant)
    assert_clean(r)
    assert "SR_GLOBALTIMER" in r.sass_text and "ATOMG" in r.sass_text  # the fix-up's count


def test_plan_caps_the_buffer_and_samples_the_sm80_grid():
    config = host.BACKENDS["sm80"].config()
    p = trace_plan.plan_trace("sm80", config, (16384, 16384, 1 << 20, 1), 132)
    assert p.ctas_launched == 128 * 128 and p.ctas_traced == 2 * 132
    assert p.recorders_per_cta == 5  # a producer warp and four MMA warps
    assert p.nbytes <= trace_plan.MAX_BUFFER_BYTES
    assert p.capacity < 6 * p.k_tiles  # capped: the overflow is counted, not written
    small = trace_plan.plan_trace("sm80", config, (100, 100, 100, 1), 132, max_ctas=1)
    assert small.ctas_traced == 1 and small.capacity >= 6 * 2 + trace_plan.EVENTS_PER_TILE
    assert trace_plan.plan_trace("sm80", config, (1, 1, 1, 1), 132, capacity=7).capacity == 7


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "10"])
def test_plan_rejects_a_bad_capacity(bad):
    config = host.BACKENDS["sm80"].config()
    with pytest.raises(ValueError, match="capacity"):
        trace_plan.plan_trace("sm80", config, (64, 64, 64, 1), 132, capacity=bad)


def test_record_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from wsgemm.tracing.record import NoGpuError, record, record_gated_grad, record_grouped

    a = torch.zeros(4, 4, dtype=torch.float16)
    with pytest.raises(NoGpuError, match="CUDA GPU"):
        record(a, a, backend="sm80")
    with pytest.raises(NoGpuError, match="CUDA GPU"):
        record_grouped(a, a.unsqueeze(0), torch.tensor([4], dtype=torch.int32))
    with pytest.raises(NoGpuError, match="CUDA GPU"):
        record_gated_grad(a, a, torch.zeros(4, 8, dtype=torch.float16))


def test_plan_sizes_a_grouped_launch_by_its_unit_bound():
    """A grouped launch's grid is sized by the bound its groups' units may reach (the kernel's
    ``unit_bound``), its rows by the units they hold."""
    from wsgemm.kernels.sm90.config import Sm90Config

    config = Sm90Config(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong")
    p = trace_plan.plan_trace("sm90-pingpong", config, (1000, 512, 256, 1), 132, units=(10, 40))
    assert p.ctas_launched == p.ctas_traced == 40 * 2  # 40 clusters of 2 (under 132 / 2)
    assert p.tiles_per_cta == 1
    p = trace_plan.plan_trace("sm90-pingpong", config, (1000, 512, 256, 1), 132, units=(300, 400))
    assert p.ctas_launched == 132 and p.tiles_per_cta == 5  # 66 clusters, 300 units


class _Row:
    """A recorder row written the way ``trace.open_recorder`` and ``trace.record`` do."""

    def __init__(self, cta, role, warp):
        self.header = dict.fromkeys(HEADER_FIELDS, 0)
        self.header.update(cta=cta, role=int(role), warp=warp, timer=int(Timer.GLOBALTIMER))
        self.events = []
        self.tile = (-1, -1, -1)

    def add(self, kind, t, k_tile=-1, stage=-1):
        self.events.append([int(kind), t & 0xFFFFFFFF, t >> 32, *self.tile, k_tile, stage])

    def fetch(self, tile, t):
        self.tile = tile
        self.add(Event.TILE_FETCH, t)


def _simulated_sm80_cta(k_tiles=5, stages=3, consumers=2):
    """One CTA of the specialized sm80 kernel, in event order: the producer fills k-tile t
    into stage t % stages at time 100 t, each consumer waits for it and releases it."""
    producer = _Row(0, Role.PRODUCER, 0)
    mmas = [_Row(0, Role.CONSUMER, 1 + w) for w in range(consumers)]
    producer.add(Event.RECORDER_BEGIN, 1)
    producer.fetch((0, 0, 0), 2)
    for c in mmas:
        c.add(Event.RECORDER_BEGIN, 1)
        c.fetch((0, 0, 0), 2)
    for t in range(k_tiles):
        s = t % stages
        producer.add(Event.WAIT_EMPTY_BEGIN, 100 * t + 3, t, s)
        producer.add(Event.WAIT_EMPTY_END, 100 * t + 4, t, s)
        producer.add(Event.LOAD_ISSUE, 100 * t + 5, t, s)
        for c in mmas:
            c.add(Event.WAIT_FULL_BEGIN, 100 * t + 10, t, s)
            c.add(Event.WAIT_FULL_END, 100 * t + 60, t, s)
            c.add(Event.STAGE_RELEASE, 100 * t + 70, t, s)
            c.add(Event.MMA_ISSUE, 100 * t + 80, t, s)
    producer.add(Event.RECORDER_END, 100 * k_tiles)
    for c in mmas:
        c.add(Event.EPILOGUE_BEGIN, 100 * k_tiles + 1)
        c.add(Event.EPILOGUE_END, 100 * k_tiles + 2)
        c.add(Event.RECORDER_END, 100 * k_tiles + 3)
    return [producer, *mmas]


def _buffer(rows, capacity=64):
    buf = np.zeros((len(rows), HEADER_WORDS + capacity * EVENT_WORDS), dtype=np.int32)
    for i, r in enumerate(rows):
        r.header["count"] = len(r.events)
        buf[i, :HEADER_WORDS] = [r.header[f] for f in HEADER_FIELDS]
        n = min(len(r.events), capacity)
        buf[i, HEADER_WORDS : HEADER_WORDS + n * EVENT_WORDS] = np.array(r.events[:n]).ravel()
    return buf


META = dict(
    consumers_per_tile=2, tiles=[1, 1, 1], ctas_traced=1, ctas_launched=1, timer=0,
    backend="sm80", config=dict(cluster_m=1, cluster_n=1), schedule=None,
)  # fmt: skip


def _check(buffer):
    """The one consistency checker (``wsgemm.tracing.check``) on a simulated recording."""
    capacity = (buffer.shape[1] - HEADER_WORDS) // EVENT_WORDS
    return wsgemm.tracing.check(RawTrace(buffer, dict(META, capacity=capacity)))


def test_checker_passes_a_consistent_recording():
    assert _check(_buffer(_simulated_sm80_cta())) == []


def test_checker_finds_each_kind_of_inconsistency():
    rows = _simulated_sm80_cta()
    rows[1].add(Event.STAGE_RELEASE, 10_000, 4, 2)  # k-tile 4 sits in stage 1, not 2
    assert any("released it twice" in p for p in _check(_buffer(rows)))

    rows = _simulated_sm80_cta()
    events = rows[2].events
    last = max(i for i, e in enumerate(events) if e[0] == Event.STAGE_RELEASE)  # k-tile 4
    again = list(next(e for e in events if e[0] == Event.STAGE_RELEASE and e[6] == 1))
    again[1:3] = events[last][1:3]  # k-tile 1's release of stage 1, after k-tile 4's
    events.insert(last + 1, again)
    assert any("twice" in p for p in _check(_buffer(rows)))

    rows = _simulated_sm80_cta()
    late = next(e for e in rows[0].events if e[0] == Event.LOAD_ISSUE and e[6] == 2)
    late[1] = 400  # well after the consumers' wait on k-tile 2 ended (260; one tick is slack)
    assert any("before its load was issued" in p for p in _check(_buffer(rows)))

    rows = _simulated_sm80_cta(consumers=1)
    assert any("expected 2" in p for p in _check(_buffer(rows)))

    overflowed = _buffer(_simulated_sm80_cta(), capacity=8)
    assert any("overflowed" in p for p in _check(overflowed))


def _simulated_grouped(tiles):
    """One CTA (a producer and one consumer recorder) per tile of ``tiles`` ((tile in its
    group, n, group) each), two k-tiles each, in the sm80 simulation's event order."""
    rows = []
    for cta, tile in enumerate(tiles):
        cta_rows = _simulated_sm80_cta(k_tiles=2, consumers=1)
        for r in cta_rows:
            r.header["cta"] = cta
            for e in r.events:
                if e[3] == 0 and e[4] == 0 and e[5] == 0:  # the fetched tile's coordinates
                    e[3:6] = list(tile)
        rows += cta_rows
    return rows


GROUPED_META = dict(META, consumers_per_tile=1, tiles=None, group_tiles=[[2, 0, 4], 1])


def _check_grouped(rows, **meta):
    buffer = _buffer(rows)
    capacity = (buffer.shape[1] - HEADER_WORDS) // EVENT_WORDS
    ctas = len({r.header["cta"] for r in rows})
    meta = dict(GROUPED_META, capacity=capacity, ctas_traced=ctas, ctas_launched=ctas, **meta)
    return wsgemm.tracing.check(RawTrace(buffer, meta))


def test_a_grouped_recording_is_checked_against_each_group_s_tiles():
    """A grouped call's tiles (tile in its group, n, group): groups of 2, 0 and 4 m-tiles. Every
    tile once passes; a missing tile, a tile past its group's m-tiles, a group past the last,
    and a tile run twice are each reported."""
    every = [(m, 0, g) for g, t in enumerate([2, 0, 4]) for m in range(t)]
    assert _check_grouped(_simulated_grouped(every)) == []
    problems = _check_grouped(_simulated_grouped(every[:-1]))
    assert any("1 of 6 tiles were run by no CTA: (3, 0, 2)" in p for p in problems), problems
    problems = _check_grouped(_simulated_grouped([*every, (2, 0, 0)]))
    assert any("past its group's grid of (2, 1, 3) tiles" in p for p in problems), problems
    problems = _check_grouped(_simulated_grouped([*every, (0, 0, 3)]))
    assert any("fetched tile (0, 0, 3), past its group's grid" in p for p in problems), problems
    problems = _check_grouped(_simulated_grouped([*every, (1, 0, 2)]))
    assert any("tile (1, 0, 2) was run by 2 CTAs" in p for p in problems), problems
    # with clusters of 2 along M a 3-tile group runs a 4th tile (its last cluster's other
    # CTA, which stores nothing): not past the group's grid, and not required
    rows = _simulated_grouped([(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)])
    meta = dict(group_tiles=[[3], 1], config=dict(cluster_m=2, cluster_n=1))
    assert _check_grouped(rows, **meta) == []
    # ... but a 5th is past the cluster-rounded grid; an empty group's tile is past its grid
    problems = _check_grouped(_simulated_grouped([(0, 0, 0), (1, 0, 0), (2, 0, 0), (4, 0, 0)]),
                              **meta)  # fmt: skip
    assert any("fetched tile (4, 0, 0), past its group's grid of (4, 1, 1)" in p
               for p in problems), problems  # fmt: skip
    problems = _check_grouped(_simulated_grouped([*every, (0, 0, 1)]))
    assert any("fetched tile (0, 0, 1), past its group's grid of (0, 1, 3)" in p
               for p in problems), problems  # fmt: skip
    # clusters of 2 along N: a 3-column grid runs a 4th column tile, not a 5th
    tiles = [(0, j, 0) for j in range(4)]
    meta = dict(group_tiles=[[1], 3], config=dict(cluster_m=1, cluster_n=2))
    assert _check_grouped(_simulated_grouped(tiles), **meta) == []
    problems = _check_grouped(_simulated_grouped([*tiles, (0, 4, 0)]), **meta)
    assert any("fetched tile (0, 4, 0), past its group's grid of (1, 4, 1)" in p
               for p in problems), problems  # fmt: skip
