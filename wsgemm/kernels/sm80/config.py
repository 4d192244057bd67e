"""The sm80 family's static configuration and its budgets: what a kernel is built with.

``Sm80Config`` (CTA tile, ring depth, warps; validated eagerly), the shared-memory and register
budgets it must fit (named functions, each saying where its number comes from) and the shipped
configs. Plain Python: dtypes may be given in any vocabulary ``wsgemm.support`` knows.
"""

from __future__ import annotations

from dataclasses import dataclass

from wsgemm.kernels.common.budget import barrier_bytes, register_budget
from wsgemm.support import (
    MAX_REGISTERS_PER_THREAD,
    SWIZZLE_ATOM_BYTES,
    WARP_SIZE,
    arch_major,
    archs_from,
    dtype_name,
    element_bytes,
    smallest_smem_per_block,
    smem_per_block,
    vector_elems,
)

__all__ = [
    "BUFFER_ALIGN_BYTES",
    "FULL_SMEM_CARVEOUT_PERCENT",
    "MAX_REGISTERS_PER_THREAD",
    "MIN_ARCH_MAJOR",
    "MMA_INST_MNK",
    "SHIPPED_CONFIGS",
    "SHIPPED_FP16_ACC_CONFIGS",
    "Sm80Config",
    "archs",
    "ab_smem_bytes",
    "accumulator_registers",
    "barrier_bytes",
    "epilogue_smem_bytes",
    "epilogue_tile_n",
    "fragment_registers",
    "mainloop_registers",
    "register_budget",
    "shipped_config",
    "smem_bytes",
    "smem_capacity_bytes",
]

#: m16n8k16: the fp16/bf16 ``mma.sync`` shape of sm_80..sm_90.
MMA_INST_MNK = (16, 8, 16)
#: Warps of the tiled MMA along M and N: ``Sm80Config.mma_warps_m`` x ``mma_warps_n``.
_MMA_WARPS_CHOICES = (2, 4)

_TILE_MN_CHOICES = (64, 96, 128, 192, 256)
_TILE_K_CHOICES = (32, 64)
_STAGE_RANGE = (3, 8)

#: cp.async and ldmatrix + mma.sync (m16n8k16) exist from compute capability 8.0 on.
MIN_ARCH_MAJOR = 8
#: ``preferred_smem_carveout`` of a launch with several CTAs per SM: all of the unified L1 /
#: shared memory as shared, so the residency promised to ptxas is not cut by the carveout.
FULL_SMEM_CARVEOUT_PERCENT = 100


def archs() -> tuple[str, ...]:
    """The DSL targets the sm80 kernels build for (``support.SMEM_PER_BLOCK``'s, from 8.0)."""
    return archs_from(MIN_ARCH_MAJOR)


def smem_capacity_bytes(arch: str | None = None) -> int:
    """Opt-in shared memory per block of ``arch``, the target a kernel compiles for; with no
    arch, the smallest of the family's targets (sm_86/sm_89's 99 KiB), so a config within it
    runs on every GPU the family serves."""
    if arch is None:
        return smallest_smem_per_block(archs())
    if arch_major(arch) < MIN_ARCH_MAJOR:  # (an unknown target raises here, naming the known)
        raise ValueError(f"the sm80 kernels need sm_80 or later, got {arch!r}")
    return smem_per_block(arch)


