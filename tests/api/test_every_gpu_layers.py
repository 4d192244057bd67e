"""Every CUDA GPU works, for the layers too (tests/api/test_every_gpu.py does ``matmul``): on a
stand-in of each generation, ``nn.Linear`` (with and without a bias, with an activation),
``replace_linear`` on a small model, ``gated_linear`` and ``nn.GatedMLP``, and ``grouped_mm``
(its four forms, and a gated unit) never raise on the dtypes they take, return the float64
product's values, and run on the road ``explain`` names: a kernel of its family, compiled for
the GPU's target, or torch.

The layers call the process's dispatcher (``host.dispatch.DISPATCHER``; ``wsgemm.api`` binds
its own name for ``matmul``): the ``pose`` fixture swaps both for a stand-in whose kernels are
float64 products on CPU tensors, and lets ``nn.Linear`` take CPU tensors for CUDA ones
(``nn._runs_on_wsgemm``: its rule, the CPU in CUDA's place)."""

import copy
import functools
import re

import pytest
import torch
from stand_ins import StandInCache
from test_every_gpu import GPUS, IDS
from test_gated import Kernels as GatedKernels
from test_grouped import GroupedStandIn, RaggedKStandIn
from test_grouped import reference as grouped_reference
from torch import nn

import wsgemm
import wsgemm.nn as wnn
from wsgemm import api, host, support
from wsgemm.api import Dispatcher
from wsgemm.api.epilogue import Epilogue, gated_unit, torch_activation
from wsgemm.host import dispatch as host_dispatch
from wsgemm.host import registry
from wsgemm.host.dispatch import TORCH, StandInDevices

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
HALF = (F16, BF16)
HOPPER = (9, 0)


class LayerKernels(StandInCache):
    """``stand_ins``' float64 kernels (plain, bias, activation), the gated kernel's
    (tests/api/test_gated.py) and the grouped kernels' (tests/api/test_grouped.py: ragged M,
    ragged K), each handed out for its variant; ``variants`` lists every variant asked for."""

    def __init__(self):
        super().__init__()
        self.grouped = {"m": GroupedStandIn(), "k": RaggedKStandIn()}

    def get(self, variant):
        spec = Epilogue.parse(variant.epilogue)
        if variant.grouping == "none" and not spec.gated:
            return super().get(variant)
        self.variants.append(variant)
        if variant.grouping != "none":
            return functools.partial(self.grouped[variant.grouping], epilogue=variant.epilogue)
        return functools.partial(GatedKernels.run, epilogue=spec)


def _runs_on_stand_in(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """``nn._runs_on_wsgemm`` outside autocast, with the CPU in CUDA's place: one half dtype,
    in_features and out_features whole 16-byte rows."""
    return (
        input.device.type == weight.device.type == "cpu"
        and not weight.shape[0] % wnn._VECTOR
        and not weight.shape[-1] % wnn._VECTOR
        and input.dtype == weight.dtype in HALF
    )


@pytest.fixture
def pose(monkeypatch):
    """``pose(cc) -> Dispatcher``: the process's dispatcher becomes a stand-in of a GPU of
    capability ``cc`` (``LayerKernels``); autotuning off, here and in ``explain``'s own."""
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", _runs_on_stand_in)

    def pose(cc):
        d = Dispatcher(LayerKernels(), StandInDevices(cc, 132), autotune=False)
        monkeypatch.setattr(host_dispatch, "DISPATCHER", d)  # gated_linear, grouped_mm
        monkeypatch.setattr(api, "DISPATCHER", d)  # matmul (and so linear)
        return d

    with wsgemm.config.autotune(False):
        yield pose


def assert_close(got, want, dtype, k, factor=1.0):
    """Within a few roundings of ``dtype`` over a K-long sum, scaled by the result's size."""
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    eps = torch.finfo(dtype).eps
    tol = factor * (4 * eps * k**0.5 + 2 * eps) * max(want.abs().max().item(), 1.0)
    err = (got.double() - want).abs().max().item()
    assert err <= tol, (err, tol)


def family(backend: str) -> str:
    return TORCH if backend == TORCH else host.BACKENDS[backend].family


def kernel_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("kernel: "))


def product_road(text: str) -> str:
    """The backend ``explain``'s text names for a product, or TORCH for torch.matmul."""
    line = kernel_line(text)
    if line.startswith("kernel: torch.matmul ("):
        return TORCH
    found = re.search(r"\(backend ([\w-]+)", line) or re.match(r"kernel: ([\w-]+) \(", line)
    assert found, line
    return found.group(1)


