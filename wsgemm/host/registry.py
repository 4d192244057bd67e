"""The backend registry: which kernels exist, what a compiled variant is specialized on."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
from dataclasses import dataclass
from typing import Any

# The dtype tables live in wsgemm.support; the host re-exports them for its callers.
from wsgemm.support import (  # noqa: F401  (the epilogue names: re-exported for the API)
    AB_DTYPES,
    ACC_DTYPES,
    ACCUMULATOR_RULE,
    ACTIVATIONS,
    BIAS_MODES,
    C_DTYPES,
    PLAIN,
    TARGETS,
    Epilogue,
    accumulator_allowed,
    cc_name,
    target,
)

#: The major modes an operand may have: A is (M, K, L), B is (N, K, L).
A_MAJORS = ("k", "m")
B_MAJORS = ("k", "n")
#: What a kernel's problem is: "none", a dense (batched) GEMM; "m", a grouped GEMM whose rows
#: are cut into groups by offsets on the GPU (``wsgemm.grouped_mm``'s 2D x 3D form); "k", one
#: whose K is (its 2D x 2D form: one output batch per group).
GROUPINGS = ("none", "m", "k")


@dataclass(frozen=True)
class Backend:
    """One selectable kernel: its family and where its class lives."""

    name: str
    module: str
    cls: str
    family: str  # where it runs: the rows of support.TARGETS that list the family
    # the classes of its grouped GEMMs (``GROUPINGS`` "m", "k") in the family's ``grouped``
    # module, or ""
    grouped_cls: str = ""
    k_grouped_cls: str = ""

    def grouped_class(self, grouping: str) -> str:
        """The name of its grouped GEMM's class of ``grouping`` ("m", "k"), or ""."""
        return self.grouped_cls if grouping == "m" else self.k_grouped_cls

    def kernel_class(self, grouping: str = "none") -> type:
        """Its kernel class, or (``grouping`` "m", "k") its grouped GEMM's."""
        if grouping == "none":
            return getattr(importlib.import_module(self.module), self.cls)
        name = self.grouped_class(grouping)
        if not name:
            raise ValueError(f"backend {self.name!r} has no grouped GEMM of grouping {grouping!r}")
        module = importlib.import_module(f"wsgemm.kernels.{self.family}.grouped")
        return getattr(module, name)

    def config(self, acc_dtype: str = "float32") -> Any:
        """The shipped config, from the family's ``config`` module (it may pick one per
        accumulator dtype: fp16 accumulators take half the registers, so sm80 affords a larger
        tile). Memoized: ``matmul``'s dispatch asks on every call, and configs are frozen."""
        return _shipped_config(self.family, self.name, acc_dtype)

    def supports(self, cc: tuple[int, int]) -> bool:
        """Whether it builds and runs on a GPU of compute capability ``cc``
        (``support.TARGETS``)."""
        row = target(cc)
        return row is not None and self.family in row.families

    def archs(self) -> tuple[str, ...]:
        """The DSL targets it compiles for, one per GPU it runs on (``support.TARGETS``)."""
        return tuple(t.arch for t in TARGETS if self.family in t.families)


@functools.cache
def _shipped_config(family: str, name: str, acc_dtype: str) -> Any:
    return importlib.import_module(f"wsgemm.kernels.{family}.config").shipped_config(
        name, acc_dtype
    )


# What each one is: README's backend table and the kernel classes' docstrings.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "sm90",
            "wsgemm.kernels.sm90.kernel",
            "Sm90Gemm",
            "sm90",
            "Sm90GroupedGemm",
            "Sm90KGroupedGemm",
        ),
        Backend(
            "sm90-pingpong",
            "wsgemm.kernels.sm90.kernel",
            "Sm90Gemm",
            "sm90",
            "Sm90GroupedGemm",
            "Sm90KGroupedGemm",
        ),
        Backend("sm80", "wsgemm.kernels.sm80.specialized", "Sm80WsGemm", "sm80"),
        Backend("sm80-multistage", "wsgemm.kernels.sm80.multistage", "Sm80MultistageGemm", "sm80"),
    )
}


def arch_for_capability(cc: tuple[int, int]) -> str:
    """The DSL target the kernels compile for on a device (``support.TARGETS``: sm_90a and later
    carry the 'a' of their architecture-specific instructions); ValueError for a GPU wsgemm does
    not build for."""
    row = target(cc)
    if row is None:
        raise ValueError(
            f"wsgemm builds no kernel for {cc_name(cc)}; it builds for "
            + ", ".join(cc_name(t.cc) for t in TARGETS)
        )
    return row.arch


