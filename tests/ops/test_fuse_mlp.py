"""``replace_linear(model, fuse_mlp=True)`` / ``fuse_gated_mlps`` (issue #25 step 2): a gated
MLP's gate and up projections become one gated GEMM over one ``[gate; up]`` buffer, keeping the
Parameter objects, the state_dict and the model's own forward wherever the fusion cannot run."""

import copy
import io

import pytest
import torch
from torch import nn

import wsgemm
import wsgemm.nn as wnn
from wsgemm.api.epilogue import torch_activation


class LlamaMLP(nn.Module):
    """transformers' LlamaMLP, as it is written."""

    def __init__(self, hidden=64, ffn=96, act=None, dtype=torch.bfloat16, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=bias, dtype=dtype)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(ffn, hidden, bias=False, dtype=dtype)
        self.act_fn = act or nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.mlp = LlamaMLP(**kw)
        self.other = nn.Linear(64, 64, dtype=torch.bfloat16)

    def forward(self, x):
        return self.other(self.mlp(x))


def test_fusion_keeps_the_parameters_and_the_state_dict():
    torch.manual_seed(0)
    model = Block()
    before = copy.deepcopy(model.state_dict())
    params = {n: p for n, p in model.named_parameters()}
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    want = model(x)
    report = wnn.replace_linear(model, fuse_mlp=True)
    assert report.fused == (("mlp", "mlp.gate_proj", "mlp.up_proj"),)
    assert "1 fused" in report.summary()
    assert {n: p for n, p in model.named_parameters()} == params  # the same objects
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    gate, up = model.mlp.gate_proj.weight, model.mlp.up_proj.weight
    assert wnn._adjacent(gate, up)
    assert torch.equal(model(x), want)  # on the CPU: the model's own forward


def fake_gated_linear(calls):
    """A CPU stand-in of ``wsgemm.gated_linear`` (float64, rounded once) that records the
    (weight shape, activation, bias shape) of each call."""

    def gated_linear(x, weight, activation, bias=None):
        calls.append((weight.shape, activation, None if bias is None else bias.shape))
        y = x.double() @ weight.double().T
        if bias is not None:
            y = y + bias.double()
        half = weight.shape[0] // 2
        return (torch_activation(activation, y[:, :half]) * y[:, half:]).to(x.dtype)

    return gated_linear


@pytest.mark.parametrize(
    "act, name",
    [
        (nn.SiLU(), "silu"),
        (nn.GELU(approximate="tanh"), "gelu_tanh"),
        (nn.GELU(), "gelu"),
        (nn.ReLU(), "relu"),
    ],  # fmt: skip
)
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_forward_runs_one_gated_linear(act, name, bias, monkeypatch):
    """One gated_linear of the two weights read as one (and of the two biases, read as one)."""
    calls = []
    monkeypatch.setattr(wnn, "gated_linear", fake_gated_linear(calls))
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    torch.manual_seed(1)
    mlp = LlamaMLP(act=act, bias=bias)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    want = mlp(x).double()
    before = copy.deepcopy(mlp.state_dict())
    wnn.fuse_gated_mlps(mlp)
    after = mlp.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    got = mlp(x).double()
    assert calls and calls[-1] == ((192, 64), name, (192,) if bias else None)
    assert (got - want).abs().max() <= 0.05 * want.abs().max()
    if bias:  # biases moved apart: the model's own forward
        mlp.up_proj.bias.data = mlp.up_proj.bias.data.clone()
        calls.clear()
        assert (mlp(x).double() - want).abs().max() <= 0.05 * want.abs().max() and not calls


def test_weights_moved_apart_fall_back_to_the_model_forward(monkeypatch):
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "gated_linear", lambda *a, **k: pytest.fail("fused path taken"))
    mlp = LlamaMLP()
    wnn.fuse_gated_mlps(mlp)
    mlp.up_proj.weight.data = mlp.up_proj.weight.data.clone()  # no longer adjacent
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: False)
    assert mlp(x).shape == (3, 64)


def test_what_is_not_a_gated_mlp_is_left_alone():
    mlp = LlamaMLP(act=nn.Tanh())
    assert wnn.fuse_gated_mlps(mlp) == []
    biased = LlamaMLP()  # a bias on the gate and none on the up projection
    biased.gate_proj = nn.Linear(64, 96, dtype=torch.bfloat16)
    assert wnn.fuse_gated_mlps(biased) == []
    assert type(biased) is LlamaMLP


