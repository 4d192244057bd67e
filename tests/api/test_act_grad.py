"""``wsgemm.api.act_grad`` on the CPU (issue #25's backward, a plain MLP's): the activation's
gradient fused into the GEMM that computes ``dh`` (a float64 stand-in of the dact kernel's
contract, ``stand_ins.GatedKernels``), swap-AB tiles, the unfused road (the kernels off, another
GPU, a split tile), the checks and the epilogue's contract. The kernel itself
runs in tests/gpu/test_gpu_epilogue.py (``-k dact``); its SASS in tests/kernels."""

import dataclasses

import pytest
import torch
from op_helpers import close
from stand_ins import GatedKernels

from wsgemm.api import Dispatcher
from wsgemm.api import act_grad as core
from wsgemm.api import epilogue as epi
from wsgemm.api.epilogue import Epilogue, activation_grad, torch_activation
from wsgemm.host import registry
from wsgemm.host.dispatch import Route, StandInDevices

F16, BF16 = torch.float16, torch.bfloat16
ACTS = ["gelu", "gelu_tanh", "silu", "relu", "relu2"]


def dispatcher(capability=(9, 0)):
    # (autotune off: no race against torch.matmul off Hopper, which needs a CUDA timer)
    return Dispatcher(GatedKernels(), StandInDevices(capability, 132), autotune=False)


@pytest.fixture
def dact(monkeypatch):
    """The dact kernel on (``DACT_FAMILIES``; off on main until it ran on a GPU)."""
    monkeypatch.setattr(registry, "DACT_FAMILIES", registry.EPILOGUE_FAMILIES)


def reference(dy, w_down, preact, act):
    return (dy.double() @ w_down.double()) * activation_grad(act, preact).double()


def operands(rows, hidden, ffn, dtype, seed=0, pad=16):
    """dy (rows, hidden), w_down (hidden, ffn) and a pre-activation (rows, ffn) with a row
    stride of its own (read where it lies)."""
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(rows, hidden, generator=gen).to(dtype)
    w_down = (torch.randn(hidden, ffn, generator=gen) / 8).to(dtype)
    preact = torch.randn(rows, ffn + pad, generator=gen).to(dtype)[:, :ffn]
    return dy, w_down, preact


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("rows, hidden, ffn", [(300, 64, 256), (2048, 512, 1024)])
def test_act_grad_runs_the_dact_kernel_on_the_product_s_tile(dact, act, rows, hidden, ffn):
    """``dpre`` from ``dy @ w_down`` and the saved pre-activation in one kernel: its variant
    names the dact epilogue, A is dy K-major, B w_down's transpose N-major, the tile is the
    one the policy picks for the product itself, and the result is float64's."""
    dy, w_down, preact = operands(rows, hidden, ffn, BF16)
    d = dispatcher()
    got = core.act_grad(dy, w_down, preact, act, dispatcher=d)
    (v,) = d.cache.variants
    route = d.route("auto", 0, (rows, ffn, hidden, None), ("bfloat16",) * 2 + ("float32",))
    assert (v.epilogue, v.a_major, v.b_major, v.c_dtype) == (f"dact+{act}", "k", "n", "bfloat16")
    assert (v.backend, v.config) == (route.backend, route.config)
    assert got.shape == (rows, ffn) and got.dtype == BF16 and got.is_contiguous()
    assert close(got, reference(dy, w_down, preact, act), BF16, hidden)


def test_the_dact_kernels_are_on_for_the_family_a_gpu_ran_them_on():
    """``DACT_FAMILIES`` holds sm90 (docs/perf.md entry 97: its float64 cases passed on an
    H100), and no family whose fused epilogues are off."""
    assert registry.DACT_FAMILIES == frozenset({"sm90"})
    assert registry.fuses_act_grad("sm90") and not registry.fuses_act_grad("sm80")


