"""wsgemm.nn against what torch.nn does, as a demanding user would use it (CPU; the CUDA roads
stood in by monkeypatching ``_runs_on_wsgemm`` and ``gated_linear``): a model-like tree through
replace_linear, GatedMLP in float64, hooks the fused roads must not skip, MLP forwards the
fusions must not assume, ``.to()`` after a fusion, parametrized layers."""

import copy
import io
import operator
import pickle

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as P
from torch import nn

import wsgemm.nn as wnn
from wsgemm.api.epilogue import torch_activation

BF16 = torch.bfloat16
ACTS = ["silu", "gelu", "gelu_tanh", "relu", "relu2"]


def fake_gated_linear(calls):
    """``wsgemm.gated_linear`` on the CPU (float64, rounded once), recording its calls."""

    def gated_linear(x, weight, activation, bias=None):
        calls.append(activation)
        y = x.double() @ weight.double().T
        if bias is not None:
            y = y + bias.double()
        half = weight.shape[0] // 2
        return (torch_activation(activation, y[..., :half]) * y[..., half:]).to(x.dtype)

    return gated_linear


@pytest.fixture
def fused_road(monkeypatch):
    """The fused roads taken on CPU tensors; returns the gated_linear calls."""
    calls = []
    monkeypatch.setattr(wnn, "gated_linear", fake_gated_linear(calls))
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "_gated_kernel_takes_bias", lambda: True)
    return calls


class LlamaMLP(nn.Module):
    def __init__(self, dtype=BF16, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(64, 128, bias=bias, dtype=dtype)
        self.up_proj = nn.Linear(64, 128, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(128, 64, bias=False, dtype=dtype)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class NeoXMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(64, 128, dtype=BF16)
        self.dense_4h_to_h = nn.Linear(128, 64, dtype=BF16)
        self.act = nn.GELU()

    def forward(self, x):
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


# ------------------------------------------------------------------ a model-like tree


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 64, bias=False), nn.GELU(), nn.Linear(64, 32))
            for _ in range(2)
        )
        self.extra = nn.ModuleDict({"proj": nn.Linear(32, 32)})
        self.shared = self.extra["proj"]  # one module under two names, called twice
        self.frozen = nn.Linear(32, 32).requires_grad_(False)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.emb.weight  # tied to the embedding

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.frozen(self.shared(self.extra["proj"](h))))


def test_a_model_like_tree_keeps_what_torch_modules_keep():
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 64, (3, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(ids).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    state = copy.deepcopy(model.state_dict())
    params = dict(model.named_parameters())
    flags = {n: p.requires_grad for n, p in params.items()}
    fired = []
    model.blocks[0][0].register_forward_pre_hook(lambda m, a: fired.append("pre"))
    model.blocks[0][2].register_forward_hook(lambda m, a, out: out * 2)
    want = model(ids)

    report = wnn.replace_linear(model)
    assert set(report.replaced) == {
        "blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "extra.proj", "frozen", "head"
    }  # fmt: skip
    assert model.head.weight is model.emb.weight and model.shared is model.extra["proj"]
    assert dict(model.named_parameters()) == params  # the same Parameter objects
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)
    fired.clear()
    assert torch.equal(model(ids), want) and fired == ["pre"]  # hooks kept (one doubles)

    model(ids).sum().backward()  # the optimizer built before the replacement steps on
    optimizer.step()
    assert model.frozen.weight.grad is None
    model.load_state_dict(state, strict=True)
    torch_model = TinyLM()
    torch_model.load_state_dict(model.state_dict(), strict=True)
    for convert in ("half", "bfloat16", "double", "float"):
        getattr(model, convert)()
        assert type(model.head) is wnn.Linear and model.head.weight is model.emb.weight
    for clone in (copy.deepcopy(model), _saved_and_loaded(model)):
        assert clone.head.weight is clone.emb.weight and type(clone.frozen) is wnn.Linear
    model.eval()
    with torch.no_grad():
        a = model(ids)
    with torch.inference_mode():
        b = model(ids)
    assert torch.equal(a, b)


def _saved_and_loaded(model):
    model = copy.deepcopy(model)
    for m in model.modules():
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# ------------------------------------------------------------------ GatedMLP


