"""What wsgemm supports and the hardware facts its kernels are built on, each defined once.

Kernels, host, API and bench import their rules from here: the allowed dtypes (one table, named
in every vocabulary the layers speak: ``"float16"``, ``"fp16"``, ``torch.float16``,
``cutlass.Float16``), the accumulator rule, warp and warpgroup sizes, shared memory per target,
vector and alignment bytes, mbarrier size and the named-barrier ids, and the one table of
the GPUs wsgemm builds for (:data:`TARGETS`: per compute capability, the DSL target, the
shared memory per block, the kernel families that run there and what ``auto`` runs).

Plain Python names only: nothing here imports ``cutlass`` or ``torch`` at import time (kernels
stay torch-free and ``import wsgemm`` stays DSL-free). :func:`cutlass_dtype` and
:func:`torch_dtype` import their library when called.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "ACC_DTYPES",
    "AB_DTYPES",
    "ACCUMULATOR_RULE",
    "C_DTYPES",
    "ELEMENT_BYTES",
    "MAX_GRID_DIM",
    "MAX_REGISTERS_PER_THREAD",
    "MBARRIER_BYTES",
    "REGISTERS_PER_SM",
    "SETMAXNREG_MAX",
    "SETMAXNREG_MIN",
    "SETMAXNREG_STEP",
    "SHORT_NAMES",
    "SMEM_PER_BLOCK",
    "SM_SUBPARTITIONS",
    "SWIZZLE_ATOM_BYTES",
    "TARGETS",
    "TCGEN05_REASON",
    "THREADS_PER_WARPGROUP",
    "VECTOR_BITS",
    "VECTOR_BYTES",
    "WARPS_PER_WARPGROUP",
    "WARP_SIZE",
    "BarrierId",
    "Target",
    "accumulator_allowed",
    "arch_major",
    "archs_from",
    "cc_name",
    "check_arch",
    "check_dtypes",
    "cutlass_dtype",
    "dtype_error",
    "dtype_name",
    "dtype_option",
    "element_bytes",
    "family_gpus",
    "has_mbarrier_try_wait",
    "int_ranges",
    "short_name",
    "smallest_smem_per_block",
    "smem_per_block",
    "target",
    "torch_dtype",
    "vector_elems",
]

# ----------------------------------------------------------------------------------------------
# Dtypes

#: The canonical names (torch's attribute names, lower-case cutlass class names): what the
#: compile key, the host and the records use.
AB_DTYPES = ("float16", "bfloat16")
C_DTYPES = ("float16", "bfloat16", "float32")
ACC_DTYPES = ("float32", "float16")
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
#: The benchmark's command-line and record names.
SHORT_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_CUTLASS_NAMES = {"float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32"}
_ALIASES = {short: name for name, short in SHORT_NAMES.items()}


def _canonical(dtype: Any) -> str | None:
    """The canonical name of ``dtype`` in any vocabulary, or None if it is none of ours."""
    if isinstance(dtype, str):
        text = dtype
    elif isinstance(dtype, type):  # cutlass.Float16 and friends are classes
        text = dtype.__name__
    else:  # torch.float16 prints as "torch.float16"
        text = str(dtype)
    text = text.lower().removeprefix("torch.")
    text = _ALIASES.get(text, text)
    return text if text in ELEMENT_BYTES else None


#: the names of the dtypes asked about so far (a call path asks per call: a lookup here is
#: ~0.05 us, ``_canonical`` ~0.3)
_NAMED: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``"float16"`` for ``"float16"``, ``"fp16"``, ``torch.float16`` or ``cutlass.Float16``."""
    try:
        return _NAMED[dtype]
    except (KeyError, TypeError):  # (TypeError: not hashable, so not kept either)
        pass
    name = _canonical(dtype)
    if name is None:
        raise ValueError(f"{dtype} is not a wsgemm dtype; known: {', '.join(ELEMENT_BYTES)}")
    with contextlib.suppress(TypeError):
        _NAMED[dtype] = name
    return name


def short_name(dtype: Any) -> str:
    """``"fp16"``, ``"bf16"`` or ``"fp32"``."""
    return SHORT_NAMES[dtype_name(dtype)]


#: What a command line takes besides the canonical and the short names: torch's alias.
_OPTION_ALIASES = {"half": "float16"}