def explain_linear(layer: nn.Linear, x: torch.Tensor, cc) -> str:
    bias = None if layer.bias is None else layer.bias.detach()
    activation = getattr(layer, "activation", None)
    return wsgemm.explain(x, layer.weight.detach().t(), bias=bias, activation=activation, cc=cc)


def assert_kernels_ran(d: Dispatcher, cc, roads: list[str]) -> None:
    """The dense kernels that ran are those of ``roads`` that are not torch's, each compiled
    for the target ``support.TARGETS`` gives the GPU; torch's roads compiled nothing."""
    ran = [v for v in d.cache.variants if v.grouping == "none"]
    assert {v.backend for v in ran} == {r for r in roads if r != TORCH}
    assert all(v.arch == support.target(cc).arch for v in ran)
    assert len(d.cache.kernel.launches) == sum(r != TORCH for r in roads)


# ----------------------------------------------------------------------------- nn.Linear

DTYPES = [F16, BF16, F32]
EVERY_GPU = pytest.mark.parametrize("cc, backends, auto", GPUS, ids=IDS)


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_linear_runs_what_explain_says(pose, cc, backends, auto, dtype):
    """fp16/bf16: wsgemm.linear, on ``auto``'s road (the kernel with the bias and activation in
    its epilogue, or torch.matmul through the dispatcher); fp32: torch's F.linear, as explain's
    torch.matmul. A layer without a bias, and one with a bias and an activation."""
    for bias, activation in (False, None), (True, "gelu"):
        d = pose(cc)
        torch.manual_seed(0)
        layer = wnn.Linear(32, 48, bias=bias, dtype=dtype, activation=activation)
        x = torch.randn(5, 8, 32).to(dtype)  # 40 rows, K = 32: the gated kernel's road
        with torch.no_grad():
            y = layer(x)
        want = x.double() @ layer.weight.double().T
        if bias:
            want = want + layer.bias.double()
        assert_close(y, torch_activation(activation or "none", want), dtype, 32)
        text = explain_linear(layer, x, cc)
        road = product_road(text)
        assert family(road) == (auto if dtype in HALF else TORCH)
        assert_kernels_ran(d, cc, [road])
        assert bool(d.launchers) == (dtype in HALF)  # through wsgemm (fp32: F.linear)
        if road != TORCH:
            (variant,) = d.cache.variants
            spec = Epilogue.parse(variant.epilogue)
            assert spec.activation == (activation or "none") and (spec.bias != "none") == bias
            assert ("fused: computed in fp32 on the accumulators" in text) == bias
            # (a swap-AB tile computes the transposed product: the bias is its per-row one)
            assert (spec.bias == "row") == ("swap-AB: the kernel's row bias" in text)


@EVERY_GPU
def test_linear_trains_on_every_gpu(pose, cc, backends, auto):
    """With a gradient to compute (bf16): the product on ``auto``'s road, the activation after
    it in torch (saved by autograd), and dx, dW, db of the float64 formula."""
    d = pose(cc)
    torch.manual_seed(1)
    layer = wnn.Linear(32, 48, dtype=BF16, activation="silu")
    x = torch.randn(6, 32).to(BF16).requires_grad_()
    y = layer(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_()
    want = torch_activation("silu", x64 @ w64.T + b64)
    want.backward(grad.double())
    assert_close(y.detach(), want.detach(), BF16, 32)
    for got, ref, k in ((x.grad, x64.grad, 48), (layer.weight.grad, w64.grad, 6),
                        (layer.bias.grad, b64.grad, 6)):  # fmt: skip
        assert_close(got, ref, BF16, k, factor=4)
    road = product_road(explain_linear(layer, x.detach(), cc))
    assert family(road) == auto
    assert {family(v.backend) for v in d.cache.variants} <= {auto} - {TORCH}


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_replace_linear_runs_a_model_on_every_gpu(pose, cc, backends, auto, dtype):
    """A model's aligned layers become wsgemm's and run where explain says; a misaligned one
    (20 outputs) stays torch's; the model computes what it computed."""
    d = pose(cc)
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 48, bias=False), nn.Linear(48, 20)
    ).to(dtype)
    reference = copy.deepcopy(model).double()
    report = wnn.replace_linear(model)
    assert report == ["0", "2"] and list(report.skipped) == ["3"]
    assert report.skipped["3"].startswith("misaligned: out_features=20")
    assert type(model[0]) is wnn.Linear and type(model[3]) is nn.Linear
    x = torch.randn(9, 32).to(dtype)
    with torch.no_grad():
        y = model(x)
        want = reference(x.double())
    assert_close(y, want, dtype, 64, factor=4)
    roads = [
        product_road(
            explain_linear(model[i], torch.empty(9, model[i].in_features, dtype=dtype), cc)
        )  # fmt: skip
        for i in (0, 2)
    ]
    assert {family(r) for r in roads} == {auto if dtype in HALF else TORCH}
    assert_kernels_ran(d, cc, roads)