def test_restore_and_pickle():
    model = Block()
    wnn.replace_linear(model, fuse_mlp=True)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.mlp).__name__ == "WsgemmFusedLlamaMLP"
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert torch.equal(loaded(x), model(x))
    assert "mlp" in wnn.restore_linear(model)
    assert type(model.mlp) is LlamaMLP
    assert wsgemm.nn.fuse_gated_mlps is wnn.fuse_gated_mlps


# --------------------------------------------------- fuse_mlp=True fuses only what it replaced


def _check_consistent(report, linears, already=()):
    """Each nn.Linear the call saw is replaced or skipped, never both; what falls back was
    replaced; a fused MLP's gate and up were replaced (or were wsgemm layers already); the
    logged line counts the same."""
    replaced, skipped = set(report.replaced), set(report.skipped)
    assert not replaced & skipped
    assert replaced | skipped == set(linears)
    assert set(report.falling_back) <= replaced
    for _mlp, gate, up in report.fused:
        assert {gate, up} <= replaced | set(already)
    summary = report.summary()
    assert f"{len(replaced)} replaced" in summary and f"{len(report.fused)} fused" in summary
    assert f"{len(skipped)} skipped" in summary


LINEARS = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "other")


@pytest.mark.parametrize(
    "declined",
    [("mlp.gate_proj", "mlp.up_proj"), ("mlp.gate_proj",), ("mlp.up_proj",)],
    ids=["gate-and-up", "gate", "up"],
)
def test_a_layer_the_filter_declines_is_neither_replaced_nor_fused(declined):
    torch.manual_seed(2)
    model = Block()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = model(x)
    weights = {n: model.get_submodule(n).weight for n in LINEARS}
    data = {n: w.data_ptr() for n, w in weights.items()}
    report = wnn.replace_linear(model, lambda layer, name: name not in declined, fuse_mlp=True)
    _check_consistent(report, LINEARS)
    assert report.fused == ()
    assert type(model.mlp) is LlamaMLP  # its own class and forward
    assert {n: r for n, r in report.skipped.items()} == {
        n: "filtered: filter_fn declined it" for n in declined
    }
    assert set(report.replaced) == set(LINEARS) - set(declined)
    for name in declined:
        assert type(model.get_submodule(name)) is nn.Linear
    # nothing was copied into a [gate; up] buffer
    assert {n: w.data_ptr() for n, w in weights.items()} == data
    assert not wnn._adjacent(model.mlp.gate_proj.weight, model.mlp.up_proj.weight)
    assert torch.equal(model(x), want)


def test_a_filter_that_declines_only_other_layers_still_fuses():
    model = Block()
    report = wnn.replace_linear(model, lambda layer, name: name != "mlp.down_proj", fuse_mlp=True)
    _check_consistent(report, LINEARS)
    assert report.fused == (("mlp", "mlp.gate_proj", "mlp.up_proj"),)
    assert set(report.skipped) == {"mlp.down_proj"}
    assert type(model.mlp).__name__ == "WsgemmFusedLlamaMLP"


class MyLinear(nn.Linear):
    pass


def _f64(model):
    model.double()


def _subclass_gate(model):
    model.mlp.gate_proj = MyLinear(64, 96, bias=False, dtype=torch.bfloat16)


def _lazy_gate_and_up(model):
    model.mlp.gate_proj = nn.LazyLinear(96, bias=False)
    model.mlp.up_proj = nn.LazyLinear(96, bias=False)


@pytest.mark.parametrize(
    "change, filter_fn, skipped",
    [
        (_f64, None, {"dtype": set(LINEARS)}),
        (_subclass_gate, None, {"filtered": {"mlp.gate_proj"}}),  # the default filter
        # a filter taking subclasses (LazyLinear is one): the size rules skip them
        (
            _lazy_gate_and_up,
            lambda layer, name: True,
            {"uninitialized": {"mlp.gate_proj", "mlp.up_proj"}},
        ),
    ],
    ids=["float64", "subclass-under-default-filter", "lazy"],
)
def test_a_layer_skipped_for_any_reason_is_not_fused(change, filter_fn, skipped):
    model = Block()
    change(model)
    report = wnn.replace_linear(model, filter_fn, fuse_mlp=True)
    _check_consistent(report, LINEARS)
    assert report.fused == ()
    assert type(model.mlp) is LlamaMLP
    kinds = {}
    for name, why in report.skipped.items():
        kinds.setdefault(why.split(":", 1)[0], set()).add(name)
    assert kinds == skipped