def dtype_option(allowed: tuple[str, ...]) -> Callable[[str], str]:
    """An ``argparse`` type for a dtype option of any wsgemm command: takes every spelling of
    one of ``allowed`` (``fp16``, ``float16`` or ``half``; ``bf16`` or ``bfloat16``; ``fp32``
    or ``float32``, any case) and returns it as ``allowed`` spells it, so one command line
    takes both vocabularies while each command keeps its own (bench's records say ``fp16``,
    trace's ``float16``); anything else is an error that names what is allowed."""
    by_name = {dtype_name(d): d for d in allowed}

    def spellings(name: str) -> list[str]:
        other = [name, SHORT_NAMES[name], *(a for a, n in _OPTION_ALIASES.items() if n == name)]
        return [s for s in other if s != by_name[name]]

    expected = ", ".join(f"{by_name[n]} ({', '.join(spellings(n))})" for n in by_name)

    def parse(text: str) -> str:
        word = text.strip().lower()
        name = _canonical(_OPTION_ALIASES.get(word, word))
        if name not in by_name:
            import argparse  # only on a bad option: support stays import-light

            raise argparse.ArgumentTypeError(f"expected one of {expected}, got {text!r}")
        return by_name[name]

    parse.__name__ = "dtype"  # what argparse calls the type in its own messages
    return parse


def element_bytes(dtype: Any) -> int:
    return ELEMENT_BYTES[dtype_name(dtype)]


def cutlass_dtype(dtype: Any):
    """The ``cutlass`` numeric type (imports the DSL)."""
    import cutlass

    return getattr(cutlass, _CUTLASS_NAMES[dtype_name(dtype)])


def torch_dtype(dtype: Any):
    """The ``torch.dtype`` (imports torch)."""
    import torch

    return getattr(torch, dtype_name(dtype))


#: Why the one rule across the dtype tables exists.
ACCUMULATOR_RULE = (
    "fp16 accumulation needs fp16 inputs: the tensor cores (mma.sync and WGMMA) accumulate "
    "bf16 products in fp32 only"
)


def accumulator_allowed(ab_dtype: Any, acc_dtype: Any) -> bool:
    """The accumulator rule (:data:`ACCUMULATOR_RULE`): fp16 accumulators need fp16 inputs."""
    return dtype_name(acc_dtype) != "float16" or dtype_name(ab_dtype) == "float16"


def dtype_error(ab_dtype: Any, c_dtype: Any, acc_dtype: Any) -> str | None:
    """Why (A/B, C, accumulator) is not a combination the kernels offer, or None if it is."""
    for what, dtype, allowed in (
        ("A/B dtype", ab_dtype, AB_DTYPES),
        ("C dtype", c_dtype, C_DTYPES),
        ("accumulator dtype", acc_dtype, ACC_DTYPES),
    ):
        if _canonical(dtype) not in allowed:
            return f"{what} {dtype} is not supported; allowed: {', '.join(allowed)}"
    if not accumulator_allowed(ab_dtype, acc_dtype):
        return f"{ACCUMULATOR_RULE} (got {dtype_name(ab_dtype)} inputs)"
    return None


def check_dtypes(ab_dtype: Any, c_dtype: Any, acc_dtype: Any) -> None:
    """Raise ``ValueError`` (saying what is allowed) unless :func:`dtype_error` finds nothing."""
    error = dtype_error(ab_dtype, c_dtype, acc_dtype)
    if error is not None:
        raise ValueError(error)


# ----------------------------------------------------------------------------------------------
# Threads and registers

WARP_SIZE = 32
#: A warpgroup: the unit WGMMA and ``setmaxnreg`` act on (sm_90a).
WARPS_PER_WARPGROUP = 4
THREADS_PER_WARPGROUP = WARP_SIZE * WARPS_PER_WARPGROUP
#: The register file of one SM (sm_80 .. sm_90): 64K 32-bit registers.
REGISTERS_PER_SM = 64 * 1024
#: ptxas' per-thread ceiling; a kernel that needs more spills to local memory.
MAX_REGISTERS_PER_THREAD = 255
#: Each of an SM's four sub-partitions owns a quarter of the registers and the warps
#: ``w % 4 == p`` of every resident CTA.
SM_SUBPARTITIONS = 4
#: ``setmaxnreg`` (sm_90a) takes 24..256 registers per thread, in steps of 8.
SETMAXNREG_MIN, SETMAXNREG_MAX, SETMAXNREG_STEP = 24, 256, 8

#: Blocks a launch grid holds along x, y and z (x is the only long one).
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)

# ----------------------------------------------------------------------------------------------
# Memory

KIB = 1024

