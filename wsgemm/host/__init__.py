"""Host layer, in rooms: ``registry`` (the backends, ``Variant``), ``compiling/`` (compiling
kernel variants, the compile caches), ``choosing/`` (which kernel ``auto`` runs: the sm90 menu,
the measured table, the rules, autotuning) and the dispatcher core, ``dispatch`` (the
``Dispatcher``: device facts, the route of a problem, the kernel memo) and ``workspace``
(split-K's buffers). The launch itself is ``wsgemm.api``'s.

A *variant* is everything a kernel is specialized on: backend (kernel class and config), target
arch, dtypes and the operands' major modes. Problem sizes (M, N, K, L) and the non-unit strides
are run-time values: a new shape never recompiles. Each variant is compiled once per process
(an in-memory dict) and, across processes, once per machine (an on-disk cache keyed by the
variant and a fingerprint of the kernel sources and toolchain versions: ``compiling/disk.py``;
its entries load without the DSL where they hold a shared library: ``compiling/library.py``).
"""

from .choosing.cost import EPILOGUE_MUFU
from .choosing.rules import SWAP_DECODE_MAX_N
from .choosing.tuning import TUNE_TOP
from .compiling.cache import COMPILE_CACHE, CacheError, CompileCache, cache_dir
from .compiling.compile import compile_variant, fake_arguments, make_kernel
from .compiling.warming import warm
from .grouped import (
    GROUPED_BACKENDS,
    RAGGED_K_FAMILIES,
    grouped_config,
    grouped_variants,
    ragged_k_beats_torch,
    ragged_k_config,
    ragged_k_variants,
    ragged_k_workspace_words,
    routes_ragged_k,
    supports_grouped,
    tile_map,
)
from .registry import (
    BACKENDS,
    Backend,
    Variant,
    arch_for_capability,
    cluster_size,
    every_variant,
    fuses_act_grad,
    fuses_epilogues,
    fuses_gated_grad,
    needs_vector_extent,
    reads_c_tensor,
    runs_gated_small,
    runs_gated_swap,
    runs_gated_swap_bias,
    scales_rows,
    shipped_backends,
)

__all__ = [
    "BACKENDS",
    "COMPILE_CACHE",
    "EPILOGUE_MUFU",
    "GROUPED_BACKENDS",
    "RAGGED_K_FAMILIES",
    "SWAP_DECODE_MAX_N",
    "TUNE_TOP",
    "Backend",
    "CacheError",
    "CompileCache",
    "Variant",
    "arch_for_capability",
    "cache_dir",
    "cluster_size",
    "compile_variant",
    "every_variant",
    "fuses_epilogues",
    "fuses_act_grad",
    "fuses_gated_grad",
    "fake_arguments",
    "grouped_config",
    "grouped_variants",
    "ragged_k_config",
    "ragged_k_variants",
    "runs_gated_small",
    "runs_gated_swap",
    "runs_gated_swap_bias",
    "ragged_k_workspace_words",
    "reads_c_tensor",
    "scales_rows",
    "ragged_k_beats_torch",
    "routes_ragged_k",
    "make_kernel",
    "needs_vector_extent",
    "shipped_backends",
    "supports_grouped",
    "tile_map",
    "warm",
]
