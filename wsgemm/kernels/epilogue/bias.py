"""The bias piece of a fused epilogue: one accumulator element's addend.

A bias is a flat vector (``mBias``, the inputs' dtype) along the kernel's M ("row") or N
("col"). An element at tile coordinate (r, c) of the tile at (tile_m0, tile_n0) adds
``bias[tile_m0 + r]`` or ``bias[tile_n0 + c]``. The index is clamped to the vector: a ragged
tile's elements past the edge read the last entry, and the TMA store drops them, so no
element needs a branch.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32


def addend(mode: str, mBias, coord, origin, extent) -> Float32:
    """``mBias``'s entry for the element at tile coordinate ``coord`` ((row, col)), in fp32;
    ``origin`` is the tile's first (row, col) in the problem, ``extent`` the vector's length."""
    i = coord[0] + origin[0] if mode == "row" else coord[1] + origin[1]
    i = cutlass.min(Int32(i), Int32(extent) - 1)
    return mBias[i].to(Float32)