#: Why ``backend="auto"`` runs torch.matmul on the tcgen05 GPUs: their tensor cores are fed by
#: ``tcgen05.mma``, and wsgemm's only kernels that build there (the ``mma.sync`` family) run the
#: legacy path, far below cuBLAS's tcgen05 kernels.
TCGEN05_REASON = (
    "a tcgen05 GPU, where wsgemm's mma.sync kernels cannot compete with cuBLAS's tcgen05 "
    "kernels (they stay available by name)"
)


@dataclass(frozen=True)
class Target:
    """One compute capability wsgemm builds for: the DSL target its kernels compile for there,
    the shared memory one block may opt into, the kernel families that build and run there
    (``host.registry.Backend.family``), and, where ``backend="auto"`` runs torch.matmul instead
    of a wsgemm kernel, why (``auto_torch``). ``gpus`` names a few of its GPUs, for messages."""

    cc: tuple[int, int]
    arch: str
    smem_per_block: int
    families: tuple[str, ...]
    gpus: str
    auto_torch: str = ""


#: Every GPU wsgemm builds for, one row per compute capability, and the only place that lists
#: them: ``auto``'s route, each backend's GPUs, the compile target and the shared-memory budget
#: all read it. A new GPU is one more row (its sm80-family compile is checked by
#: tests/kernels/test_compile_sass.py).
#:
#: ``smem_per_block`` is the opt-in maximum shared memory per block: the SM's shared memory
#: less the 1 KiB the driver reserves per block (the CUDA programming guide's "maximum amount of
#: shared memory per thread block", docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/
#: compute-capabilities.html; the same numbers as CCCL's ``cuda::arch_traits``,
#: libcudacxx/include/cuda/__device/arch_traits.h). Left out: sm_88 (the DSL, nvidia-cutlass-dsl
#: 4.8.1, has no such target) and everything before sm_80 (no cp.async, no bf16 ``mma.sync``).
TARGETS = (
    Target((8, 0), "sm_80", 163 * KIB, ("sm80",), "A100, A30"),
    Target((8, 6), "sm_86", 99 * KIB, ("sm80",), "RTX 30xx, A10, A40"),
    Target((8, 7), "sm_87", 163 * KIB, ("sm80",), "Jetson Orin"),
    Target((8, 9), "sm_89", 99 * KIB, ("sm80",), "RTX 40xx, L4, L40"),
    Target((9, 0), "sm_90a", 227 * KIB, ("sm90", "sm80"), "H100, H200, GH200"),
    Target((10, 0), "sm_100a", 227 * KIB, ("sm80",), "B200, GB200", TCGEN05_REASON),
    Target((10, 3), "sm_103a", 227 * KIB, ("sm80",), "B300, GB300", TCGEN05_REASON),
    Target((11, 0), "sm_110a", 227 * KIB, ("sm80",), "Jetson Thor", TCGEN05_REASON),
    Target((12, 0), "sm_120a", 99 * KIB, ("sm80",), "RTX 50xx, RTX PRO 6000 Blackwell"),
    Target((12, 1), "sm_121a", 99 * KIB, ("sm80",), "DGX Spark (GB10)"),
)
_BY_CC = {t.cc: t for t in TARGETS}

#: The largest dynamic shared memory one block may opt into, per DSL target (``TARGETS``'s).
SMEM_PER_BLOCK = {t.arch: t.smem_per_block for t in TARGETS}


def cc_name(cc: tuple[int, int]) -> str:
    """``"sm_86"`` for compute capability (8, 6)."""
    return f"sm_{cc[0]}{cc[1]}"


def target(cc: tuple[int, int]) -> Target | None:
    """The row of :data:`TARGETS` for compute capability ``cc``, or None: no wsgemm kernel
    builds for it."""
    return _BY_CC.get(tuple(cc))


def family_gpus(family: str) -> str:
    """Where a kernel family runs, in words for an error message:
    ``"sm_80 (A100, A30), sm_86 (RTX 30xx, A10, A40), ..."``."""
    return ", ".join(f"{cc_name(t.cc)} ({t.gpus})" for t in TARGETS if family in t.families)


def check_arch(arch: str) -> str:
    """``arch`` if it is a DSL target wsgemm builds for, else ``ValueError``."""
    if arch not in SMEM_PER_BLOCK:
        raise ValueError(f"unknown target {arch!r}; known: {', '.join(SMEM_PER_BLOCK)}")
    return arch