def test_layers_already_on_wsgemm_fuse_on_a_later_call():
    model = Block()
    first = wnn.replace_linear(model)
    assert first.fused == () and type(model.mlp) is LlamaMLP
    report = wnn.replace_linear(model, fuse_mlp=True)
    assert report.replaced == () and report.skipped == {}
    _check_consistent(report, (), already=first.replaced)
    assert report.fused == (("mlp", "mlp.gate_proj", "mlp.up_proj"),)


def test_fuse_gated_mlps_leaves_lazy_layers_and_gates_with_an_activation_alone():
    lazy = LlamaMLP()
    lazy.gate_proj, lazy.up_proj = nn.LazyLinear(96, bias=False), nn.LazyLinear(96, bias=False)
    assert wnn.fuse_gated_mlps(lazy) == [] and type(lazy) is LlamaMLP
    # a wsgemm Linear with its own activation computes act(x @ W.T): the fusion would drop it
    for proj in ("gate_proj", "up_proj"):
        mlp = LlamaMLP()
        setattr(mlp, proj, wnn.Linear(64, 96, bias=False, dtype=torch.bfloat16, activation="relu"))
        assert wnn.fuse_gated_mlps(mlp) == [] and type(mlp) is LlamaMLP


@pytest.mark.parametrize("bias", [False, True])
def test_a_fused_mlp_trains_both_projections(bias, monkeypatch):
    """With a gradient to compute, the fused forward joins the two weights (and biases) by a
    copy whose backward reaches both Parameters: the up projection's gradients are the
    model's own forward's, not None (a view through the gate's Parameter dropped them)."""
    monkeypatch.setattr(wnn, "gated_linear", fake_gated_linear([]))
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    torch.manual_seed(2)
    mlp = LlamaMLP(bias=bias, dtype=torch.float32)
    theirs = copy.deepcopy(mlp)
    wnn.fuse_gated_mlps(mlp)
    x = torch.randn(5, 64)
    mlp(x).pow(2).sum().backward()
    theirs(x).pow(2).sum().backward()
    for (name, p), q in zip(mlp.named_parameters(), theirs.parameters(), strict=True):
        assert p.grad is not None, f"{name}: no gradient"
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("switched_on", [False, True])
def test_a_biased_gated_mlp_takes_gated_linear_once_its_kernel_takes_a_bias(
    switched_on, monkeypatch
):
    """``GatedMLP(bias=True)`` runs ``gated_linear(..., bias=)`` where the gated kernel takes a
    bias (``GATED_BIAS_FAMILIES``); while it does not, torch's road (the product in the inputs'
    dtype, half the bytes of the unfused road's fp32 one). The same result either way."""
    from op_helpers import install

    from wsgemm import ops
    from wsgemm.host import registry

    install(monkeypatch)  # wsgemm.linear's core on the CPU (the Linear layers)
    monkeypatch.setattr(ops, "_FAKE_DEVICES", ("cuda", "meta", "cpu"))
    calls = []
    monkeypatch.setattr(wnn, "gated_linear", fake_gated_linear(calls))
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    families = registry.EPILOGUE_FAMILIES if switched_on else frozenset()
    monkeypatch.setattr(registry, "GATED_BIAS_FAMILIES", families)
    torch.manual_seed(5)
    mlp = wnn.GatedMLP(64, 96, activation="silu", bias=True, dtype=torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        got = mlp(x).double()
    assert bool(calls) == switched_on and (not calls or calls[0][2] == (192,))
    y = x.double() @ mlp.gate_up_proj.weight.double().T + mlp.gate_up_proj.bias.double()
    h = torch_activation("silu", y[:, :96]) * y[:, 96:]
    want = h @ mlp.down_proj.weight.double().T + mlp.down_proj.bias.double()
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


@pytest.fixture
def fused_training(monkeypatch):
    """``GatedMLP``'s fused training step on the CPU: matmul's core a float64 stand-in, the
    gated training kernels on and run by the CPU stand-ins of their contracts
    (``op_helpers.install_gated_training``). Returns the stand-in's compiled variants."""
    from op_helpers import install, install_gated_training

    install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "_fuses_gated_grad", lambda x: True)
    return install_gated_training(monkeypatch)