def _gated_reference(mlp, x):
    """torch's own gated MLP on the module's Parameters (two slices of gate_up_proj)."""
    w, b = mlp.gate_up_proj.weight, mlp.gate_up_proj.bias
    half = w.shape[0] // 2
    gate = F.linear(x, w[:half], None if b is None else b[:half])
    up = F.linear(x, w[half:], None if b is None else b[half:])
    return mlp.down_proj(torch_activation(mlp.activation, gate) * up)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_a_float64_gated_mlp_computes_in_float64(act, bias):
    """The torch road kept float64 (it rounded the unit through float32: errors of 1e-8 and a
    failing gradcheck); forward and every gradient as torch's formula computes them."""
    torch.manual_seed(1)
    mlp = wnn.GatedMLP(8, 16, activation=act, bias=bias, dtype=torch.float64)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    got, want = mlp(x), _gated_reference(mlp, x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    grad = torch.randn_like(got)
    inputs = [x, *mlp.parameters()]
    for g, w in zip(torch.autograd.grad(got, inputs, grad),
                    torch.autograd.grad(want, inputs, grad), strict=True):  # fmt: skip
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), want, rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(mlp, (x[:2].detach().requires_grad_(),))


@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_keys_shapes_and_float32_gradients(bias):
    torch.manual_seed(2)
    mlp = wnn.GatedMLP(8, 16, bias=bias)
    keys = ["gate_up_proj.weight", "gate_up_proj.bias", "down_proj.weight", "down_proj.bias"]
    assert list(mlp.state_dict()) == (keys if bias else keys[::2])
    assert mlp.gate_up_proj.weight.shape == (32, 8) and mlp.down_proj.weight.shape == (8, 16)
    # 1-D, N-D, no rows, a non-contiguous input
    shapes = [(8,), (2, 3, 8), (0, 8), None]
    for shape in shapes:
        x = torch.randn(8, 4).t() if shape is None else torch.randn(shape)
        x.requires_grad_()
        got = mlp(x)
        x64 = x.detach().double().requires_grad_()
        ref = copy.deepcopy(mlp).double()
        want = _gated_reference(ref, x64)
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
        for p, q in zip(mlp.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5)
        mlp.zero_grad()


def test_gated_mlp_inference_runs_its_projection_s_hooks(fused_road):
    """The inference road read gate_up_proj's weight and skipped its call: a forward hook on it
    neither fired nor changed the output. Now a hooked layer takes its call, as in training."""
    torch.manual_seed(3)
    mlp = wnn.GatedMLP(64, 128, dtype=BF16)
    x = torch.randn(4, 64, dtype=BF16)
    with torch.no_grad():
        mlp(x)
    assert fused_road == ["silu"]  # unhooked: the gated kernel
    seen = []
    mlp.gate_up_proj.register_forward_hook(lambda m, a, out: seen.append(1) or out * 0)
    with torch.no_grad():
        assert torch.equal(mlp(x), torch.zeros(4, 64, dtype=BF16))
    assert seen == [1] and fused_road == ["silu"]


# ------------------------------------------------------------------ fused gated MLPs


def test_a_fused_gated_mlp_runs_hooks_added_after_the_fusion(fused_road):
    """The fused forward read the gate and up weights and skipped the gate's, the up's and the
    activation's calls: their hooks never fired, and a hook that changes an output changed
    nothing. Now any hook (or a global module hook) takes the model's own forward."""
    torch.manual_seed(4)
    x = torch.randn(4, 64, dtype=BF16)
    mlp = LlamaMLP()
    assert wnn.replace_linear(mlp, fuse_mlp=True).fused == (("", "gate_proj", "up_proj"),)
    with torch.no_grad():
        mlp(x)
    assert fused_road == ["silu"]
    fired = []
    for name in ("gate_proj", "up_proj", "act_fn"):
        handle = getattr(mlp, name).register_forward_hook(lambda m, a, o: fired.append(1) or o * 0)
        with torch.no_grad():
            assert torch.equal(mlp(x), torch.zeros(4, 64, dtype=BF16)), name
        handle.remove()
    assert fired == [1, 1, 1] and fused_road == ["silu"]
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: fired.append(2))
    try:
        with torch.no_grad():
            mlp(x)
    finally:
        handle.remove()
    assert fused_road == ["silu"] and fired.count(2) == 5  # the MLP and its four children


