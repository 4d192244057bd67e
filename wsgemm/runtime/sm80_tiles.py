"""What the two sm80 kernels (cp.async loads, ldmatrix + mma.sync) share.

``Sm80Config`` and its budgets, the shared-memory layouts, the tiled copies and the tiled MMA,
the per-thread operand loaders (global -> shared, residue-aware), the fragment readers (shared ->
registers) and the epilogue (accumulators -> shared -> 16-byte global stores). The kernels only
differ in who loads and how loads and MMAs are synchronised.

Residues. The k-tile loop runs over ``ceil(K / tile_k)`` tiles with the *first* one shifted to
start at ``K - tile_k * k_tiles <= 0`` (CUTLASS's "residue first"): only that tile holds
out-of-range k, and it is loaded into a zero-filled stage. Rows beyond M (N) are never copied
in any k-tile, so they stay zero in every stage. The zero fill happens once, before the loads.
Every 16-byte vector is entirely in or out of range, because the contract makes the major
mode's extent a multiple of 8 (one vector); so each copy is predicated per vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from wsgemm.runtime.sm80_pipeline import target_is_hopper
from wsgemm.support import (
    MAX_REGISTERS_PER_THREAD,
    MBARRIER_BYTES,
    REGISTERS_PER_SM,
    SM_SUBPARTITIONS,
    SWIZZLE_ATOM_BYTES,
    VECTOR_BITS,
    WARP_SIZE,
    WARPS_PER_WARPGROUP,
    BarrierId,
    check_dtypes,
    smem_per_block,
)

#: m16n8k16: the fp16/bf16 ``mma.sync`` shape of sm_80..sm_90.
MMA_INST_MNK = (16, 8, 16)
#: Warps of the tiled MMA along M and N: ``Sm80Config.mma_warps_m`` x ``mma_warps_n``.
_MMA_WARPS_CHOICES = (2, 4)
#: Warps of a warpgroup, the unit `setmaxnreg` acts on (sm_90a).
WARPGROUP_WARPS = WARPS_PER_WARPGROUP
#: Every global<->shared copy moves one 16-byte vector per thread per instruction.
COPY_BITS = VECTOR_BITS
#: The epilogue's barrier among the MMA threads.
EPILOGUE_BARRIER_ID = int(BarrierId.EPILOGUE)
SUBPARTITION_REGISTERS = REGISTERS_PER_SM // SM_SUBPARTITIONS

_TILE_MN_CHOICES = (64, 96, 128, 192, 256)
_TILE_K_CHOICES = (32, 64)
_STAGE_RANGE = (3, 8)


def vector_elems(dtype) -> int:
    """Elements in one 16-byte vector of ``dtype``."""
    return COPY_BITS // dtype.width


#: What an :class:`Sm80Config` may be built for: every GPU of the family, or Hopper only.
TARGETS = ("sm_80", "sm_90a")


def smem_capacity_bytes(target: str = "sm_80") -> int:
    """Opt-in shared memory per block: for ``target="sm_80"`` configs that of sm_86/sm_89
    (99 KiB), the smallest of the GPUs this backend serves (sm_80 has 163 KiB), so one config
    runs on all of them; for ``"sm_90a"`` configs Hopper's 227 KiB."""
    if target not in TARGETS:
        raise ValueError(f"unknown sm80 config target {target!r}; choose one of {TARGETS}")
    if target == "sm_90a":
        return smem_per_block("sm_90a")
    return min(smem_per_block(arch) for arch in ("sm_80", "sm_86", "sm_89"))


def _elem_bytes(dtype) -> int:
    return dtype.width // 8


