"""The problem sizes the benchmark runs: named suites and ``--shapes`` strings.

A shape is a GEMM ``C[M, N] = A[M, K] @ B[K, N]``. For transformer layers M is the number of
tokens, N the layer's output features and K its input features (``x @ W.T`` with ``W`` of shape
``(N, K)``), so the weights are the K-major B of the ``TN`` layout. The ``models`` suite draws such
layer GEMMs from public models' configs (models.py); the ``moe`` suite's problems are grouped
GEMMs of mixture-of-experts layers (moe.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import moe
from .layouts import LAYOUTS
from .models import DEFAULT_COUNT, draw


@dataclass(frozen=True)
class Shape:
    """One GEMM problem size; ``label`` names it in tables and plots, ``group`` groups plots;
    ``layout`` (``TN``, ...) is this shape's own operand layout, which wins over the run's
    ``--layout`` (empty: the run's)."""

    m: int
    n: int
    k: int
    label: str = ""
    group: str = ""
    layout: str = ""

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Shape.{name} must be an int >= 1, got {value!r}")
        if self.layout and self.layout not in LAYOUTS:
            raise ValueError(
                f"Shape.layout must be empty or one of {', '.join(LAYOUTS)}, got {self.layout!r}"
            )
        if not self.label:
            object.__setattr__(self, "label", f"{self.m}x{self.n}x{self.k}")

    @property
    def flop(self) -> int:
        """Multiply-adds count twice, the usual GEMM convention."""
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class Transformer:
    """The four GEMMs of one layer of a Llama-style decoder (grouped-query attention, SwiGLU).

    Gate and up projections are fused into one GEMM of ``2 * ffn`` outputs, as serving stacks
    run them."""

    name: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int

    def projections(self) -> tuple[tuple[str, int, int], ...]:
        """(name, N, K) of each projection."""
        q = self.q_heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return (
            ("qkv", q + 2 * kv, self.hidden),
            ("o", self.hidden, q),
            ("gate_up", 2 * self.ffn, self.hidden),
            ("down", self.hidden, self.ffn),
        )


# Llama-3 8B and 70B: the published configs (hidden, heads, kv heads, head dim, FFN width).
MODELS = {
    "8b": Transformer("8b", hidden=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "70b": Transformer("70b", hidden=8192, q_heads=64, kv_heads=8, head_dim=128, ffn=28672),
}

SQUARE_SIZES = (1024, 2048, 4096, 8192, 16384)
LLM_TOKENS = (1, 16, 128, 1024, 4096, 16384)
DECODE_TOKENS = (1, 16, 64, 128)
#: The token bands the issues report speed by (M of a TN layer GEMM: decode, small batches,
#: the mid band, prefill): ``token_band`` names them "1-16", "17-128", "129-1024", ">1024".
TOKEN_BANDS = ((1, 16), (17, 128), (129, 1024), (1025, None))


def token_band(m: int) -> str:
    """The name of the ``TOKEN_BANDS`` band that holds ``m`` (>= 1)."""
    for lo, hi in TOKEN_BANDS:
        if hi is None or m <= hi:
            return f"{lo}-{hi}" if hi else f">{lo - 1}"
    raise AssertionError(m)


# Shapes no tile divides: primes (M, N and K all prime, so no tile, vector width or cluster
# shape divides them, and K-major rows are not 16-byte aligned), then multiples of 8 that are
# multiples of no tile (aligned rows, ragged edge tiles only).
RAGGED = (
    (1021, 1021, 1021),
    (2053, 4099, 1031),
    (4093, 4093, 4093),
    (8191, 8191, 8191),
    (127, 4099, 8191),
    (1000, 3000, 5000),
    (4104, 6152, 4104),
    (8200, 2056, 8200),
)

# Mid-size problems, a few thousand per dimension, where the tile menu and its policy must hold
# up without a model's shapes to be tuned on (the bar issue #10 set). Drawn once,
# before any tuning, and fixed here: random.Random(20261201), each dimension
# round(exp(uniform(ln 500, ln 6000))), every other shape rounded down to a multiple of 8 (16-byte
# rows, ragged edge tiles only) and the rest left ragged (unaligned rows, which the API copies),
# layouts TN, NN, NT, TT in turn.
MIDSIZE = (
    (704, 5528, 720, "TN"),
    (808, 5903, 591, "NN"),
    (5024, 880, 1112, "NT"),
    (4527, 3910, 4047, "TT"),
    (2360, 632, 3488, "TN"),
    (4241, 2251, 5402, "NN"),
    (1128, 1968, 4056, "NT"),
    (935, 4933, 2295, "TT"),
    (2144, 1776, 1960, "TN"),
    (535, 3073, 1084, "NN"),
    (4272, 4552, 544, "NT"),
    (2345, 778, 1684, "TT"),
    (736, 5440, 2400, "TN"),
    (1116, 2557, 4337, "NN"),
    (840, 760, 2560, "NT"),
    (2530, 4278, 4085, "TT"),
    (4472, 1928, 680, "TN"),
    (5793, 1015, 1586, "NN"),
    (560, 1088, 2336, "NT"),
    (608, 3263, 4259, "TT"),
    (2712, 3592, 2920, "TN"),
    (1118, 811, 646, "NN"),
    (2888, 2072, 1504, "NT"),
    (943, 2078, 845, "TT"),
)


def square(sizes: tuple[int, ...] = SQUARE_SIZES) -> list[Shape]:
    return [Shape(s, s, s, label=f"{s}^3", group="square") for s in sizes]


def llm(
    tokens: tuple[int, ...] = LLM_TOKENS, models: tuple[str, ...] = ("8b", "70b")
) -> list[Shape]:
    shapes = []
    for model_name in models:
        model = _model(model_name)
        for proj, n, k in model.projections():
            for t in tokens:
                shapes.append(Shape(t, n, k, label=f"{model.name} {proj} t={t}", group=model.name))
    return shapes


def decode(
    tokens: tuple[int, ...] = DECODE_TOKENS, models: tuple[str, ...] = ("8b", "70b")
) -> list[Shape]:
    return llm(tokens, models)


def ragged() -> list[Shape]:
    return [Shape(m, n, k, group="ragged") for m, n, k in RAGGED]


def midsize() -> list[Shape]:
    return [
        Shape(m, n, k, label=f"{m}x{n}x{k} {layout}", group="midsize", layout=layout)
        for m, n, k, layout in MIDSIZE
    ]


def quick() -> list[Shape]:
    """The README's main-job suite: two square sizes and the 8B gate/up GEMM at 4096 tokens."""
    gate_up = next(p for p in MODELS["8b"].projections() if p[0] == "gate_up")
    return square((4096, 8192)) + [
        Shape(4096, gate_up[1], gate_up[2], label="8b gate_up t=4096", group="8b")
    ]


def drawn(
    seed: int = 0,
    families: tuple[str, ...] | None = None,
    count: int = DEFAULT_COUNT,
    dtype: str | None = None,
) -> list[Shape]:
    """The ``models`` suite: ``models.draw(seed, families, count)`` as shapes grouped by family,
    keeping only the draws of ``dtype`` when one is given: a run has one dtype, so the fp16 and
    the bf16 run of one seed measure the whole draw between them, each problem in the dtype it
    was drawn with."""
    shapes = [
        Shape(d.m, d.n, d.k, label=d.label, group=d.family)
        for d in draw(seed, families, count)
        if dtype is None or d.dtype == dtype
    ]
    if not shapes:
        raise ValueError(f"the {count} problems drawn with seed {seed} have none in {dtype}")
    return shapes


SUITES = ("square", "llm", "decode", "ragged", "midsize", "quick", "models", "moe")


def suite(
    name: str,
    *,
    tokens: tuple[int, ...] | None = None,
    models: tuple[str, ...] | None = None,
    seed: int = 0,
    families: tuple[str, ...] | None = None,
    count: int | None = None,
    dtype: str | None = None,
    routings: tuple[str, ...] | None = None,
    passes: tuple[str, ...] | None = None,
) -> list[Shape] | list[moe.GroupedShape]:
    """The shapes of suite ``name``; ``tokens``/``models`` override the LLM suites' defaults,
    ``seed``, ``families``, ``count`` and ``dtype`` pick the models suite's draw (``drawn``).
    The moe suite's grouped problems (``moe.problems``) take ``seed``, ``models`` (MoE models),
    ``tokens`` (per expert), ``routings`` and ``passes``."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    if name != "models" and (families is not None or count is not None):
        raise ValueError(f"--families and --count apply to the models suite, not {name!r}")
    if name == "moe":
        return moe.problems(seed, models, tokens, routings, passes)
    if routings or passes:
        raise ValueError(f"--routing/--pass apply to the moe suite, not {name!r}")
    if name in ("llm", "decode"):
        default = LLM_TOKENS if name == "llm" else DECODE_TOKENS
        return llm(tokens or default, models or tuple(MODELS))
    if tokens or models:
        raise ValueError(
            f"--tokens and --models apply to the llm and decode suites, not {name!r} (moe "
            "takes them too)"
        )
    if name == "models":
        return drawn(seed, families, DEFAULT_COUNT if count is None else count, dtype)
    return {"square": square, "ragged": ragged, "midsize": midsize, "quick": quick}[name]()


def parse_shapes(text: str) -> list[Shape]:
    """Parse ``"M,N,K;M,N,K"`` (``x`` also separates, whitespace is ignored)."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        fields = [f for f in re.split(r"[,xX\s]+", item) if f]
        if len(fields) != 3 or not all(_positive(f) for f in fields):
            raise ValueError(f"bad shape {item!r}: expected three positive integers M,N,K")
        m, n, k = (int(f) for f in fields)
        shapes.append(Shape(m, n, k, group="custom"))
    if not shapes:
        raise ValueError(f"no shapes in {text!r}: expected 'M,N,K;M,N,K;...'")
    return shapes


def parse_int_list(text: str) -> tuple[int, ...]:
    """Parse ``"1,16,128"`` into positive ints."""
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields or not all(_positive(f) for f in fields):
        raise ValueError(f"expected a comma-separated list of positive integers, got {text!r}")
    return tuple(int(f) for f in fields)


def _positive(field: str) -> bool:
    """``field`` is a positive decimal integer in ASCII digits (``str.isdigit`` alone also
    takes digits such as ``'\u00b2'`` that ``int`` refuses)."""
    return field.isascii() and field.isdigit() and int(field) > 0


def _model(name: str) -> Transformer:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}") from None