def smem_per_block(arch: str) -> int:
    """Opt-in shared memory per block of ``arch`` (:data:`SMEM_PER_BLOCK`)."""
    return SMEM_PER_BLOCK[check_arch(arch)]


def archs_from(major: int) -> tuple[str, ...]:
    """The targets of :data:`SMEM_PER_BLOCK` of compute capability ``major`` or later: those a
    kernel family that needs that capability builds for."""
    return tuple(arch for arch in SMEM_PER_BLOCK if arch_major(arch) >= major)


def smallest_smem_per_block(archs) -> int:
    """The shared memory a block may use on every one of ``archs``: the smallest budget."""
    return min(smem_per_block(arch) for arch in archs)


def arch_major(arch: str) -> int:
    """The compute-capability major of a target: 8 for ``"sm_86"``, 9 for ``"sm_90a"``."""
    digits = "".join(ch for ch in check_arch(arch) if ch.isdigit())  # "90" of "sm_90a"
    return int(digits[:-1])


def has_mbarrier_try_wait(arch: str) -> bool:
    """``mbarrier.try_wait`` (the waiting thread is suspended in hardware) exists from sm_90;
    older targets poll with ``mbarrier.test_wait``."""
    return arch_major(arch) >= 9


#: TMA and cp.async move 16-byte vectors: base pointers and non-unit strides of the operands
#: are multiples of it, and every global<->shared copy moves one per thread per instruction.
VECTOR_BYTES = 16
VECTOR_BITS = 8 * VECTOR_BYTES


def vector_elems(dtype: Any) -> int:
    """Elements of ``dtype`` in one 16-byte vector."""
    return VECTOR_BYTES // element_bytes(dtype)


def int_ranges(values: list[int]) -> str:
    """Sorted ints as runs, for people to read (SMs, CTAs): ``[0, 1, 2, 5]`` -> ``"0-2, 5"``,
    ``[]`` -> ``"none"``."""
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out) or "none"


#: A swizzled shared buffer starts on this boundary: the 128-byte swizzle pattern repeats every
#: 1 KiB (8 rows of 128 bytes), so the swizzle is a function of the buffer offset alone.
SWIZZLE_ATOM_BYTES = 1024
#: One mbarrier is an 8-byte word of shared memory.
MBARRIER_BYTES = 8


class BarrierId(enum.IntEnum):
    """Named hardware barriers (``bar.sync id, count``) the kernels use; 0 is ``__syncthreads``.
    Ping-pong kernels use ``base + warpgroup`` (two ids each) for the per-warpgroup ones."""

    SYNC_THREADS = 0
    EPILOGUE = 1  # the threads that write the output (ping-pong: + warpgroup)
    MMA_ORDER = 3  # ping-pong: + warpgroup whose turn it is to issue its MMAs
    EPI_ORDER = 5  # ping-pong: + warpgroup whose turn it is to run its epilogue


# ----------------------------------------------------------------------------- fused epilogues
# The compile-time choice of a fused epilogue (``wsgemm.kernels.epilogue``), here because the
# host's compile key names it without importing a kernel module.

#: Where a bias vector runs along: "col" adds ``bias[n]`` to every row (``nn.Linear``'s bias),
#: "row" adds ``bias[m]`` to every column. In the kernel's own (M, N): under swap-AB the host
#: turns the caller's column bias into the transposed problem's row bias (``swapped``).
BIAS_MODES = ("none", "row", "col")
#: The activations, applied in fp32 after the bias: "relu2" is relu(x)², "gelu" the erf form
#: (torch's default), "gelu_tanh" torch's ``approximate="tanh"``, "silu" x·sigmoid(x).
ACTIVATIONS = ("none", "relu", "relu2", "gelu", "gelu_tanh", "silu")
#: A row scale's vector: none, fp32, or the inputs' dtype ("input"); each result row ``m`` is
#: multiplied by ``scale[m]`` (a mixture-of-experts router weight on the down projection).
ROW_SCALES = ("none", "fp32", "input")