@dataclass(frozen=True)
class Sm80Config:
    """CTA tile and shared-memory ring depth of the sm80 kernels.

    ``tile_m``/``tile_n`` in {64, 96, 128, 192, 256} (96 and 192 are for ``tile_m``: no 96- or
    192-wide C slab splits over the epilogue's threads; M/N-major operands of a 96-row tile use
    64-byte shared rows instead of 128-byte ones), ``tile_k``
    in {32, 64} (an even number of 16-deep k-blocks, for the two-slot fragment buffer),
    ``stages`` in [3, 8] and the A/B ring within :func:`smem_capacity_bytes` of ``target``
    (sm_89's 99 KiB unless ``target="sm_90a"``). ``ctas_per_sm``
    (1-4) is the residency the launch promises ptxas (``min_blocks_per_mp``): with more than one
    CTA per SM, ptxas caps registers so that many fit, which trades registers for warps that
    hide each other's latency.

    ``mma_warps_m`` x ``mma_warps_n`` in {2, 4} x {2, 4}, not 4 x 4: the MMA (consumer) warps
    form that grid of m16n8k16 warps, so a CTA has 4 or 8 of them, each owning a
    (tile_m / mma_warps_m) x (tile_n / mma_warps_n) block of C. ``tile_m`` must be a multiple
    of ``16 * mma_warps_m`` and ``tile_n`` of ``16 * mma_warps_n`` (each warp takes two n8
    atoms per step). 2 x 2 is the study design (128x256: 64x128 per warp); 2 x 4 gives 128x256
    the per-warp tile and registers of 128x128 with 2x2 warps (64x64) and twice the warps;
    4 x 2 on 192x128 gives eight warps of 48x64, whose fp32 accumulators fit the 168
    registers of a 288-thread CTA. Thread counts, the epilogue's barrier, the arrive counts
    and the register budget all follow from it (:attr:`mma_threads`).
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 32
    stages: int = 3
    ctas_per_sm: int = 1
    mma_warps_n: int = 2
    mma_warps_m: int = 2
    #: Warps that load, in the specialized kernel only: 1 is the study design; 2 or 4 spread
    #: the copies over as many SM sub-partitions (a measured departure, docs/perf.md entry 8).
    producer_warps: int = 1
    #: 1: a CTA whose tile has every row in range loads it without row predicates, from a
    #: second copy of the loading loop (fewer instructions per copy; docs/perf.md); 0: one
    #: predicated loop for every tile.
    fast_interior: int = 1
    #: 1 (specialized kernel, ``target="sm_90a"`` only): the producer warp(s) sit in a
    #: warpgroup of their own, padded to four warps, which ``setmaxnreg`` shrinks to
    #: :data:`HANDOFF_PRODUCER_REGISTERS` so the eight consumer warps (``mma_warps`` must be 8)
    #: grow past the 168 registers a 12-warp CTA launches with to
    #: :data:`HANDOFF_CONSUMER_REGISTERS`: eight 64x64 fp32 warps fit (docs/perf.md entry 9).
    #: Ampere and Ada have no ``setmaxnreg``; the shipped configs keep 0.
    register_handoff: int = 0
    #: "sm_80": runs on every GPU of the family (sm_80, sm_86, sm_89, sm_90a), within sm_89's
    #: 99 KiB of shared memory; "sm_90a": Hopper only (its 227 KiB, ``register_handoff``).
    target: str = "sm_80"

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(
                f"Sm80Config.target={self.target!r} is not allowed; choose one of {TARGETS}"
            )
        if type(self.producer_warps) is not int or self.producer_warps not in (1, 2, 4):
            raise ValueError(f"Sm80Config.producer_warps={self.producer_warps!r} must be 1, 2 or 4")
        if type(self.fast_interior) is not int or self.fast_interior not in (0, 1):
            raise ValueError(f"Sm80Config.fast_interior={self.fast_interior!r} must be 0 or 1")
        if type(self.register_handoff) is not int or self.register_handoff not in (0, 1):
            raise ValueError(
                f"Sm80Config.register_handoff={self.register_handoff!r} must be 0 or 1"
            )
        if self.register_handoff and (
            self.mma_warps_m * self.mma_warps_n != 8
            or self.ctas_per_sm != 1
            or self.target != "sm_90a"
            or self.producer_warps != 1
        ):
            # (producer_warps 2 and 4 would load from the warpgroup's idle warps: they compile
            # spill-free but have not run on a GPU yet.)
            raise ValueError(
                "Sm80Config.register_handoff=1 needs target='sm_90a' (setmaxnreg), 8 MMA warps "
                "(two consumer warpgroups), ctas_per_sm=1 and producer_warps=1, got "
                f"target={self.target!r}, {self.mma_warps_m} x {self.mma_warps_n} warps, "
                f"ctas_per_sm={self.ctas_per_sm}, producer_warps={self.producer_warps}"
            )
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
        need = smem_bytes(self, cutlass.Float16, cutlass.Float16, barrier_stages=self.stages)
        if need > smem_capacity_bytes(self.target):
            where = "sm_90a" if self.target == "sm_90a" else "sm_89; target='sm_90a' allows more"
            raise ValueError(
                f"Sm80Config {self.tile_m}x{self.tile_n}x{self.tile_k} with {self.stages} stages "
                f"needs {need} bytes of shared memory; at most "
                f"{smem_capacity_bytes(self.target)} are allowed ({where}): use fewer stages "
                "or a smaller tile"
            )

    @property
    def tile_shape_mnk(self) -> tuple[int, int, int]:
        return (self.tile_m, self.tile_n, self.tile_k)

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
        if self.register_handoff:
            # ptxas budgets the launch for exactly one CTA of ``threads`` (168 registers for
            # 384) and keeps the setmaxnreg hand-over.
            return {"min_blocks_per_mp": 1, "max_number_threads": [threads, 1, 1]}
        if self.ctas_per_sm == 1:
            return {}
        return {
            "min_blocks_per_mp": self.ctas_per_sm,
            "max_number_threads": [threads, 1, 1],
            "preferred_smem_carveout": 100,
        }


# ----------------------------------------------------------------------------------------------
# Budgets


def ab_smem_bytes(config: Sm80Config, ab_dtype) -> int:
    """The A and B rings: ``stages`` tiles of (tile_m + tile_n) x tile_k."""
    return (config.tile_m + config.tile_n) * config.tile_k * config.stages * _elem_bytes(ab_dtype)


def epilogue_tile_n(config: Sm80Config, ab_dtype, c_dtype) -> int:
    """Columns of C staged through shared memory per epilogue pass: the whole tile when it fits
    in the A/B ring it reuses, else the largest half, quarter... that does (fp32 C of a 128x256
    tile is 128 KiB, more than the 72 KiB ring)."""
    epi_n = config.tile_n
    while config.tile_m * epi_n * _elem_bytes(c_dtype) > ab_smem_bytes(config, ab_dtype):
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
    return config.tile_m * epilogue_tile_n(config, ab_dtype, c_dtype) * _elem_bytes(c_dtype)


def barrier_bytes(stages: int) -> int:
    """A full and an empty 8-byte mbarrier per stage (0 stages: no mbarrier pipeline)."""
    return 2 * MBARRIER_BYTES * stages


#: Registers per thread after ``setmaxnreg`` with ``Sm80Config.register_handoff``. The CTA
#: launches 12 warps at 168 each (its pool: 168 x 384 threads); the producer warpgroup (the
#: loading warp and three that exit) drops to 56 and the two consumer warpgroups rise to 224:
#: 56 x 128 + 224 x 256 = 168 x 384. 56 holds the producer's unrolled interior loop; its loop
#: for edge tiles is rolled (``OperandLoader._load_rolled``): fully unrolled, it spilled at 88
#: (its 48-96 copy addresses are all computed before the first copy). 224 holds eight 64x64
#: fp32 consumers (a 104 / 200 split spilled in every variant).
HANDOFF_PRODUCER_REGISTERS = 56
HANDOFF_CONSUMER_REGISTERS = 224

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
    return config.tile_m * config.tile_n * acc_dtype.width // (32 * config.mma_threads)


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


def register_budget(threads: int, ctas_per_sm: int = 1) -> int:
    """Registers per thread ptxas allows a CTA of ``threads`` with ``ctas_per_sm`` resident:
    the fullest SM sub-partition holds ceil(warps / 4) warps, and allocation is in units of 8
    (why 160 threads x 2 CTAs and 288 threads x 1 CTA both get 168, 256 x 1 gets 255)."""
    warps = ctas_per_sm * math.ceil(threads / WARP_SIZE)
    per_subpartition = math.ceil(warps / SM_SUBPARTITIONS)
    budget = SUBPARTITION_REGISTERS // (per_subpartition * WARP_SIZE) // 8 * 8
    return min(budget, MAX_REGISTERS_PER_THREAD)


# ----------------------------------------------------------------------------------------------
# Operands


def check_target(config: Sm80Config, kernel_name: str) -> None:
    """Trace-time: a ``target="sm_90a"`` config compiles for Hopper (sm_90) only."""
    if config.target == "sm_90a" and not target_is_hopper():
        raise ValueError(
            f"{kernel_name}: this Sm80Config has target='sm_90a' (Hopper's shared memory or "
            "setmaxnreg); other GPUs take target='sm_80' configs"
        )


def check_operands(mA, mB, mC, ab_dtype, c_dtype) -> None:
    """Trace-time checks of the kernel contract the layouts depend on."""
    for name, tensor, dtype in (("A", mA, ab_dtype), ("B", mB, ab_dtype), ("C", mC, c_dtype)):
        if tensor.element_type is not dtype:
            raise ValueError(f"{name} is {tensor.element_type}, the kernel was built for {dtype}")
        major_mode(tensor)
    if major_mode(mC) != 1:
        raise ValueError("C must be N-major (row-major (M, N)): the epilogue stores along N")


# ----------------------------------------------------------------------------------------------
# Static layouts, copies and the tiled MMA (built while tracing; no run-time cost)


def major_mode(tensor: cute.Tensor) -> int:
    """0 if mode 0 of ``tensor`` has a static stride of 1, 1 if mode 1 has (the contract
    guarantees exactly one of the first two does)."""
    for mode in (0, 1):
        stride = tensor.stride[mode]
        if cute.is_static(stride) and stride == 1:
            return mode
    raise ValueError(f"neither of the first two modes of {tensor.layout} has a static stride 1")


def make_tiled_mma(ab_dtype, acc_dtype, warps_m: int, warps_n: int) -> cute.TiledMma:
    """``warps_m`` x ``warps_n`` warps of m16n8k16; each warp takes two n8 atoms per
    (16 * warps_n)-wide N step, so one ldmatrix.x4 fills a 16x16 B fragment."""
    op = warp.MmaF16BF16Op(ab_dtype, acc_dtype, MMA_INST_MNK)
    permutation = (
        warps_m * MMA_INST_MNK[0],
        warps_n * MMA_INST_MNK[1] * 2,
        MMA_INST_MNK[2],
    )
    return cute.make_tiled_mma(op, cute.make_layout((warps_m, warps_n, 1)), permutation)


def mn_atom_vectors(tile_mn: int, dtype) -> int:
    """16-byte vectors per row of an M/N-major shared atom: 8 (128-byte rows, Swizzle<3,3,3>)
    when they tile ``tile_mn``, else 4 (64-byte rows, Swizzle<2,3,3>: 96-row tiles). With 64-byte
    rows two rows fill the 32 banks and the row-pair index picks one of four chunk orders, so
    the 8 rows one ldmatrix reads are again 8 different bank groups."""
    vec = vector_elems(dtype)
    return 8 if tile_mn % (8 * vec) == 0 else 4


def make_ab_smem_layout(dtype, k_major: bool, tile_mn: int, tile_k: int, stages: int):
    """(tile_mn, tile_k, stages) ring of Swizzle<3,3,3> atoms: 8 x tile_k for K-major operands,
    64 x 8 for M/N-major ones (32 x 8 under Swizzle<2,3,3> for 96-row tiles:
    :func:`mn_atom_vectors`). The swizzle XORs the 128-byte line index into the 16-byte chunk
    index, so the eight 16-byte rows one ldmatrix reads sit in eight different bank groups."""
    vec = vector_elems(dtype)
    if k_major:
        swizzle = cute.make_swizzle(3, int(math.log2(vec)), 3)
        outer = cute.make_layout((8, tile_k), stride=(tile_k, 1))
    else:
        chunks = mn_atom_vectors(tile_mn, dtype)
        swizzle = cute.make_swizzle(int(math.log2(chunks)), int(math.log2(vec)), 3)
        mn_atom = chunks * vec
        outer = cute.make_layout((mn_atom, 8), stride=(1, mn_atom))
    atom = cute.make_composed_layout(swizzle, 0, outer)
    return cute.tile_to_shape(atom, (tile_mn, tile_k, stages), (0, 1, 2))


def make_c_smem_layout(dtype, tile_m: int, epi_n: int):
    """(tile_m, epi_n) row-major slab of 8 x (8 vectors) atoms, Swizzle<3, log2(vec), 3>: the
    accumulator stores of a warp (8 rows x one 16-byte chunk) hit 8 different bank groups and
    each 16-byte vector read stays contiguous."""
    vec = vector_elems(dtype)
    swizzle = cute.make_swizzle(3, int(math.log2(vec)), 3)
    outer = cute.make_layout((8, 8 * vec), stride=(8 * vec, 1))
    atom = cute.make_composed_layout(swizzle, 0, outer)
    return cute.tile_to_shape(atom, (tile_m, epi_n), (1, 0))


def make_g2s_copy(dtype, k_major: bool, num_threads: int, tile_mn: int, tile_k: int):
    """cp.async.cg 16-byte copies; threads run along the major mode first so each warp reads
    whole contiguous row segments of global memory."""
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
        dtype,
        num_bits_per_copy=COPY_BITS,
    )
    vec = vector_elems(dtype)
    if k_major:
        # Whole rows of the k-tile (64 or 128 bytes) per group of threads: one instruction reads
        # num_threads / along full rows. (Two threads per 64-byte row, a 32-byte sector each,
        # shares addresses between a thread's copies but doubles the lines an instruction
        # touches: both kernels lost 10-30% on the H200, docs/perf.md entry 7.)
        along = tile_k // vec
        threads = cute.make_layout((num_threads // along, along), stride=(along, 1))
        values = cute.make_layout((1, vec))
        covers = (num_threads // along, tile_k)
    else:
        # Threads along MN: as many as divide both the vectors of a column and the threads
        # (16 of 32 for a 128-wide tile, 8 of 32 for a 192-wide one).
        along = math.gcd(tile_mn // vec, num_threads)
        threads = cute.make_layout((along, num_threads // along), stride=(1, along))
        values = cute.make_layout((vec, 1))
        covers = (along * vec, num_threads // along)
    # One pass of the threads must tile the (tile_mn, tile_k) tile exactly: no thread idles or
    # copies a vector twice.
    if num_threads % along or tile_mn % covers[0] or tile_k % covers[1]:
        raise ValueError(
            f"{num_threads} threads cannot split a {tile_mn}x{tile_k} tile into 16-byte copies"
        )
    return cute.make_tiled_copy_tv(atom, threads, values)


def make_s2r_copy(dtype, k_major: bool, tiled_mma: cute.TiledMma, operand: str):
    """ldmatrix.x4 matching the MMA's fragment layout; transposed for M/N-major operands."""
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(not k_major, 4), dtype)
    if operand == "A":
        return cute.make_tiled_copy_A(atom, tiled_mma)
    return cute.make_tiled_copy_B(atom, tiled_mma)