def test_a_layer_swapped_in_after_the_fusion_takes_the_model_forward(fused_road):
    """A wrapper put in gate_proj's place (a LoRA layer exposing the base weight) used to be
    read through its weight, its own forward dropped."""

    class LoRA(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base, self.delta = base, nn.Linear(64, 128, bias=False, dtype=BF16)

        @property
        def weight(self):
            return self.base.weight

        @property
        def bias(self):
            return self.base.bias

        def forward(self, x):
            return self.base(x) + self.delta(x)

    torch.manual_seed(5)
    x = torch.randn(4, 64, dtype=BF16)
    mlp = LlamaMLP()
    wnn.replace_linear(mlp, fuse_mlp=True)
    mlp.gate_proj = LoRA(mlp.gate_proj)
    with torch.no_grad():
        got = mlp(x)
        want = LlamaMLP.forward(mlp, x)
    assert torch.equal(got, want) and fused_road == []


def test_hooks_at_fusion_time_or_a_shared_gate_leave_the_mlp_unfused():
    hooked = LlamaMLP()
    hooked.gate_proj.register_forward_hook(lambda *a: None)
    assert wnn.replace_linear(hooked, fuse_mlp=True).fused == ()
    assert type(hooked) is LlamaMLP
    a, b = LlamaMLP(), LlamaMLP()
    b.gate_proj = a.gate_proj  # one gate under two MLPs: it cannot lie beside both ups
    assert wnn.replace_linear(nn.ModuleDict({"a": a, "b": b}), fuse_mlp=True).fused == ()


class Scaled(LlamaMLP):
    def forward(self, x):
        return 0.5 * self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ActOnUp(LlamaMLP):
    def forward(self, x):
        return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))


class DropoutBeforeDown(LlamaMLP):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.down_proj(self.drop(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))


class Branchy(LlamaMLP):
    def forward(self, x):
        if x.sum() > 0:  # control flow on values: no trace, no fusion
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return x


class MulMethod(LlamaMLP):
    def forward(self, x):
        return self.down_proj(self.up_proj(x).mul(self.act_fn(self.gate_proj(x))))


@pytest.mark.parametrize("cls", [Scaled, ActOnUp, DropoutBeforeDown, Branchy])
def test_a_gated_mlp_whose_forward_is_not_the_form_stays_unfused(cls, fused_road):
    """Fused on names alone, these computed down(act(gate) * up) in place of their own forward
    (Scaled lost its 0.5, ActOnUp applied the activation to the wrong half): silently wrong.
    The forward is traced (torch.fx) and only the exact form fuses."""
    torch.manual_seed(6)
    mlp = cls().train()
    report = wnn.replace_linear(mlp, fuse_mlp=True)
    assert report.fused == () and type(mlp) is cls
    x = torch.randn(4, 64, dtype=BF16).abs()
    mlp.eval()
    with torch.no_grad():
        assert torch.equal(mlp(x), cls.forward(mlp, x)) and fused_road == []


def test_the_form_fuses_whichever_way_the_product_is_written():
    assert wnn.replace_linear(MulMethod(), fuse_mlp=True).fused == (("", "gate_proj", "up_proj"),)
    assert operator.mul in wnn._MULS


def test_to_after_a_fusion_keeps_the_two_weights_side_by_side(fused_road):
    """Built (and fused) on the CPU in fp32, then moved: ``.to()`` copied each Parameter
    apart and the fused forward never ran again. Now the move joins them again."""
    torch.manual_seed(7)
    mlp = LlamaMLP(dtype=torch.float32, bias=True)
    model = nn.Sequential(mlp)
    wnn.replace_linear(model, fuse_mlp=True)
    params = list(model.parameters())
    x = torch.randn(4, 64, dtype=BF16)
    with torch.no_grad():
        want = LlamaMLP.forward(copy.deepcopy(mlp).to(BF16), x)
    for move in (lambda m: m.to(BF16), lambda m: m.half(), lambda m: m.bfloat16()):
        move(model)
        gate, up = mlp.gate_proj, mlp.up_proj
        assert wnn._adjacent(gate.weight, up.weight) and wnn._adjacent(gate.bias, up.bias)
    assert list(model.parameters()) == params and gate.weight.dtype == BF16
    with torch.no_grad():
        got = model(x)
    assert fused_road == ["silu"]
    assert (got.double() - want.double()).abs().max() <= 0.02 * want.double().abs().max()
    model.to_empty(device="meta")  # the meta road of a big model's loading
    assert mlp.gate_proj.weight.is_meta


# ------------------------------------------------------------------ fused plain MLPs


class ScaledPlain(NeoXMLP):
    def forward(self, x):
        return self.dense_4h_to_h(self.act(2 * self.dense_h_to_4h(x)))


class Residual(NeoXMLP):
    def forward(self, x):
        h = self.dense_h_to_4h(x)
        return self.dense_4h_to_h(self.act(h) + h)


class ActTwice(NeoXMLP):
    def forward(self, x):
        return self.act(self.dense_4h_to_h(self.act(self.dense_h_to_4h(x))))


class DropoutAfter(NeoXMLP):
    def forward(self, x):
        return F.dropout(self.dense_4h_to_h(self.act(self.dense_h_to_4h(x))), 0.1, self.training)