def test_act_grad_takes_the_unfused_road_where_no_kernel_fuses_it(monkeypatch):
    """Off, or on another GPU: ``dh`` a product of its own, then ``dh · act'(pre)`` in fp32;
    float64's values, and no dact variant asked for."""
    dy, w_down, preact = operands(300, 64, 256, F16, seed=1)
    want = reference(dy, w_down, preact, "gelu")
    for capability, families in (((9, 0), frozenset()), ((8, 0), registry.EPILOGUE_FAMILIES)):
        monkeypatch.setattr(registry, "DACT_FAMILIES", families)
        d = dispatcher(capability)
        got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
        assert not any(Epilogue.parse(v.epilogue).dact for v in d.cache.variants)
        assert close(got, want, F16, 64)
        with pytest.raises(ValueError, match="runs no dact kernel"):
            core.act_grad_launch(d, dy, w_down, preact, "gelu")


@pytest.mark.parametrize("rows", [1, 8, 300])
def test_a_swap_ab_tile_runs_the_transposed_problem(dact, rows):
    """Where the policy runs the product on a swap-AB tile (decode-sized rows; 300 rows takes
    a wide swap tile), the dact kernel runs the transposed problem on it: A the weight
    M-major, B dy K-major, the result and the pre-activation read M-major (their transposes),
    float64's values."""
    hidden, ffn = (1024, 4096) if rows == 300 else (64, 256)
    dy, w_down, preact = operands(rows, hidden, ffn, F16, seed=2)
    d = dispatcher()
    route = d.route("auto", 0, (rows, ffn, hidden, None), ("float16",) * 2 + ("float32",))
    assert route.config.swap_ab
    got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
    (v,) = d.cache.variants
    assert (v.epilogue, v.a_major, v.b_major, v.config) == ("dact+gelu", "m", "k", route.config)
    assert close(got, reference(dy, w_down, preact, "gelu"), F16, hidden)


def test_a_split_tile_takes_the_unfused_road(dact, monkeypatch):
    """Where the policy runs the product split (split-K's count, or a stream-K config), the
    dact epilogue has no form: the unfused road, which says so; float64's values."""
    dy, w_down, preact = operands(300, 64, 256, F16, seed=2)
    d = dispatcher()
    base = registry.BACKENDS["sm90"].config()
    for config, split in ((base, 4), (dataclasses.replace(base, stream_k=True), 1)):
        route = Route("sm90", config, split)
        monkeypatch.setattr(d, "route", lambda *a, r=route, **k: r)
        with pytest.raises(ValueError, match="runs no dact kernel: the product's tile is a split"):
            core.act_grad_launch(d, dy, w_down, preact, "gelu")
        got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
        assert close(got, reference(dy, w_down, preact, "gelu"), F16, 64)
    assert not any(Epilogue.parse(v.epilogue).dact for v in d.cache.variants)


def test_act_grad_launch_is_the_call_s_kernel_launch(dact):
    """``act_grad_launch`` plans what ``act_grad`` runs: the same variant's fields, and the
    kernel run on its views gives ``act_grad``'s result."""
    dy, w_down, preact = operands(300, 64, 256, BF16, seed=3)
    d = dispatcher()
    want = core.act_grad(dy, w_down, preact, "silu", dispatcher=d)
    v = d.cache.variants[-1]
    launch = core.act_grad_launch(d, dy, w_down, preact, "silu")
    got = (launch.backend, launch.config, launch.a_major, launch.b_major, launch.epilogue)
    assert got == (v.backend, v.config, v.a_major, v.b_major, v.epilogue)
    assert launch.dtypes == (v.ab_dtype, v.c_dtype, v.acc_dtype)
    fn = d.cache.get(v)
    fn(launch.a, launch.b, launch.c, 132, 0, 1, None, None, None, None, None, launch.c_in)
    assert torch.equal(launch.out, want)


