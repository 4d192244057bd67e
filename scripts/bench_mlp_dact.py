"""A plain MLP's forward+backward on wsgemm against torch's (issue #25's dact), interleaved.

For each model (plain-MLP families: their hidden and ffn sizes and activation) and token count,
in one process, round-robin with the order rotated each round, cold L2
(``wsgemm.bench.measure.CudaTimer``), one training step of ``down(act(x @ W_up^T + b_up) +
b_down)``:

* ``wsgemm``: ``wsgemm.nn.MLP`` with the dact kernel switched on for its call
  (``host.registry.DACT_FAMILIES`` holding sm90: the activation's gradient fused into the dh
  GEMM, ``mlp.mlp``), checked against float64 first;
* ``wsgemm_unfused``: the same module with it off (its layers' own autograd: the dh product,
  then torch's activation backward), checked the same way;
* ``torch``: ``F.linear`` -> activation -> ``F.linear`` on the same weights;
* the fused GEMM against its plain one (issue #25's bar, <= 1.05x): ``dh_dact``
  (``api.act_grad.act_grad``: ``dh = d_out @ W_down`` with ``act'(pre)`` in its epilogue,
  writing ``dpre``) against ``dh_plain`` (``wsgemm.matmul(d_out, W_down)``) and against
  ``dh_unfused`` (that product, then torch's ``gelu_backward``-style pass: what it replaces).

cuBLAS's reduced-precision split-K reduction is off, as in ``python -m wsgemm bench``.

    python scripts/bench_mlp_dact.py [--models phi2,falcon7b,neox20b] [--tokens 1024,4096]
        [--rounds 5] [--dtype bf16] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

import wsgemm
from wsgemm.api import act_grad as act_grad_core
from wsgemm.api.epilogue import activation_grad, torch_activation
from wsgemm.bench import env, measure, suites
from wsgemm.bench.nvml import Nvml
from wsgemm.host import registry
from wsgemm.host.dispatch import DISPATCHER

#: plain-MLP layers of public configs: (hidden, ffn, activation)
MODELS = {
    "phi2": (2560, 10240, "gelu_tanh"),  # microsoft/phi-2 (gelu_new)
    "falcon7b": (4544, 18176, "gelu"),  # tiiuae/falcon-7b
    "neox20b": (6144, 24576, "gelu"),  # EleutherAI/gpt-neox-20b
}


class _Switch:
    """``DACT_FAMILIES`` holding sm90 (or emptied) for one call."""

    def __init__(self, on: bool):
        self.value = registry.EPILOGUE_FAMILIES if on else frozenset()

    def __enter__(self):
        self.saved, registry.DACT_FAMILIES = registry.DACT_FAMILIES, self.value

    def __exit__(self, *exc):
        registry.DACT_FAMILIES = self.saved


def contenders(hidden: int, ffn: int, act: str, tokens: int, dtype, gen):
    mlp = wsgemm.nn.MLP(hidden, ffn, activation=act, device="cuda", dtype=dtype)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device="cuda", dtype=dtype)
                    / p.shape[-1] ** 0.5)  # fmt: skip
    up, down = mlp.up_proj, mlp.down_proj
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    dout = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=gen)
    pre = torch.randn(tokens, ffn, device="cuda", dtype=dtype, generator=gen)

    def zero():
        for t in (x, *mlp.parameters()):
            t.grad = None

    def step(on: bool):
        def call():
            zero()
            with _Switch(on):
                mlp(x).backward(dout)

        return call

    def step_torch():
        zero()
        h = torch_activation(act, F.linear(x, up.weight, up.bias))
        F.linear(h, down.weight, down.bias).backward(dout)

    def no_grad(fn, on=False):
        def call():
            with torch.no_grad(), _Switch(on):
                fn()

        return call

    def unfused():
        dh = wsgemm.matmul(dout, down.weight)
        return (dh.float() * activation_grad(act, pre)).to(dtype)

    calls = {
        "wsgemm": step(True), "wsgemm_unfused": step(False), "torch": step_torch,
        "dh_plain": no_grad(lambda: wsgemm.matmul(dout, down.weight)),
        "dh_dact": no_grad(lambda: act_grad_core.act_grad(dout, down.weight, pre, act), True),
        "dh_unfused": no_grad(unfused),
    }  # fmt: skip
    return calls, (mlp, x, dout, pre)


def check(mlp, x, dout, step) -> None:
    """A contender's gradients (dx, both weights', both biases') against float64 (a loose
    bound: a benchmark)."""
    step()
    x64 = x.detach().double().requires_grad_()
    p64 = {n: p.detach().double().requires_grad_() for n, p in mlp.named_parameters()}
    h = torch_activation(mlp.activation, F.linear(x64, p64["up_proj.weight"], p64["up_proj.bias"]))
    F.linear(h, p64["down_proj.weight"], p64["down_proj.bias"]).backward(dout.double())
    for name, got, want in [("dx", x, x64), *((n, p, p64[n]) for n, p in mlp.named_parameters())]:
        err = (got.grad.double() - want.grad).abs().max().item()
        scale = want.grad.abs().max().item() + 1e-6
        if not err <= 3e-2 * scale:
            raise AssertionError(f"{name} off by {err:.3g} (scale {scale:.3g})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--tokens", default="1024,4096")
    p.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    records = []
    for name in args.models.split(","):
        hidden, ffn, act = MODELS[name]
        for tokens in suites.parse_int_list(args.tokens):
            calls, (mlp, x, dout, pre) = contenders(hidden, ffn, act, tokens, dtype, gen)
            with _Switch(True):  # raises where the dact GEMM would take the unfused road
                launch = act_grad_core.act_grad_launch(DISPATCHER, dout, mlp.down_proj.weight, pre,
                                                       act)  # fmt: skip
            tile = f"{launch.backend} {launch.config}"
            for contender in ("wsgemm", "wsgemm_unfused"):
                check(mlp, x, dout, calls[contender])
            samples = measure.interleaved(timer, calls, args.rounds, args.reps)
            times = {n: [sample.ms for sample in v] for n, v in samples.items()}
            med = {n: statistics.median(v) for n, v in times.items()}
            ratios = {
                "wsgemm/torch": med["wsgemm"] / med["torch"],
                "wsgemm_unfused/torch": med["wsgemm_unfused"] / med["torch"],
                "dact/plain": med["dh_dact"] / med["dh_plain"],
                "unfused/plain": med["dh_unfused"] / med["dh_plain"],
            }
            print(f"{name} t={tokens:<6d} " + "  ".join(f"{k} {v:.3f}" for k, v in ratios.items())
                  + f"  (dh plain {med['dh_plain'] * 1e3:.1f} us, step torch "
                  f"{med['torch']:.3f} ms; dact on {tile})", flush=True)  # fmt: skip
            records.append(dict(model=name, tokens=tokens, hidden=hidden, ffn=ffn,
                                activation=act, dact_tile=tile, ratios=ratios, times_ms=times,
                                median_ms=med))  # fmt: skip
            del calls, mlp, x, dout, pre
    if args.json:
        env.write_script_record(args.json, args, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
