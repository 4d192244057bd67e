"""The layer GEMMs of public models, and a seeded draw of them to fit and judge a cost model on.

``MODELS`` holds the published sizes of 42 decoder models in 13 families; each entry's comment
says where its numbers were checked. ``gemms(model, tp)`` lists the GEMMs one layer of a model
runs on one of ``tp`` tensor-parallel ranks, as ``torch.matmul(x, W.T)`` problems: M is the
token count, N the rank's output features, K its input features (the ``TN`` layout in the
bench's letters, layouts.py). ``draw(seed, families, count)`` samples (model, layer, tp, tokens,
dtype) reproducibly.

The families are split once, by vendor, into ``FIT_FAMILIES`` (what a cost model may be fitted
on) and ``HELDOUT_FAMILIES`` (what it is judged on): no vendor's conventions (head sizes, MLP
ratios, vocabularies) are on both sides, and each side has dense and MoE families and small and
large hidden sizes. docs/benchmarking.md ("The models suite") says how to draw a held-out report.

Tensor parallelism splits a layer as Megatron-LM and vLLM do: the QKV and gate/up projections
by output columns, the attention output and down projections by input rows, the LM head by
vocabulary rows, each expert's MLP like the dense one (no expert parallelism). Query heads
must divide among the ranks; KV heads divide too, or, when there are fewer KV heads than ranks,
are replicated (one per rank) as vLLM does. A slice that does not divide evenly (query heads,
KV heads that neither divide nor replicate evenly, an MLP width or a vocabulary not a multiple
of tp) is left out of that tp rather than padded.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..support import AB_DTYPES, short_name

#: Tensor-parallel degrees drawn.
TP_DEGREES = (1, 2, 4, 8)
#: Token counts (M) drawn: log-uniform integers in [1, MAX_TOKENS].
MAX_TOKENS = 16384
DTYPES = tuple(short_name(d) for d in AB_DTYPES)
DEFAULT_COUNT = 64
#: The most draws one call makes: beyond this a count is a typo, not a benchmark.
MAX_COUNT = 10_000


@dataclass(frozen=True)
class Model:
    """One decoder's sizes, as its config.json names them (in brackets).

    ``heads`` is None where attention is left out (DeepSeek's multi-head latent attention,
    whose low-rank projections are not the QKV/O GEMMs below). ``intermediate`` is the dense
    MLP width, None when no layer has a dense MLP (Mixtral, Qwen3-MoE, OLMoE); a MoE model
    has ``expert_intermediate``, ``experts`` and ``experts_per_token`` and, where its MoE
    layers also run shared experts, their summed width ``shared_intermediate``."""

    name: str
    family: str
    hidden: int  # hidden_size
    vocab: int  # vocab_size: the LM head's rows
    heads: int | None = None  # num_attention_heads
    kv_heads: int | None = None  # num_key_value_heads
    head_dim: int | None = None  # head_dim, or hidden_size / num_attention_heads
    intermediate: int | None = None  # intermediate_size of the dense MLP layers
    expert_intermediate: int | None = None  # moe_intermediate_size
    experts: int = 0  # num_experts, num_local_experts, n_routed_experts
    experts_per_token: int = 0  # num_experts_per_tok
    shared_intermediate: int | None = None  # n_shared_experts * moe_intermediate_size

    def __post_init__(self) -> None:
        sizes = ("hidden", "vocab", "heads", "kv_heads", "head_dim", "intermediate",
                 "expert_intermediate", "shared_intermediate")  # fmt: skip
        for field in sizes:
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{self.name}: {field} must be a positive int, got {value!r}")
        attention = (self.heads, self.kv_heads, self.head_dim)
        if any(v is None for v in attention) and any(v is not None for v in attention):
            raise ValueError(f"{self.name}: give heads, kv_heads and head_dim, or none of them")
        if self.heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: {self.heads} heads do not group {self.kv_heads}")
        moe = self.expert_intermediate is not None
        if moe != (self.experts > 0) or moe != (0 < self.experts_per_token <= self.experts):
            raise ValueError(
                f"{self.name}: a MoE model needs expert_intermediate, experts and "
                "0 < experts_per_token <= experts; a dense one none of them"
            )
        if not moe and (self.intermediate is None or self.shared_intermediate is not None):
            raise ValueError(f"{self.name}: a dense model needs intermediate and no shared experts")

    @property
    def moe(self) -> bool:
        return self.experts > 0


# fmt: off
# Where the numbers come from. "HF" is the model's config.json on huggingface.co; the
# transcriptions that were read: litgpt/config.py (Lightning-AI/litgpt, each entry links the
# HF config it copies), mlc-llm's model_preset.py (mlc-ai/mlc-llm, HF configs pasted whole),
# torchtune's _model_builders.py (pytorch/torchtune), and HF configs quoted in full in other
# public repositories (with their "_name_or_path" or a revision-pinned HF link).
MODELS = (
    # -- Meta Llama 3.1 / 3.2 --
    # HF meta-llama/Llama-3.1-8B; litgpt, mlc-llm, torchtune agree.
    Model("llama-3.1-8b", "llama3", hidden=4096, vocab=128256, heads=32, kv_heads=8,
          head_dim=128, intermediate=14336),
    # HF meta-llama/Llama-3.1-70B; litgpt, mlc-llm agree.
    Model("llama-3.1-70b", "llama3", hidden=8192, vocab=128256, heads=64, kv_heads=8,
          head_dim=128, intermediate=28672),
    # HF meta-llama/Llama-3.1-405B; litgpt and Meta's llama-models sku_list (8 KV heads, the
    # bf16 checkpoint, not the replicated-KV mp16 one) agree.
    Model("llama-3.1-405b", "llama3", hidden=16384, vocab=128256, heads=128, kv_heads=8,
          head_dim=128, intermediate=53248),
    # HF meta-llama/Llama-3.2-1B (head_dim 64); litgpt, mlc-llm agree.
    Model("llama-3.2-1b", "llama3", hidden=2048, vocab=128256, heads=32, kv_heads=8,
          head_dim=64, intermediate=8192),
    # HF meta-llama/Llama-3.2-3B; litgpt, mlc-llm agree.
    Model("llama-3.2-3b", "llama3", hidden=3072, vocab=128256, heads=24, kv_heads=8,
          head_dim=128, intermediate=8192),
    # -- Qwen2.5 (the 0.5B-3B vocabulary is 151936, the 7B-72B one 152064) --
    # HF Qwen/Qwen2.5-0.5B; litgpt, mlc-llm (qwen2_0_5b), torchtune agree.
    Model("qwen2.5-0.5b", "qwen2.5", hidden=896, vocab=151936, heads=14, kv_heads=2,
          head_dim=64, intermediate=4864),
    # HF Qwen/Qwen2.5-1.5B; litgpt, torchtune agree.
    Model("qwen2.5-1.5b", "qwen2.5", hidden=1536, vocab=151936, heads=12, kv_heads=2,
          head_dim=128, intermediate=8960),
    # HF Qwen/Qwen2.5-3B; litgpt, mlc-llm, torchtune agree.
    Model("qwen2.5-3b", "qwen2.5", hidden=2048, vocab=151936, heads=16, kv_heads=2,
          head_dim=128, intermediate=11008),
    # HF Qwen/Qwen2.5-7B; litgpt, torchtune agree.
    Model("qwen2.5-7b", "qwen2.5", hidden=3584, vocab=152064, heads=28, kv_heads=4,
          head_dim=128, intermediate=18944),
    # HF Qwen/Qwen2.5-14B; litgpt, torchtune agree.
    Model("qwen2.5-14b", "qwen2.5", hidden=5120, vocab=152064, heads=40, kv_heads=8,
          head_dim=128, intermediate=13824),
    # HF Qwen/Qwen2.5-32B; litgpt, torchtune agree.
    Model("qwen2.5-32b", "qwen2.5", hidden=5120, vocab=152064, heads=40, kv_heads=8,
          head_dim=128, intermediate=27648),
    # HF Qwen/Qwen2.5-72B; litgpt, torchtune agree.
    Model("qwen2.5-72b", "qwen2.5", hidden=8192, vocab=152064, heads=64, kv_heads=8,
          head_dim=128, intermediate=29568),
    # -- Qwen3, dense (head_dim 128 throughout, so q width != hidden on most) --
    # HF Qwen/Qwen3-0.6B; litgpt, mlc-llm, torchtune agree.
    Model("qwen3-0.6b", "qwen3", hidden=1024, vocab=151936, heads=16, kv_heads=8,
          head_dim=128, intermediate=3072),
    # HF Qwen/Qwen3-1.7B; litgpt, mlc-llm, torchtune agree.
    Model("qwen3-1.7b", "qwen3", hidden=2048, vocab=151936, heads=16, kv_heads=8,
          head_dim=128, intermediate=6144),
    # HF Qwen/Qwen3-4B; litgpt, torchtune agree.
    Model("qwen3-4b", "qwen3", hidden=2560, vocab=151936, heads=32, kv_heads=8,
          head_dim=128, intermediate=9728),
    # HF Qwen/Qwen3-8B; litgpt, torchtune, a revision-pinned HF quote agree.
    Model("qwen3-8b", "qwen3", hidden=4096, vocab=151936, heads=32, kv_heads=8,
          head_dim=128, intermediate=12288),
    # HF Qwen/Qwen3-14B; litgpt, torchtune, a revision-pinned HF quote agree.
    Model("qwen3-14b", "qwen3", hidden=5120, vocab=151936, heads=40, kv_heads=8,
          head_dim=128, intermediate=17408),
    # HF Qwen/Qwen3-32B; litgpt, torchtune, a revision-pinned HF quote agree.
    Model("qwen3-32b", "qwen3", hidden=5120, vocab=151936, heads=64, kv_heads=8,
          head_dim=128, intermediate=25600),
    # -- Qwen3 MoE (every layer MoE: the config's intermediate_size is unused) --
    # HF Qwen/Qwen3-30B-A3B; litgpt, a revision-pinned HF quote agree.
    Model("qwen3-30b-a3b", "qwen3-moe", hidden=2048, vocab=151936, heads=32, kv_heads=4,
          head_dim=128, expert_intermediate=768, experts=128, experts_per_token=8),
    # HF Qwen/Qwen3-235B-A22B; litgpt, a revision-pinned HF quote agree.
    Model("qwen3-235b-a22b", "qwen3-moe", hidden=4096, vocab=151936, heads=64, kv_heads=4,
          head_dim=128, expert_intermediate=1536, experts=128, experts_per_token=8),
    # -- Mistral, dense --
    # HF mistralai/Mistral-7B-v0.3 (vocabulary 32768); litgpt, mlc-llm agree.
    Model("mistral-7b-v0.3", "mistral", hidden=4096, vocab=32768, heads=32, kv_heads=8,
          head_dim=128, intermediate=14336),
    # HF mistralai/Mistral-Nemo-Base-2407 (head_dim 128 != 5120 / 32), quoted whole.
    Model("mistral-nemo-12b", "mistral", hidden=5120, vocab=131072, heads=32, kv_heads=8,
          head_dim=128, intermediate=14336),
    # HF mistralai/Mistral-Large-Instruct-2407; litgpt only.
    Model("mistral-large-2407", "mistral", hidden=12288, vocab=32768, heads=96, kv_heads=8,
          head_dim=128, intermediate=28672),
    # -- Mixtral (Mistral's MoE: every layer MoE, intermediate_size is the expert width) --
    # HF mistralai/Mixtral-8x7B-v0.1; litgpt, mlc-llm, a revision-pinned HF quote agree.
    Model("mixtral-8x7b", "mixtral", hidden=4096, vocab=32000, heads=32, kv_heads=8,
          head_dim=128, expert_intermediate=14336, experts=8, experts_per_token=2),
    # HF mistralai/Mixtral-8x22B-Instruct-v0.1 (vocabulary 32768); litgpt, and microsoft's
    # superbench (widths, heads) agree.
    Model("mixtral-8x22b", "mixtral", hidden=6144, vocab=32768, heads=48, kv_heads=8,
          head_dim=128, expert_intermediate=16384, experts=8, experts_per_token=2),
    # -- Google Gemma 2 (head_dim 256 on the two smaller ones; GeGLU has gate/up too) --
    # HF google/gemma-2-2b; litgpt, mlc-llm agree.
    Model("gemma-2-2b", "gemma2", hidden=2304, vocab=256000, heads=8, kv_heads=4,
          head_dim=256, intermediate=9216),
    # HF google/gemma-2-9b; litgpt, mlc-llm, an HF config quoted whole agree.
    Model("gemma-2-9b", "gemma2", hidden=3584, vocab=256000, heads=16, kv_heads=8,
          head_dim=256, intermediate=14336),
    # HF google/gemma-2-27b; litgpt, mlc-llm agree.
    Model("gemma-2-27b", "gemma2", hidden=4608, vocab=256000, heads=32, kv_heads=16,
          head_dim=128, intermediate=36864),
    # -- Microsoft Phi-3 / Phi-4 (fused qkv_proj and gate_up_proj: the same GEMMs) --
    # HF microsoft/Phi-3-mini-4k-instruct (head_dim 96); litgpt, torchtune, mlc-llm agree.
    Model("phi-3-mini", "phi", hidden=3072, vocab=32064, heads=32, kv_heads=32,
          head_dim=96, intermediate=8192),
    # HF microsoft/Phi-3-medium-4k-instruct, as GenZ-LLM-Analyzer transcribes it (HF link).
    Model("phi-3-medium", "phi", hidden=5120, vocab=32064, heads=40, kv_heads=10,
          head_dim=128, intermediate=17920),
    # HF microsoft/phi-4; litgpt, torchtune, a revision-pinned HF quote agree.
    Model("phi-4", "phi", hidden=5120, vocab=100352, heads=40, kv_heads=10,
          head_dim=128, intermediate=17920),
    # -- DeepSeek (multi-head latent attention: attention left out) --
    # HF deepseek-ai/DeepSeek-V3 and the V3 repository's inference/configs/config_671B.json
    # agree: dense MLP in the first 3 layers, 256 routed experts (8 a token) and one shared
    # expert of the routed width in the others.
    Model("deepseek-v3", "deepseek", hidden=7168, vocab=129280, intermediate=18432,
          expert_intermediate=2048, experts=256, experts_per_token=8, shared_intermediate=2048),
    # HF deepseek-ai/DeepSeek-V2-Lite, as mlc-llm pastes it: dense MLP in the first layer,
    # 64 routed experts (6 a token) and 2 shared ones.
    Model("deepseek-v2-lite", "deepseek", hidden=2048, vocab=102400, intermediate=10944,
          expert_intermediate=1408, experts=64, experts_per_token=6, shared_intermediate=2816),
    # -- TII Falcon3 (Llama layout, head_dim 256; the 7B is left out: its vocabulary reads
    # 131072 in litgpt and 131080 elsewhere) --
    # HF tiiuae/Falcon3-1B-Base; litgpt and a second transcription agree.
    Model("falcon3-1b", "falcon3", hidden=2048, vocab=131072, heads=8, kv_heads=4,
          head_dim=256, intermediate=8192),
    # HF tiiuae/Falcon3-3B-Base; litgpt and a second transcription agree.
    Model("falcon3-3b", "falcon3", hidden=3072, vocab=131072, heads=12, kv_heads=4,
          head_dim=256, intermediate=9216),
    # HF tiiuae/Falcon3-10B-Base; litgpt, a revision-pinned HF quote agree.
    Model("falcon3-10b", "falcon3", hidden=3072, vocab=131072, heads=12, kv_heads=4,
          head_dim=256, intermediate=23040),
    # -- AI2 OLMo 2 --
    # HF allenai/OLMo-2-1124-7B; litgpt, mlc-llm agree.
    Model("olmo-2-7b", "olmo2", hidden=4096, vocab=100352, heads=32, kv_heads=32,
          head_dim=128, intermediate=11008),
    # HF allenai/OLMo-2-1124-13B; litgpt, mlc-llm agree.
    Model("olmo-2-13b", "olmo2", hidden=5120, vocab=100352, heads=40, kv_heads=40,
          head_dim=128, intermediate=13824),
    # HF allenai/OLMo-2-0325-32B; mlc-llm, a revision-pinned HF quote agree.
    Model("olmo-2-32b", "olmo2", hidden=5120, vocab=100352, heads=40, kv_heads=8,
          head_dim=128, intermediate=27648),
    # -- AI2 OLMoE (every layer MoE) --
    # HF allenai/OLMoE-1B-7B-0924, as three repositories quote its config; the width is also
    # what the published 6.9B total / 1.3B active parameters imply (2048 would double them).
    Model("olmoe-1b-7b", "olmoe", hidden=2048, vocab=50304, heads=16, kv_heads=16,
          head_dim=128, expert_intermediate=1024, experts=64, experts_per_token=8),
    # -- 01.AI Yi 1.5 (Llama layout) --
    # HF 01-ai/Yi-1.5-6B, quoted whole.
    Model("yi-1.5-6b", "yi", hidden=4096, vocab=64000, heads=32, kv_heads=4,
          head_dim=128, intermediate=11008),
    # HF 01-ai/Yi-1.5-34B, quoted whole, and a revision-pinned HF quote agree.
    Model("yi-1.5-34b", "yi", hidden=7168, vocab=64000, heads=56, kv_heads=8,
          head_dim=128, intermediate=20480),
)
# fmt: on

#: Every family, in table order (the order draws enumerate them in).
FAMILIES = tuple(dict.fromkeys(m.family for m in MODELS))
#: Split by vendor: Meta, Alibaba and Mistral to fit on; Google, Microsoft, DeepSeek, TII,
#: AI2 and 01.AI to judge on. Dense and MoE on both sides (MoE: qwen3-moe and mixtral to fit,
#: deepseek and olmoe held out), hidden sizes 896-16384 to fit and 2048-7168 held out.
FIT_FAMILIES = ("llama3", "qwen2.5", "qwen3", "qwen3-moe", "mistral", "mixtral")
HELDOUT_FAMILIES = ("gemma2", "phi", "deepseek", "falcon3", "olmo2", "olmoe", "yi")
BY_NAME = {m.name: m for m in MODELS}


@dataclass(frozen=True)
class Gemm:
    """One layer GEMM on one tensor-parallel rank: ``x (M, k) @ W.T`` with ``W (n, k)``."""

    layer: str
    n: int
    k: int


@dataclass(frozen=True)
class Draw:
    """One drawn problem: ``tokens`` rows of ``model``'s ``layer`` on one of ``tp`` ranks, in
    ``dtype``. For the expert layers ``tokens`` is what reaches one expert, not the batch."""

    model: str
    family: str
    layer: str
    tp: int
    tokens: int
    dtype: str
    n: int
    k: int

    @property
    def m(self) -> int:
        return self.tokens

    @property
    def label(self) -> str:
        return f"{self.model} {self.layer} tp={self.tp} t={self.tokens}"


def gemms(model: Model, tp: int) -> tuple[Gemm, ...]:
    """The layer GEMMs of ``model`` on one of ``tp`` ranks, leaving out slices that do not
    divide evenly (the module docstring's rules)."""
    if tp not in TP_DEGREES:
        raise ValueError(f"tp must be one of {TP_DEGREES}, got {tp!r}")
    out = []
    if model.heads is not None and model.heads % tp == 0:
        kv = _kv_heads_per_rank(model.kv_heads, tp)
        if kv is not None:
            q = model.heads // tp
            out += [
                Gemm("qkv", (q + 2 * kv) * model.head_dim, model.hidden),
                Gemm("o", model.hidden, q * model.head_dim),
            ]
    out += _mlp("", model.hidden, model.intermediate, tp)
    out += _mlp("shared_", model.hidden, model.shared_intermediate, tp)
    out += _mlp("expert_", model.hidden, model.expert_intermediate, tp)
    if model.vocab % tp == 0:
        out.append(Gemm("lm_head", model.vocab // tp, model.hidden))
    return tuple(out)


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int | None:
    """KV heads split across ranks, or replicated one per rank when fewer than the ranks
    (vLLM's rule); None when neither is even."""
    if kv_heads >= tp:
        return kv_heads // tp if kv_heads % tp == 0 else None
    return 1 if tp % kv_heads == 0 else None


def _mlp(prefix: str, hidden: int, width: int | None, tp: int) -> list[Gemm]:
    """Fused gate/up (column-parallel) and down (row-parallel) of a gated MLP of ``width``."""
    if width is None or width % tp:
        return []
    return [
        Gemm(f"{prefix}gate_up", 2 * width // tp, hidden),
        Gemm(f"{prefix}down", hidden, width // tp),
    ]


def from_config(config: dict, name: str = "model") -> Model:
    """A ``Model`` from a Hugging Face ``config.json`` (its keys in ``Model``'s brackets; a
    ``text_config`` inside is read instead). MoE: the experts' width is
    ``moe_intermediate_size`` (else ``intermediate_size``, as Mixtral's), the dense width
    ``intermediate_size_mlp`` or ``intermediate_size`` only where some layers stay dense
    (``first_k_dense_replace``, ``mlp_only_layers``, a ``decoder_sparse_step`` or
    ``interleave_moe_layer_step`` above 1); shared experts from ``n_shared_experts`` or
    ``shared_expert_intermediate_size``. Multi-head latent attention (``kv_lora_rank``) has no
    QKV/O GEMMs here. ValueError naming a missing or wrong key."""
    if not isinstance(config, dict):
        raise ValueError(f"{name}: a config is a JSON object, got {type(config).__name__}")
    try:
        return _from_config(config.get("text_config") or config, name)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not a config this reads ({type(exc).__name__}: {exc})") from None


def _from_config(c: dict, name: str) -> Model:
    if "hidden_size" not in c or "vocab_size" not in c:
        raise ValueError("config needs hidden_size and vocab_size")
    hidden, vocab = int(c["hidden_size"]), int(c["vocab_size"])
    heads = kv_heads = head_dim = None
    if c.get("num_attention_heads") and not c.get("kv_lora_rank"):
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or hidden // heads)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts")
                  or 0)  # fmt: skip
    dense = c.get("intermediate_size")
    fields = {}
    if experts:
        moe_width = c.get("moe_intermediate_size") or dense
        # the dense layers' width: Llama-4's own key, else intermediate_size beside a MoE width
        dense_width = c.get("intermediate_size_mlp") or (
            dense if c.get("moe_intermediate_size") else None
        )
        keeps_dense = (c.get("first_k_dense_replace") or c.get("mlp_only_layers")
                       or int(c.get("decoder_sparse_step") or 1) > 1
                       or int(c.get("interleave_moe_layer_step") or 1) > 1)  # fmt: skip
        shared = c.get("shared_expert_intermediate_size") or (
            int(c["n_shared_experts"]) * int(moe_width) if c.get("n_shared_experts") else None
        )
        fields = dict(
            intermediate=int(dense_width) if keeps_dense and dense_width else None,
            expert_intermediate=int(moe_width), experts=experts,
            experts_per_token=int(c.get("num_experts_per_tok") or 1),
            shared_intermediate=int(shared) if shared else None,
        )  # fmt: skip
    else:
        fields = dict(intermediate=int(dense) if dense else None)
    return Model(name, "user", hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads,
                 head_dim=head_dim, **fields)  # fmt: skip


def family_models(families: tuple[str, ...] | list[str] | None = None) -> tuple[Model, ...]:
    """The models of ``families`` (None: all), in table order; ValueError naming the allowed
    families for an unknown one."""
    if families is None:
        return MODELS
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown model famil{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(map(repr, unknown))}; choose from {', '.join(FAMILIES)}"
        )
    if not families:
        raise ValueError(f"no model families given; choose from {', '.join(FAMILIES)}")
    return tuple(m for m in MODELS if m.family in families)


def draw(
    seed: int, families: tuple[str, ...] | list[str] | None = None, count: int = DEFAULT_COUNT
) -> list[Draw]:
    """``count`` distinct problems drawn with ``random.Random(seed)``: a family (uniformly, so a
    family of seven models weighs as much as one of one), one of its models, a tp degree with
    at least one GEMM, one of the GEMMs, a log-uniform token count in [1, MAX_TOKENS] and a
    dtype. ``families`` (None: all) only filters: the same set in any order draws the same.

    Reproducible for a seed: every choice comes from ``Random.random()``, the one part of the
    random module Python promises to keep across versions (``choice`` and ``uniform`` may
    change), and nothing depends on set or hash order."""
    if not (isinstance(count, int) and 1 <= count <= MAX_COUNT):
        raise ValueError(f"count must be an int in [1, {MAX_COUNT}], got {count!r}")
    chosen = family_models(families)
    by_family = {f: [m for m in chosen if m.family == f] for f in FAMILIES}
    names = [f for f in FAMILIES if by_family[f]]
    rng = random.Random(seed)
    out: list[Draw] = []
    seen = set()
    while len(out) < count:
        model = _pick(rng, by_family[_pick(rng, names)])
        tp = _pick(rng, [tp for tp in TP_DEGREES if gemms(model, tp)])
        gemm = _pick(rng, gemms(model, tp))
        tokens = _log_uniform_tokens(rng)
        dtype = _pick(rng, DTYPES)
        key = (model.name, gemm.layer, tp, tokens, dtype)
        if key in seen:  # a repeat would be measured twice under one label
            continue
        seen.add(key)
        out.append(Draw(model.name, model.family, gemm.layer, tp, tokens, dtype, gemm.n, gemm.k))
    return out


def _pick(rng: random.Random, items):
    """One of ``items``, uniformly, from ``rng.random()`` alone (the min: ``random() * n`` can
    round up to n)."""
    return items[min(len(items) - 1, int(rng.random() * len(items)))]


def _log_uniform_tokens(rng: random.Random) -> int:
    """floor(exp(U * ln(MAX_TOKENS + 1))), U uniform in [0, 1): each t in [1, MAX_TOKENS]
    with probability ln((t + 1) / t) / ln(MAX_TOKENS + 1), the discrete log-uniform law."""
    return min(MAX_TOKENS, int(math.exp(rng.random() * math.log(MAX_TOKENS + 1))))
