"""The gated kernel's row tiles against each other at few rows (issue #25), interleaved.

For each shape (rows x 2I x K of ``gated_linear(x, W)``, W = ``[w_gate; w_up]`` row-major) in one
process, round-robin with the order rotated each round, cold L2
(``wsgemm.bench.measure.CudaTimer``): the gated kernel forced onto each menu entry of ``--tiles``
(``api.gated.gated_config`` replaced for the call; each checked against float64 first), up to 32
rows the gated swap-AB decode tile (``swap``, switched on for its calls), the shipped rule's tile
(``kernel``: up to 32 rows the swap tile since entry 85), ``road`` (``auto``'s product in fp32, then
``api.gated.gated_in_torch``), ``torch`` (``F.linear``, then torch's unit in the dtype) and
``plain`` (the 2I-wide product alone). Prints per shape each contender's median over rounds over
``plain``'s; ``--json`` keeps every time with the clocks
(``scripts/fit_gated_cost.py`` reads ``kernel`` and ``road`` as both roads of a row and each
forced tile as a row of its tile). A forced tile that fails, is wrong, or does not run its
gated kernel is left out of that shape, with the reason printed.

    python scripts/bench_gated_tiles.py [--rows 1,8,32,64,128,256] [--shapes 28672x4096,...]
        [--tiles pingpong-64x128-c1x2,...] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from unittest import mock

import torch
import torch.nn.functional as F

import wsgemm
from wsgemm.api import gated as gated_core
from wsgemm.api.epilogue import gated_unit
from wsgemm.api.gated import gated_in_torch
from wsgemm.bench import env, measure
from wsgemm.bench.nvml import Nvml
from wsgemm.host import registry
from wsgemm.host.choosing.cost import GATED_SWAP_MAX_ROWS
from wsgemm.host.choosing.menu import entry
from wsgemm.host.dispatch import Dispatcher

TILES = "sm90-pingpong,pingpong-64x128-c1x2,pingpong-64x128-c2x1,pingpong-64x256-c1x1,sm90"
#: (2I, K): 8B and 70B gate_up, a tensor-parallel slice, a narrow expert's
SHAPES = "28672x4096,57344x8192,7168x5120,14336x4096,2048x2048"


class KernelOnly(Dispatcher):
    """Every gated call takes the gated kernel (the road choice's other side); ``kernels``
    records the (backend, config, epilogue) of each kernel it was asked for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = []

    def gated_unfused(self, *args):
        return None

    def kernel(self, backend, device, dtypes, a_major, b_major, config=None, epilogue="none",
               grouping="none"):  # fmt: skip
        self.kernels.append((backend, config, epilogue))
        return super().kernel(backend, device, dtypes, a_major, b_major, config, epilogue,
                              grouping)  # fmt: skip


def forced(name: str):
    """A call of ``gated_linear`` on the gated kernel with menu entry ``name``'s tile."""
    e = entry(name)
    config = e.variant_config()
    d = KernelOnly()

    def call(x, w):
        tile = (e.backend, config)
        with mock.patch.object(gated_core, "gated_config", lambda rows, *flags: tile):
            out = gated_core.gated_linear(x, w, "silu", dispatcher=d)
        if not d.kernels:  # its first call: the forced tile's gated kernel must have run
            raise RuntimeError(f"{name}: the gated kernel did not run (the unfused road?)")
        if d.kernels[0] != (e.backend, config, "gated+silu"):
            raise RuntimeError(f"{name}: ran {d.kernels[0]}, not its own gated kernel")
        return out

    return call


def swap_tile():
    """A call of ``gated_linear`` on the gated swap-AB decode tile (``GATED_SWAP_FAMILIES``
    switched on for the call, as main has it since docs/perf.md entry 85)."""
    d = KernelOnly()

    def call(x, w):
        saved = registry.GATED_SWAP_FAMILIES
        registry.GATED_SWAP_FAMILIES = registry.EPILOGUE_FAMILIES
        try:
            out = gated_core.gated_linear(x, w, "silu", dispatcher=d)
        finally:
            registry.GATED_SWAP_FAMILIES = saved
        if not d.kernels or not getattr(d.kernels[0][1], "swap_ab", False):
            raise RuntimeError(f"the swap-AB tile did not run: {d.kernels[:1]}")
        return out

    return call


def contenders(x, w, tiles) -> dict:
    """name -> zero-argument call on (x, w): each forced tile, the swap-AB decode tile (up to
    its rows), the rule's, the road, torch's unfused SwiGLU, plain."""
    calls = {}
    for t in tiles:
        call = forced(t)
        calls[t] = lambda call=call: call(x, w)
    if x.shape[0] <= GATED_SWAP_MAX_ROWS:
        swap = swap_tile()
        calls["swap"] = lambda: swap(x, w)
    rule = KernelOnly()
    calls["kernel"] = lambda: gated_core.gated_linear(x, w, "silu", dispatcher=rule)
    calls["torch"] = lambda: gated_unit("silu", F.linear(x, w))
    calls["road"] = lambda: gated_in_torch(
        wsgemm.matmul(x, w.t(), out_dtype=torch.float32), "silu", x.dtype
    )
    calls["plain"] = lambda: wsgemm.linear(x, w)
    return calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,32,64,128,256")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--tiles", default=TILES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    nvml = Nvml.open(0)
    timer = measure.CudaTimer(torch.device("cuda"), nvml)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tiles = args.tiles.split(",")
    records = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / math.sqrt(k)
        for rows in (int(v) for v in args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16, generator=gen)
            calls = contenders(x, w, tiles)
            ref = gated_unit("silu", x.double() @ w.double().t())
            scale = ref.abs().max().item() + 1.0
            for name, fn in list(calls.items()):
                if name == "plain":
                    continue
                try:  # a tile that fails or is wrong is left out of this shape, said why
                    err = (fn().double() - ref).abs().max().item()
                    if not err <= 2e-2 * scale:
                        raise AssertionError(f"off by {err:.3g} (scale {scale:.3g})")
                except Exception as exc:  # noqa: BLE001 (any failure: report, go on)
                    print(f"{rows}x{n}x{k} {name}: left out: {exc}", flush=True)
                    del calls[name]
            names = list(calls)
            samples = measure.interleaved(timer, calls, args.rounds, args.reps)
            times = {c: [s.ms for s in v] for c, v in samples.items()}
            clocks = [s.sm_clock_mhz for v in samples.values() for s in v]
            med = {c: statistics.median(v) for c, v in times.items()}
            cells = "  ".join(f"{c} {med[c] / med['plain']:.2f}" for c in names if c != "plain")
            print(f"{rows:5d}x{n}x{k}  plain {med['plain'] * 1e3:7.1f} us  {cells}", flush=True)
            records.append(dict(epilogue="swiglu", m=rows, n=n, k=k, label=f"{rows}x{n}x{k}",
                                times_ms=times, median_ms=med,
                                clock_mhz=[c for c in clocks if c]))  # fmt: skip
    if args.json:
        env.write_script_record(args.json, args, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
