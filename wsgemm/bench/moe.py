"""The ``moe`` suite: the grouped GEMMs of mixture-of-experts layers (issue #26), and the
contenders that run them.

One MoE layer sends every token to ``top_k`` of ``experts`` experts; with the tokens sorted by
expert, each expert's MLP is one GEMM of its own rows, and the layer's GEMMs are one *grouped*
GEMM: ``a`` [sum_M, K] (the routed rows, sorted by expert), ``b`` [G, K, N] (one weight per
expert), ``offs`` int32 [G] (each group's end row; no leading 0; a group may be empty), output
[sum_M, N], group g being ``a[offs[g-1]:offs[g]] @ b[g]``. That is ``torch._grouped_mm``'s 2D x
3D forward case, and ``wsgemm.grouped_mm``'s.

A problem is (model, projection, tokens per expert, routing): the fused gate/up projection
(N = 2 * expert width, K = hidden) or the down projection (N = hidden, K = expert width);
``tokens_per_expert * experts`` routed rows in all (a token counts once per expert it is sent
to); routed ``balanced`` (equal counts, the remainder one each to the first experts) or
``skewed`` (each row drawn from a Zipf law of exponent ``ZIPF_S`` over the experts, ranked in a
seeded random order, so some experts may get no rows). A draw depends only on (seed, model,
tokens per expert), so filtering the suite never changes a problem, and the gate/up and down
problems of one layer share their group sizes, as the two GEMMs of one layer do. The draws use
only ``random.Random(str).random()``, which Python keeps the same across versions.

The weights are stored as the model's ``[G, N, K]`` (``nn.Linear``-like) and passed as the
transposed view ``[G, K, N]``: the bench's ``TN`` layout per group. FLOP = 2 * sum_M * N * K
(only real rows).

A problem's *pass* (``PASSES``): ``forward`` (above) or ``wgrad``, the same layer's weight
gradient: ``dW[g] = dY[rows of g]^T @ X[rows of g]``, ``[G, N, K]`` like the weights, K
(here the tokens) split by ``offs``: ``torch._grouped_mm``'s and ``wsgemm.grouped_mm``'s 2D x 2D
form with ``a`` = dY^T (the transposed view of the row-major ``[sum_M, N]`` output gradient)
and ``b`` = X (``[sum_M, K]``, row-major). The same FLOP; an empty group's gradient is zero.
Or ``routed``: the forward product with each row times its router weight (a down projection's
combine weights, fp32 in [0, 1)), ``grouped_mm(..., row_scale=w)`` in wsgemm's kernel epilogue,
torch's and the loop's result scaled in place after the product (``out.mul_(w[:, None])``: one
more pass over the output, what a model without a fused kernel runs).

Contenders (``resolve``): ``torch`` (``torch._grouped_mm``, bf16 only), ``loop`` (one
``torch.mm`` per non-empty group over the host-known sizes: what a model without a grouped
kernel runs), ``wsgemm:auto`` / ``wsgemm:<backend>`` (``wsgemm.grouped_mm``). The baseline,
always run and listed first, is ``torch`` in bf16 and ``loop`` in fp16 (and in bf16 where
``torch._grouped_mm`` does not run).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass
from functools import lru_cache

from ..support import short_name
from . import check
from .backends import AUTO, Contender, Unavailable, leading_first

ROUTINGS = ("balanced", "skewed")
#: A layer's forward grouped GEMM, or its weight gradient (module docstring).
PASSES = ("forward", "wgrad", "routed")
TOKENS_PER_EXPERT = (8, 64, 512, 4096)
#: The Zipf exponent of skewed routing: with 256 experts the busiest gets about a quarter of
#: the rows and the idlest, at 8 rows per expert on average, often none.
ZIPF_S = 1.2
#: The suite's operands are always stored as the model stores them (module docstring).
LAYOUT = "TN"
#: Rows of one group's fp64 reference computed at a time: at most this many bytes of fp64
#: per chunk, so a skewed group of 270k rows does not need its whole reference at once.
REFERENCE_CHUNK_BYTES = 2**28

TORCH = "torch"
LOOP = "loop"
DEFAULT_SELECTION = (TORCH, LOOP, "wsgemm")
SELECTABLE = ("all", TORCH, LOOP, "wsgemm", "wsgemm:<name>")


@dataclass(frozen=True)
class MoeModel:
    """One MoE layer's sizes, as the model's config.json names them (in brackets)."""

    name: str
    experts: int  # n_routed_experts, num_experts, num_local_experts
    hidden: int  # hidden_size
    intermediate: int  # moe_intermediate_size (Mixtral: intermediate_size): one expert's width
    top_k: int  # num_experts_per_tok

    def projections(self) -> tuple[tuple[str, int, int], ...]:
        """(name, N, K) of each expert GEMM: gate and up fused into one, then down."""
        return (("gate_up", 2 * self.intermediate, self.hidden),
                ("down", self.hidden, self.intermediate))  # fmt: skip


MODELS = {
    m.name: m
    for m in (
        MoeModel("deepseek-v3", experts=256, hidden=7168, intermediate=2048, top_k=8),
        MoeModel("qwen3-30b-a3b", experts=128, hidden=2048, intermediate=768, top_k=8),
        MoeModel("qwen3-235b-a22b", experts=128, hidden=4096, intermediate=1536, top_k=8),
        MoeModel("mixtral-8x7b", experts=8, hidden=4096, intermediate=14336, top_k=2),
    )
}


@dataclass(frozen=True)
class GroupedShape:
    """One grouped GEMM problem: ``sizes[g]`` rows of ``a`` times expert g's (K, N) weight.
    Reads like ``suites.Shape`` (``m`` is the total rows) for the runner and the record."""

    n: int
    k: int
    sizes: tuple[int, ...]
    routing: str
    tokens_per_expert: int
    label: str
    group: str
    layout: str = LAYOUT
    direction: str = "forward"  # ``PASSES``: the forward product or the weight gradient

    def __post_init__(self) -> None:
        if self.direction not in PASSES:
            raise ValueError(f"unknown pass {self.direction!r}; choose from {', '.join(PASSES)}")
        if not self.sizes or any(not isinstance(s, int) or s < 0 for s in self.sizes):
            raise ValueError(f"group sizes must be ints >= 0, got {self.sizes!r}")
        if sum(self.sizes) < 1 or self.n < 1 or self.k < 1:
            raise ValueError(f"{self.label}: need rows, N and K >= 1")

    @property
    def m(self) -> int:
        return sum(self.sizes)

    @property
    def flop(self) -> int:
        """2 * sum_M * N * K: only the real rows count."""
        return 2 * self.m * self.n * self.k

    @property
    def offs(self) -> list[int]:
        """Each group's end row (cumulative sizes, no leading 0): ``torch._grouped_mm``'s offs."""
        return list(itertools.accumulate(self.sizes))

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The result's shape: [sum_M, N] (forward, routed), [G, N, K] (the weight gradient)."""
        return (self.m, self.n) if self.direction != "wgrad" else (len(self.sizes), self.n,
                                                                     self.k)  # fmt: skip

    @property
    def grouped(self) -> dict:
        """The record's ``grouped`` field (schema.py); ``pass`` only on a weight gradient's
        (forward records keep the fields they had)."""
        fields = {
            "groups": len(self.sizes),
            "routing": self.routing,
            "tokens_per_expert": self.tokens_per_expert,
            "sizes": list(self.sizes),
        }
        if self.direction != "forward":
            fields["pass"] = self.direction
        return fields