@functools.cache
def shipped_backends(family: str | None = None) -> tuple[str, ...]:
    """The backends (of ``family``, or all), in preference order. A kernel module that fails to
    import raises at first use (``Backend.kernel_class``), never drops out of this list."""
    return tuple(n for n, b in BACKENDS.items() if family is None or b.family == family)


# The cp.async kernels (the sm80 family) copy whole 16-byte vectors; TMA kernels (sm90) zero-fill
# partial boxes. Told by the family rather than the kernel class's ``needs_vector_extent``, so a
# call whose kernel is in the disk cache never imports the DSL (tests/host/test_cold_start.py checks
# that the two agree for every backend).
_VECTOR_EXTENT_FAMILIES = frozenset({"sm80"})


def needs_vector_extent(backend: str) -> bool:
    """cp.async kernels need each unit-stride extent to be a whole number of 16-byte vectors."""
    return BACKENDS[backend].family in _VECTOR_EXTENT_FAMILIES


#: The families whose fused-epilogue kernels calls run (bias, activation in the kernel's
#: epilogue); elsewhere calls run the plain kernel and torch's epilogue after it, one more pass
#: over the output (docs/perf.md entry 34). The sm90 ones ran on an H100 on 2026-12-05 (docs/perf.md
#: entry 41): the 351 fused cases of ``tests/gpu/test_gpu_epilogue.py`` (every activation, with
#: and without bias, both schedules, split-K and stream-K, ``linear`` gradients), float64
#: reference, within the suite's tolerance.
FUSING_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families that have fused-epilogue kernels at all (what ``FUSING_FAMILIES`` may hold).
EPILOGUE_FAMILIES = frozenset({"sm90"})
#: The families whose *gated* kernels (``gated_linear``'s: ``act(gate) * up``; with a bias
#: also ``GATED_BIAS_FAMILIES``) calls
#: run. The sm90 one ran on the H200 on 2026-12-05 (docs/perf.md entry 39): 15 cases of
#: ``tests/gpu/test_gpu_epilogue.py`` (silu, gelu_tanh, relu2; 1 to 2048 rows; both schedules)
#: and ``GatedMLP``'s forward and backward, within the suite's tolerance. The grouped kernel's
#: epilogues (``grouped_mm(activation=, gated=)``) stay on ``FUSING_FAMILIES``.
GATED_FAMILIES = frozenset({"sm90"})
#: The families whose gated kernels take a bias (``[b_gate; b_up]``, ``Epilogue(bias="col",
#: gated=True)``) in calls. The sm90 one ran on an H100 on 2026-12-06
#: (``docs/data/gpu-2026-12-06h/gated-bias-tests.log``): 11 cases of
#: ``tests/gpu/test_gpu_epilogue.py -k "gated_bias or biases"`` (silu, gelu_tanh; 1 to 2048 rows;
#: both row tiles; a strided bias; ``GatedMLP(bias=True)`` forward, backward and under
#: autocast), float64 reference, within the suite's tolerance. Elsewhere a biased call takes the
#: unfused road: the product with its bias in fp32, then the gating.
GATED_BIAS_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose gated swap-AB decode tile runs ``gated_linear`` calls of a few rows (the
#: weights in the tile's M, the gate's and up projection's rows the two 64-row bands of a
#: ping-pong warpgroup: ``kernels/sm90/kernel.gated_swap_refusal``; unbiased unless
#: ``GATED_SWAP_BIAS_FAMILIES``). The sm90 one ran
#: on an H100 on 2026-12-06 (docs/perf.md entry 85): the 34 float64 cases of
#: ``tests/gpu/test_gpu_epilogue.py -k gated_swap``, memcheck, racecheck and initcheck clean;
#: 1.02-1.14x the plain product's time at 1-16 rows and 0.90-1.09x at 32, 0.62-1.006x the
#: product then the gating, and on held-out families' rows the road choice 1.002x the faster
#: of the two (docs/perf.md entry 86). Elsewhere a
#: call of a few rows runs the gated kernel's 128-row tile or, where the cost model says so, the
#: product on a swap-AB tile and then the gating.
GATED_SWAP_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose gated swap-AB decode tile also takes a bias (``[b_gate; b_up]`` along the
#: tile's rows, the weights': ``Epilogue(bias="row", gated=True)`` on that tile only). The sm90
#: one compiles (4 bias loads a thread on the 8-wide tile, no spills); empty until
#: ``tests/gpu/test_gpu_epilogue.py -k gated_swap_bias`` passes (it switches the family on for
#: itself). Elsewhere a biased call of a few rows takes a row tile or the product then the
#: gating.
GATED_SWAP_BIAS_FAMILIES: frozenset[str] = frozenset()
#: The families whose gated kernel runs ``gated_linear`` calls of up to
#: ``choosing.cost.GATED_SMALL_MAX_ROWS`` rows on its small row tile (the ping-pong 64x128 in
#: 2x1 clusters, ``cost.GATED_SMALL_TILE``) rather than the 128x128 one: not the preact
#: forward's nor the dgated backward's. The sm90 one was checked against float64 on 30 shapes
#: by session 25's forced-tile bench (docs/perf.md entry 88) and priced from those times; on
#: since ``tests/gpu/test_gpu_epilogue.py -k gated_small`` passed on an H100 (37 of 37,
#: 2026-12-07) and the held-out gate_up rows of 33-128 tokens ran at 1.045x the plain product
#: with it on, against 1.271x before (docs/perf.md entry 97).
GATED_SMALL_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose kernels take ``alpha`` and the residual (``Epilogue.scale``/``residual``:
#: C read from the output before its store, ``kernels/sm90/residual.py``) in calls. The sm90
#: ones ran on an H100 on 2026-12-05 and, with C by TMA, on 2026-12-06 (docs/perf.md entries
#: 54, 58): the 129 cases of ``tests/gpu/test_gpu_residual.py`` within the suite's tolerance;
#: in place (``c=out``) they cost 1.034x the plain GEMM (geomean, llm suite fp16), against the
#: torch combination's extra fp32 product and pass. Elsewhere the API computes the product,
#: then alpha, C, the bias and the activation in torch (``api.epilogue.combine_in_torch``),
#: which ``explain`` says.
RESIDUAL_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose kernels read a residual's C from a tensor of its own
#: (``Epilogue.c_tensor``: ``matmul(a, b, c=r)`` with ``r`` not the output, no copy of ``r``
#: into the result first; docs/perf.md entry 57). The sm90 ones passed
#: ``tests/gpu/test_gpu_residual.py`` (129 of 129, its "copied" cases on this road) on an H100
#: on 2026-12-06 (entry 58). Elsewhere such a ``c`` is copied into the result and read there
#: (one more pass), which ``explain`` says.
C_TENSOR_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose grouped kernels multiply each result row by a row scale in their
#: epilogue (``Epilogue.row_scale``: ``grouped_mm(row_scale=)``, a router weight on a
#: mixture-of-experts down projection; ``kernels/epilogue/row_scale.py``). The sm90 one ran on
#: an H100 on 2026-12-06 (docs/perf.md entry 63): 8 of 8 ``tests/gpu/test_gpu_grouped.py -k
#: row_scale`` (both schedules, fp32 and 16-bit scales, an activation, the gated unit, ``out=``,
#: a CUDA graph replayed with new offsets and scales) and the moe bench's ``--pass routed``, 48
#: rows checked against float64: 1.32x ``torch._grouped_mm`` then the scale (bf16), 1.81x the
#: per-expert loop then the scale (fp16). Elsewhere the API runs the plain grouped kernel, then
#: the scale in torch (one more pass over the result), which ``explain`` says.
ROW_SCALE_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose gated training kernels run in calls: the gated unit's gradient fused
#: into the GEMM that computes ``dh`` (``Epilogue.dgated``: ``d[gate | up]`` from ``d_out @
#: W_down`` and the saved pre-activation, ``api.gated.gated_grad``, a ``GatedMLP``'s backward)
#: and the gated kernel that also stores that pre-activation (``Epilogue.preact``,
#: ``api.gated.gated_linear_preact``, its forward). The sm90 ones ran on an H100 on
#: 2026-12-06 (docs/perf.md entry 80): 49 of 49 ``tests/gpu/test_gpu_epilogue.py -k "dgated
#: or preact or gated_mlp"`` against float64 (the dgated epilogue with all five activations,
#: preact with silu and gelu_tanh, 1-2048 rows; ``GatedMLP``'s step with and without biases
#: and under autocast). Elsewhere ``dh`` is a
#: product of its own, then the gradient in three elementwise passes (torch's kernels), and
#: the forward the product, then the unit in torch.
DGATED_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose plain-MLP training kernels run in calls: an activation's gradient fused
#: into the GEMM that computes ``dh`` (``Epilogue.dact``: ``dpre = (d_out @ W_down) ·
#: act'(pre)`` from the saved pre-activation, ``api.act_grad.act_grad``, a plain ``MLP``'s
#: backward) and the up projection storing its pre-activation beside ``h`` (``Epilogue.preact``
#: on a plain product, ``api.act_grad.linear_preact``, its forward). Built and checked on the
#: CPU (SASS: one TMA load of the pre-activation a subtile, two stores a subtile, spill-free);
#: on since ``tests/gpu/test_gpu_epilogue.py -k "dact or linear_preact"`` passed on an H100
#: (31 of 31 against float64, 2026-12-07; memcheck and racecheck clean: docs/perf.md entry
#: 97; timed in entry 104). Elsewhere ``dh`` is a product of its own,
#: then torch's activation backward, and the forward the product, then torch's activation.
DACT_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The families whose policy splits run as a cluster split (``Sm90Config.cluster_split``: K
#: split over a cluster's CTAs, the partials met in rank 0's shared memory) where they can:
#: a split of 2 or 4 on a menu entry of 1x1 clusters whose receive buffers leave the ring two
#: stages (``cluster_split_config``). The sm90 one ran on an H100 on 2026-12-07 (docs/perf.md
#: entries 95 and 97): 61 float64 cases of ``tests/gpu/test_gpu_cluster_split.py``, bitwise
#: the workspace split's result; memcheck, racecheck and initcheck clean; 1.035x (2 ways) and
#: 1.093x (4 ways) the workspace split's speed at decode, median over 24 rows. On held-out
#: families' decode rows (56, 1-32 tokens) the policy's picks priced in this form ran 1.024x
#: cuBLAS against 1.017x for its picks without it. Elsewhere a split runs through the
#: workspace (``split_k``).
CLUSTER_SPLIT_FAMILIES: frozenset[str] = frozenset({"sm90"})
#: The largest fp32 partial tile (tile_m x tile_n x 4 bytes) the policy's splits run over a
#: cluster: the menu's swap-AB decode tiles (64x8 to 64x32), where the cluster split was timed
#: faster (docs/perf.md entry 95). A larger tile's receive buffers take ring stages from its
#: mainloop: the 64x128 ping-pong tile (32 KB) at 64 tokens gained nothing over the best of
#: unsplit and the workspace split (0.950 -> 0.951x cuBLAS), and the cost model, which does not
#: see the stages, predicted it ~8% faster than it ran. There the workspace split runs.
CLUSTER_SPLIT_MAX_PARTIAL_BYTES = 64 * 32 * 4


#: The families whose cluster split kernels run a fused bias or activation in calls
#: (``Epilogue.rides_cluster_split``: rank 0 runs the epilogue after the sum): on since
#: ``tests/gpu/test_gpu_cluster_split.py -k epilogue`` passed on an H100 (9 of 9 against
#: float64, docs/perf.md entry 104). Elsewhere a call with a bias or an activation on a
#: cluster-split route takes the same ways through the workspace (``Route.for_epilogue``), as a
#: residual does.
CLUSTER_SPLIT_EPILOGUE_FAMILIES: frozenset[str] = frozenset({"sm90"})


@contextlib.contextmanager
def switches(**families: frozenset[str]):
    """The named family switches (``..._FAMILIES`` of this module) set for a block, then put
    back: a fit replaying records timed before a switch changed, or a tool's run with one on
    (``scripts/switched.py``). A name that is no switch: ValueError, nothing set."""
    for name in families:
        if not name.endswith("_FAMILIES") or name not in globals():
            raise ValueError(f"{name!r} is not a host.registry family switch")
    saved = {name: globals()[name] for name in families}
    globals().update(families)
    try:
        yield
    finally:
        globals().update(saved)


def runs_over_cluster(backend: str, epilogue) -> bool:
    """Whether ``backend``'s cluster split kernel runs a call with ``epilogue`` (an
    ``Epilogue``): the plain one, or one it rides once ``CLUSTER_SPLIT_EPILOGUE_FAMILIES``
    holds the family; elsewhere the split goes through the workspace."""
    if epilogue.plain:
        return True
    family = BACKENDS[backend].family
    return epilogue.rides_cluster_split and family in CLUSTER_SPLIT_EPILOGUE_FAMILIES


def cluster_split_config(entry, split: int, k: int, c_dtype: str, families=None) -> Any:
    """The config that runs menu ``entry`` split ``split`` ways as a cluster split, or None
    where it does not (``families``, by default ``CLUSTER_SPLIT_FAMILIES`` as set now; ways 2
    or 4; the entry's clusters 1x1; a partial tile within ``CLUSTER_SPLIT_MAX_PARTIAL_BYTES``;
    K of at least ``split`` k-tiles; rank 0's receive buffers leave the ring two stages with a
    C of ``c_dtype``, a host dtype name)."""
    from wsgemm.kernels.sm90.config import CLUSTER_SPLITS

    families = CLUSTER_SPLIT_FAMILIES if families is None else families
    if BACKENDS[entry.backend].family not in families or split not in CLUSTER_SPLITS:
        return None
    if split == 1 or entry.config.get("cluster_m") != 1 or entry.config.get("cluster_n") != 1:
        return None
    if entry.tile_m * entry.tile_n * 4 > CLUSTER_SPLIT_MAX_PARTIAL_BYTES:
        return None
    config = dataclasses.replace(entry.variant_config(split=False), cluster_split=split)
    c_bytes = 4 if c_dtype == "float32" else 2
    if not config.k_tiles_for_every_rank(k) or not config.cluster_split_fits(2, c_bytes):
        return None
    return config


def fuses_epilogues(
    backend: str, gated: bool = False, scalars: bool = False, bias: bool = False
) -> bool:
    """Whether calls on ``backend`` run a fused-epilogue kernel (bias, activation in the
    kernel's epilogue): its family is in ``FUSING_FAMILIES`` (``gated``: a dense gated unit's,
    ``GATED_FAMILIES``, and with ``bias`` ``GATED_BIAS_FAMILIES`` too; ``scalars``: one with
    alpha or a residual, ``RESIDUAL_FAMILIES`` too); elsewhere the API applies the epilogue
    after the product (``api.epilogue.apply_in_torch``, ``combine_in_torch``)."""
    family = BACKENDS[backend].family
    if scalars and family not in RESIDUAL_FAMILIES:
        return False
    if gated and bias and family not in GATED_BIAS_FAMILIES:
        return False
    return family in (GATED_FAMILIES if gated else FUSING_FAMILIES)


def runs_gated_small(backend: str) -> bool:
    """Whether ``gated_linear`` calls of a few dozen rows on ``backend`` take its gated small
    row tile (``GATED_SMALL_FAMILIES``, and the family's gated kernels on)."""
    return BACKENDS[backend].family in GATED_SMALL_FAMILIES and fuses_epilogues(backend, gated=True)


def runs_gated_swap_bias(backend: str) -> bool:
    """Whether ``backend``'s gated swap-AB decode tile takes a biased call
    (``GATED_SWAP_BIAS_FAMILIES``, and the tile itself on: ``runs_gated_swap``)."""
    return BACKENDS[backend].family in GATED_SWAP_BIAS_FAMILIES and runs_gated_swap(backend)


def runs_gated_swap(backend: str) -> bool:
    """Whether ``gated_linear`` calls of a few rows on ``backend`` take its gated swap-AB tile
    (``GATED_SWAP_FAMILIES``, and the family's gated kernels on)."""
    return BACKENDS[backend].family in GATED_SWAP_FAMILIES and fuses_epilogues(backend, gated=True)


def fuses_gated_grad(backend: str) -> bool:
    """Whether ``backend``'s kernels fuse the gated unit's gradient (``DGATED_FAMILIES``)."""
    return BACKENDS[backend].family in DGATED_FAMILIES and fuses_epilogues(backend)


def fuses_act_grad(backend: str) -> bool:
    """Whether ``backend``'s kernels fuse an activation's gradient (``DACT_FAMILIES``)."""
    return BACKENDS[backend].family in DACT_FAMILIES and fuses_epilogues(backend)


def scales_rows(backend: str) -> bool:
    """Whether ``backend``'s grouped kernel fuses a row scale (``ROW_SCALE_FAMILIES``)."""
    return BACKENDS[backend].family in ROW_SCALE_FAMILIES and fuses_epilogues(backend)


def reads_c_tensor(backend: str) -> bool:
    """Whether ``backend``'s fused residual reads a C of its own (``C_TENSOR_FAMILIES``)."""
    family = BACKENDS[backend].family
    return family in C_TENSOR_FAMILIES and fuses_epilogues(backend, scalars=True)


def cluster_size(config: Any) -> int:
    """CTAs per cluster: the persistent grid has (SMs // this) clusters."""
    return config.cluster_size


@dataclass(frozen=True)
class Variant:
    """Everything one compiled kernel is specialized on."""

    backend: str
    arch: str
    ab_dtype: str = "float16"
    c_dtype: str = "float16"
    acc_dtype: str = "float32"
    a_major: str = "k"  # A is (M, K, L): "k" (row-major a) or "m"
    b_major: str = "k"  # B is (N, K, L): "k" (column-major b) or "n" (row-major b)
    config: Any = None  # None: the backend's shipped config; else a config to try (tuning)
    # the fused epilogue's name (``wsgemm.kernels.epilogue.Epilogue.name``); "none": plain
    epilogue: str = "none"
    grouping: str = "none"  # ``GROUPINGS``: a dense GEMM, or a grouped one

    def __post_init__(self) -> None:
        checks = (
            ("backend", self.backend, tuple(BACKENDS)),
            ("ab_dtype", self.ab_dtype, AB_DTYPES),
            ("c_dtype", self.c_dtype, C_DTYPES),
            ("acc_dtype", self.acc_dtype, ACC_DTYPES),
            ("a_major", self.a_major, A_MAJORS),
            ("b_major", self.b_major, B_MAJORS),
            ("grouping", self.grouping, GROUPINGS),
        )
        for field, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"Variant.{field}={value!r}; allowed: {', '.join(allowed)}")
        if not accumulator_allowed(self.ab_dtype, self.acc_dtype):
            raise ValueError(ACCUMULATOR_RULE)
        if self.epilogue != "none":
            if Epilogue.parse(self.epilogue).name != self.epilogue:
                raise ValueError(
                    f"Variant.epilogue={self.epilogue!r} is not an epilogue's name; say "
                    f"{Epilogue.parse(self.epilogue).name!r}"
                )
            if BACKENDS[self.backend].family not in EPILOGUE_FAMILIES:
                raise ValueError(
                    f"Variant.epilogue={self.epilogue!r}: only the sm90 family fuses epilogues"
                )
        if self.grouping != "none" and not BACKENDS[self.backend].grouped_class(self.grouping):
            grouped = [n for n, b in BACKENDS.items() if b.grouped_class(self.grouping)]
            raise ValueError(
                f"Variant.grouping={self.grouping!r}: backend {self.backend!r} has no grouped "
                f"GEMM; these have: {', '.join(grouped)}"
            )

    def key(self) -> str:
        skip = ("config", "epilogue", "grouping")
        names = [f.name for f in dataclasses.fields(self) if f.name not in skip]
        fields = [str(getattr(self, name)) for name in names]
        if self.config is not None:
            fields.append(repr(self.config))
        if self.epilogue != "none":  # plain variants keep the keys they had before epilogues
            fields.append(f"epilogue={self.epilogue}")
        if self.grouping != "none":  # and dense ones those they had before grouped GEMMs
            fields.append(f"grouping={self.grouping}")
        return "-".join(fields)

    def kernel_class(self) -> type:
        """The class that builds it (its backend's, or its grouped GEMM's)."""
        return BACKENDS[self.backend].kernel_class(self.grouping)

    def kernel_config(self) -> Any:
        if self.config is not None:
            return self.config
        return BACKENDS[self.backend].config(self.acc_dtype)


def every_variant(backend: str, arch: str, config: Any = None) -> list[Variant]:
    """Every dtype, accumulator and operand-major combination of ``backend`` for ``arch``
    (``config`` None: its shipped config): what ``inspect --all`` and ``warm`` compile."""
    combos = itertools.product(AB_DTYPES, C_DTYPES, ACC_DTYPES, A_MAJORS, B_MAJORS)
    return [
        Variant(backend, arch, ab, c, acc, am, bm, config)
        for ab, c, acc, am, bm in combos
        if accumulator_allowed(ab, acc)
    ]
