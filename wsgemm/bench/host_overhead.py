"""Host time per call: ``wsgemm.matmul`` against ``torch.mm`` on the same small tensors.

Back-to-back calls on 64x64 fp16 operands, where the GPU work is a few microseconds and the host
path is what a caller waits for. The four contenders (torch.mm and wsgemm.matmul, each with and
without ``out=``) run interleaved in one process, ``calls`` calls per measurement, ``rounds``
rounds, and the median per-call time of each is reported. "host" times the loop alone
(synchronized before, not inside): with a few hundred calls the launch queue never fills, so the
GPU never holds the host back. "with sync" adds the wait for the GPU to finish the calls, as a
caller who synchronizes sees it.

``stand_in`` (no GPU needed) times the core's Python path (``wsgemm.api.matmul``) on CPU tensors,
on a dispatcher whose kernels do nothing (``wsgemm.api.stand_in``): the overhead wsgemm adds
around the kernel call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

SIZE = 64
ROUNDS = 7
CALLS = 200


@dataclass(frozen=True)
class Row:
    name: str
    host_us: float  # median over rounds of the per-call host time
    host_min_us: float
    synced_us: float  # median per-call time including the final synchronization


def _per_call_us(fn: Callable[[], object], calls: int, sync) -> tuple[float, float]:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    sync()
    synced = time.perf_counter() - start
    return host / calls * 1e6, synced / calls * 1e6


def _interleaved(contenders: dict, rounds: int, calls: int, sync) -> list[Row]:
    for fn in contenders.values():  # compile, allocate, warm the launcher memo
        fn()
    sync()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(_per_call_us(fn, calls, sync))
    rows = []
    for name, t in times.items():
        host = [h for h, _ in t]
        rows.append(
            Row(name, statistics.median(host), min(host), statistics.median(s for _, s in t))
        )
    return rows


def measure(device: str = "cuda", rounds: int = ROUNDS, calls: int = CALLS) -> list[Row]:
    """torch.mm and wsgemm.matmul, with and without ``out=``, on ``device`` (a CUDA GPU)."""
    import torch

    import wsgemm

    gen = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=gen).half().to(device) for _ in range(2))
    out_mm, out_ws = (torch.empty(SIZE, SIZE, dtype=torch.float16, device=device) for _ in "12")
    x, w = (
        torch.randn(8, SIZE, generator=gen).half().to(device),
        torch.randn(2 * SIZE, SIZE, generator=gen).half().to(device),
    )

    def torch_swiglu():
        y = torch.nn.functional.linear(x, w)
        return torch.nn.functional.silu(y[:, :SIZE]) * y[:, SIZE:]

    contenders = {
        "torch.mm": lambda: torch.mm(a, b),
        "wsgemm.matmul": lambda: wsgemm.matmul(a, b),
        "torch.mm, out=": lambda: torch.mm(a, b, out=out_mm),
        "wsgemm.matmul, out=": lambda: wsgemm.matmul(a, b, out=out_ws),
        # 8 rows: torch's unfused SwiGLU (three kernels) and wsgemm's gated swap-AB tile (one)
        "torch SwiGLU 8 rows": torch_swiglu,
        "wsgemm.gated_linear 8 rows": lambda: wsgemm.gated_linear(x, w),
    }
    return _interleaved(contenders, rounds, calls, torch.cuda.synchronize)


def stand_in(rounds: int = ROUNDS, calls: int = 2000) -> list[Row]:
    """wsgemm's per-call Python path on CPU tensors with a no-op kernel (no GPU needed)."""
    import torch

    from wsgemm import api

    d = api.stand_in()
    a, b = (torch.randn(SIZE, SIZE).half() for _ in range(2))
    out = torch.empty(SIZE, SIZE, dtype=torch.float16)
    x, w = torch.randn(8, SIZE).half(), torch.randn(2 * SIZE, SIZE).half()
    contenders = {
        "wsgemm (no-op kernel)": lambda: api.matmul(a, b, dispatcher=d),
        "wsgemm (no-op kernel), out=": lambda: api.matmul(a, b, out=out, dispatcher=d),
        # 8 rows: the gated swap-AB decode tile (docs/perf.md entry 85)
        "gated_linear, 8 rows (no-op)": lambda: api.gated_linear(x, w, dispatcher=d),
    }
    return _interleaved(contenders, rounds, calls, lambda: None)


def render(rows: list[Row], title: str) -> str:
    lines = [title, f"{'us per call':30s} {'host':>8s} {'host min':>9s} {'with sync':>10s}"]
    lines += [
        f"{r.name:30s} {r.host_us:8.1f} {r.host_min_us:9.1f} {r.synced_us:10.1f}" for r in rows
    ]
    return "\n".join(lines)


def report(device: str, rounds: int, console) -> int:
    """``python -m wsgemm bench --host-overhead``: measure and print; the exit code."""
    rows = measure(device, rounds)
    console.print(render(rows, f"{SIZE}x{SIZE} fp16 on {device}, {rounds} rounds of {CALLS}"))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument(
        "--stand-in", action="store_true", help="no GPU: wsgemm's Python path, no-op kernel"
    )
    args = parser.parse_args(argv)
    if args.stand_in:
        print(render(stand_in(args.rounds), "CPU stand-in (no-op kernel), 2000 calls a round"))
        return 0
    rows = measure(args.device, args.rounds, args.calls)
    print(
        render(rows, f"{SIZE}x{SIZE} fp16 on {args.device}, {args.rounds} rounds of {args.calls}")
    )
    return 0