# ----------------------------------------------------------------------------- gated


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_gated_linear_runs_what_explain_says(pose, cc, backends, auto, dtype):
    """fp16/bf16: on Hopper the gated kernel (of the family explain names for the product),
    elsewhere the (rows, 2I) product on explain's road, then act(gate) * up; fp32 is refused,
    naming the dtypes it takes (GatedMLP runs fp32 on torch)."""
    d = pose(cc)
    torch.manual_seed(3)
    # (35 rows, K = 32: the cost model's road is the gated kernel)
    x, w = torch.randn(5, 7, 32).to(dtype), torch.randn(2 * 24, 32).to(dtype)
    if dtype not in HALF:
        with pytest.raises(TypeError, match="float16 or bfloat16"):
            wsgemm.gated_linear(x, w)
        return
    y = wsgemm.gated_linear(x, w, "silu")
    assert_close(y, gated_unit("silu", x.double() @ w.double().T), dtype, 32)
    road = product_road(wsgemm.explain(x, w.t(), cc=cc))
    assert family(road) == auto
    if cc == HOPPER:
        (variant,) = d.cache.variants
        assert variant.epilogue == "gated+silu" and family(variant.backend) == family(road)
        assert variant.arch == support.target(cc).arch
    else:
        assert_kernels_ran(d, cc, [road])


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_gated_mlp_runs_what_explain_says(pose, cc, backends, auto, dtype):
    """``GatedMLP``: on Hopper the gated kernel (with biases: once the biased one has run on a
    GPU), then ``down_proj`` on explain's road; else (or off Hopper) both products on
    explain's roads and act(gate) * up in torch; fp32 on torch throughout."""
    for bias in False, True:
        d = pose(cc)
        torch.manual_seed(4)
        mlp = wnn.GatedMLP(32, 24, activation="gelu_tanh", bias=bias, dtype=dtype)
        x = torch.randn(5, 8, 32).to(dtype)  # 40 rows, K = 32: the gated kernel's road
        with torch.no_grad():
            y = mlp(x)
        up, down = mlp.gate_up_proj, mlp.down_proj
        h = gated_unit("gelu_tanh", x.double() @ up.weight.double().T
                       + (up.bias.double() if bias else 0))  # fmt: skip
        want = h @ down.weight.double().T + (down.bias.double() if bias else 0)
        assert_close(y, want, dtype, 32, factor=4)
        hidden = torch.empty(10, 24, dtype=dtype)
        roads = [product_road(explain_linear(up, x, cc)),
                 product_road(explain_linear(down, hidden, cc))]  # fmt: skip
        assert {family(r) for r in roads} == {auto if dtype in HALF else TORCH}
        gated = [v for v in d.cache.variants if Epilogue.parse(v.epilogue).gated]
        # (biased: the gated kernel once it has run on a GPU, GATED_BIAS_FAMILIES)
        if cc == HOPPER and dtype in HALF and (not bias or "sm90" in registry.GATED_BIAS_FAMILIES):
            (variant,) = gated
            assert variant.epilogue == ("bias_col+" if bias else "") + "gated+gelu_tanh"
            assert family(variant.backend) == family(roads[0])
            assert_kernels_ran(d, cc, roads[1:])
        else:
            assert not gated
            assert_kernels_ran(d, cc, roads)


# ----------------------------------------------------------------------------- grouped_mm


def ends(*sizes):
    return torch.tensor(list(torch.tensor(sizes).cumsum(0)), dtype=torch.int32)


