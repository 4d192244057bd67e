"""Shared-memory and register budgets of the Hopper (sm_90a) warp-specialized GEMM.

Plain Python on static tile facts, so the numbers can be tested without a GPU and read in
one place. Each function says where its number comes from.
"""

from __future__ import annotations

from wsgemm.support import (
    MBARRIER_BYTES,
    REGISTERS_PER_SM,
    SETMAXNREG_MAX,
    SETMAXNREG_MIN,
    SETMAXNREG_STEP,
    SWIZZLE_ATOM_BYTES,
    THREADS_PER_WARPGROUP,
    smem_per_block,
)

__all__ = [
    "SM90_REGISTERS_PER_SM",
    "SM90_SMEM_CAPACITY",
    "SMEM_BUFFER_ALIGN",
    "STATIC_SMEM_BYTES",
    "epilogue_stage_bytes",
    "mainloop_stage_bytes",
    "register_split",
    "reserved_smem_bytes",
    "stage_counts",
]

# The largest dynamic shared memory one block may opt into on sm_90 (227 KiB).
SM90_SMEM_CAPACITY = smem_per_block("sm_90a")
SM90_REGISTERS_PER_SM = REGISTERS_PER_SM
# ptxas gives a kernel whose dynamic smem is 1 KiB-aligned a 1 KiB static smem section (seen in
# the cubin); it counts against the same per-block limit, so the budget keeps it free.
STATIC_SMEM_BYTES = 1024
# Swizzled TMA/WGMMA buffers start on 1 KiB boundaries (the 128B swizzle pattern repeats
# every 1024 bytes, and the descriptors assume the pattern starts at the buffer).
SMEM_BUFFER_ALIGN = SWIZZLE_ATOM_BYTES
# The epilogue keeps at least this many smem buffers so one TMA store can drain while the next
# subtile is written; more are added only from smem the mainloop ring cannot use.
MIN_EPILOGUE_STAGES = 2
MAX_EPILOGUE_STAGES = 4
# The producer warpgroup only issues TMA and walks the schedule (a few divisions per tile);
# 40 registers hold that without spilling, the rest goes to the accumulators.
PRODUCER_REGISTERS = 40


def mainloop_stage_bytes(tile_m: int, tile_n: int, tile_k: int, ab_bytes: int) -> int:
    """One ring stage holds an A tile (tile_m x tile_k) and a B tile (tile_n x tile_k)."""
    return (tile_m + tile_n) * tile_k * ab_bytes


def epilogue_stage_bytes(epi_m: int, epi_n: int, c_bytes: int) -> int:
    """One epilogue buffer holds one output subtile in the output dtype."""
    return epi_m * epi_n * c_bytes


def reserved_smem_bytes(ab_stages_upper_bound: int = 64) -> int:
    """The mbarrier pairs (full + empty, 8 bytes each, per stage) sit before the first swizzled
    buffer, which starts at the next 1 KiB boundary: one alignment unit covers them."""
    barrier_bytes = 2 * MBARRIER_BYTES * ab_stages_upper_bound
    return -(-barrier_bytes // SMEM_BUFFER_ALIGN) * SMEM_BUFFER_ALIGN


def stage_counts(
    ab_stage_bytes: int,
    epi_stage_bytes: int,
    num_epi_subtiles: int,
    capacity: int = SM90_SMEM_CAPACITY,
) -> tuple[int, int]:
    """(mainloop stages, epilogue stages) that fit in ``capacity`` bytes of shared memory
    (less the static section).

    The mainloop ring gets every stage that fits beside the barriers and the minimum epilogue
    buffers (deeper rings hide more TMA latency); epilogue buffers then take what is left, up to
    ``MAX_EPILOGUE_STAGES`` and never more than there are subtiles in a tile.
    """
    min_epi = min(MIN_EPILOGUE_STAGES, num_epi_subtiles)
    capacity -= STATIC_SMEM_BYTES
    free = capacity - reserved_smem_bytes() - min_epi * epi_stage_bytes
    ab_stages = free // ab_stage_bytes
    if ab_stages < 2:
        raise ValueError(
            f"a {ab_stage_bytes}-byte mainloop stage leaves room for {ab_stages} stage(s) in "
            f"{capacity} bytes of shared memory; at least 2 are needed to overlap load and MMA"
        )
    left = capacity - reserved_smem_bytes() - ab_stages * ab_stage_bytes
    epi_stages = min(MAX_EPILOGUE_STAGES, num_epi_subtiles, left // epi_stage_bytes)
    return ab_stages, epi_stages


def register_split(
    num_consumer_warpgroups: int, threads_per_warpgroup: int = THREADS_PER_WARPGROUP
) -> tuple[int, int]:
    """(producer, consumer) registers per thread after ``setmaxnreg``.

    The producer warpgroup drops to ``PRODUCER_REGISTERS``; the consumer warpgroups share the
    rest of the register file equally, rounded down to the step of 8 that setmaxnreg needs, so
    the total never exceeds 64K registers.
    """
    per_thread_pool = SM90_REGISTERS_PER_SM // threads_per_warpgroup
    consumer = (per_thread_pool - PRODUCER_REGISTERS) // num_consumer_warpgroups
    consumer = min(SETMAXNREG_MAX, consumer // SETMAXNREG_STEP * SETMAXNREG_STEP)
    if consumer < SETMAXNREG_MIN:
        raise ValueError(f"{num_consumer_warpgroups} consumer warpgroups leave too few registers")
    total = threads_per_warpgroup * (PRODUCER_REGISTERS + num_consumer_warpgroups * consumer)
    assert total <= SM90_REGISTERS_PER_SM, total
    return PRODUCER_REGISTERS, consumer