@dataclass(frozen=True)
class Sm80Config:
    """CTA tile and shared-memory ring depth of the sm80 kernels.

    ``tile_m``/``tile_n`` in {64, 96, 128, 192, 256} (96 and 192 are for ``tile_m``: no 96- or
    192-wide C slab splits over the epilogue's threads; M/N-major operands of a 96-row tile use
    64-byte shared rows instead of 128-byte ones), ``tile_k``
    in {32, 64} (an even number of 16-deep k-blocks, for the two-slot fragment buffer),
    ``stages`` in [3, 8]. ``ctas_per_sm``
    (1-4) is the residency the launch promises ptxas (``min_blocks_per_mp``): with more than one
    CTA per SM, ptxas caps registers so that many fit, which trades registers for warps that
    hide each other's latency.

    Shared memory is a property of the target, so :meth:`check_smem` is separate: the kernels
    call it with the arch they compile for; without one it takes the smallest budget of the
    family (sm_86/sm_89's 99 KiB), which every shipped config fits.

    ``mma_warps_m`` x ``mma_warps_n`` in {2, 4} x {2, 4}, not 4 x 4: the MMA (consumer) warps
    form that grid of m16n8k16 warps, so a CTA has 4 or 8 of them, each owning a
    (tile_m / mma_warps_m) x (tile_n / mma_warps_n) block of C. ``tile_m`` must be a multiple
    of ``16 * mma_warps_m`` and ``tile_n`` of ``16 * mma_warps_n`` (each warp takes two n8
    atoms per step). Thread counts, the epilogue's barrier, the arrive counts and the register
    budget all follow from it (:attr:`mma_threads`).

    ``fast_interior``: 1 loads a tile whose rows are all in range without row predicates, from
    a second copy of the loading loop (fewer instructions per copy); 0: one predicated loop.
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 32
    stages: int = 3
    ctas_per_sm: int = 1
    mma_warps_n: int = 2
    mma_warps_m: int = 2
    fast_interior: int = 1

    def __post_init__(self) -> None:
        if type(self.fast_interior) is not int or self.fast_interior not in (0, 1):
            raise ValueError(f"Sm80Config.fast_interior={self.fast_interior!r} must be 0 or 1")
        if self.ctas_per_sm not in (1, 2, 3, 4):
            raise ValueError(f"Sm80Config.ctas_per_sm={self.ctas_per_sm!r} must be 1, 2, 3 or 4")
        for name in ("mma_warps_m", "mma_warps_n"):
            value = getattr(self, name)
            if value not in _MMA_WARPS_CHOICES or isinstance(value, bool):
                raise ValueError(
                    f"Sm80Config.{name}={value!r} is not allowed; choose one of "
                    f"{_MMA_WARPS_CHOICES} (a mma_warps_m x mma_warps_n grid of MMA warps)"
                )
        if self.mma_warps > 8:
            raise ValueError(
                f"Sm80Config.mma_warps_m x mma_warps_n = {self.mma_warps_m} x {self.mma_warps_n}"
                " is not allowed: at most 8 MMA warps"
            )
        for name in ("tile_m", "tile_n", "tile_k", "stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"Sm80Config.{name} must be an int, got {value!r}")
        for name in ("tile_m", "tile_n"):
            if getattr(self, name) not in _TILE_MN_CHOICES:
                raise ValueError(
                    f"Sm80Config.{name}={getattr(self, name)} is not allowed; "
                    f"choose one of {_TILE_MN_CHOICES}"
                )
        if self.tile_k not in _TILE_K_CHOICES:
            raise ValueError(
                f"Sm80Config.tile_k={self.tile_k} is not allowed; choose one of {_TILE_K_CHOICES}"
            )
        lo, hi = _STAGE_RANGE
        if not lo <= self.stages <= hi:
            raise ValueError(f"Sm80Config.stages={self.stages} must be in [{lo}, {hi}]")
        if self.tile_m % self.mma_tile_m:
            raise ValueError(
                f"Sm80Config.tile_m={self.tile_m} with mma_warps_m={self.mma_warps_m} is not "
                f"allowed: tile_m must be a multiple of {self.mma_tile_m} (16 per M warp)"
            )
        if self.tile_n % self.mma_tile_n:
            raise ValueError(
                f"Sm80Config.tile_n={self.tile_n} with mma_warps_n={self.mma_warps_n} is not "
                f"allowed: tile_n must be a multiple of {self.mma_tile_n} (16 per N warp)"
            )
        # The epilogue's passes of C split over the MMA threads (raises if they cannot).
        epilogue_tile_n(self, "float16", "float16")

    def check_smem(self, arch: str | None = None) -> None:
        """Raise ``ValueError`` unless the kernels' shared memory fits
        :func:`smem_capacity_bytes` of ``arch`` (None: every target of the family). The A/B
        ring and the mbarriers of the specialized kernel are the most either kernel uses with
        any dtypes (the epilogue reuses the ring)."""
        need = smem_bytes(self, "float16", "float16", barrier_stages=self.stages)
        capacity = smem_capacity_bytes(arch)
        if need > capacity:
            where = arch or f"the smallest of {', '.join(archs())}"
            raise ValueError(
                f"Sm80Config {self.tile_m}x{self.tile_n}x{self.tile_k} with {self.stages} stages "
                f"needs {need} bytes of shared memory; at most {capacity} are allowed "
                f"({where}): use fewer stages or a smaller tile"
            )

    @property
    def cluster_size(self) -> int:
        """CTAs per cluster: one (the sm80 kernels launch no clusters)."""
        return 1

    @property
    def mma_warps(self) -> int:
        """Warps that run the MMA and the epilogue (consumers in the WS kernel)."""
        return self.mma_warps_m * self.mma_warps_n

    @property
    def mma_threads(self) -> int:
        return self.mma_warps * WARP_SIZE

    @property
    def mma_tile_m(self) -> int:
        """Rows of the tiled MMA's permutation: one m16 atom per M warp."""
        return self.mma_warps_m * MMA_INST_MNK[0]

    @property
    def mma_tile_n(self) -> int:
        """Columns of the tiled MMA's permutation: two n8 atoms per N warp."""
        return self.mma_warps_n * MMA_INST_MNK[1] * 2

    @property
    def warp_tile_mn(self) -> tuple[int, int]:
        """The block of C one MMA warp owns."""
        return (self.tile_m // self.mma_warps_m, self.tile_n // self.mma_warps_n)

    def launch_bounds(self, threads: int) -> dict:
        """Launch keywords that tell ptxas the block size and residency to budget registers for
        (a carveout is given so the DSL does not query a device for it: this compiles GPU-less)."""
        if self.ctas_per_sm == 1:
            return {}
        return {
            "min_blocks_per_mp": self.ctas_per_sm,
            "max_number_threads": [threads, 1, 1],
            "preferred_smem_carveout": FULL_SMEM_CARVEOUT_PERCENT,
        }


# ----------------------------------------------------------------------------------------------
# Budgets


def ab_smem_bytes(config: Sm80Config, ab_dtype) -> int:
    """The A and B rings: ``stages`` tiles of (tile_m + tile_n) x tile_k."""
    return (config.tile_m + config.tile_n) * config.tile_k * config.stages * element_bytes(ab_dtype)


def epilogue_tile_n(config: Sm80Config, ab_dtype, c_dtype) -> int:
    """Columns of C staged through shared memory per epilogue pass: the whole tile when it fits
    in the A/B ring it reuses, else the largest half, quarter... that does (fp32 C of a 128x256
    tile is 128 KiB, more than the 72 KiB ring)."""
    epi_n = config.tile_n
    while config.tile_m * epi_n * element_bytes(c_dtype) > ab_smem_bytes(config, ab_dtype):
        epi_n //= 2
    # A pass is a whole number of the tiled MMA's N steps (a contiguous run of accumulators)
    # and of 8-vector swizzle atoms.
    if epi_n < max(8 * vector_elems(c_dtype), config.mma_tile_n):
        raise ValueError(f"{config} leaves too little shared memory for a {c_dtype} epilogue")
    # The 16-byte stores: rows of epi_n / vec threads, a whole number of rows per pass.
    along_n = epi_n // vector_elems(c_dtype)
    if config.mma_threads % along_n or config.tile_m % (config.mma_threads // along_n):
        raise ValueError(
            f"{config.mma_threads} threads cannot store a {config.tile_m}x{epi_n} slab"
        )
    return epi_n


def epilogue_smem_bytes(config: Sm80Config, ab_dtype, c_dtype) -> int:
    """One epilogue pass: a (tile_m, epilogue_tile_n) slab of C in the output dtype."""
    return config.tile_m * epilogue_tile_n(config, ab_dtype, c_dtype) * element_bytes(c_dtype)


#: Alignment of the A/B/C buffer: a whole 8x64 swizzle atom of 16-bit elements (1 KiB) starts
#: on a boundary, so the swizzle is a function of the buffer offset alone.
BUFFER_ALIGN_BYTES = SWIZZLE_ATOM_BYTES


def smem_bytes(config: Sm80Config, ab_dtype, c_dtype, *, barrier_stages: int) -> int:
    """Dynamic shared memory of a CTA: the epilogue reuses the A/B ring, so the buffer is the
    max of the two needs, not their sum; the mbarriers sit in front of it."""
    buffer = max(ab_smem_bytes(config, ab_dtype), epilogue_smem_bytes(config, ab_dtype, c_dtype))
    return BUFFER_ALIGN_BYTES + buffer + barrier_bytes(barrier_stages)


def accumulator_registers(config: Sm80Config, acc_dtype) -> int:
    """32-bit registers of one MMA thread's accumulators (fp16 ones pack two per register)."""
    return config.tile_m * config.tile_n * element_bytes(acc_dtype) // (4 * config.mma_threads)


def fragment_registers(config: Sm80Config) -> int:
    """32-bit registers of one MMA thread's A and B fragments, two k-block slots each: per
    warp tile warp_m x 16 of A (4 registers per 16x16) and warp_n x 16 of B (2 per 8x16)."""
    warp_m, warp_n = config.warp_tile_mn
    per_slot = (warp_m // 16) * 4 + (warp_n // 8) * 2
    return 2 * per_slot


def mainloop_registers(config: Sm80Config, acc_dtype) -> int:
    """Registers that stay live through the main loop (before addresses and predicates);
    over :data:`MAX_REGISTERS_PER_THREAD` means the kernel spills for sure."""
    return accumulator_registers(config, acc_dtype) + fragment_registers(config)


# ----------------------------------------------------------------------------------------------
# Shipped configs


#: Both kernels ship the specialized kernel's fastest spill-free tile (the ablation compares
#: like with like); why each number: docs/perf.md entry 14.
SHIPPED_CONFIGS = {
    "sm80": Sm80Config(tile_m=128, tile_n=128, tile_k=64, stages=3, mma_warps_n=2),
    "sm80-multistage": Sm80Config(tile_m=128, tile_n=128, tile_k=64, stages=3, mma_warps_n=2),
}
#: fp16 accumulators pack two per register: a tile twice as wide (docs/perf.md entry 14).
SHIPPED_FP16_ACC_CONFIGS = {
    "sm80": Sm80Config(tile_m=128, tile_n=256, tile_k=32, stages=4, mma_warps_n=4),
    "sm80-multistage": Sm80Config(
        tile_m=128, tile_n=256, tile_k=32, stages=4, mma_warps_n=4, fast_interior=0
    ),
}


def _check_shipped() -> None:
    """A shipped config serves every target: it fits the family's smallest shared memory."""
    for table in (SHIPPED_CONFIGS, SHIPPED_FP16_ACC_CONFIGS):
        for config in table.values():
            config.check_smem()


_check_shipped()


def shipped_config(name: str, acc_dtype) -> Sm80Config:
    """The largest spill-free config of kernel ``name`` for this accumulator dtype."""
    fp16 = dtype_name(acc_dtype) == "float16"
    table = SHIPPED_FP16_ACC_CONFIGS if fp16 else SHIPPED_CONFIGS
    if name not in table:
        raise ValueError(f"no sm80 kernel named {name!r}; known: {sorted(table)}")
    return table[name]
