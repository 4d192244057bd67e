"""The row-scale piece of a fused epilogue: one accumulator element's factor.

A row scale is a flat vector (``mScale``, fp32 or the inputs' dtype) along the kernel's M: the
element at tile coordinate (r, c) of the tile whose first row is ``origin[0]`` is multiplied
by ``scale[origin[0] + r]``, after the activation (a mixture-of-experts router weight on the
down projection's rows). The index is clamped to the vector, as a bias's is (``bias``): rows
past the edge read the last entry and are never stored. A thread's registers that share a
row share the load; the consumer reads a tile's factors once, before its mainloop.
"""

from __future__ import annotations

from cutlass import Float32

from wsgemm.kernels.epilogue import bias


def factor(mScale, coord, origin, extent) -> Float32:
    """``mScale``'s entry for the element at tile coordinate ``coord`` ((row, col)), in fp32;
    ``origin`` is the tile's first (row, col) in the problem, ``extent`` the vector's length."""
    return bias.addend("row", mScale, coord, origin, extent)