@pytest.mark.parametrize("cls", [ScaledPlain, Residual, ActTwice])
def test_a_plain_mlp_whose_up_output_goes_elsewhere_stays_unfused(cls):
    """Fused on names alone these changed their output (the activation moved before the
    scale, the residual took activated values, the second act call became the identity)."""
    torch.manual_seed(8)
    mlp = cls()
    x = torch.randn(4, 64, dtype=BF16)
    want = mlp(x)
    assert wnn.replace_linear(mlp, fuse_mlp=True).fused == ()
    assert not any(isinstance(m, wnn.FusedActivation) for m in mlp.modules())
    assert torch.equal(mlp(x), want)


def test_a_plain_mlp_with_work_after_its_activation_still_fuses():
    mlp = DropoutAfter().eval()
    x = torch.randn(4, 64, dtype=BF16)
    want = mlp(x)
    assert wnn.replace_linear(mlp, fuse_mlp=True).fused == (("", "dense_h_to_4h"),)
    assert torch.equal(mlp(x), want)


def test_a_hook_added_to_a_fused_up_projection_sees_what_it_saw_unfused():
    """The fused up projection returned act(x W^T + b): a hook added later saw activated
    values, and one that changes the output had the activation applied before its change.
    Now a hooked fused layer returns the product and its FusedActivation applies the act."""
    torch.manual_seed(9)
    x = torch.randn(4, 64, dtype=BF16)
    ours, theirs = NeoXMLP(), NeoXMLP()
    theirs.load_state_dict(ours.state_dict())
    wnn.replace_linear(ours, fuse_mlp=True)
    seen = []
    for mlp in (ours, theirs):
        mlp.dense_h_to_4h.register_forward_hook(lambda m, a, o: seen.append(o.min()) or o + 1)
    assert torch.equal(ours(x), theirs(x)) and seen[0] == seen[1]
    ours.dense_h_to_4h._forward_hooks.clear()
    theirs.dense_h_to_4h._forward_hooks.clear()
    assert torch.equal(ours(x), theirs(x))
    wnn.restore_linear(ours)
    assert "_act_from_fusion" not in vars(ours.dense_h_to_4h) and isinstance(ours.act, nn.GELU)


def test_a_hook_that_removes_itself_leaves_the_output_right():
    """The up projection and its FusedActivation each asked whether the layer had hooks: a
    one-shot hook that removed itself made the first return the plain product and the second
    pass it on, the activation never applied. FusedActivation now follows the call's own
    decision."""
    torch.manual_seed(12)
    x = torch.randn(4, 64, dtype=BF16)
    ours, theirs = NeoXMLP(), NeoXMLP()
    theirs.load_state_dict(ours.state_dict())
    wnn.replace_linear(ours, fuse_mlp=True)
    seen = []

    def once(module, args, output):
        seen.append(output.clone())
        handle.remove()

    handle = ours.dense_h_to_4h.register_forward_hook(once)
    theirs.dense_h_to_4h.register_forward_hook(lambda m, a, o: seen.append(o.clone()))
    assert torch.equal(ours(x), theirs(x)) and torch.equal(seen[0], seen[1])
    assert torch.equal(ours(x), theirs(x))  # the hook gone: the fused road again


# ------------------------------------------------------------------ parametrized layers


class Double(nn.Module):
    def forward(self, w):
        return 2 * w


def test_a_parametrized_linear_is_replaced_and_its_parametrization_removable():
    """Replaced with a filter taking it, a parametrized layer got a wsgemm class above torch's
    parametrized one: remove_parametrizations then raised AttributeError halfway, leaving the
    weight doubled (2 * 2 * w). Now the parametrization stays on top of the wsgemm class."""
    torch.manual_seed(10)
    layer = nn.Linear(8, 8)
    P.register_parametrization(layer, "weight", Double())
    weight, x = layer.weight.detach().clone(), torch.randn(2, 8)
    want = layer(x)
    assert wnn.replace_linear(layer) == [""]  # a parametrized nn.Linear is an nn.Linear
    assert isinstance(layer, wnn.Linear) and P.is_parametrized(layer)
    assert torch.equal(layer(x), want) and torch.equal(copy.deepcopy(layer)(x), want)
    with pytest.raises(RuntimeError, match="parametrized modules"):  # as torch refuses it
        pickle.dumps(layer)
    P.remove_parametrizations(layer, "weight")
    assert type(layer) is wnn.Linear and torch.equal(layer.weight, weight)
    assert torch.equal(layer(x), want)


def test_restore_linear_reaches_a_layer_parametrized_after_its_replacement():
    layer = nn.Linear(8, 8)
    wnn.replace_linear(layer)
    P.register_parametrization(layer, "weight", Double())
    assert wnn.restore_linear(layer) == [""]
    assert not isinstance(layer, wnn.Linear) and P.is_parametrized(layer)
    P.remove_parametrizations(layer, "weight")
    assert type(layer) is nn.Linear