def _mlp_reference(mlp, x, grad):
    """Every gradient of the step in float64 (torch's formula)."""
    from op_helpers import float64_mlp_step

    def unit(y):
        half = y.shape[-1] // 2
        return torch_activation(mlp.activation, y[..., :half]) * y[..., half:]

    return float64_mlp_step(mlp, x, grad, "gate_up_proj", unit)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_a_gated_mlp_trains_with_the_unit_s_gradient_fused(fused_training, bias, act):
    """Where the dgated kernel runs, ``GatedMLP``'s training step is ``gated.gated_mlp``: its
    forward the gated kernel that also stores the pre-activation, its backward the dgated
    kernel (``d[gate | up]`` from ``d_out @ w_down``), then dx, dW and the biases' sums;
    every gradient against float64, an N-D input folded."""
    torch.manual_seed(3)
    mlp = wnn.GatedMLP(64, 96, activation=act, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_GatedMLPBackward"
    grad = torch.randn_like(out)
    out.backward(grad)
    # the forward: the gated kernel storing h and [gate | up] (the cost model's road at 10
    # rows), the backward the dgated kernel
    prefix = "bias_col+" if bias else ""
    assert [v.epilogue for v in fused_training] == [f"{prefix}gated+preact+{act}",
                                                    f"dgated+{act}"]  # fmt: skip
    want_out, want = _mlp_reference(mlp, x, grad)
    assert (out.double() - want_out).abs().max() <= 0.02 * want_out.abs().max()
    for name, got in [("x", x.grad), *((n, q.grad) for n, q in mlp.named_parameters())]:
        assert got is not None and got.shape == want[name].shape, name
        err = (got.double() - want[name]).abs().max().item()
        assert err <= 0.02 * want[name].abs().max().item() + 1e-3, name


def test_a_fused_gated_mlp_step_keeps_the_module_road_where_it_would_change_behaviour(
    fused_training,
):
    """A hook on a projection (the fused step bypasses its forward), no gradient to compute,
    or a double backward: the module's own road runs the hook; with create_graph the step's
    backward differentiates torch's formula on the saved inputs (a second derivative that
    reaches x, against float64)."""
    torch.manual_seed(4)
    mlp = wnn.GatedMLP(64, 96, dtype=torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16, requires_grad=True)
    seen = []
    handle = mlp.down_proj.register_forward_hook(lambda *a: seen.append(1))
    mlp(x).sum().backward()
    assert seen == [1] and not fused_training
    handle.remove()
    with torch.no_grad():
        assert not mlp._trains_fused(x)
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_GatedMLPBackward"
    (gx,) = torch.autograd.grad(out.float().pow(2).sum(), x, create_graph=True)
    x.grad = None
    gx.float().pow(2).sum().backward()  # a second derivative, through the step's formula
    x64 = x.detach().double().requires_grad_()
    w = {n: q.detach().double() for n, q in mlp.named_parameters()}
    y = x64 @ w["gate_up_proj.weight"].T
    out64 = (torch_activation("silu", y[:, :96]) * y[:, 96:]) @ w["down_proj.weight"].T
    (g64,) = torch.autograd.grad(out64.pow(2).sum(), x64, create_graph=True)
    g64.pow(2).sum().backward()
    err = (x.grad.double() - x64.grad).abs().max().item()
    assert err <= 0.05 * x64.grad.abs().max().item() + 1e-3


@pytest.mark.parametrize(
    "families, capability, fuses",
    [("on", (9, 0), True), ("on", (8, 0), False), ("off", (9, 0), False)],
)
def test_the_fused_step_runs_where_a_dgated_kernel_does(monkeypatch, families, capability,
                                                        fuses):  # fmt: skip
    """``GatedMLP``'s fused training step needs a GPU whose kernels fuse the unit's gradient:
    Hopper with ``DGATED_FAMILIES`` on; CPU tensors never."""
    from op_helpers import fake_cuda
    from torch._subclasses.fake_tensor import FakeTensorMode

    from wsgemm.host import registry
    from wsgemm.host.dispatch import DISPATCHER, StandInDevices

    on = registry.EPILOGUE_FAMILIES if families == "on" else frozenset()
    monkeypatch.setattr(registry, "DGATED_FAMILIES", on)
    monkeypatch.setattr(DISPATCHER, "devices", StandInDevices(capability, 132))
    with FakeTensorMode():
        assert wnn._fuses_gated_grad(fake_cuda((4, 8))) == fuses
    assert not wnn._fuses_gated_grad(torch.zeros(4, 8))


# ------------------------------------------------------------------------------ plain MLPs


class GPTNeoXMLP(nn.Module):
    """transformers' GPTNeoXMLP (Falcon's is the same), as it is written."""

    def __init__(self, hidden=64, ffn=128, act=None, dtype=torch.bfloat16):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden, ffn, dtype=dtype)
        self.dense_4h_to_h = nn.Linear(ffn, hidden, dtype=dtype)
        self.act = act or nn.GELU()

    def forward(self, hidden_states):
        hidden_states = self.dense_h_to_4h(hidden_states)
        hidden_states = self.act(hidden_states)
        return self.dense_4h_to_h(hidden_states)


