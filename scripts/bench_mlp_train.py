"""A SwiGLU/GeGLU MLP's forward+backward on wsgemm against torch's (issue #25), interleaved.

For each model (the llm suite's 8B/70B hidden and ffn sizes, or a dense model of the models
suite by name, ``NAME/TP`` for its ffn on one of TP ranks: ``mlp_dims``) and token count, in one
process,
round-robin with the order rotated each round, cold L2 (``wsgemm.bench.measure.CudaTimer``),
one training step's forward and backward of ``down(act(x @ Wg^T) * (x @ Wu^T))``:

* ``wsgemm``: ``wsgemm.nn.GatedMLP`` as main runs it (the gate/up product on wsgemm; the unit's
  gradient fused into the dh GEMM where ``host.registry.DGATED_FAMILIES`` holds the family,
  sm90 since docs/perf.md entry 80; the backward GEMMs on wsgemm);
* ``wsgemm_unfused``: the same module with the dgated kernels switched off for its call
  (``DGATED_FAMILIES`` emptied: the unit's gradient in three passes, entry 74), checked the
  same way;
* ``torch``: the same with ``F.linear`` on the same fused ``[gate; up]`` weight and torch's
  ``act(y[..., :I]) * y[..., I:]`` (autograd through the two slices);
* ``gemms``: torch's six GEMMs alone, ``wsgemm_gemms`` wsgemm's (``wsgemm.matmul``) on the
  same operands: what each step would take with free elementwise work;
* the fused GEMMs against their plain ones (issue #25's bars, each <= 1.05x): ``dh_dgated``
  (``api.gated.gated_grad``: ``dh = d_out @ W_down`` with the unit's gradient in its epilogue,
  writing ``d[gate | up]``) against ``dh_plain`` (``wsgemm.matmul(d_out, W_down)``), and
  ``fwd_preact`` (``api.gated.gated_linear_preact``: ``h`` and ``[gate | up]`` from one
  kernel) against ``fwd_plain`` (``wsgemm.linear(x, W_gate_up)``, the 2I-wide product);
  ``dh_dgated_<entry>`` for each menu entry of ``--dgated-tiles``: the dgated GEMM forced onto
  that entry's tile (``api.gated.dgated_tile`` replaced for the call), against ``dh_plain``
  too (perf.md entry 81: on the cooperative tile the epilogue's extra traffic is exposed; a
  ping-pong tile's other warpgroup may hide it). These per-GEMM ratios are biased: each call
  is timed after the same neighbour in the rotation, whose power draw moves its clock (the
  same kernel 0-15% apart, perf.md entry 107); ``bench_dgated_tiles.py`` times them alone.

cuBLAS's reduced-precision split-K reduction is off, as in ``python -m wsgemm bench``. Prints
per shape the medians, each side's elementwise time (``torch - gemms``, ``wsgemm -
wsgemm_gemms``) and the share of torch's that wsgemm's saves (``1 - wsgemm's / torch's``,
issue #25's bar: >= 75%); ``--json`` keeps the times.

    python scripts/bench_mlp_train.py [--models 8b,70b,qwen2.5-7b,qwen3-32b/4] [--tokens 1024,4096]
        [--rounds 5] [--dtype bf16] [--activation silu] [--dgated-tiles sm90-pingpong,...]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from unittest import mock

import torch
import torch.nn.functional as F

import wsgemm
from wsgemm.api import gated as gated_core
from wsgemm.api.epilogue import gated_unit
from wsgemm.bench import env, measure, models, suites
from wsgemm.bench.nvml import Nvml
from wsgemm.host import registry
from wsgemm.host.choosing.menu import entry


def mlp_dims(name: str) -> tuple[int, int]:
    """(hidden, ffn) of ``name``: the llm suite's ``8b`` or ``70b``, or a dense model of the
    models suite (``wsgemm.bench.models.BY_NAME``), ``NAME/TP`` for the ffn one of TP
    tensor-parallel ranks holds."""
    base, _, tp = name.partition("/")
    if base in suites.MODELS and not tp:
        return suites.MODELS[base].hidden, suites.MODELS[base].ffn
    model = models.BY_NAME.get(base)
    if model is None or not model.intermediate:
        raise SystemExit(f"--models: {name!r} is not 8b, 70b or a dense model of the models suite")
    ways = int(tp) if tp else 1
    if ways < 1 or model.intermediate % ways:
        raise SystemExit(f"--models: {name!r}: {model.intermediate} does not split {tp} ways")
    return model.hidden, model.intermediate // ways


def forced_dgated(name: str, dout, w_d, preact, act):
    """``gated_grad`` (a call returning its result) with the dgated GEMM on menu entry
    ``name``'s tile."""
    e = entry(name)
    tile = (e.backend, e.variant_config())

    def call():
        with torch.no_grad(), mock.patch.object(gated_core, "dgated_tile",
                                                lambda *_: tile):  # fmt: skip
            return gated_core.gated_grad(dout, w_d, preact, act)

    return call


