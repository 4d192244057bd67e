"""Budgets every kernel family computes the same way: registers per thread and mbarrier bytes.

Plain Python on static facts, so the numbers can be tested without a GPU.
"""

from __future__ import annotations

import math

from wsgemm.support import (
    MAX_REGISTERS_PER_THREAD,
    MBARRIER_BYTES,
    REGISTERS_PER_SM,
    SM_SUBPARTITIONS,
    WARP_SIZE,
)

#: Registers of one SM sub-partition (it holds the warps ``w % 4 == p`` of every resident CTA).
SUBPARTITION_REGISTERS = REGISTERS_PER_SM // SM_SUBPARTITIONS
#: ptxas allocates registers per thread in units of this.
REGISTER_ALLOCATION_UNIT = 8


def register_budget(threads: int, ctas_per_sm: int = 1) -> int:
    """Registers per thread ptxas allows a CTA of ``threads`` with ``ctas_per_sm`` resident:
    the fullest SM sub-partition holds ceil(warps / 4) warps, and allocation is in units of 8
    (why 160 threads x 2 CTAs and 288 threads x 1 CTA both get 168, 256 x 1 gets 255)."""
    warps = ctas_per_sm * math.ceil(threads / WARP_SIZE)
    per_subpartition = math.ceil(warps / SM_SUBPARTITIONS)
    unit = REGISTER_ALLOCATION_UNIT
    budget = SUBPARTITION_REGISTERS // (per_subpartition * WARP_SIZE) // unit * unit
    return min(budget, MAX_REGISTERS_PER_THREAD)


def barrier_bytes(stages: int) -> int:
    """A full and an empty mbarrier per stage (0 stages: no mbarrier pipeline)."""
    return 2 * MBARRIER_BYTES * stages
