"""The static plan of an sm80 kernel: everything fixed when it is traced.

``Sm80Plan`` (config, dtypes, operand majors, load threads, epilogue width), the shared-memory
layouts, the tiled copies and the tiled MMA, the carving of the one shared buffer into the A/B
ring and the epilogue slab, and the trace-time operand checks. Built while tracing; no run-time
cost.

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

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from wsgemm.kernels.sm80.config import MMA_INST_MNK, Sm80Config, ab_smem_bytes, epilogue_tile_n
from wsgemm.support import VECTOR_BITS, VECTOR_BYTES, vector_elems

#: Every global<->shared copy moves one 16-byte vector per thread per instruction.
COPY_BITS = VECTOR_BITS


def check_operands(mA, mB, mC, ab_dtype, c_dtype) -> None:
    """Trace-time checks of the kernel contract the layouts depend on."""
    for name, tensor, dtype in (("A", mA, ab_dtype), ("B", mB, ab_dtype), ("C", mC, c_dtype)):
        if tensor.element_type is not dtype:
            raise ValueError(f"{name} is {tensor.element_type}, the kernel was built for {dtype}")
        major_mode(tensor)
    if major_mode(mC) != 1:
        raise ValueError("C must be N-major (row-major (M, N)): the epilogue stores along N")


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
        # touches: slower for both kernels, docs/perf.md entry 7.)
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
class Sm80Plan:
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


def make_plan(
    config: Sm80Config, ab_dtype, c_dtype, acc_dtype, mA, mB, load_threads: int
) -> Sm80Plan:
    return Sm80Plan(
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


def carve_smem(plan: Sm80Plan, buffer: cute.Pointer) -> SmemViews:
    layout_a = plan.smem_layout_a()
    layout_b = plan.smem_layout_b()
    a_ptr = cute.recast_ptr(buffer, dtype=plan.ab_dtype)
    sA = cute.make_tensor(a_ptr, layout_a)
    sB = cute.make_tensor(a_ptr + cute.cosize(layout_a), layout_b)
    sC = cute.make_tensor(cute.recast_ptr(buffer, dtype=plan.c_dtype), plan.smem_layout_c())
    return SmemViews(sA, sB, sC, buffer, ab_smem_bytes(plan.config, plan.ab_dtype))


@cute.jit
def zero_fill(
    buffer: cute.Pointer, num_bytes: cutlass.Constexpr, tid, num_threads: cutlass.Constexpr
):
    """Zero ``num_bytes`` of shared memory with 16-byte stores spread over ``num_threads``."""
    num_vectors = num_bytes // VECTOR_BYTES
    # A vector as 32-bit words: column v of (words, vectors) is one vectorized store.
    vector_words = VECTOR_BYTES * 8 // cutlass.Int32.width
    words = cute.make_tensor(
        cute.recast_ptr(buffer, dtype=cutlass.Int32), cute.make_layout((vector_words, num_vectors))
    )
    zeros = cute.make_rmem_tensor(cute.make_layout(vector_words), cutlass.Int32)
    zeros.fill(0)
    for i in cutlass.range_constexpr((num_vectors + num_threads - 1) // num_threads):
        v = i * num_threads + tid
        if v < num_vectors:
            cute.autovec_copy(zeros, words[None, v])