@dataclass(frozen=True)
class Sm80Tiles:
    """Everything static a kernel body needs for one (config, dtypes, operand majors)."""

    config: Sm80Config
    ab_dtype: type
    c_dtype: type
    acc_dtype: type
    a_k_major: bool
    b_k_major: bool
    load_threads: int
    epi_n: int

    @property
    def k_blocks(self) -> int:
        """16-deep MMA k-blocks per k-tile."""
        return self.config.tile_k // MMA_INST_MNK[2]

    def tiled_mma(self) -> cute.TiledMma:
        c = self.config
        return make_tiled_mma(self.ab_dtype, self.acc_dtype, c.mma_warps_m, c.mma_warps_n)

    def smem_layout_a(self):
        c = self.config
        return make_ab_smem_layout(self.ab_dtype, self.a_k_major, c.tile_m, c.tile_k, c.stages)

    def smem_layout_b(self):
        c = self.config
        return make_ab_smem_layout(self.ab_dtype, self.b_k_major, c.tile_n, c.tile_k, c.stages)

    def smem_layout_c(self):
        return make_c_smem_layout(self.c_dtype, self.config.tile_m, self.epi_n)

    def g2s_copy_a(self):
        c = self.config
        return make_g2s_copy(self.ab_dtype, self.a_k_major, self.load_threads, c.tile_m, c.tile_k)

    def g2s_copy_b(self):
        c = self.config
        return make_g2s_copy(self.ab_dtype, self.b_k_major, self.load_threads, c.tile_n, c.tile_k)


