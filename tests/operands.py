"""Operand factories shared by the CPU planning tests and the GPU correctness tests."""

import torch


def make(shape, dtype, device, *, col_major=False, offset=0, pad=0, gen=None):
    """A randn tensor of ``shape`` ((R, C) or (L, R, C)) as a view: row- or column-major within
    each matrix, ``pad`` extra elements on the leading dimension and ``offset`` elements of
    storage before it, so sliced views with offsets and unaligned strides are covered."""
    *batch, r, c = shape
    inner = (c, r) if col_major else (r, c)
    full = (*batch, inner[0], inner[1] + pad)
    numel = offset + int(torch.tensor(full).prod())
    flat = torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype).to(device)
    t = flat[offset:].view(full)[..., : inner[1]]
    return t.transpose(-1, -2) if col_major else t