def contenders(hidden: int, ffn: int, tokens: int, dtype, act: str, gen, dgated_tiles=()):
    mlp = wsgemm.nn.GatedMLP(hidden, ffn, activation=act, device="cuda", dtype=dtype)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device="cuda", dtype=dtype)
                    / p.shape[-1] ** 0.5)  # fmt: skip
    w_gu, w_d = mlp.gate_up_proj.weight, mlp.down_proj.weight
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    dout = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=gen)
    h_plain = torch.randn(tokens, ffn, device="cuda", dtype=dtype, generator=gen)
    dy = torch.randn(tokens, 2 * ffn, device="cuda", dtype=dtype, generator=gen)

    def zero():
        for t in (x, w_gu, w_d):
            t.grad = None

    def step_wsgemm():
        zero()
        mlp(x).backward(dout)

    def step_unfused():
        saved = registry.DGATED_FAMILIES
        registry.DGATED_FAMILIES = frozenset()
        try:
            step_wsgemm()
        finally:
            registry.DGATED_FAMILIES = saved

    def step_torch():
        zero()
        F.linear(gated_unit(act, F.linear(x, w_gu)), w_d).backward(dout)

    def products(mm):
        def step():  # the six products of a step, nothing else
            with torch.no_grad():
                mm(x, w_gu.t())
                mm(h_plain, w_d.t())
                mm(dout, w_d)  # dh
                mm(dout.t(), h_plain)  # dW_down
                mm(dy, w_gu)  # dx
                mm(dy.t(), x)  # dW_gate_up

        return step

    preact = torch.randn(tokens, 2 * ffn, device="cuda", dtype=dtype, generator=gen)
    x0 = x.detach()

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()

        return call

    calls = {"wsgemm": step_wsgemm, "wsgemm_unfused": step_unfused, "torch": step_torch,
             "gemms": products(torch.matmul), "wsgemm_gemms": products(wsgemm.matmul),
             "dh_plain": no_grad(lambda: wsgemm.matmul(dout, w_d)),
             "dh_dgated": no_grad(lambda: gated_core.gated_grad(dout, w_d, preact, act)),
             "fwd_plain": no_grad(lambda: wsgemm.linear(x0, w_gu)),
             "fwd_preact": no_grad(lambda: gated_core.gated_linear_preact(x0, w_gu, act)),
             }  # fmt: skip
    for name in dgated_tiles:
        calls[f"dh_dgated_{name}"] = forced_dgated(name, dout, w_d, preact, act)
    return calls, (mlp, x, dout)