def balanced(total: int, groups: int) -> tuple[int, ...]:
    """``total`` rows over ``groups`` experts as evenly as they go: the first ``total % groups``
    get one more."""
    base, extra = divmod(total, groups)
    return tuple(base + (g < extra) for g in range(groups))


@lru_cache(maxsize=64)
def skewed(total: int, groups: int, key: str) -> tuple[int, ...]:
    """``total`` rows, each sent to an expert drawn from a Zipf law (weight ``rank ** -ZIPF_S``)
    over the experts in a random rank order; reproducible from ``key``."""
    rng = random.Random(key)
    ranks = list(range(groups))
    for i in range(groups - 1, 0, -1):  # Fisher-Yates on random() alone (module docstring)
        j = int(rng.random() * (i + 1))
        ranks[i], ranks[j] = ranks[j], ranks[i]
    cum = list(itertools.accumulate(r**-ZIPF_S for r in range(1, groups + 1)))
    scale, draw, find = cum[-1], rng.random, bisect.bisect_right
    by_rank = [0] * (groups + 1)
    for _ in range(total):
        by_rank[find(cum, draw() * scale)] += 1
    by_rank[groups - 1] += by_rank.pop()  # a product that rounded up to the scale
    sizes = [0] * groups
    for rank, expert in enumerate(ranks):
        sizes[expert] = by_rank[rank]
    return tuple(sizes)