@dataclass(frozen=True)
class Epilogue:
    """``D = act(alpha · acc + beta · C + bias)``: ``bias`` one of ``BIAS_MODES``,
    ``activation`` one of ``ACTIVATIONS``. The default is the plain epilogue (convert and
    store), whose compiled code is the kernel's code before fused epilogues existed.

    ``scale``: the accumulators are multiplied by ``alpha``; ``residual``: ``beta`` times C is
    added, C the output's own value before the call (the kernel reads each element of C
    before it stores it: an in-place residual, ``C = alpha · A B + beta · C``), or with
    ``c_tensor`` a tensor of its own (a launch argument of the output's shape and major, read
    the same way: no copy of it into the output first). ``alpha`` and ``beta`` are launch
    arguments: only "alpha is 1" (no ``scale``) and "beta is 0" (no ``residual``) are
    compiled in.

    ``gated``: a gated linear unit, ``D = act(acc[:, :N]) * acc[:, N:]`` of a product ``2N``
    wide (SwiGLU with "silu", GeGLU with "gelu" or "gelu_tanh"), writing an N-wide output: the
    kernel's B view (N, K, L) holds the gate's rows and the up projection's N rows follow them
    in memory (one ``[w_gate; w_up]`` weight, K-major). Its bias, if any, is "col" and 2N long,
    ``[b_gate; b_up]``: ``D = act(acc[:, :N] + b_gate) * (acc[:, N:] + b_up)``.

    ``row_scale``: ``D[m, :]`` multiplied by ``scale[m]`` last, after the activation (or the
    gated unit), the vector one of ``ROW_SCALES`` (its element type; a launch argument of the
    kernel's M rows: no swap-AB form).

    ``preact``: the pre-activation a backward reads, stored too, into the ``residual`` launch
    argument. With ``gated`` the product ``[gate | up]`` (plus its bias): an (M, 2N) tensor of
    the output's dtype given as an (M, N, 1) view of its gate half (the up half N columns on,
    as ``dgated``'s); else ``acc + bias`` before the activation (``dact``'s C): a tensor of the
    output's shape, dtype and major (an unsplit cooperative row tile: no swap-AB form).

    ``dgated``: the gated unit's gradient, fused into the GEMM that computes ``dh`` (the
    gradient of ``act(gate) * up``: a gated MLP's ``d_out @ W_down``): C (the ``residual``
    launch argument) is the saved pre-activation ``[gate | up]`` and the output ``[dgate |
    dup]``, each (M, 2N), their up halves N columns after their gate halves: ``dgate = acc ·
    up · act'(gate)``, ``dup = acc · act(gate)``. Both are given as (M, N, 1) views of their
    gate halves (N a multiple of 16 bytes; the kernel reads them as (M, N, 2)); no bias, alpha,
    residual or row scale.

    ``dact``: an activation's gradient, fused into the GEMM that computes ``dh`` (the gradient
    of ``h = act(pre)``: a plain MLP's ``d_out @ W_down``): C (the ``residual`` launch argument,
    of the output's shape and major) is the saved pre-activation and the output ``dpre = acc ·
    act'(C)``, read per subtile as a residual's C is; no bias, alpha, residual, row scale or
    gated output. Elementwise in C, it is its own swap-AB form (C and the output both
    M-major there); no split or grouped form."""

    bias: str = "none"
    activation: str = "none"
    gated: bool = False
    scale: bool = False
    residual: bool = False
    c_tensor: bool = False
    row_scale: str = "none"
    dgated: bool = False
    preact: bool = False
    dact: bool = False

    def __post_init__(self) -> None:
        if self.bias not in BIAS_MODES:
            raise ValueError(f"bias mode {self.bias!r}; allowed: {', '.join(BIAS_MODES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        if self.gated and self.activation == "none":
            raise ValueError(
                "a gated epilogue takes an activation (silu: SwiGLU, gelu or gelu_tanh: GeGLU, "
                "relu, relu2)"
            )
        if self.gated and (self.scale or self.residual):
            raise ValueError("a gated epilogue takes no alpha and no residual")
        if self.c_tensor and not self.residual:
            raise ValueError("c_tensor names where a residual's C is read: it needs residual")
        if self.row_scale not in ROW_SCALES:
            raise ValueError(
                f"row scale {self.row_scale!r}; allowed: {', '.join(ROW_SCALES)}"
            )  # fmt: skip
        if self.preact and (
            self.row_scale != "none" or self.activation == "none" or self.scalars
            or self.dgated or self.dact
        ):  # fmt: skip
            raise ValueError(
                "preact (the pre-activation stored too) needs an activation (a gated one or "
                "not), without a row scale, alpha or residual"
            )
        if self.dgated and (
            self.activation == "none" or self.gated or self.scale or self.residual
            or self.c_tensor or self.bias != "none" or self.row_scale != "none"
        ):  # fmt: skip
            raise ValueError(
                "a dgated epilogue (the gated unit's gradient) takes an activation and nothing "
                "else: no bias, alpha, residual, row scale or gated output"
            )
        if self.dact and (
            self.activation == "none" or self.gated or self.dgated or self.preact or self.scale
            or self.residual or self.c_tensor or self.bias != "none" or self.row_scale != "none"
        ):  # fmt: skip
            raise ValueError(
                "a dact epilogue (an activation's gradient) takes an activation and nothing "
                "else: no bias, alpha, residual, row scale or gated output"
            )

    @property
    def plain(self) -> bool:
        return (
            self.bias == "none" and self.activation == "none" and not self.scale
            and not self.residual and self.row_scale == "none"
        )  # fmt: skip

    @property
    def rides_cluster_split(self) -> bool:
        """Whether a cluster split kernel (``Sm90Config.cluster_split``) runs this epilogue:
        the plain, bias and activation ones; not one that reads a C (residual, dgated, dact),
        stores a pre-activation or gates (their loads and buffers are rank 0's alone, not yet
        built). Elsewhere the split goes through the workspace (``host.Route.for_epilogue``)."""
        return not (self.reads_c or self.preact or self.gated or self.dgated or self.dact)

    @property
    def reads_c(self) -> bool:
        """Whether the kernel reads a C by TMA into its epilogue buffers (``residual``: the
        output's own or ``c_tensor``'s; ``dgated`` and ``dact``: the saved pre-activation)."""
        return self.residual or self.dgated or self.dact

    @property
    def own_c(self) -> bool:
        """Whether the kernel takes a tensor of the output's kind as a launch argument
        (``residual``): a residual's C (``c_tensor``), the saved pre-activation (``dgated``,
        ``dact``) or where the pre-activation goes (``preact``)."""
        return self.c_tensor or self.dgated or self.preact or self.dact

    @property
    def reads_c_per_subtile(self) -> bool:
        """Whether each output subtile reads its own C subtile into its buffer before it is
        stored (``residual``'s loop: a residual's C, or ``dact``'s pre-activation); a dgated
        tile reads two per product subtile (its own loop)."""
        return self.residual or self.dact

    @property
    def scalars(self) -> bool:
        """Whether the kernel takes ``alpha`` and ``beta`` (launch arguments)."""
        return self.scale or self.residual

    @property
    def name(self) -> str:
        """ "none", or the pieces joined by "+" ("bias_col", "bias_col+gelu", "silu"): the form
        compile keys and ``parse`` use."""
        flags = (("scale", self.scale), ("residual", self.residual), ("c_tensor", self.c_tensor))
        parts = [p for p, on in flags if on]
        if self.bias != "none":
            parts.append(f"bias_{self.bias}")
        if self.gated:
            parts.append("gated")
        if self.dgated:
            parts.append("dgated")
        if self.dact:
            parts.append("dact")
        if self.preact:
            parts.append("preact")
        if self.activation != "none":
            parts.append(self.activation)
        if self.row_scale != "none":
            parts.append(f"row_scale_{self.row_scale}")
        return "+".join(parts) or "none"

    @classmethod
    def parse(cls, name: str) -> Epilogue:
        """The epilogue ``name`` names (``Epilogue.parse(e.name) == e``)."""
        if not isinstance(name, str):
            raise TypeError(f"an epilogue name is a str, got {type(name).__name__}")
        bias, activation, row_scale, flags = "none", "none", "none", set()
        for part in name.split("+") if name != "none" else ():
            if part.startswith("bias_"):
                bias = part[len("bias_") :]
            elif part.startswith("row_scale_"):
                row_scale = part[len("row_scale_") :]
            elif part in ("gated", "dgated", "dact", "preact", "scale", "residual", "c_tensor"):
                flags.add(part)
            else:
                activation = part
        return cls(
            bias, activation, "gated" in flags, "scale" in flags, "residual" in flags,
            "c_tensor" in flags, row_scale, "dgated" in flags, "preact" in flags, "dact" in flags,
        )  # fmt: skip

    def swapped(self) -> Epilogue:
        """The same epilogue on the transposed problem (swap-AB): rows and columns trade."""
        if self.gated or self.dgated:
            raise ValueError("a gated epilogue pairs columns: it has no swap-AB form")
        if self.preact:
            raise ValueError("a preact output runs on a row tile: it has no swap-AB form")
        if self.row_scale != "none":
            raise ValueError("a row scale runs along the kernel's rows: it has no swap-AB form")
        trade = {"row": "col", "col": "row", "none": "none"}
        return replace(self, bias=trade[self.bias])


PLAIN = Epilogue()
