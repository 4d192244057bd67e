"""What wsgemm's torch layer costs, on a GPU, everything interleaved in one process:

1. Host time per call of back-to-back 64x64 fp16 products (the GPU finishes each in a few
   microseconds, so the loop measures the Python and dispatch work): torch.mm, the core
   (wsgemm.api.matmul, what wsgemm.matmul was before the torch op), wsgemm.matmul's eager fast
   road, the registered op through torch's dispatcher, the same with inputs that require grad
   (autograd.Function road vs register_autograd), under autocast, and linear.
2. A compiled SwiGLU MLP block (torch.compile, fullgraph), forward, with wsgemm (replace_linear)
   vs torch's matmul, without and with CUDA graphs (mode="reduce-overhead"), at a decode-sized and
   a prefill-sized token count.

    python scripts/bench_torch_op.py [--rounds 7] [--calls 2000] [--no-compile]

Prints the median over rounds, the min-max and the difference to the first row per table;
docs/perf.md entry 13 holds the measured numbers.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import wsgemm
from wsgemm import api, ops  # noqa: F401  (ops registers torch.ops.wsgemm)


def host_us(fn, calls: int) -> float:
    """Wall time per call of ``calls`` back-to-back calls, the queue drained on both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def host_candidates() -> dict:
    make = dict(device="cuda", dtype=torch.float16)
    a, b = torch.randn(64, 64, **make), torch.randn(64, 64, **make)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    a32, b32 = a.float(), b.float()
    weight = nn.Parameter(torch.randn(64, 64, **make))
    op = torch.ops.wsgemm.matmul

    def autocast(fn):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                fn()

        return run

    return {
        "torch.mm": lambda: torch.mm(a, b),
        "core: wsgemm.api.matmul (before)": lambda: api.matmul(a, b),
        "wsgemm.matmul (fast road)": lambda: wsgemm.matmul(a, b),
        "torch.ops.wsgemm.matmul (dispatcher)": lambda: op(a, b),
        "torch.ops.wsgemm.matmul.default": lambda: op.default(a, b),
        "torch.mm, requires_grad": lambda: torch.mm(ag, bg),
        "wsgemm.matmul, requires_grad (autograd.Function)": lambda: wsgemm.matmul(ag, bg),
        "torch.ops.wsgemm.matmul, requires_grad (register_autograd)": lambda: op(ag, bg),
        "torch.mm, fp32 under autocast": autocast(lambda: torch.mm(a32, b32)),
        "wsgemm.matmul, fp32 under autocast": autocast(lambda: wsgemm.matmul(a32, b32)),
        "F.linear (Parameter)": lambda: F.linear(a, weight),
        "wsgemm.linear (Parameter)": lambda: wsgemm.linear(a, weight),
    }


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, **factory):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False, **factory)
        self.down = nn.Linear(hidden, dim, bias=False, **factory)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def device_ms(fn, iters: int, graphs: bool) -> float:
    """Time per call of ``iters`` back-to-back calls, by CUDA events (the median is over rounds)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def block_candidates(models: dict, tokens: int) -> dict:
    """One timing function per (model, CUDA graphs or not), each compiled and checked first."""
    torch._dynamo.reset()
    dim = models["torch.matmul"].gate_up.in_features
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    want = models["torch.matmul"](x).float()
    out = {}
    for mode, graphs in ((None, False), ("reduce-overhead", True)):
        for name, model in models.items():
            fn = torch.compile(model, fullgraph=True, dynamic=False, mode=mode)
            for _ in range(3):  # compile, warm up, record the graph
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                got = fn(x).float()
            err = ((got - want).norm() / want.norm()).item()
            assert err < 2e-2, f"{name}: relative error {err:.2g} against torch"
            label = f"{name}, {'CUDA graphs' if graphs else 'no graphs'}"
            out[label] = lambda fn=fn, graphs=graphs: device_ms(lambda: fn(x), 20, graphs)
    return out


def interleave(candidates: dict, rounds: int, measure) -> dict:
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            times[name].append(measure(fn))
    return times


def table(title: str, unit: str, times: dict, base: str) -> None:
    """Median per candidate, the min-max over rounds, and the difference to ``base``'s median."""
    width = max(map(len, times)) + 2
    ref = statistics.median(times[base])
    print(f"\n{title}")
    print(f"{'':{width}}{unit:>9}  {'min-max':>15}  {'minus ' + base}")
    for name, values in times.items():
        med = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"{name:{width}}{med:9.2f}  {spread:>15}  {med - ref:+.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-compile", action="store_true", help="host times only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")

    host = host_candidates()
    for fn in host.values():  # compile the kernels, fill the caches
        for _ in range(20):
            fn()
    times = interleave(host, args.rounds, lambda fn: host_us(fn, args.calls))
    table("host time per 64x64 fp16 call", "us", times, "torch.mm")
    if args.no_compile:
        return
    torch.manual_seed(0)
    theirs = SwiGLU(4096, 14336, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    ours = copy.deepcopy(theirs)
    wsgemm.nn.replace_linear(ours)
    for tokens in (16, 4096):
        blocks = block_candidates({"torch.matmul": theirs, "wsgemm": ours}, tokens)
        times = interleave(blocks, args.rounds, lambda measure: measure())
        title = f"compiled SwiGLU block, {tokens} tokens, dim 4096, hidden 14336, bf16, forward"
        table(title, "ms", times, "torch.matmul, no graphs")


if __name__ == "__main__":
    main()
