"""GPU correctness of the fused epilogue, ``activation(a @ b + bias)`` (issue #25, step 1).

Against a float64 reference of the same formula; the tolerance is the suite's
(``assert_within_torch_error``): twice the error of torch's own unfused path in the same dtypes
(``activation(torch.matmul(a, b) + bias)``), plus the fp32 accumulation bound where the output is
fp32, scaled by how much the activation can stretch an error (its largest slope on the values
seen). Outputs are poisoned first. Every backend (sm80 applies the epilogue after the product),
``auto`` (swap-AB at few tokens, split-K where the policy splits), explicit split-K and stream-K
configs, batched and folded batches, row, column and scalar biases, column-major operands,
offset views, ``out=``, and a second call of a signature (its launcher, with another bias).
"""

import random

import pytest
import torch
from operands import assert_within_torch_error, fp32_accumulation_bound, make

import wsgemm
from wsgemm import api, host
from wsgemm.api.epilogue import torch_activation

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, scope="module")
def fusing():
    """The sm90 fused-epilogue kernels switched on for this module (``FUSING_FAMILIES``: off
    on main until these tests pass on a GPU), with no launcher kept from before or after."""
    from wsgemm.host import registry

    saved = registry.FUSING_FAMILIES
    registry.FUSING_FAMILIES = registry.EPILOGUE_FAMILIES
    api.DISPATCHER.forget()
    yield
    registry.FUSING_FAMILIES = saved
    api.DISPATCHER.forget()


ACTIVATIONS = [None, "relu", "relu2", "gelu", "gelu_tanh", "silu"]
BIASES = ["col", "row", "scalar", "none"]
DIMS = [1, 2, 7, 8, 16, 31, 64, 97, 128, 129, 257, 383, 640, 1021]
CASES = 96