def group_sizes(model: MoeModel, tokens_per_expert: int, routing: str, seed: int = 0):
    """The rows each expert gets: ``tokens_per_expert * experts`` in all."""
    total = tokens_per_expert * model.experts
    if routing == "balanced":
        return balanced(total, model.experts)
    if routing == "skewed":
        return skewed(total, model.experts, f"wsgemm.bench.moe:{seed}:{model.name}:{total}")
    raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")


def problems(
    seed: int = 0,
    models: tuple[str, ...] | None = None,
    tokens: tuple[int, ...] | None = None,
    routings: tuple[str, ...] | None = None,
    passes: tuple[str, ...] | None = None,
) -> list[GroupedShape]:
    """The suite: every model x projection x tokens per expert x routing x pass (default:
    the forward only), in that nesting."""
    for name in models or ():
        if name not in MODELS:
            raise ValueError(f"unknown MoE model {name!r}; choose from {', '.join(MODELS)}")
    for routing in routings or ():
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
    for direction in passes or ():
        if direction not in PASSES:
            raise ValueError(f"unknown pass {direction!r}; choose from {', '.join(PASSES)}")
    out = []
    for name in models or tuple(MODELS):
        model = MODELS[name]
        for proj, n, k in model.projections():
            for t in tokens or TOKENS_PER_EXPERT:
                for routing in routings or ROUTINGS:
                    for direction in passes or ("forward",):
                        tag = "" if direction == "forward" else f" {direction}"
                        out.append(GroupedShape(
                            n, k, group_sizes(model, t, routing, seed), routing, t,
                            label=f"{name} {proj}{tag} t/e={t} {routing}", group=name,
                            direction=direction,
                        ))  # fmt: skip
    return out


# ---- operands, reference, check -------------------------------------------------------------


@dataclass(frozen=True)
class GroupedWorkload:
    """What every grouped contender computes: ``out[rows of g] = a[rows of g] @ b[g]``
    (forward), ``out[g] = a[:, cols of g] @ b[rows of g]`` (the weight gradient). Reads like
    ``backends.Workload`` for the runner (no bias, no activation)."""

    a: object  # torch.Tensor [sum_M, K], row-major; wgrad: dY^T [N, sum_M], M-major
    b: object  # torch.Tensor [G, K, N], the transposed view of [G, N, K] weights; wgrad: X
    offs: object  # torch.Tensor int32 [G] on the device
    sizes: tuple[int, ...]  # the same, host side
    accumulate: object  # torch.float32: grouped GEMMs accumulate in fp32
    accumulate_name: str = "fp32"
    bias: object = None
    activation: str | None = None
    direction: str = "forward"
    row_scale: object = None  # torch.Tensor fp32 [sum_M]: a routed pass's router weights

    plain = True


def workload(shape: GroupedShape, dtype, device, generator=None) -> GroupedWorkload:
    """Standard-normal operands of ``shape`` (module docstring for their layout)."""
    import torch

    def randn(*size):
        return torch.randn(*size, dtype=dtype, device=device, generator=generator)

    offs = torch.tensor(shape.offs, dtype=torch.int32, device=device)
    if shape.direction == "wgrad":  # dY^T (the output gradient's view) and X
        a, b = randn(shape.m, shape.n).t(), randn(shape.m, shape.k)
        return GroupedWorkload(a, b, offs, shape.sizes, torch.float32, direction="wgrad")
    a = randn(shape.m, shape.k)
    b = randn(len(shape.sizes), shape.n, shape.k).transpose(-1, -2)
    scale = None
    if shape.direction == "routed":
        scale = torch.rand(shape.m, dtype=torch.float32, device=device, generator=generator)
    return GroupedWorkload(a, b, offs, shape.sizes, torch.float32, direction=shape.direction,
                           row_scale=scale)  # fmt: skip