#: form -> (a's shape, b's shape, offs): an empty group, groups of odd sizes. The 2D x 3D
#: form's b is experts' (G, N, K) weights transposed, as a model passes them: K-major, which
#: the fused gated unit reads.
FORMS = {
    "2d3d": ((35, 32), (4, 48, 32), ends(5, 0, 15, 15)),
    "2d2d": ((24, 35), (35, 16), ends(5, 0, 15, 15)),
    "3d3d": ((4, 10, 32), (4, 32, 16), None),
    "3d2d": ((4, 10, 32), (32, 48), ends(8, 0, 16, 24)),
}
#: Where grouped_mm runs a grouped kernel under ``auto`` (its docstring): on Hopper, fp16/bf16
#: 2D x 3D, and the 2D x 2D and 3D x 2D forms where torch has no fused kernel (fp16; bf16
#: 2D x 2D groups this small stay on torch's): grouping "m" (ragged M) or "k" (ragged K).
#: 3D x 3D is matmul's batched product; the rest runs torch.
# (bf16 too for 3D x 2D and this row-major a's 2D x 2D: torch's fused kernel would need
# aligned groups there, api.grouped._torch_needs_aligned_groups)
GROUPED_KERNELS = {("2d3d", F16): "m", ("2d3d", BF16): "m", ("2d2d", F16): "k",
                   ("2d2d", BF16): "k", ("3d2d", F16): "m", ("3d2d", BF16): "m"}  # fmt: skip


def grouped_operands(form, dtype):
    a_shape, b_shape, offs = FORMS[form]
    a, b = torch.randn(a_shape).to(dtype), torch.randn(b_shape).to(dtype)
    return a, (b.transpose(1, 2) if form == "2d3d" else b), offs


def grouped_want(a, b, offs, form) -> torch.Tensor:
    ref = grouped_reference(a, b, offs, form)
    if form in ("3d3d", "2d2d"):
        return ref
    return torch.cat([block for _, _, block in ref], dim=0 if form == "2d3d" else 1)


def grouped_road(text: str, a, b, cc) -> tuple[str, str]:
    """(backend or TORCH, grouping) of explain's kernel line for a grouped call; the batched
    form's is the product's (``explain(a, b)``)."""
    line = kernel_line(text)
    if line.startswith("kernel: torch ("):
        return TORCH, "none"
    if line.startswith("kernel: wsgemm.matmul's batched GEMM"):
        return product_road(wsgemm.explain(a, b, cc=cc)), "none"
    found = re.match(r"kernel: ([\w-]+) grouped \(ragged (M|K)\)", line)
    assert found, line
    return found.group(1), found.group(2).lower()


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_grouped_mm_runs_what_explain_says(pose, cc, backends, auto, dtype):
    """The four forms, each on the road explain names (``GROUPED_KERNELS``; 3D x 3D on
    ``auto``'s), with the float64 product's values."""
    torch.manual_seed(5)
    for form in FORMS:
        d = pose(cc)
        a, b, offs = grouped_operands(form, dtype)
        y = wsgemm.grouped_mm(a, b, offs)
        assert_close(y, grouped_want(a, b, offs, form), dtype, a.shape[-1])
        text = wsgemm.explain(a, b, offs=offs, grouped=True, cc=cc)
        backend, grouping = grouped_road(text, a, b, cc)
        if form == "3d3d":
            assert family(backend) == (auto if dtype in HALF else TORCH), form
        else:
            kernel = GROUPED_KERNELS.get((form, dtype)) if cc == HOPPER else None
            want = ("sm90", kernel) if kernel else (TORCH, "none")
            assert (family(backend), grouping) == want, form
        ran = [(v.backend, v.grouping, v.arch) for v in d.cache.variants]
        arch = support.target(cc).arch if backend != TORCH else None
        assert ran == ([] if backend == TORCH else [(backend, grouping, arch)]), form


@pytest.mark.parametrize("dtype", DTYPES)
@EVERY_GPU
def test_a_gated_grouped_mm_runs_what_explain_says(pose, cc, backends, auto, dtype):
    """A mixture-of-experts SwiGLU's first GEMM (2D x 3D, gated silu, K-major experts): the
    grouped kernel with the gated unit in its epilogue on Hopper (fp16/bf16), torch
    elsewhere."""
    d = pose(cc)
    torch.manual_seed(6)
    a, b, offs = grouped_operands("2d3d", dtype)
    y = wsgemm.grouped_mm(a, b, offs, activation="silu", gated=True)
    assert_close(y, gated_unit("silu", grouped_want(a, b, offs, "2d3d")), dtype, 32)
    text = wsgemm.explain(a, b, offs=offs, activation="silu", gated=True, cc=cc)
    backend, grouping = grouped_road(text, a, b, cc)
    fused = cc == HOPPER and dtype in HALF
    assert (family(backend), grouping) == (("sm90", "m") if fused else (TORCH, "none"))
    assert ("epilogue: gated+silu: in the kernel" in text) == fused
    ran = [(v.backend, v.grouping, v.epilogue) for v in d.cache.variants]
    assert ran == ([(backend, "m", "gated+silu")] if fused else [])