def _cases(seed):
    rng = random.Random(seed)
    out = []
    for i in range(CASES):
        m, n, k = (rng.choice(DIMS) for _ in range(3))
        if i % 16 == 0:
            m, n, k = rng.choice([(2048, 1536, 1024), (1031, 2053, 777), (16, 4096, 4096)])
        act = ACTIVATIONS[i % len(ACTIVATIONS)]
        bias = BIASES[(i // len(ACTIVATIONS)) % len(BIASES)]
        if act is None and bias == "none":
            bias = "col"
        out.append(dict(
            m=m, n=n, k=k, act=act, bias=bias,
            ab=(torch.float16, torch.bfloat16)[i % 2],
            out_dtype=None if i % 3 else torch.float32,
            a_col=rng.random() < 0.5, b_col=rng.random() < 0.5,
            batch=rng.choice(["none", "none", "both", "a3b2"]),
            offset=rng.choice([0, 0, 8]), use_out=i % 2 == 1,
        ))  # fmt: skip
    return out


def _bias(case, gen):
    m, n, ab = case["m"], case["n"], case["ab"]
    shape = {"col": (n,), "row": (m, 1), "scalar": (), "none": None}[case["bias"]]
    if shape is None:
        return None
    return torch.randn(shape, generator=gen).to(ab).cuda()


def _slope(act, pre: torch.Tensor) -> float:
    """The activation's largest slope on values like ``pre`` (an error in the pre-activation is
    stretched by at most this)."""
    if act == "relu2":
        return 2.0 * pre.abs().max().item() + 1.0
    return 1.2  # relu, silu (1.1), gelu (1.13), gelu_tanh (1.13), none (1)


def check(case, backend, gen, config=None, second=False):
    ab, m, n, k = case["ab"], case["m"], case["n"], case["k"]
    la, lb = {"none": (None, None), "both": (3, 3), "a3b2": (3, None)}[case["batch"]]
    a = make(((la,) if la else ()) + (m, k), ab, "cuda", col_major=case["a_col"],
             offset=case["offset"], gen=gen)  # fmt: skip
    b = make(((lb,) if lb else ()) + (k, n), ab, "cuda", col_major=case["b_col"],
             offset=case["offset"], gen=gen)  # fmt: skip
    bias, act = _bias(case, gen), case["act"]
    pre = torch.matmul(a.double(), b.double()) + (0 if bias is None else bias.double())
    ref = torch_activation(act or "none", pre)
    want = case["out_dtype"] or ab
    kw = dict(out_dtype=case["out_dtype"], backend=backend, bias=bias, activation=act)
    call = wsgemm.matmul
    if config is not None:
        call = api.matmul
        kw["config"] = config
    for attempt in range(2 if second else 1):
        if attempt:  # the signature's launcher, with another bias's values
            bias = None if bias is None else torch.randn_like(bias, dtype=torch.float32).to(ab)
            kw["bias"] = bias
            pre = torch.matmul(a.double(), b.double()) + (0 if bias is None else bias.double())
            ref = torch_activation(act or "none", pre)
        if case["use_out"] or config is not None:
            out = torch.full(ref.shape, float("nan"), dtype=want, device="cuda")
            got = call(a, b, out=out, **kw)
            assert got is out
        else:
            torch.full((ref.numel() + 4096,), float("nan"), dtype=want, device="cuda")
            got = call(a, b, **kw)
    assert got.shape == ref.shape and got.dtype == want
    assert not torch.isnan(got).any(), "unwritten (poisoned) output elements"
    theirs = torch.matmul(a, b) if want != torch.float32 else torch.matmul(a.float(), b.float())
    theirs = theirs.to(want)
    if bias is not None:
        theirs = theirs + bias.to(want)
    theirs = torch_activation(act or "none", theirs)
    slack = fp32_accumulation_bound(a, b) if want == torch.float32 else 0.0
    assert_within_torch_error(got, ref, theirs, slack=slack * _slope(act, pre))


def _backends():
    names = wsgemm.available_backends() if torch.cuda.is_available() else []
    return ["auto", *(names or ["sm90"])]


# auto takes every case; each named backend every other one (their shapes differ anyway)
BACKEND_CASES = [
    (backend, index)
    for backend in _backends()
    for index in range(CASES)
    if backend == "auto" or index % 2 == 0
]


@pytest.mark.parametrize("backend, index", BACKEND_CASES)
def test_fused_epilogue(backend, index):
    case = _cases(4242)[index]
    check(case, backend, torch.Generator().manual_seed(index), second=index % 4 == 0)


@pytest.mark.parametrize("form", ["split_k", "stream_k"])
@pytest.mark.parametrize("index", range(0, CASES, 4))
def test_fused_epilogue_split(form, index):
    """The epilogue runs once, after the fix-up, on the unit that finishes the tile."""
    from wsgemm.kernels.sm90.config import Sm90Config

    case = dict(_cases(4242)[index], k=max(_cases(4242)[index]["k"], 300))
    config = Sm90Config(split_k=3) if form == "split_k" else Sm90Config(stream_k=True)
    check(case, "sm90", torch.Generator().manual_seed(index), config=config)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_fused_linear_gradients(act):
    """``linear`` with a bias and an activation: the gradients of input, weight and bias against
    float64 autograd of the same formula."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 37, 96, generator=gen).half().cuda().requires_grad_()
    w = (torch.randn(160, 96, generator=gen) / 10).half().cuda().requires_grad_()
    bias = torch.randn(160, generator=gen).half().cuda().requires_grad_()
    g = torch.randn(3, 37, 160, generator=gen).half().cuda()
    wsgemm.linear(x, w, bias, activation=act).backward(g)
    ref = [t.detach().double().requires_grad_() for t in (x, w, bias)]
    y = torch_activation(act or "none", torch.nn.functional.linear(*ref))
    y.backward(g.double())
    for got, r, name in zip((x.grad, w.grad, bias.grad), ref, ("x", "w", "bias"), strict=True):
        scale = r.grad.abs().max().item() + 1.0
        err = (got.double() - r.grad).abs().max().item()
        assert err <= 2e-2 * scale, f"{name}.grad off by {err:.3g} (scale {scale:.3g})"


# ----------------------------------------------------------------------------- gated (step 2)

GATED_CASES = [
    (m, half, k, act, ab)
    for (m, half, k) in (
        (1, 64, 64),
        (7, 128, 200),
        (64, 1000, 4096),
        (300, 4096, 1024),
        (2048, 1536, 4096),
    )  # fmt: skip
    for act, ab in (
        ("silu", torch.bfloat16),
        ("gelu_tanh", torch.float16),
        ("relu2", torch.bfloat16),
    )
]


@pytest.mark.parametrize("m, half, k, act, ab", GATED_CASES)
def test_gated_linear_matches_float64(m, half, k, act, ab):
    """``act(x @ w_gate.T) * (x @ w_up.T)`` in one kernel, against float64; torch's road
    (the product in the dtype, then the gate in fp32) sets the tolerance."""
    gen = torch.Generator().manual_seed(m * 7 + half)
    x = make((m, k), ab, "cuda", gen=gen)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
    got = wsgemm.gated_linear(x, w, act)
    assert_gated_right(got, x, w, act, f"gated {act}")


def assert_gated_right(got, x, w, act, what, bias=None):
    """``got`` against float64 ``act(x Wg^T + bg) * (x Wu^T + bu)``, torch's road (the
    product in x's dtype, then the gate in fp32) setting the tolerance; every value finite."""
    half = w.shape[0] // 2
    y64, y = x.double() @ w.double().T, (x @ w.T).float()
    if bias is not None:
        y64, y = y64 + bias.double(), y + bias.float()
    ref = torch_activation(act, y64[:, :half]) * y64[:, half:]
    theirs = (torch_activation(act, y[:, :half]) * y[:, half:]).to(x.dtype)
    assert torch.isfinite(got).all(), what
    assert_within_torch_error(got, ref, theirs, what)


def asked_epilogues(monkeypatch) -> list:
    """The epilogue names of the kernels the shared dispatcher is asked for from now on (a
    list the calls fill)."""
    asked = []
    kernel = api.DISPATCHER.kernel
    monkeypatch.setattr(api.DISPATCHER, "kernel",
                        lambda *a, **k: asked.append(a[6] if len(a) > 6 else k.get("epilogue"))
                        or kernel(*a, **k))  # fmt: skip
    return asked


def assert_grads_match(module, x, x64, p64) -> None:
    """``x``'s and every parameter's gradient against float64's (``x64``, ``p64`` by name)."""
    for name, p in [("x", x), *module.named_parameters()]:
        want = x64.grad if name == "x" else p64[name].grad
        err = (p.grad.double() - want).abs().max().item()
        assert err <= 2**-6 * want.abs().max().item() + 1e-3, name


class GatedKernelOnly(api.Dispatcher):
    """The gated kernel whatever the cost model's road, on the shared compile cache; records
    the epilogue of every kernel it was asked for."""

    def __init__(self):
        from wsgemm.api import DISPATCHER

        super().__init__(DISPATCHER.cache)
        self.epilogues = []
        self.configs = []
        self.backends = []

    def gated_unfused(self, *args):
        return None

    def kernel(self, backend, device, dtypes, a_major, b_major, config=None, epilogue="none",
               grouping="none"):  # fmt: skip
        self.epilogues.append(epilogue)
        self.configs.append(config)
        self.backends.append(backend)
        return super().kernel(backend, device, dtypes, a_major, b_major, config, epilogue,
                              grouping)  # fmt: skip


@pytest.fixture
def gated_swap(monkeypatch):
    """The gated swap-AB decode tile switched on (``GATED_SWAP_FAMILIES``: on on main since
    these cases passed, docs/perf.md entry 85), with no launcher kept from before or after."""
    yield from _switched_on(monkeypatch, "GATED_SWAP_FAMILIES")


#: ``GatedKernelOnly`` read for each kernel's config (was it the swap tile?): it records them.
SwapTiles = GatedKernelOnly


GATED_SWAP_CASES = [
    (m, half, k, act, ab, x_major)
    for (m, half, k) in (
        (1, 64, 64),  # one row, one tile
        (5, 200, 1000),  # a ragged last tile of rows (200 = 3 x 64 + 8), K not a tile multiple
        (8, 4096, 4096),
        (9, 1024, 2048),  # the 16-wide tile
        (16, 2048, 7168),
        (24, 704, 2048),  # the 32-wide tile
        (32, 14336, 4096),
    )  # fmt: skip
    for act, ab in (
        ("silu", torch.bfloat16),
        ("gelu_tanh", torch.float16),
        ("relu2", torch.float16),
    )
    for x_major in ("k", "m")
    if x_major == "k" or m % 8 == 0  # an M-major x needs 16-byte columns
]


@pytest.mark.parametrize("m, half, k, act, ab, x_major", GATED_SWAP_CASES)
def test_gated_swap_matches_float64(gated_swap, m, half, k, act, ab, x_major):
    """The swap-AB decode tile: the weights' gate and up rows in one ping-pong warpgroup's two
    64-row bands, the tokens in its N; against float64 with torch's road setting the tolerance;
    the result poisoned first (each call writes a new one: a kept launcher's later call,
    with new tensors, must write all of its own)."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(m * 11 + half)
    d = SwapTiles()
    for _ in range(2):  # the second call takes the first's kept launcher
        x = make((m, k), ab, "cuda", gen=gen)
        if x_major == "m":
            x = x.t().contiguous().t()
        w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
        # poison: the result's block is likely this freed NaN-filled one (the caching
        # allocator hands a freed block of the size back first)
        poison = torch.full((m, half), float("nan"), dtype=ab, device="cuda")
        del poison
        got = gated_core.gated_linear(x, w, act, dispatcher=d)
        assert_gated_right(got, x, w, act, f"gated swap {act}")
    assert d.configs and all(c is not None and c.swap_ab for c in d.configs)


@pytest.fixture
def gated_swap_bias(gated_swap, monkeypatch):
    """The gated swap-AB tile's bias switched on too (``GATED_SWAP_BIAS_FAMILIES``: off on
    main until these cases pass)."""
    yield from _switched_on(monkeypatch, "GATED_SWAP_BIAS_FAMILIES")


@pytest.mark.parametrize("m, half, k, act, ab", [
    (1, 64, 64, "silu", torch.bfloat16),
    (5, 200, 1000, "gelu_tanh", torch.float16),  # a ragged last tile of features
    (16, 2048, 7168, "silu", torch.float16),
    (24, 704, 2048, "relu2", torch.bfloat16),
    (32, 14336, 4096, "silu", torch.bfloat16),
])  # fmt: skip
def test_gated_swap_bias_matches_float64(gated_swap_bias, m, half, k, act, ab):
    """``act(x Wg^T + bg) * (x Wu^T + bu)`` on the swap-AB decode tile, the bias along its rows
    (the weights'), against float64; a kept launcher's later call with another bias, then a
    strided one, gets its own."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(m * 17 + half)
    x = make((m, k), ab, "cuda", gen=gen)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
    d = SwapTiles()
    biases = [torch.randn(2 * half, generator=gen).to(ab).cuda() for _ in range(2)]
    biases.append(torch.randn(4 * half, generator=gen).to(ab).cuda()[::2])
    for bias in biases:
        got = gated_core.gated_linear(x, w, act, bias=bias, dispatcher=d)
        assert_gated_right(got, x, w, act, f"gated swap {act} with a bias", bias)
    assert d.configs and all(c is not None and c.swap_ab for c in d.configs)
    assert set(d.epilogues) == {f"bias_row+gated+{act}"}


def test_gated_swap_in_a_cuda_graph(gated_swap):
    """Captured and replayed with new x values: the graph's result is the new product's."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(3)
    x = make((4, 512), torch.bfloat16, "cuda", gen=gen)
    w = (torch.randn(2 * 256, 512, generator=gen) / 512**0.5).bfloat16().cuda()
    d = SwapTiles()
    gated_core.gated_linear(x, w, "silu", dispatcher=d)  # checks, road, compile (not captured)
    assert d.configs and d.configs[0].swap_ab
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gated_core.gated_linear(x, w, "silu", dispatcher=d)
    x.copy_(make((4, 512), torch.bfloat16, "cuda", gen=gen))
    graph.replay()
    y = x.double() @ w.double().T
    ref = torch_activation("silu", y[:, :256]) * y[:, 256:]
    theirs = wsgemm.gated_linear(x, w, "silu")
    assert_within_torch_error(out, ref, theirs, "gated swap in a graph")


@pytest.fixture
def gated_bias(monkeypatch):
    """The biased gated kernel switched on (``GATED_BIAS_FAMILIES``: on on main since these
    cases passed on an H100, 2026-12-06; the fixture keeps them meaningful if it is switched
    off), with no launcher kept from before or after (a kept launcher does not look at the
    switch)."""
    yield from _switched_on(monkeypatch, "GATED_BIAS_FAMILIES")


def _switched_on(monkeypatch, switch: str):
    """A fixture's body: the family set ``switch`` of ``host.registry`` holding the sm90
    family for the test, with no launcher kept from before or after (a kept launcher does not
    look at the switch)."""
    from wsgemm.host import registry

    monkeypatch.setattr(registry, switch, registry.EPILOGUE_FAMILIES)
    api.DISPATCHER.forget()
    yield
    api.DISPATCHER.forget()


GATED_BIAS_CASES = [
    (m, half, k, act, ab)
    for (m, half, k) in (
        (1, 64, 64),
        (37, 128, 200),
        (256, 1000, 4096),
        (300, 4096, 1024),
        (2048, 1536, 4096),
    )  # fmt: skip
    for act, ab in (("silu", torch.bfloat16), ("gelu_tanh", torch.float16))
]


@pytest.mark.parametrize("m, half, k, act, ab", GATED_BIAS_CASES)
def test_gated_bias_matches_float64(gated_bias, m, half, k, act, ab):
    """``act(x Wg^T + bg) * (x Wu^T + bu)`` in the gated kernel's epilogue (both row tiles),
    against float64; a kept launcher's later call with another (strided) bias gets its own."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(m * 5 + half)
    x = make((m, k), ab, "cuda", gen=gen)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
    d = GatedKernelOnly()
    biases = [torch.randn(2 * half, generator=gen).to(ab).cuda() for _ in range(2)]
    biases.append(torch.randn(4 * half, generator=gen).to(ab).cuda()[::2])  # a strided one
    for bias in biases:
        got = gated_core.gated_linear(x, w, act, bias=bias, dispatcher=d)
        assert_gated_right(got, x, w, act, f"gated {act} with a bias", bias)
    # the second call took the first's kept launcher (its own bias); the strided bias is
    # another signature: its first call asks for the (same, cached) kernel again
    assert d.epilogues == [f"bias_col+gated+{act}"] * 2


@pytest.fixture
def gated_small(monkeypatch):
    """The gated kernel's small row tile switched on (``GATED_SMALL_FAMILIES``: off on main
    until these cases pass, docs/perf.md entry 88), with no launcher kept from before or
    after."""
    yield from _switched_on(monkeypatch, "GATED_SMALL_FAMILIES")


GATED_SMALL_CASES = [
    (m, half, k, act, ab, biased, x_major)
    for (m, half, k) in (
        (1, 64, 64),  # one row, one tile
        (33, 200, 1000),  # a ragged I (200 = 6 x 32 + 8) and K, rows past one 64-row CTA
        (64, 4096, 4096),
        (100, 1024, 2048),  # a cluster's second CTA half empty
        (128, 14336, 4096),
    )  # fmt: skip
    for act, ab in (
        ("silu", torch.bfloat16),
        ("gelu_tanh", torch.float16),
        ("relu2", torch.float16),
    )
    for biased in (False, True)
    for x_major in ("k", "m")
    if x_major == "k" or (m % 8 == 0 and not biased)  # an M-major x needs 16-byte columns
]


@pytest.mark.parametrize("m, half, k, act, ab, biased, x_major", GATED_SMALL_CASES)
def test_gated_small_tile_matches_float64(gated_small, m, half, k, act, ab, biased, x_major):
    """The small row tile (the ping-pong 64x128 tile in 2x1 clusters, up to 128 rows) with
    and without a bias, against float64 with torch's road setting the tolerance; the result
    poisoned first; the second call takes the first's kept launcher with new tensors."""
    from wsgemm.api import gated as gated_core
    from wsgemm.host.choosing.menu import entry

    small = entry("pingpong-64x128-c2x1").variant_config()
    gen = torch.Generator().manual_seed(m * 13 + half)
    d = SwapTiles()
    for _ in range(2):
        x = make((m, k), ab, "cuda", gen=gen)
        if x_major == "m":
            x = x.t().contiguous().t()
        w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
        bias = torch.randn(2 * half, generator=gen).to(ab).cuda() if biased else None
        poison = torch.full((m, half), float("nan"), dtype=ab, device="cuda")
        del poison
        got = gated_core.gated_linear(x, w, act, bias=bias, dispatcher=d)
        assert_gated_right(got, x, w, act, f"gated small tile {act}", bias)
    if biased or m > 32:  # (an unbiased call of up to 32 rows takes the swap tile)
        assert d.configs and all(c == small for c in d.configs), d.configs


def test_gated_small_tile_in_a_cuda_graph(gated_small):
    """Captured and replayed with new x values: the graph's result is the new product's."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(7)
    m, half, k = 96, 1024, 2048
    x = make((m, k), torch.float16, "cuda", gen=gen)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).half().cuda()
    d = SwapTiles()
    gated_core.gated_linear(x, w, "silu", dispatcher=d)  # compiled and kept outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gated_core.gated_linear(x, w, "silu", dispatcher=d)
    x.copy_(make((m, k), torch.float16, "cuda", gen=gen))
    graph.replay()
    torch.cuda.synchronize()
    assert_gated_right(out, x, w, "silu", "gated small tile in a CUDA graph")


def test_gated_mlp_with_biases_forward_and_backward(gated_bias, monkeypatch):
    """``GatedMLP(bias=True)``: the biased gated kernel without a gradient (asked for whatever
    the cost model's road), the product with its bias then torch's unit with one; both against
    float64, every gradient too; and trained under autocast with fp32 parameters."""
    asked = asked_epilogues(monkeypatch)
    monkeypatch.setattr(api.DISPATCHER, "gated_unfused", lambda *a: None)
    gen = torch.Generator().manual_seed(2)
    mlp = wsgemm.nn.GatedMLP(256, 512, activation="silu", bias=True, device="cuda",
                             dtype=torch.bfloat16)  # fmt: skip
    with torch.no_grad():
        mlp.gate_up_proj.bias.normal_(generator=None)
    x = make((33, 256), torch.bfloat16, "cuda", gen=gen)
    up, down = mlp.gate_up_proj, mlp.down_proj
    y = x.double() @ up.weight.double().T + up.bias.double()
    h = torch_activation("silu", y[:, :512]) * y[:, 512:]
    ref = h @ down.weight.double().T + down.bias.double()
    with torch.no_grad():
        out = mlp(x)
    assert (out.double() - ref).abs().max().item() <= 2**-6 * ref.abs().max().item() + 1e-3
    assert "bias_col+gated+silu" in asked
    x = x.clone().requires_grad_()
    mlp(x).sum().backward()
    x64 = x.detach().double().requires_grad_()
    params = {n: p.detach().double().requires_grad_() for n, p in mlp.named_parameters()}
    y = x64 @ params["gate_up_proj.weight"].T + params["gate_up_proj.bias"]
    h = torch_activation("silu", y[:, :512]) * y[:, 512:]
    (h @ params["down_proj.weight"].T + params["down_proj.bias"]).sum().backward()
    assert_grads_match(mlp, x, x64, params)
    # fp32 parameters trained under autocast (the training road casts them as matmul would)
    mlp32 = wsgemm.nn.GatedMLP(256, 512, activation="silu", bias=True, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp32(x.detach().float())
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert all(p.grad is not None for p in mlp32.parameters())


def test_gated_mlp_forward_and_backward():
    gen = torch.Generator().manual_seed(1)
    mlp = wsgemm.nn.GatedMLP(256, 512, activation="silu", device="cuda", dtype=torch.bfloat16)
    x = make((33, 256), torch.bfloat16, "cuda", gen=gen).requires_grad_()
    out = mlp(x)
    w, wd = mlp.gate_up_proj.weight.double(), mlp.down_proj.weight.double()
    y = x.double() @ w.T
    ref = (torch_activation("silu", y[:, :512]) * y[:, 512:]) @ wd.T
    err = (out.double() - ref).abs().max().item()
    assert err <= 2**-6 * ref.abs().max().item() + 1e-3
    out.sum().backward()
    assert x.grad is not None and mlp.gate_up_proj.weight.grad is not None
    x64 = x.detach().double().requires_grad_()
    y = x64 @ w.T
    ((torch_activation("silu", y[:, :512]) * y[:, 512:]) @ wd.T).sum().backward()
    err = (x.grad.double() - x64.grad).abs().max().item()
    assert err <= 2**-6 * x64.grad.abs().max().item() + 1e-3


@pytest.fixture
def dgated(monkeypatch):
    """The dgated kernel switched on (``DGATED_FAMILIES``, on on main since these cases passed),
    with no launcher kept from before or after."""
    yield from _switched_on(monkeypatch, "DGATED_FAMILIES")


DGATED_CASES = [
    (m, half, hidden, act, ab)
    for (m, half, hidden) in (
        (1, 64, 64),
        (37, 128, 200),
        (256, 1000, 4096),  # the ping-pong tile; I not a multiple of its width
        (300, 4096, 1024),  # the cooperative tile
        (2048, 1536, 4096),
    )  # fmt: skip
    for act, ab in (
        ("silu", torch.bfloat16),
        ("gelu_tanh", torch.float16),
        ("gelu", torch.bfloat16),
        ("relu2", torch.float16),
        ("relu", torch.bfloat16),
    )  # fmt: skip
]


@pytest.mark.parametrize("m, half, hidden, act, ab", DGATED_CASES)
def test_dgated_matches_float64(dgated, m, half, hidden, act, ab):
    """``d[gate | up]`` of ``act(gate) * up`` from ``dh = dy @ w_down`` in the GEMM's epilogue
    (``Epilogue.dgated``, both row tiles), against float64 of the same formula; the output
    poisoned first (every element written); a pre-activation with a row stride of its own."""
    _check_dgated(m, half, hidden, act, ab)


@pytest.mark.parametrize("m, half, hidden", [(256, 1000, 4096), (4096, 2048, 1024)])
@pytest.mark.parametrize("act, ab", [("silu", torch.bfloat16), ("gelu_tanh", torch.float16)])
def test_dgated_on_the_pingpong_tile_over_many_tiles(dgated, monkeypatch, m, half, hidden, act, ab):
    """The ping-pong tile's dgated epilogue, its whole tile's pre-activation in 16 buffers
    loaded at the epilogue's start (``kernels/sm90/dgated.py``), at 256 rows and at 4096
    (forced onto the tile), where each warpgroup runs several tiles and each buffer's
    mbarrier flips its phase once a tile."""
    from wsgemm.host.choosing import cost

    monkeypatch.setattr(cost, "GATED_PINGPONG_MAX_ROWS", 1 << 30)
    assert cost.dgated_kernel_entry(m, half, 132) == "sm90-pingpong"
    config = _check_dgated(m, half, hidden, act, ab)
    assert config.pingpong


@pytest.mark.parametrize("m, half, hidden", [(300, 4096, 1024), (4096, 2048, 1024)])
@pytest.mark.parametrize("act, ab", [("silu", torch.bfloat16), ("gelu_tanh", torch.float16)])
def test_dgated_on_the_cooperative_tile_with_a_loader_warp(
    dgated, monkeypatch, m, half, hidden, act, ab
):
    """The cooperative tile's dgated epilogue, its pre-activation loaded by the producer
    warpgroup's loader warp, which runs ahead into the next tile while the store warp frees
    buffers by mbarrier (``Sm90Gemm.dgated_loader``), at 300 rows and at 4096, several tiles
    a CTA."""
    from wsgemm.host.choosing import cost

    # the cooperative tile however well the ping-pong one fills its waves
    monkeypatch.setattr(cost, "DGATED_PINGPONG_WAVE_MARGIN", float("inf"))
    assert cost.dgated_kernel_entry(m, half, 132) == "sm90"
    config = _check_dgated(m, half, hidden, act, ab)
    assert not config.pingpong


#: The menu's row tiles (every entry but the swap-AB ones), each of which the dgated GEMM can
#: run (``api.gated.dgated_tile``'s candidates; docs/perf.md entry 110).
ROW_TILES = [e.name for e in host.choosing.menu.MENU if not e.swap_ab]


@pytest.mark.parametrize("name", ROW_TILES)
@pytest.mark.parametrize(
    "m, half, hidden, act, ab",
    [(300, 1000, 1024, "silu", torch.bfloat16), (2048, 2000, 512, "gelu_tanh", torch.float16)],
)
def test_dgated_on_every_row_tile_of_the_menu(dgated, monkeypatch, name, m, half, hidden, act, ab):
    """The dgated epilogue forced onto each of the menu's row tiles (its schedule's form:
    ``kernels/sm90/dgated.py``): ragged rows and columns (300 x 1000: no tile's multiple),
    then 2048 x 2000 where the small tiles run several a CTA."""
    from wsgemm.api import gated as gated_core

    e = host.choosing.menu.entry(name)
    forced = (e.backend, e.variant_config())
    monkeypatch.setattr(gated_core, "dgated_tile", lambda *_: forced)
    config = _check_dgated(m, half, hidden, act, ab)
    assert (config.tile_m, config.tile_n) == (e.tile_m, e.tile_n)


def _check_dgated(m, half, hidden, act, ab):
    """The dgated call's result against float64 (``test_dgated_matches_float64``); returns
    the config its kernel ran (the backend's own where None was passed)."""
    from wsgemm.api import gated as gated_core
    from wsgemm.api.epilogue import activation_grad, gated_unit_grad

    gen = torch.Generator().manual_seed(m * 7 + half)
    dy = make((m, hidden), ab, "cuda", gen=gen)
    w_down = (torch.randn(hidden, half, generator=gen) / hidden**0.5).to(ab).cuda()
    wide = torch.randn(m, 2 * half + 8, generator=gen).to(ab).cuda()
    preact = wide[:, : 2 * half]  # row stride 2I + 8
    d = GatedKernelOnly()
    # poison: the result's block is likely this freed NaN-filled one (the caching allocator),
    # so an element the kernel leaves unwritten fails the comparison below
    poison = torch.full((m, 2 * half), float("nan"), dtype=ab, device="cuda")
    del poison
    got = gated_core.gated_grad(dy, w_down, preact, act, dispatcher=d)
    assert d.epilogues == [f"dgated+{act}"]
    assert not got.isnan().any()
    dh = dy.double() @ w_down.double()
    gate, up = preact[:, :half].double(), preact[:, half:].double()
    ref = torch.cat(
        [dh * up * activation_grad(act, gate).double(), dh * torch_activation(act, gate)], dim=1
    )
    theirs = gated_unit_grad(act, dy @ w_down, preact)
    for name, cols in (("dgate", slice(0, half)), ("dup", slice(half, None))):  # each half
        assert_within_torch_error(got[:, cols], ref[:, cols], theirs[:, cols], f"{name} {act}")
    (config,) = d.configs
    return config if config is not None else host.BACKENDS[d.backends[0]].config()


@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_trains_with_dgated(dgated, monkeypatch, bias):
    """``GatedMLP``'s training step with the unit's gradient fused (``gated.gated_mlp``): the
    dgated kernel asked for, every gradient against float64; 300 tokens (the cooperative
    tile) folded from (3, 100); and once more under autocast with fp32 parameters."""
    asked = asked_epilogues(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    mlp = wsgemm.nn.GatedMLP(256, 512, activation="silu", bias=bias, device="cuda",
                             dtype=torch.bfloat16)  # fmt: skip
    x = make((3, 100, 256), torch.bfloat16, "cuda", gen=gen).requires_grad_()
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_GatedMLPBackward"
    dout = make(tuple(out.shape), torch.bfloat16, "cuda", gen=gen)
    out.backward(dout)
    assert "dgated+silu" in asked
    x64 = x.detach().double().requires_grad_()
    p64 = {n: p.detach().double().requires_grad_() for n, p in mlp.named_parameters()}
    y = x64 @ p64["gate_up_proj.weight"].T
    if bias:
        y = y + p64["gate_up_proj.bias"]
    ref = (torch_activation("silu", y[..., :512]) * y[..., 512:]) @ p64["down_proj.weight"].T
    if bias:
        ref = ref + p64["down_proj.bias"]
    ref.backward(dout.double())
    assert_grads_match(mlp, x, x64, p64)
    mlp32 = wsgemm.nn.GatedMLP(256, 512, activation="silu", bias=bias, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp32(x.detach().float())
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_GatedMLPBackward"
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mlp32.parameters())


@pytest.fixture
def dact(monkeypatch):
    """The dact kernel switched on (``DACT_FAMILIES``: off on main until these cases pass,
    docs/perf.md entry 92), with no launcher kept from before or after."""
    yield from _switched_on(monkeypatch, "DACT_FAMILIES")


DACT_CASES = [
    (m, ffn, hidden, act, ab)
    for (m, ffn, hidden) in (
        (1, 256, 64),  # a swap-AB decode tile (the result and the pre-activation M-major)
        (37, 1000, 200),  # the ping-pong tile; I not a multiple of its width
        (300, 4096, 1024),  # a wide swap-AB tile (the policy's pick; asserted below)
        (1024, 3072, 768),  # a cooperative 128-row tile
        (4096, 8192, 2048),  # the shipped tile
    )  # fmt: skip
    for act, ab in (
        ("gelu", torch.bfloat16),
        ("gelu_tanh", torch.float16),
        ("silu", torch.bfloat16),
        ("relu2", torch.float16),
        ("relu", torch.bfloat16),
    )  # fmt: skip
]


@pytest.mark.parametrize("m, ffn, hidden, act, ab", DACT_CASES)
def test_dact_matches_float64(dact, m, ffn, hidden, act, ab):
    """``dpre = (dy @ w_down) · act'(pre)`` in the GEMM's epilogue (``Epilogue.dact``, on the
    tile the policy picks for the product: swap-AB or not), against float64 of the same
    formula; the output poisoned first (every element written); a pre-activation with a row
    stride of its own."""
    from wsgemm.api import act_grad as act_grad_core
    from wsgemm.api.epilogue import activation_grad

    gen = torch.Generator().manual_seed(m * 5 + ffn)
    dy = make((m, hidden), ab, "cuda", gen=gen)
    w_down = (torch.randn(hidden, ffn, generator=gen) / hidden**0.5).to(ab).cuda()
    preact = torch.randn(m, ffn + 8, generator=gen).to(ab).cuda()[:, :ffn]  # row stride I + 8
    d = SwapTiles()
    poison = torch.full((m, ffn), float("nan"), dtype=ab, device="cuda")
    del poison
    got = act_grad_core.act_grad(dy, w_down, preact, act, dispatcher=d)
    assert d.epilogues == [f"dact+{act}"]
    (config,) = d.configs  # the swap-AB cases ran on a swap-AB tile (the policy's pick)
    assert (config is not None and config.swap_ab) == (m in (1, 300)), config
    assert not got.isnan().any()
    ref = (dy.double() @ w_down.double()) * activation_grad(act, preact).double()
    theirs = ((dy @ w_down).float() * activation_grad(act, preact)).to(ab)
    assert_within_torch_error(got, ref, theirs, f"dact {act}")


@pytest.mark.parametrize(
    "m, ffn, k, act, ab, biased",
    [
        (1024, 2048, 512, "gelu", torch.bfloat16, True),  # a 128x128 cooperative tile
        (2047, 3000, 2048, "gelu_tanh", torch.float16, False),  # ragged M and I: 128x192
        (4096, 10240, 2560, "relu2", torch.bfloat16, True),  # phi-2's up projection: 256x160
        (2048, 18176, 4544, "silu", torch.float16, True),  # falcon-7b's
    ],
)
def test_linear_preact_matches_float64(dact, m, ffn, k, act, ab, biased):
    """``linear_preact``: one kernel writing ``h = act(x W^T + b)`` and the pre-activation
    (``Epilogue.preact`` on a plain product, the policy's cooperative tile), both against
    float64; both outputs poisoned first."""
    from wsgemm.api import act_grad as act_grad_core

    gen = torch.Generator().manual_seed(m + ffn)
    x = make((m, k), ab, "cuda", gen=gen)
    w = (torch.randn(ffn, k, generator=gen) / k**0.5).to(ab).cuda()
    bias = torch.randn(ffn, generator=gen).to(ab).cuda() if biased else None
    d = SwapTiles()
    # both results' likely blocks poisoned: two NaN tensors alive at once, then freed
    poison = [torch.full((m, ffn), float("nan"), dtype=ab, device="cuda") for _ in range(2)]
    del poison
    h, pre = act_grad_core.linear_preact(x, w, act, bias=bias, dispatcher=d)
    assert d.epilogues == [("bias_col+" if biased else "") + f"preact+{act}"]
    assert not h.isnan().any() and not pre.isnan().any()
    pre64 = x.double() @ w.double().T + (0 if bias is None else bias.double())
    theirs = torch.nn.functional.linear(x, w, bias)
    assert_within_torch_error(pre, pre64, theirs, f"preact {act}")
    assert_within_torch_error(h, torch_activation(act, pre64), torch_activation(act, theirs),
                              f"h {act}")  # fmt: skip


@pytest.mark.parametrize("bias", [False, True])
def test_mlp_trains_with_dact(dact, monkeypatch, bias):
    """``MLP``'s training step with the activation's gradient fused (``mlp.mlp``): the dact
    kernel asked for, every gradient against float64; 2048 tokens folded from (4, 512); and
    once more under autocast with fp32 parameters."""
    asked = asked_epilogues(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    mlp = wsgemm.nn.MLP(512, 2048, activation="gelu_tanh", bias=bias, device="cuda",
                        dtype=torch.bfloat16)  # fmt: skip
    x = make((4, 512, 512), torch.bfloat16, "cuda", gen=gen).requires_grad_()
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_MLPBackward"
    dout = make(tuple(out.shape), torch.bfloat16, "cuda", gen=gen)
    out.backward(dout)
    assert "dact+gelu_tanh" in asked
    assert ("bias_col+" if bias else "") + "preact+gelu_tanh" in asked
    x64 = x.detach().double().requires_grad_()
    p64 = {n: p.detach().double().requires_grad_() for n, p in mlp.named_parameters()}
    pre = x64 @ p64["up_proj.weight"].T
    if bias:
        pre = pre + p64["up_proj.bias"]
    ref = torch_activation("gelu_tanh", pre) @ p64["down_proj.weight"].T
    if bias:
        ref = ref + p64["down_proj.bias"]
    ref.backward(dout.double())
    assert_grads_match(mlp, x, x64, p64)
    mlp32 = wsgemm.nn.MLP(512, 2048, activation="gelu_tanh", bias=bias, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp32(x.detach().float())
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_MLPBackward"
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mlp32.parameters())


@pytest.mark.parametrize("m, half, k, act, ab", GATED_BIAS_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_gated_preact_matches_float64(dgated, m, half, k, act, ab, bias):
    """``gated_linear_preact``: one gated kernel writing ``h`` and the product ``[gate | up]``
    (``Epilogue.preact``, both row tiles, with and without a bias) against float64; the
    pre-activation's error against the plain product's, ``h``'s against torch's unit."""
    from wsgemm.api import gated as gated_core

    gen = torch.Generator().manual_seed(m * 3 + half)
    x = make((m, k), ab, "cuda", gen=gen)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(ab).cuda()
    b = torch.randn(2 * half, generator=gen).to(ab).cuda() if bias else None
    d = GatedKernelOnly()
    for size in ((m, half), (m, 2 * half)):  # poison: freed NaN blocks the results likely reuse
        torch.full(size, float("nan"), dtype=ab, device="cuda")
    h, pre = gated_core.gated_linear_preact(x, w, act, bias=b, dispatcher=d)
    prefix = "bias_col+" if bias else ""
    assert d.epilogues == [f"{prefix}gated+preact+{act}"]
    assert not h.isnan().any() and not pre.isnan().any()
    y64 = x.double() @ w.double().T + (0 if b is None else b.double())
    y = torch.nn.functional.linear(x, w, b)
    for name, cols in (("gate", slice(0, half)), ("up", slice(half, None))):  # each half
        assert_within_torch_error(pre[:, cols], y64[:, cols], y[:, cols], f"preact {name}")
    ref = torch_activation(act, y64[:, :half]) * y64[:, half:]
    yf = y.float()
    theirs = (torch_activation(act, yf[:, :half]) * yf[:, half:]).to(ab)
    assert_within_torch_error(h, ref, theirs, f"gated {act} with preact")