def make_tiles(
    config: Sm80Config, ab_dtype, c_dtype, acc_dtype, mA, mB, load_threads: int
) -> Sm80Tiles:
    return Sm80Tiles(
        config=config,
        ab_dtype=ab_dtype,
        c_dtype=c_dtype,
        acc_dtype=acc_dtype,
        a_k_major=major_mode(mA) == 1,
        b_k_major=major_mode(mB) == 1,
        load_threads=load_threads,
        epi_n=epilogue_tile_n(config, ab_dtype, c_dtype),
    )


# ----------------------------------------------------------------------------------------------
# Shared memory carving


@dataclass(frozen=True)
class SmemViews:
    """The A/B ring and the epilogue slab over one buffer (the slab reuses the ring)."""

    sA: cute.Tensor  # (tile_m, tile_k, stages)
    sB: cute.Tensor  # (tile_n, tile_k, stages)
    sC: cute.Tensor  # (tile_m, epi_n)
    buffer: cute.Pointer
    ab_bytes: int


def carve_smem(tiles: Sm80Tiles, buffer: cute.Pointer) -> SmemViews:
    layout_a = tiles.smem_layout_a()
    layout_b = tiles.smem_layout_b()
    a_ptr = cute.recast_ptr(buffer, dtype=tiles.ab_dtype)
    sA = cute.make_tensor(a_ptr, layout_a)
    sB = cute.make_tensor(a_ptr + cute.cosize(layout_a), layout_b)
    sC = cute.make_tensor(cute.recast_ptr(buffer, dtype=tiles.c_dtype), tiles.smem_layout_c())
    return SmemViews(sA, sB, sC, buffer, ab_smem_bytes(tiles.config, tiles.ab_dtype))