def errors(out, problem: GroupedWorkload) -> check.Errors:
    """``check.errors`` against the fp64 product of each group, computed a chunk at a time
    (never the whole fp64 reference at once): ``_forward_chunks`` or ``_wgrad_chunks``. The
    relative error is the whole output's; the peak error is each group's over that group's
    RMS, the largest of them: groups differ in scale (a weight gradient sums each group's own
    number of tokens, up to a quarter of a million in a skewed draw), and one RMS over all of
    them called torch's own result wrong (docs/perf.md entry 58). Each element's error counts
    past its own output rounding (``u_out * |ref|``, the unit roundoff of the output's dtype):
    a group of one token's weight gradient is an outer product, whose largest elements are ~20
    times its RMS, so rounding them alone passed eight ``u_out`` of the RMS on every backend,
    torch's included (entry 61)."""
    import torch

    if not bool(torch.isfinite(out).all()):
        return check.Errors(rel=math.inf, peak=math.inf, finite=False)
    chunks = (_wgrad_chunks if problem.direction == "wgrad" else _forward_chunks)(out, problem)
    zero = torch.zeros((), dtype=torch.float64, device=out.device)
    diff_sq, ref_sq = zero.clone(), zero.clone()
    groups: dict[int, list] = {}  # group -> [its diff peak, its reference's square sum, count]
    u_out = _unit_roundoff(out.dtype)
    for g, got, ref in chunks:
        diff = got.double().sub_(ref)
        diff_sq += diff.square().sum()
        ref_sq += ref.square().sum()
        acc = groups.setdefault(g, [zero.clone(), zero.clone(), 0])
        past_rounding = diff.abs_().sub_(ref.abs().mul_(u_out)).clamp_(min=0)
        acc[0] = torch.maximum(acc[0], past_rounding.max())
        acc[1] += ref.square().sum()
        acc[2] += ref.numel()
    ref_norm = math.sqrt(float(ref_sq))
    peak = 0.0
    for g_peak, g_sq, count in groups.values():
        rms = math.sqrt(float(g_sq) / count) if count else 0.0
        peak = max(peak, float(g_peak) / (rms if rms > 0 else 1.0))
    return check.Errors(
        rel=math.sqrt(float(diff_sq)) / (ref_norm if ref_norm > 0 else 1.0),
        peak=peak,
        finite=True,
    )


def _unit_roundoff(dtype) -> float:
    """``check.UNIT_ROUNDOFF`` of a torch dtype (the grouped results' fp16, bf16 or fp32)."""
    return check.UNIT_ROUNDOFF[short_name(dtype)]