def test_act_grad_reads_a_broadcast_gradient_one_row_and_negated_views(dact):
    """A broadcast ``dy`` (``out.sum().backward()``'s) is copied for the kernel; a negated
    view is resolved first; one row (its made-up stride unused) takes the kernel too."""
    _, w_down, preact = operands(40, 64, 256, BF16, seed=4)
    dy = torch.ones(1, 1, dtype=BF16).expand(40, 64)
    d = dispatcher()
    got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
    assert close(got, reference(dy, w_down, preact, "gelu"), BF16, 64)
    assert [v.epilogue for v in d.cache.variants] == ["dact+gelu"]
    d = dispatcher()
    neg = torch._neg_view(preact)
    got = core.act_grad(dy.contiguous(), w_down, neg, "gelu", dispatcher=d)
    assert close(got, reference(dy, w_down, -preact, "gelu"), BF16, 64)
    assert [v.epilogue for v in d.cache.variants] == ["dact+gelu"]
    one = torch.randn(1, 64, dtype=BF16)
    got = core.act_grad(one, w_down, preact[:1], "gelu", dispatcher=d)
    assert close(got, reference(one, w_down, preact[:1], "gelu"), BF16, 64)
    assert d.cache.variants[-1].epilogue == "dact+gelu"


def test_act_grad_says_what_is_wrong():
    dy, w_down, preact = torch.randn(4, 8), torch.randn(8, 16), torch.randn(4, 16)
    kw = dict(dispatcher=dispatcher())
    with pytest.raises(TypeError, match="share float16 or bfloat16"):
        core.act_grad(dy, w_down, preact, "gelu", **kw)
    dy, w_down, preact = dy.half(), w_down.half(), preact.half()
    with pytest.raises(ValueError, match=r"must be \(M, H\), \(H, I\)"):
        core.act_grad(dy, w_down, preact[:, :8], "gelu", **kw)
    with pytest.raises(ValueError, match="needs its activation"):
        core.act_grad(dy, w_down, preact, None, **kw)
    with pytest.raises(ValueError, match="activation"):
        core.act_grad(dy, w_down, preact, "tanh", **kw)
    with pytest.raises(ValueError, match="must be 2-D"):
        core.act_grad(dy[None], w_down, preact, "gelu", **kw)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        core.act_grad(dy, w_down.tolist(), preact, "gelu", **kw)
    with pytest.raises(TypeError, match="strided"):
        core.act_grad(dy, w_down.to_sparse(), preact, "gelu", **kw)
    with pytest.raises(ValueError, match="CUDA tensor"):
        core.act_grad(dy, w_down, preact, "gelu", dispatcher=None)
    assert core.act_grad(dy[:0], w_down, preact[:0], "gelu", **kw).shape == (0, 16)
    empty = core.act_grad(dy[:, :0], w_down[:0], preact, "gelu", **kw)
    assert empty.shape == (4, 16) and not empty.any()  # K = 0: dh is 0


def test_a_dact_epilogue_takes_an_activation_and_nothing_else():
    e = Epilogue(activation="gelu", dact=True)
    assert e.name == "dact+gelu" and Epilogue.parse(e.name) == e
    assert e.reads_c and e.own_c and e.reads_c_per_subtile and not e.plain and not e.scalars
    for bad in (dict(), dict(bias="col"), dict(gated=True), dict(residual=True),
                dict(scale=True), dict(row_scale="fp32"), dict(dgated=True)):  # fmt: skip
        with pytest.raises(ValueError, match="epilogue"):
            Epilogue(**{"activation": "silu", **bad, "dact": True} if bad else {"dact": True})
    assert e.swapped() == e  # elementwise in C: its own transpose


@pytest.mark.parametrize("rows", [4, 300])  # a swap-AB tile's, a row tile's
def test_a_result_the_kernel_cannot_address_takes_the_unfused_road(dact, rows):
    """I not a multiple of 8: a padded pre-activation is addressable, but the (M, I) result is
    not (its row stride is I): the unfused road, with float64's values (not a launch on a
    missing view)."""
    gen = torch.Generator().manual_seed(9)
    dy = torch.randn(rows, 64, generator=gen).to(F16)
    w_down = torch.randn(12, 64, generator=gen).to(F16).t()  # (64, 12), K-major as the kernel's B
    preact = torch.randn(rows, 16, generator=gen).to(F16)[:, :12]
    d = dispatcher()
    with pytest.raises(ValueError, match="not addressable"):
        core.act_grad_launch(d, dy, w_down, preact, "gelu")
    got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
    assert close(got, reference(dy, w_down, preact, "gelu"), F16, 64)
    assert not any(Epilogue.parse(v.epilogue).dact for v in d.cache.variants)