@cute.jit
def zero_fill(
    buffer: cute.Pointer, num_bytes: cutlass.Constexpr, tid, num_threads: cutlass.Constexpr
):
    """Zero ``num_bytes`` of shared memory with 16-byte stores spread over ``num_threads``."""
    num_vectors = num_bytes // 16
    words = cute.make_tensor(
        cute.recast_ptr(buffer, dtype=cutlass.Int32), cute.make_layout((4, num_vectors))
    )
    zeros = cute.make_rmem_tensor(cute.make_layout(4), cutlass.Int32)
    zeros.fill(0)
    for i in cutlass.range_constexpr((num_vectors + num_threads - 1) // num_threads):
        v = i * num_threads + tid
        if v < num_vectors:
            cute.autovec_copy(zeros, words[None, v])


# ----------------------------------------------------------------------------------------------
# Global -> shared: one operand's per-thread copies


#: Row groups per trip of :meth:`OperandLoader._load_rolled`'s loop.
ROLLED_UNROLL = 4


@dataclass(frozen=True)
class OperandLoader:
    """One thread's cp.async work for one operand (A or B) of one CTA tile."""

    tiled_copy: cute.TiledCopy
    tXgX: cute.Tensor  # (CPY, CPY_MN, CPY_K, k_tiles) global source, residue-shifted along k
    tXsX: cute.Tensor  # (CPY, CPY_MN, CPY_K, stages) shared destination
    tXcX: cute.Tensor  # (CPY, CPY_MN, CPY_K, k_tiles) (mn, k) coordinates of the source
    tXpX: cute.Tensor  # (CPY_V, CPY_MN, CPY_K) row-in-range predicates, broadcast along k
    #: Whether every row of the CTA's tile is in range (run-time, uniform over the CTA).
    interior: cutlass.Boolean
    #: Rows of the operand (M or N), for predicates computed where they are used.
    extent_mn: cutlass.Int32
    #: Edge tiles through :meth:`_load_rolled` (a producer with few registers:
    #: ``register_handoff``), static.
    rolled_edges: bool = False

    @cute.jit
    def load(self, k_tile, stage, predicated: cutlass.Constexpr = True):
        """A k-tile after the first: every k is in range; rows are predicated unless the
        caller knows the tile is ``interior`` (then each copy is one instruction, with no
        predicate to rebuild: the producer warp's budget, docs/sm80.md)."""
        if cutlass.const_expr(predicated and self.rolled_edges):
            self._load_rolled(k_tile, stage)
        else:
            # Row group by row group, the k-direction copies of a row group back to back: they
            # share one address (constant offsets), which the compiler then computes once.
            for i in cutlass.range_constexpr(cute.size(self.tXsX, mode=[1])):
                cute.copy(
                    self.tiled_copy,
                    self.tXgX[None, i, None, k_tile],
                    self.tXsX[None, i, None, stage],
                    pred=self.tXpX[None, i, None] if predicated else None,
                )

    @cute.jit
    def _load_rolled(self, k_tile, stage):
        """:meth:`load` with row predicates, for a producer with few registers: a loop over
        the row groups (mode 1 of the partition), unrolled :data:`ROLLED_UNROLL` times, so only
        their addresses are live at once (fully unrolled, ptxas computes every copy's 64-bit
        address before the first copy: 96 registers for 48 copies); each row predicate is
        compared where it is used instead of kept in a mask. K-major operands have a row group
        per 4 or 8 rows; an M/N-major 128- or 256-wide tile has one, whose k-direction copies
        stay unrolled."""
        vecs = self.tXsX.shape[0][1]
        for i in cutlass.range(cute.size(self.tXsX, mode=[1]), unroll=ROLLED_UNROLL):
            pred = cute.make_rmem_tensor(
                cute.make_layout((vecs, cute.size(self.tXsX, mode=[2])), stride=(1, 0)),
                cutlass.Boolean,
            )
            for v in cutlass.range_constexpr(vecs):
                pred[v, 0] = _row_in_range(self.tXcX, v, i, self.extent_mn)
            cute.copy(
                self.tiled_copy,
                self.tXgX[None, i, None, k_tile],
                self.tXsX[None, i, None, stage],
                pred=pred,
            )

    @cute.jit
    def load_first(self, stage):
        """k-tile 0 holds the k residue: vectors at negative (shifted) k are skipped and keep
        the zeros of the stage."""
        for k in cutlass.range_constexpr(cute.size(self.tXsX, mode=[2])):
            if cute.elem_less(cutlass.Int32(-1), self.tXcX[0, 0, k, 0][1]):
                cute.copy(
                    self.tiled_copy,
                    self.tXgX[None, None, k, 0],
                    self.tXsX[None, None, k, stage],
                    pred=self.tXpX[None, None, k],
                )


def _row_in_range(tXcX: cute.Tensor, v, i, extent_mn):
    """Whether vector ``v`` of row group ``i`` of a thread's copies lies in rows [0, extent)."""
    return cute.elem_less(tXcX[(0, v), i, 0, 0][0], extent_mn)


@cute.jit
def make_operand_loader(
    tiled_copy: cute.TiledCopy,
    mX: cute.Tensor,
    sX: cute.Tensor,
    tile_mn: cutlass.Constexpr,
    tile_k: cutlass.Constexpr,
    tile_idx,
    tid,
    rolled_edges: cutlass.Constexpr = False,
) -> OperandLoader:
    """``mX``: one batch of the operand, (MN, K); ``tile_idx``: this CTA's tile along MN;
    ``rolled_edges``: see :attr:`OperandLoader.rolled_edges`."""
    gX = cute.local_tile(mX, (tile_mn, tile_k), (tile_idx, None))  # (tile_mn, tile_k, k_tiles)
    cX = cute.local_tile(cute.make_identity_tensor(mX.shape), (tile_mn, tile_k), (tile_idx, None))
    # Shift the k-tiles so the partial one is first (its start is <= 0).
    residue_k = cute.size(mX, mode=[1]) - tile_k * cute.size(gX, mode=[2])
    gX = cute.domain_offset((0, residue_k, 0), gX)
    cX = cute.domain_offset((0, residue_k, 0), cX)
    # The shift is a multiple of 8 elements along a stride-1 K or a K stride that is a
    # multiple of 8, so every k-tile still starts on a 16-byte boundary.
    gX = cute.make_tensor(gX.iterator.align(16), gX.layout)

    thr = tiled_copy.get_slice(tid)
    tXgX = thr.partition_S(gX)
    tXsX = thr.partition_D(sX)
    tXcX = thr.partition_S(cX)
    tXpX = cute.make_rmem_tensor(
        cute.make_layout(
            (tXsX.shape[0][1], cute.size(tXsX, mode=[1]), cute.size(tXsX, mode=[2])),
            stride=(cute.size(tXsX, mode=[1]), 1, 0),
        ),
        cutlass.Boolean,
    )
    extent_mn = cute.size(mX, mode=[0])
    for v in cutlass.range_constexpr(tXpX.shape[0]):
        for i in cutlass.range_constexpr(tXpX.shape[1]):
            tXpX[v, i, 0] = _row_in_range(tXcX, v, i, extent_mn)
    interior = (tile_idx + 1) * tile_mn <= extent_mn
    return OperandLoader(tiled_copy, tXgX, tXsX, tXcX, tXpX, interior, extent_mn, rolled_edges)


# ----------------------------------------------------------------------------------------------
# Shared -> registers: one operand's fragments, two k-block slots


@dataclass(frozen=True)
class FragmentReader:
    """ldmatrix of one k-block of one operand into one of two register slots."""

    tiled_copy: cute.TiledCopy
    tCsX: cute.Tensor  # (CPY, CPY_MN, k_blocks, stages) shared source
    tCrX_copy: cute.Tensor  # (CPY, CPY_MN, 2) the two slots, as the copy sees them

    @cute.jit
    def load(self, k_block, stage, slot):
        cute.copy(
            self.tiled_copy,
            self.tCsX[None, None, k_block, stage],
            self.tCrX_copy[None, None, slot],
        )


@dataclass(frozen=True)
class MmaFragments:
    """One MMA thread's operand fragments (two k-block slots each) and their readers."""

    tCrA: cute.Tensor  # (MMA, MMA_M, 2)
    tCrB: cute.Tensor  # (MMA, MMA_N, 2)
    read_a: FragmentReader
    read_b: FragmentReader

    @cute.jit
    def load(self, k_block, stage, slot):
        self.read_a.load(k_block, stage, slot)
        self.read_b.load(k_block, stage, slot)

    @cute.jit
    def mma(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, slot):
        cute.gemm(tiled_mma, acc, self.tCrA[None, None, slot], self.tCrB[None, None, slot], acc)


@cute.jit
def make_mma_fragments(tiles: Sm80Tiles, tiled_mma, sA, sB, tid) -> MmaFragments:
    c = tiles.config
    # Fragments of two k-blocks only, whatever tile_k is: the register double buffer.
    two_k_blocks = 2 * MMA_INST_MNK[2]
    tCrA = tiled_mma.make_fragment_A(tiled_mma.partition_shape_A((c.tile_m, two_k_blocks)))
    tCrB = tiled_mma.make_fragment_B(tiled_mma.partition_shape_B((c.tile_n, two_k_blocks)))
    copy_a = make_s2r_copy(tiles.ab_dtype, tiles.a_k_major, tiled_mma, "A")
    copy_b = make_s2r_copy(tiles.ab_dtype, tiles.b_k_major, tiled_mma, "B")
    thr_a = copy_a.get_slice(tid)
    thr_b = copy_b.get_slice(tid)
    read_a = FragmentReader(copy_a, thr_a.partition_S(sA), thr_a.retile(tCrA))
    read_b = FragmentReader(copy_b, thr_b.partition_S(sB), thr_b.retile(tCrB))
    return MmaFragments(tCrA, tCrB, read_a, read_b)


def make_accumulators(tiles: Sm80Tiles, tiled_mma: cute.TiledMma) -> cute.Tensor:
    """(MMA, MMA_M, MMA_N) accumulators of the whole CTA tile, zeroed."""
    c = tiles.config
    acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((c.tile_m, c.tile_n)))
    acc.fill(0.0)
    return acc