class PhiBlock(nn.Module):
    """Phi's MLP under a block: ``fc1``, ``activation_fn`` (its tanh GELU), ``fc2``."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(64, 128, dtype=torch.bfloat16)
        self.mlp.fc2 = nn.Linear(128, 64, dtype=torch.bfloat16)
        self.mlp.activation_fn = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.mlp.fc2(self.mlp.activation_fn(self.mlp.fc1(x)))


def test_a_plain_mlp_s_activation_moves_into_its_up_projection():
    """``replace_linear(fuse_mlp=True)``: the activation runs in the replaced up projection's
    epilogue (``Linear.activation``), a ``FusedActivation`` (the identity) in its place; the
    Parameters and state_dict are untouched, the values the same (on the CPU both roads are
    torch's ops: bit for bit), and ``restore_linear`` gives the model its own module back."""
    torch.manual_seed(0)
    cases = ((GPTNeoXMLP(), "dense_h_to_4h", "act", "gelu"),
             (PhiBlock(), "mlp.fc1", "activation_fn", "gelu_tanh"))  # fmt: skip
    for model, up, act_attr, name in cases:
        x = torch.randn(3, 64, dtype=torch.bfloat16)
        want, keys = model(x), list(model.state_dict())
        params = [id(p) for p in model.parameters()]
        report = wnn.replace_linear(model, fuse_mlp=True)
        owner = model.get_submodule(up.rpartition(".")[0])
        assert report.fused == ((up.rpartition(".")[0], up),)
        assert model.get_submodule(up).activation == name
        assert isinstance(getattr(owner, act_attr), wnn.FusedActivation)
        assert f"{name!r}, fused" in repr(model)
        assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
        assert torch.equal(model(x), want)
        clone = copy.deepcopy(model)
        buf = io.BytesIO()
        torch.save(clone, buf)
        buf.seek(0)
        assert torch.equal(torch.load(buf, weights_only=False)(x), want)
        wnn.restore_linear(model)
        assert type(model.get_submodule(up)) is nn.Linear
        assert not isinstance(getattr(owner, act_attr), wnn.FusedActivation)
        assert torch.equal(model(x), want)


def test_a_fused_plain_mlp_runs_one_gemm_with_its_activation(monkeypatch):
    """Where wsgemm runs the layer, the up projection is one ``wsgemm.linear`` with the
    activation (and the bias) in its epilogue: two products for the MLP, no other pass."""
    from op_helpers import install

    stub = install(monkeypatch)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    torch.manual_seed(1)
    model = GPTNeoXMLP()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = model(x).double()
    wnn.replace_linear(model, fuse_mlp=True)
    calls = []
    monkeypatch.setattr(wnn, "linear", lambda *a: calls.append(a[3]) or wsgemm.linear(*a))
    got = model(x).double()
    assert calls == ["gelu", None] and len(stub.calls) == 2
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_what_is_not_a_plain_mlp_is_left_alone():
    """An activation wsgemm does not know, a gated MLP (``fuse_gated_mlps``' own), an up
    projection the rules skip (misaligned), or one a filter declined: nothing moves."""
    tanh = GPTNeoXMLP(act=nn.Tanh())
    assert wnn.replace_linear(tanh, fuse_mlp=True).fused == ()
    assert isinstance(tanh.act, nn.Tanh) and tanh.dense_h_to_4h.activation is None
    odd = GPTNeoXMLP(ffn=100)  # 100 % 8: the up projection is skipped, so is the MLP
    assert wnn.replace_linear(odd, fuse_mlp=True).fused == ()
    declined = GPTNeoXMLP()
    wnn.replace_linear(declined, lambda layer, name: name != "dense_h_to_4h", fuse_mlp=True)
    assert isinstance(declined.act, nn.GELU)
    llama = LlamaMLP()
    fused = wnn.replace_linear(llama, fuse_mlp=True).fused
    assert fused == (("", "gate_proj", "up_proj"),)
    assert not isinstance(llama.act_fn, wnn.FusedActivation)


class GatedFc1(nn.Module):
    """transformers' MoshiGatingMLP: ``fc1`` twice ``fc2``'s input, the activation on its first
    half only (the names of a plain MLP, not its meaning)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256, bias=False, dtype=torch.bfloat16)
        self.fc2 = nn.Linear(128, 64, bias=False, dtype=torch.bfloat16)
        self.activation_fn = nn.SiLU()

    def forward(self, x):
        y = self.fc1(x)
        return self.fc2(self.activation_fn(y[..., :128]) * y[..., 128:])


def test_a_plain_mlp_is_fused_only_where_the_meaning_stays():
    """Not fused: a gated unit under plain names (fc1 wider than fc2's input), a hook on the
    up projection (it would see activated values) or on the activation (it would not fire),
    an up projection shared by two MLPs (it would take both activations). Each keeps its
    output."""
    torch.manual_seed(3)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    gated = GatedFc1()
    hooked_up, hooked_act = GPTNeoXMLP(), GPTNeoXMLP()
    hooked_up.dense_h_to_4h.register_forward_hook(lambda *a: None)
    hooked_act.act.register_forward_hook(lambda *a: None)
    shared = nn.Module()
    shared.a, shared.b = GPTNeoXMLP(), GPTNeoXMLP(act=nn.ReLU())
    shared.b.dense_h_to_4h = shared.a.dense_h_to_4h
    for model in (gated, hooked_up, hooked_act, shared):
        children = [m for m in model.modules() if isinstance(m, (GatedFc1, GPTNeoXMLP))]
        want = [m(x) for m in children]
        assert wnn.replace_linear(model, fuse_mlp=True).fused == ()
        assert all(torch.equal(m(x), w) for m, w in zip(children, want, strict=True))
        assert not any(isinstance(m, wnn.FusedActivation) for m in model.modules())


def test_restoring_an_up_projection_alone_keeps_the_mlp_right():
    """``restore_linear`` on the fused up projection alone leaves it a wsgemm layer (it carries
    the activation; ``nn.Linear`` has none); restoring the MLP undoes the fusion. A subclass
    of ``nn.Linear`` a filter chose (Falcon's ``FalconLinear``) fuses too."""
    torch.manual_seed(4)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    mlp = GPTNeoXMLP()
    want = mlp(x)
    wnn.replace_linear(mlp, fuse_mlp=True)
    assert wnn.restore_linear(mlp.dense_h_to_4h) == []
    assert torch.equal(mlp(x), want)
    mlp.dense_h_to_4h.activation = None  # changed behind the fusion's back: the model's own
    assert torch.equal(mlp(x), want)
    mlp.dense_h_to_4h.activation = "gelu"
    assert sorted(wnn.restore_linear(mlp)) == ["dense_4h_to_h", "dense_h_to_4h"]
    assert isinstance(mlp.act, nn.GELU) and torch.equal(mlp(x), want)

    class FalconLinear(nn.Linear):
        pass

    falcon = GPTNeoXMLP()
    falcon.dense_h_to_4h.__class__ = FalconLinear
    want = falcon(x)
    report = wnn.replace_linear(falcon, lambda layer, name: True, fuse_mlp=True)
    assert report.fused == (("", "dense_h_to_4h"),) and torch.equal(falcon(x), want)