def test_relu_s_gradient_is_zero_where_its_derivative_is(monkeypatch):
    """relu and relu2: 0 where the pre-activation is <= 0 whatever dh holds (an inf), as torch's
    ``threshold_backward``; the unfused road's pass (the kernel's combine does the same, a
    ``select``: tests/kernels)."""
    dh = torch.tensor([[float("inf"), 2.0, float("-inf"), 3.0]])
    pre = torch.tensor([[-1.0, 0.5, 0.0, 2.0]])
    for act, want in (("relu", [0.0, 2.0, 0.0, 3.0]), ("relu2", [0.0, 2.0, 0.0, 12.0])):
        assert epi.grad_through(act, dh, pre).tolist() == [want]
    assert epi.grad_through("gelu", dh, pre)[0, 0].isinf()  # (gelu'(-1) != 0: inf times it)


# ------------------------------------------------------------------ the forward: linear_preact


def preact_reference(x, w, bias, act):
    pre = x.double() @ w.double().T + (0 if bias is None else bias.double())
    return torch_activation(act, pre), pre


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("biased", [False, True])
def test_linear_preact_runs_one_kernel_on_a_cooperative_tile(dact, act, biased):
    """Where the policy's tile is a cooperative row tile (1024 x 2048 x 512), one kernel
    writes h and the pre-activation (``Epilogue.preact``, a column bias), x and the weight
    K-major; float64's values."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1024, 512, generator=gen).to(BF16)
    w = (torch.randn(2048, 512, generator=gen) / 16).to(BF16)
    bias = torch.randn(2048, generator=gen).to(BF16) if biased else None
    d = dispatcher()
    h, pre = core.linear_preact(x, w, act, bias=bias, dispatcher=d)
    (v,) = d.cache.variants
    prefix = "bias_col+" if biased else ""
    assert (v.epilogue, v.a_major, v.b_major) == (f"{prefix}preact+{act}", "k", "k")
    assert not v.kernel_config().pingpong and not v.kernel_config().swap_ab
    want_h, want_pre = preact_reference(x, w, bias, act)
    assert close(pre, want_pre, BF16, 512) and close(h, want_h, BF16, 512)


def test_linear_preact_takes_torch_s_road_elsewhere(monkeypatch):
    """Off (the default), a ping-pong or swap-AB tile (short K, few rows), a transposed x: the
    product with its bias, then torch's activation; float64's values and no preact kernel."""
    gen = torch.Generator().manual_seed(12)
    bias = torch.randn(256, generator=gen).to(F16)
    for rows, k, switch in ((300, 64, True), (4, 64, True), (1024, 512, False)):
        monkeypatch.setattr(registry, "DACT_FAMILIES",
                            registry.EPILOGUE_FAMILIES if switch else frozenset())  # fmt: skip
        x = torch.randn(rows, k, generator=gen).to(F16)
        w = (torch.randn(256, k, generator=gen) / 8).to(F16)
        d = dispatcher()
        h, pre = core.linear_preact(x, w, "gelu_tanh", bias=bias, dispatcher=d)
        assert not any(Epilogue.parse(v.epilogue).preact for v in d.cache.variants)
        want_h, want_pre = preact_reference(x, w, bias, "gelu_tanh")
        assert close(pre, want_pre, F16, k) and close(h, want_h, F16, k)
    monkeypatch.setattr(registry, "DACT_FAMILIES", registry.EPILOGUE_FAMILIES)
    xt = torch.randn(512, 1024, generator=gen).to(F16).t()  # M-major: not the kernel's A
    d = dispatcher()
    w = (torch.randn(2048, 512, generator=gen) / 16).to(F16)
    h, pre = core.linear_preact(xt, w, "gelu", dispatcher=d)
    assert not any(Epilogue.parse(v.epilogue).preact for v in d.cache.variants)
    assert close(pre, preact_reference(xt, w, None, "gelu")[1], F16, 512)


def test_linear_preact_says_what_is_wrong():
    x, w = torch.randn(4, 8, dtype=F16), torch.randn(16, 8, dtype=F16)
    kw = dict(dispatcher=dispatcher())
    with pytest.raises(TypeError, match="share float16 or bfloat16"):
        core.linear_preact(x.float(), w, "gelu", **kw)
    with pytest.raises(ValueError, match=r"must be \(M, K\) and \(I, K\)"):
        core.linear_preact(x, w.t(), "gelu", **kw)
    with pytest.raises(ValueError, match=r"bias \(8,\) must be \(16,\)"):
        core.linear_preact(x, w, "gelu", bias=torch.zeros(8, dtype=F16), **kw)
    with pytest.raises(ValueError, match="needs an activation"):
        core.linear_preact(x, w, None, **kw)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        core.linear_preact(x, w.tolist(), "gelu", **kw)
    h, pre = core.linear_preact(x[:0], w, "gelu", **kw)
    assert h.shape == pre.shape == (0, 16)
    b = torch.randn(16, dtype=F16)
    h, pre = core.linear_preact(x[:, :0], w[:, :0], "relu", bias=b, **kw)  # K = 0: the bias
    assert torch.equal(pre, b.expand(4, 16)) and torch.equal(h, torch.relu(b).expand(4, 16))


def test_linear_preact_resolves_negated_views(dact):
    """Negated views of x, the weight and the bias are read as their values (the stand-in
    refuses a negated operand: the kernel reads memory)."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(1024, 512, generator=gen).to(BF16)
    w = (torch.randn(2048, 512, generator=gen) / 16).to(BF16)
    b = torch.randn(2048, generator=gen).to(BF16)
    d = dispatcher()
    negs = [torch._neg_view(t) for t in (x, w, b)]
    h, pre = core.linear_preact(*negs[:2], "gelu", bias=negs[2], dispatcher=d)
    assert d.cache.variants[-1].epilogue == "bias_col+preact+gelu"
    want_h, want_pre = preact_reference(-x, -w, -b, "gelu")
    assert close(pre, want_pre, BF16, 512) and close(h, want_h, BF16, 512)