# ----------------------------------------------------------------------------------------------
# Epilogue: accumulators -> output dtype -> swizzled shared slab -> 16-byte global stores


@cute.jit
def store_accumulators(
    tiles: Sm80Tiles,
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    sC: cute.Tensor,
    mC: cute.Tensor,
    tile_mn,
    tid,
):
    """Write this CTA's (tile_m, tile_n) tile of ``mC`` (one batch, (M, N), N-major).

    Runs on the ``config.mma_threads`` MMA threads only (``tid`` in [0, mma_threads)) and
    synchronises them with named barrier :data:`EPILOGUE_BARRIER_ID`, which counts exactly
    those threads; the first barrier also guarantees that every MMA warp is done
    reading the A/B ring before the slab overwrites it. The tile goes out in passes of
    ``epi_n`` columns when the whole of it does not fit in the ring.
    """
    c = tiles.config
    c_dtype = tiles.c_dtype
    vec = vector_elems(c_dtype)
    epi_n = tiles.epi_n
    mma_threads = c.mma_threads
    barrier = cutlass.pipeline.NamedBarrier(barrier_id=EPILOGUE_BARRIER_ID, num_threads=mma_threads)

    # Registers -> shared: two adjacent columns per store, the MMA's accumulator pairs.
    r2s = cute.make_tiled_copy_C(
        cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), c_dtype, num_bits_per_copy=2 * c_dtype.width
        ),
        tiled_mma,
    )
    thr_r2s = r2s.get_slice(tid)
    tRsC = thr_r2s.partition_D(sC)
    pass_layout = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((c.tile_m, epi_n))).layout
    pass_size = cute.size(pass_layout)

    # Shared -> global: one 16-byte vector per thread, threads along N, whole rows per pass of
    # the threads (``epilogue_tile_n`` checked that they divide the slab).
    along_n = epi_n // vec
    s2g = cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), c_dtype, num_bits_per_copy=COPY_BITS),
        cute.make_layout((mma_threads // along_n, along_n), stride=(along_n, 1)),
        cute.make_layout((1, vec)),
    )
    thr_s2g = s2g.get_slice(tid)
    tSsC = thr_s2g.partition_S(sC)  # (CPY, CPY_M, CPY_N)

    gC = cute.local_tile(mC, (c.tile_m, c.tile_n), tile_mn)
    cC = cute.local_tile(cute.make_identity_tensor(mC.shape), (c.tile_m, c.tile_n), tile_mn)
    extent = mC.shape
    for p in cutlass.range_constexpr(c.tile_n // epi_n):
        # The accumulators' N mode is the outermost, so a pass is a contiguous run of them.
        acc_pass = cute.make_tensor(acc.iterator + p * pass_size, pass_layout)
        out = cute.make_fragment_like(acc_pass, c_dtype)
        out.store(acc_pass.load().to(c_dtype))
        # Pass 0: every MMA warp is done with the A/B ring. Later passes: done reading the slab.
        barrier.arrive_and_wait()
        cute.copy(r2s, thr_r2s.retile(out), tRsC)
        barrier.arrive_and_wait()

        gC_pass = cute.local_tile(gC, (c.tile_m, epi_n), (0, p))
        cC_pass = cute.local_tile(cC, (c.tile_m, epi_n), (0, p))
        tSgC = thr_s2g.partition_D(gC_pass)
        tScC = thr_s2g.partition_D(cC_pass)
        tSrC = cute.make_fragment_like(tSsC)
        cute.autovec_copy(tSsC, tSrC)
        for m in cutlass.range_constexpr(cute.size(tSrC, mode=[1])):
            for n in cutlass.range_constexpr(cute.size(tSrC, mode=[2])):
                coord = tScC[0, m, n]
                if cute.elem_less(coord[0], extent[0]) and cute.elem_less(coord[1], extent[1]):
                    cute.copy(s2g, tSrC[None, m, n], tSgC[None, m, n])


class Sm80Kernel:
    """What both sm80 kernel classes share: the contract's attributes, a validated constructor
    and the host entry (``kernel``); each subclass sets ``name``, ``threads``, ``device_call``
    (and ``load_threads`` when not every thread loads) and writes its own roles."""

    name = "sm80"
    arch = "sm_80"
    # cp.async moves whole 16-byte vectors: the host pads unit-stride extents to 8 elements
    needs_vector_extent = True

    def __init__(self, config: Sm80Config, ab_dtype, c_dtype, acc_dtype):
        if not isinstance(config, Sm80Config):
            raise ValueError(f"{self.name} takes an Sm80Config, got {type(config).__name__}")
        check_dtypes(ab_dtype, c_dtype, acc_dtype)
        self.config = config
        self.ab_dtype = ab_dtype
        self.c_dtype = c_dtype
        self.acc_dtype = acc_dtype

    @property
    def load_threads(self) -> int:
        """Threads that issue the cp.async copies (all of them, or the producer warps)."""
        return self.threads

    @cute.jit
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """The host's entry: check the operands, build the static tiles, launch one CTA per
        (tile_m, tile_n) output tile and batch with the config's shared memory and launch
        bounds. Each kernel class supplies ``device_call`` (its traced ``@cute.kernel``)."""
        check_operands(mA, mB, mC, self.ab_dtype, self.c_dtype)
        c = self.config
        check_target(c, self.name)
        tiles = make_tiles(
            c, self.ab_dtype, self.c_dtype, self.acc_dtype, mA, mB, self.load_threads
        )
        self.device_call(mA, mB, mC, tiles).launch(
            grid=cute.ceil_div(mC.shape, (c.tile_m, c.tile_n, 1)),
            block=[self.threads, 1, 1],
            smem=self.shared_memory_bytes(),
            stream=stream,
            **c.launch_bounds(self.threads),
        )

    # ``cute.compile(kernel_object, ...)`` (the host's call) compiles ``__call__``.
    __call__ = kernel


# ----------------------------------------------------------------------------------------------
# Shipped configs

#: Both kernels ship the same tile, stages and warps (the ablation compares like with like),
#: chosen by measurement on the H200 (docs/perf.md, entries 3-4 and 7; scripts/sm80_study.sh):
#: the specialized kernel's fastest, run by the baseline too. The one field that may differ is
#: ``fast_interior``: a second, unpredicated copy of the loading loop is worth +16% (fp32) and
#: +6% (fp16) to the single producer warp; to the multistage kernel, whose loads share the MMA
#: loop's code, it cost 3-7% on most configs (entry 7).
#: fp32 accumulators: 128x128x64, 3 stages (96 KiB), 2x2 warps of 64x64 (the study layout;
#: WS 210-215 registers x 160 threads, one CTA an SM; multistage 246-255 x 128, two). Whole
#: 128-byte rows per k-tile halve the global lines and shared wavefronts of every cp.async
#: against 64-byte ones. The baseline keeps ``fast_interior=1`` here: without it, it ran 3%
#: faster on the measured fp16 TN variant but spilled 16 bytes in two of its 48 fp32 variants
#: (bf16 in, fp32 out, A M-major; docs/perf.md quotes both). Eight warps of 48x64 (4x2 on
#: 192x128) fit the 9-warp CTA's 168 registers but measured ~6% slower for the specialized
#: kernel; eight warps of 64x64 do not fit (:func:`register_budget` (288) = 168 < 128
#: accumulators + 64 fragments).
SHIPPED_CONFIGS = {
    "sm80": Sm80Config(tile_m=128, tile_n=128, tile_k=64, stages=3, mma_warps_n=2),
    "sm80-multistage": Sm80Config(tile_m=128, tile_n=128, tile_k=64, stages=3, mma_warps_n=2),
}
#: fp16 accumulators pack two per register: 128x256x32, 4 stages, 2x4 warps of 64x64 (WS 144
#: registers x 288 threads, multistage 166 x 256; 96 KiB ring + 1 KiB alignment + mbarriers
#: fits sm_89's 99 KiB; fp32 C goes out in two 128-column passes). The baseline without the
#: unpredicated loop copy (``fast_interior=0``): 5% faster for it.
SHIPPED_FP16_ACC_CONFIGS = {
    "sm80": Sm80Config(tile_m=128, tile_n=256, tile_k=32, stages=4, mma_warps_n=4),
    "sm80-multistage": Sm80Config(
        tile_m=128, tile_n=256, tile_k=32, stages=4, mma_warps_n=4, fast_interior=0
    ),
}


def shipped_config(name: str, acc_dtype) -> Sm80Config:
    """The largest spill-free config of kernel ``name`` for this accumulator dtype."""
    table = SHIPPED_FP16_ACC_CONFIGS if acc_dtype is cutlass.Float16 else SHIPPED_CONFIGS
    if name not in table:
        raise ValueError(f"no sm80 kernel named {name!r}; known: {sorted(table)}")
    return table[name]