def test_explain_answers_for_gated_linear_and_refuses_a_dense_row_scale(monkeypatch):
    """``explain(x, w.t(), gated=True)`` is ``gated_linear(x, w)``'s road: the gated kernel
    or the product then the gating, whichever the cost model predicts faster (both predictions
    printed either way), torch's product off Hopper; a row scale belongs to ``grouped_mm`` and
    is refused without ``grouped``/``offs``."""
    from wsgemm.host import registry

    w = torch.empty(8192, 4096, dtype=F16, device="meta")
    # 5 rows: the swap-AB decode tile (GATED_SWAP_FAMILIES, on since docs/perf.md entry 85);
    # 40 rows: the small row tile (GATED_SMALL_FAMILIES, on since entry 97), and without it
    # the product then the gating, predicted faster than the 128x128 row tile
    cases = ((512, True, "row tile", True), (5, True, "swap-AB 8-token tile", True),
             (40, True, "small row tile", True), (40, False, "row tile", False))  # fmt: skip
    for rows, fused, tile, small in cases:
        if not small:
            monkeypatch.setattr(registry, "GATED_SMALL_FAMILIES", frozenset())
        x = torch.empty(rows, 4096, dtype=F16, device="meta")
        text = wsgemm.explain(x, w.t(), activation="silu", gated=True, cc=HOPPER)
        assert text.startswith(f"gated_linear: act(gate) * up with silu, {rows} rows, 4096")
        assert ("kernel: the gated kernel on" in text) == fused
        assert ("unfused: " in text and "the cost model predicts the product on" in text) == (
            not fused
        )
        assert f"the gated kernel's {tile} (" in text and "then the gating (" in text
    w = torch.randn(48, 32, dtype=F16)
    off = wsgemm.explain(torch.randn(40, 32, dtype=F16), w.t(), gated=True, cc=(8, 0))
    assert "no gated kernel runs on this GPU" in off
    with pytest.raises(ValueError, match="row_scale is grouped_mm's"):
        wsgemm.explain(torch.randn(5, 32, dtype=F16), w.t(), row_scale=torch.ones(5), cc=HOPPER)


def test_explain_gated_gives_the_road_s_own_reason_and_refuses_what_gated_linear_lacks():
    """24 rows with I = 15001 (not a multiple of 8): the reason is the weight's, not decode's;
    arguments gated_linear does not take are refused, not dropped (found by a review)."""
    w = torch.empty(2 * 15001, 512, dtype=F16, device="meta")
    x = torch.empty(24, 512, dtype=F16, device="meta")
    text = wsgemm.explain(x, w.t(), activation="silu", gated=True, cc=HOPPER)
    assert "I is not a multiple of 8" in text and "decode" not in text
    w, x = torch.randn(48, 32, dtype=F16), torch.randn(40, 32, dtype=F16)
    for kw in (dict(backend="sm90"), dict(alpha=2.0), dict(out_dtype=torch.float32)):
        with pytest.raises(ValueError, match="which takes no"):
            wsgemm.explain(x, w.t(), gated=True, cc=HOPPER, **kw)
    # its bias is gated_linear's: [b_gate; b_up], the weight's 2I rows long
    with pytest.raises(ValueError, match=r"must be \(48,\)"):
        wsgemm.explain(x, w.t(), gated=True, cc=HOPPER, bias=torch.randn(24, dtype=F16))
    text = wsgemm.explain(x, w.t(), gated=True, cc=HOPPER, bias=torch.randn(48, dtype=F16))
    assert "act(gate) * up + its bias" in text


def test_explain_says_when_an_epilogue_takes_a_cluster_split_through_the_workspace():
    """At decode the policy splits over a cluster; a bias rides it (rank 0 runs the epilogue
    after the sum: ``CLUSTER_SPLIT_EPILOGUE_FAMILIES``, on since its GPU check), a residual's C
    (rank 0's loads not built) runs the same ways through the workspace, and ``explain`` says
    so; a plain call does not."""
    a = torch.empty(5, 4096, dtype=F16, device="meta")
    b = torch.empty(4096, 1536, dtype=F16, device="meta")
    bias = torch.empty(1536, dtype=F16, device="meta")
    plain = wsgemm.explain(a, b, cc=HOPPER)
    assert "over a cluster of" in plain and "go through the workspace" not in plain
    biased = wsgemm.explain(a, b, bias=bias, cc=HOPPER)
    assert "over a cluster of" in biased and "go through the workspace" not in biased
    c = torch.empty(5, 1536, dtype=F16, device="meta")
    residual = wsgemm.explain(a, b, c=c, beta=0.5, cc=HOPPER)
    assert "parts go through the workspace, not over a cluster" in residual