def test_linear_preact_s_rounding_does_not_depend_on_the_rows_in_batch_invariant_mode(dact):
    """In batch-invariant mode every call takes one road (the product, then torch's
    activation): 300 rows alone and as the first rows of 1024 give the same bits."""
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(1024, 1024, generator=gen).to(BF16)
    w = (torch.randn(4096, 1024, generator=gen) / 32).to(BF16)
    d = Dispatcher(GatedKernels(), StandInDevices((9, 0), 132), batch_invariant=True)
    h_all, pre_all = core.linear_preact(x, w, "gelu", dispatcher=d)
    h, pre = core.linear_preact(x[:300], w, "gelu", dispatcher=d)
    assert torch.equal(pre, pre_all[:300]) and torch.equal(h, h_all[:300])
    assert not any(Epilogue.parse(v.epilogue).preact for v in d.cache.variants)
    assert "batch-invariant" in core._preact_road(d, x, w, h_all, pre_all)


def test_a_cluster_split_product_takes_the_unfused_road(dact):
    """Where the policy runs the product as a cluster split (a decode problem: 5 rows, K =
    4096), no dact kernel runs (a cluster split kernel has no dact epilogue): the unfused
    road, whose product is the cluster split itself; float64's values."""
    dy, w_down, preact = operands(5, 4096, 1536, F16, seed=3)
    d = dispatcher()
    route = d.route("auto", 0, (5, 1536, 4096, None), ("float16",) * 2 + ("float32",))
    assert route.config.cluster_split > 1 and route.k_parts == route.config.cluster_split
    got = core.act_grad(dy, w_down, preact, "gelu", dispatcher=d)
    assert not any(Epilogue.parse(v.epilogue).dact for v in d.cache.variants)
    assert {v.config.cluster_split for v in d.cache.variants} == {route.config.cluster_split}
    assert close(got, reference(dy, w_down, preact, "gelu"), F16, 4096)
    with pytest.raises(ValueError, match="the product's tile is a split one"):
        core.act_grad_launch(d, dy, w_down, preact, "gelu")
