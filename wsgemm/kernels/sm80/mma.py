"""Shared -> registers -> tensor cores for the sm80 kernels: one operand's fragments in two
k-block slots (ldmatrix), the register accumulators and the mma.sync of a k-block."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass.cute as cute

from wsgemm.kernels.sm80.config import MMA_INST_MNK
from wsgemm.kernels.sm80.plan import Sm80Plan, make_s2r_copy


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
def make_mma_fragments(plan: Sm80Plan, tiled_mma, sA, sB, tid) -> MmaFragments:
    c = plan.config
    # Fragments of two k-blocks only, whatever tile_k is: the register double buffer.
    two_k_blocks = 2 * MMA_INST_MNK[2]
    tCrA = tiled_mma.make_fragment_A(tiled_mma.partition_shape_A((c.tile_m, two_k_blocks)))
    tCrB = tiled_mma.make_fragment_B(tiled_mma.partition_shape_B((c.tile_n, two_k_blocks)))
    copy_a = make_s2r_copy(plan.ab_dtype, plan.a_k_major, tiled_mma, "A")
    copy_b = make_s2r_copy(plan.ab_dtype, plan.b_k_major, tiled_mma, "B")
    thr_a = copy_a.get_slice(tid)
    thr_b = copy_b.get_slice(tid)
    read_a = FragmentReader(copy_a, thr_a.partition_S(sA), thr_a.retile(tCrA))
    read_b = FragmentReader(copy_b, thr_b.partition_S(sB), thr_b.retile(tCrB))
    return MmaFragments(tCrA, tCrB, read_a, read_b)


def make_accumulators(plan: Sm80Plan, tiled_mma: cute.TiledMma) -> cute.Tensor:
    """(MMA, MMA_M, MMA_N) accumulators of the whole CTA tile, zeroed."""
    c = plan.config
    acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((c.tile_m, c.tile_n)))
    acc.fill(0.0)
    return acc