def check(mlp, x, dout, act, step=None) -> None:
    """wsgemm's gradients (dx, both weights') against float64 (a loose bound: a benchmark);
    ``step``: the contender's own step (default: the module's)."""
    x.grad = None
    for p in mlp.parameters():
        p.grad = None
    if step is None:
        mlp(x).backward(dout)
    else:
        step()
    x64 = x.detach().double().requires_grad_()
    w64 = mlp.gate_up_proj.weight.detach().double().requires_grad_()
    d64 = mlp.down_proj.weight.detach().double().requires_grad_()
    F.linear(gated_unit(act, F.linear(x64, w64)), d64).backward(dout.double())
    pairs = (("dx", x, x64), ("dW gate_up", mlp.gate_up_proj.weight, w64),
             ("dW down", mlp.down_proj.weight, d64))  # fmt: skip
    for name, got, want in pairs:
        err = (got.grad.double() - want.grad).abs().max().item()
        scale = want.grad.abs().max().item() + 1e-6
        if not err <= 3e-2 * scale:
            raise AssertionError(f"{name} off by {err:.3g} (scale {scale:.3g})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--tokens", default="1024,4096")
    p.add_argument("--activation", default="silu", choices=("silu", "gelu_tanh", "gelu"))
    p.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--dgated-tiles",
        default="",
        help="menu entries to force the dgated GEMM onto, e.g. sm90-pingpong",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    dgated_tiles = tuple(t for t in args.dgated_tiles.split(",") if t)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    timer = measure.CudaTimer(torch.device("cuda"), Nvml.open(0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    records = []
    dims = {name: mlp_dims(name) for name in args.models.split(",")}  # bad names before any run
    for name, (hidden, ffn) in dims.items():
        for tokens in suites.parse_int_list(args.tokens):
            calls, (mlp, x, dout) = contenders(hidden, ffn, tokens, dtype,
                                               args.activation, gen, dgated_tiles)  # fmt: skip
            check(mlp, x, dout, args.activation)
            check(mlp, x, dout, args.activation, calls["wsgemm_unfused"])
            samples = measure.interleaved(timer, calls, args.rounds, args.reps)
            times = {n: [s.ms for s in v] for n, v in samples.items()}
            med = {n: statistics.median(v) for n, v in times.items()}
            theirs = med["torch"] - med["gemms"]  # torch's elementwise time
            ours = med["wsgemm"] - med["wsgemm_gemms"]  # wsgemm's
            saved = 1 - ours / theirs if theirs > 0 else None
            said = "n/a" if saved is None else f"{saved:6.1%}"
            unfused = med["wsgemm_unfused"] - med["wsgemm_gemms"]
            saved_unfused = 1 - unfused / theirs if theirs > 0 else None
            print(f"{name} t={tokens:<6d} wsgemm {med['wsgemm']:8.3f} ms  torch "
                  f"{med['torch']:8.3f} ms  wsgemm/torch {med['wsgemm'] / med['torch']:.3f}  "
                  f"elementwise {ours:7.3f} vs {theirs:7.3f} ms  saved {said}",
                  flush=True)  # fmt: skip
            if saved_unfused is not None:
                print(f"{name} t={tokens:<6d} wsgemm_unfused {med['wsgemm_unfused']:8.3f} ms  "
                      f"wsgemm_unfused/torch {med['wsgemm_unfused'] / med['torch']:.3f}  "
                      f"elementwise {unfused:7.3f} ms  saved {saved_unfused:6.1%}",
                      flush=True)  # fmt: skip
            dgated_over_plain = med["dh_dgated"] / med["dh_plain"]
            preact_over_plain = med["fwd_preact"] / med["fwd_plain"]
            print(f"{name} t={tokens:<6d} dh dgated/plain {dgated_over_plain:.3f} "
                  f"({med['dh_plain'] * 1e3:.1f} us plain)  forward preact/plain "
                  f"{preact_over_plain:.3f} ({med['fwd_plain'] * 1e3:.1f} us plain)",
                  flush=True)  # fmt: skip
            for tile in dgated_tiles:
                ratio = med[f"dh_dgated_{tile}"] / med["dh_plain"]
                print(f"{name} t={tokens:<6d} dh dgated on {tile}/plain {ratio:.3f}", flush=True)
            records.append(dict(model=name, tokens=tokens, hidden=hidden, ffn=ffn,
                                dgated_over_plain=dgated_over_plain,
                                preact_over_plain=preact_over_plain,
                                times_ms=times, median_ms=med, elementwise_ms=ours,
                                torch_elementwise_ms=theirs, saved=saved,
                                unfused_elementwise_ms=unfused,
                                saved_unfused=saved_unfused))  # fmt: skip
            del calls, mlp, x, dout
    if args.json:
        env.write_script_record(args.json, args, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