def _forward_chunks(out, problem: GroupedWorkload):
    """(group, output rows, their fp64 reference) of each group, a chunk of rows at a time."""
    a, b, scale = problem.a, problem.b, problem.row_scale
    chunk = max(1, REFERENCE_CHUNK_BYTES // (8 * max(out.shape[1], a.shape[1])))
    start = 0
    for g, size in enumerate(problem.sizes):
        weight = b[g].double()
        for lo in range(start, start + size, chunk):
            hi = min(lo + chunk, start + size)
            ref = a[lo:hi].double() @ weight
            if scale is not None:
                ref *= scale[lo:hi, None].double()
            yield g, out[lo:hi], ref
        start += size


def _wgrad_chunks(out, problem: GroupedWorkload):
    """(group, gradient rows, their fp64 reference) of a weight gradient: group g's ``a[:, cols of
    g] @ b[rows of g]``, a chunk of its N rows at a time, each summed over chunks of the group's
    tokens (no fp64 copy of more than ``REFERENCE_CHUNK_BYTES`` of either operand at once: a
    skewed group holds up to a quarter of a million tokens); an empty group's reference is
    zero."""
    import torch

    a, b = problem.a, problem.b
    n, k = a.shape[0], b.shape[1]
    rows = max(1, REFERENCE_CHUNK_BYTES // (8 * k))  # N rows of the reference at a time
    tokens = max(1, REFERENCE_CHUNK_BYTES // (8 * max(k, min(rows, n))))  # tokens at a time
    start = 0
    for g, size in enumerate(problem.sizes):
        for lo in range(0, n, rows):
            ref = torch.zeros(min(rows, n - lo), k, dtype=torch.float64, device=out.device)
            for t in range(start, start + size, tokens):
                end = min(t + tokens, start + size)
                ref += a[lo : lo + rows, t:end].double() @ b[t:end].double()
            yield g, out[g, lo : lo + rows], ref
        start += size


# ---- contenders -----------------------------------------------------------------------------


def torch_grouped() -> Contender:
    """``torch._grouped_mm``: it has no ``out=``, so the call returns its fresh output (the
    allocation, from torch's caching allocator, is part of what a model's call costs)."""

    def make(problem: GroupedWorkload, out):
        import torch

        a, b, offs, scale = problem.a, problem.b, problem.offs, problem.row_scale
        if scale is not None:
            return lambda: torch._grouped_mm(a, b, offs).mul_(scale[:, None])
        return lambda: torch._grouped_mm(a, b, offs)

    return Contender(TORCH, make, returns_output=True)


def loop() -> Contender:
    """One ``torch.mm`` per non-empty group into its rows of ``out`` (per group into its
    gradient, zeros for an empty one): the sizes are known on the host, as a model that routes
    on the host knows them."""

    def make(problem: GroupedWorkload, out):
        import torch

        a, b = problem.a, problem.b
        spans = []
        start = 0
        for g, size in enumerate(problem.sizes):
            if problem.direction == "wgrad":  # an empty group's mm writes its zeros
                spans.append((a[:, start : start + size], b[start : start + size], out[g]))
            elif size:
                spans.append((a[start : start + size], b[g], out[start : start + size]))
            start += size

        scale = problem.row_scale

        def call():
            for rows, weight, dest in spans:
                torch.mm(rows, weight, out=dest)
            if scale is not None:
                out.mul_(scale[:, None])
            return out

        return call

    return Contender(LOOP, make)


def wsgemm_grouped(kernel: str) -> Contender:
    """``wsgemm.grouped_mm`` as a model calls it in torch's place: no ``out=``, its fresh
    result returned (the allocation counted, as torch's is). With ``out=`` a call on torch's
    road (bf16 weight gradients under ``auto``) must copy torch's result into it, a pass over
    an output of up to 800 MB that ran it at 0.57x torch (docs/perf.md entry 61)."""

    def make(problem: GroupedWorkload, out):
        import wsgemm

        a, b, offs, scale = problem.a, problem.b, problem.offs, problem.row_scale
        if scale is not None:
            return lambda: wsgemm.grouped_mm(a, b, offs, backend=kernel, row_scale=scale)
        return lambda: wsgemm.grouped_mm(a, b, offs, backend=kernel)

    return Contender(f"wsgemm:{kernel}", make, returns_output=True)


def expand(selection: list[str]) -> list[str]:
    """The selected names, ``all`` spelled out and ``wsgemm`` read as ``wsgemm:auto``;
    ValueError for a name the moe suite does not know."""
    names: list[str] = []
    for item in (s.strip() for s in selection):
        for name in DEFAULT_SELECTION if item == "all" else (item,) if item else ():
            if name == "wsgemm":
                name = AUTO
            if name not in (TORCH, LOOP) and not (
                name.startswith("wsgemm:") and len(name) > len("wsgemm:") and "{" not in name
            ):
                raise ValueError(
                    f"unknown backend {name!r} for the moe suite; choose from "
                    f"{', '.join(SELECTABLE)}"
                )
            names.append(name)
    return list(dict.fromkeys(names))


def resolve(
    selection: list[str], device, dtype: str
) -> tuple[list[Contender], list[Unavailable], str]:
    """(contenders, the unavailable ones, the baseline's name): the baseline first, always run
    (``torch`` in bf16 where ``torch._grouped_mm`` runs on ``device``, else ``loop``), then
    ``wsgemm:auto``, then the rest in the order given."""
    names = expand(selection)
    torch_problem = _torch_problem(device, dtype)
    baseline = LOOP if torch_problem else TORCH
    missing = [Unavailable(TORCH, torch_problem)] if torch_problem and TORCH in names else []
    grouped_problem = _wsgemm_problem() if any(n.startswith("wsgemm:") for n in names) else None
    backends = []
    for name in leading_first([baseline, *names], baseline):
        if name == TORCH:
            if not torch_problem:
                backends.append(torch_grouped())
        elif name == LOOP:
            backends.append(loop())
        elif grouped_problem:
            missing.append(Unavailable(name, grouped_problem))
        else:
            backends.append(wsgemm_grouped(name.split(":", 1)[1]))
    return list({b.name: b for b in backends}.values()), missing, baseline


def _torch_problem(device, dtype: str) -> str | None:
    """Why ``torch._grouped_mm`` cannot be a contender here (None when it can)."""
    if dtype != "bf16":
        return f"torch._grouped_mm runs bf16 only (this run is {dtype}); the baseline is loop"
    try:
        import torch

        grouped_mm = torch._grouped_mm
        a = torch.ones(32, 64, dtype=torch.bfloat16, device=device)
        b = torch.ones(2, 32, 64, dtype=torch.bfloat16, device=device).transpose(-1, -2)
        offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
        out = grouped_mm(a, b, offs)
        if not bool((out == 64).all()):
            return "torch._grouped_mm gave a wrong result on a probe; the baseline is loop"
    except Exception as exc:
        return f"torch._grouped_mm does not run here ({_describe(exc)}); the baseline is loop"
    return None


def _wsgemm_problem() -> str | None:
    try:
        import wsgemm

        wsgemm.grouped_mm  # noqa: B018 (the lookup is the probe)
    except Exception as exc:
        return f"wsgemm.grouped_mm is missing ({_describe(exc)})"
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
