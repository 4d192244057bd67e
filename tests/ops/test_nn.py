"""wsgemm.nn without a GPU: Linear is a drop-in nn.Linear (constructor, parameters, init,
state_dict; its repr adds wsgemm's part), routes aligned fp16/bf16 CUDA work to wsgemm and
everything else to torch, visibly, and replace_linear swaps layers in place keeping their
Parameter objects. The report, pickling and restore_linear: test_replace_linear.py."""

import pytest
import torch
from op_helpers import cuda_autocast, fake_cuda, install
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm
from wsgemm.nn import Linear, replace_linear

BF16 = torch.bfloat16


def test_linear_is_a_drop_in_for_nn_linear():
    torch.manual_seed(0)
    theirs = nn.Linear(12, 5, dtype=torch.float64)
    torch.manual_seed(0)
    ours = Linear(12, 5, dtype=torch.float64)
    assert isinstance(ours, nn.Linear)
    assert [(n, p.shape, p.dtype) for n, p in ours.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in theirs.named_parameters()
    ]
    assert theirs.extra_repr() == "in_features=12, out_features=5, bias=True"
    assert (
        ours.extra_repr()
        == theirs.extra_repr() + ", wsgemm=auto, falls back to torch: weight on cpu"
    )
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    assert Linear(3, 4, bias=False, device="meta").bias is None


def test_state_dict_round_trip():
    theirs = nn.Linear(8, 3)
    ours = Linear(8, 3)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == ["weight", "bias"]
    back = nn.Linear(8, 3)
    back.load_state_dict(ours.state_dict())
    for name, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, BF16])
def test_outside_wsgemm_the_layer_computes_what_nn_linear_does(dtype):
    torch.manual_seed(1)
    layer = Linear(8, 3, dtype=dtype)
    x = torch.randn(2, 4, 8, dtype=dtype)
    assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))


def test_which_calls_run_on_wsgemm():
    from wsgemm.nn import _runs_on_wsgemm

    with FakeTensorMode():
        half, single = fake_cuda((4, 8), BF16), fake_cuda((4, 8), torch.float32)
        w_half, w_single = fake_cuda((16, 8), BF16), fake_cuda((16, 8), torch.float32)
        assert _runs_on_wsgemm(half, w_half)
        # sizes wsgemm would copy on every call: torch
        assert not _runs_on_wsgemm(half, fake_cuda((12, 8), BF16))
        assert not _runs_on_wsgemm(fake_cuda((4, 12), BF16), fake_cuda((16, 12), BF16))
        assert not _runs_on_wsgemm(single, w_single)  # fp32 without autocast: torch
        assert not _runs_on_wsgemm(half, w_single)  # mixed: torch (which refuses it)
        with cuda_autocast(BF16):
            assert _runs_on_wsgemm(single, w_single) and _runs_on_wsgemm(half, w_single)
            assert not _runs_on_wsgemm(fake_cuda((4, 8), torch.float64), w_single)
    assert not _runs_on_wsgemm(torch.ones(2, 8, dtype=BF16), torch.ones(16, 8, dtype=BF16))


def test_eligible_layers_call_wsgemm_linear(monkeypatch):
    core = install(monkeypatch, fast=True)
    monkeypatch.setattr("wsgemm.nn._runs_on_wsgemm", lambda x, w: True)
    layer = Linear(8, 3, dtype=BF16)
    x = torch.randn(2, 8, dtype=BF16, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert len(core.calls) == 3  # forward, dX, dW
    want = nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)
    assert layer.weight.grad.shape == (3, 8) and layer.weight.grad.is_contiguous()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.down = nn.Linear(16, 8, bias=False)
        self.tied = nn.Linear(16, 8, bias=False)
        self.tied.weight = self.down.weight


class MyLinear(nn.Linear):
    def extra_repr(self):
        return "mine, " + super().extra_repr()


def test_replace_linear_swaps_in_place_and_keeps_parameters():
    model = nn.Sequential(Block(), MyLinear(8, 4), Linear(4, 4), nn.LayerNorm(4))
    params = {name: p for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    up = model[0].up
    fired = []
    up.register_forward_hook(lambda *args: fired.append(1))

    assert replace_linear(model) == ["0.up", "0.down", "0.tied"]
    assert model[0].up is up and type(up) is Linear and fired == []
    assert type(model[1]) is MyLinear and type(model[3]) is nn.LayerNorm
    assert model[0].tied.weight is model[0].down.weight  # still tied
    assert [name for name, _ in model.named_parameters()] == list(params)
    assert all(p is params[name] for name, p in model.named_parameters())
    assert all(
        p is q for p, q in zip(optimizer.param_groups[0]["params"], model.parameters(), strict=True)
    )
    up(torch.randn(2, 8))
    assert fired == [1]
    assert replace_linear(model) == []  # nothing left to swap


def test_replace_linear_takes_subclasses_through_filter_fn():
    model = nn.Sequential(nn.Linear(8, 8), MyLinear(8, 16))
    names = replace_linear(model, filter_fn=lambda layer, name: isinstance(layer, MyLinear))
    assert names == ["1"]
    assert type(model[0]) is nn.Linear
    mine = model[1]
    assert isinstance(mine, MyLinear) and isinstance(mine, Linear)
    assert repr(mine).startswith("WsgemmMyLinear(mine, in_features=8")
    assert type(mine).forward is Linear.forward


def test_replace_linear_on_a_bare_layer_names_it_empty():
    layer = nn.Linear(8, 8)
    assert replace_linear(layer) == [""] and type(layer) is Linear


def test_replaced_model_computes_the_same_on_cpu():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(3, 8)
    before = model(x)
    replace_linear(model)
    assert torch.equal(model(x), before)


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (("model",), TypeError, ["module must be a torch.nn.Module", "str"]),
        ((nn.Linear(2, 2), "all"), TypeError, ["filter_fn must be callable", "str"]),
    ],
)
def test_replace_linear_bad_input(args, exc, words):
    with pytest.raises(exc) as info:
        replace_linear(*args)
    for w in words:
        assert w in str(info.value)


def test_public_names():
    assert wsgemm.nn.Linear is Linear and wsgemm.nn.replace_linear is replace_linear


def test_linear_with_an_activation_fuses_it_and_falls_back_with_it(monkeypatch):
    """``wsgemm.nn.Linear(..., activation=)``: wsgemm's linear gets the activation (fused with
    the bias into the epilogue); on the torch fallback (a CPU fp32 layer) torch applies it; it
    shows in ``extra_repr`` and survives a deepcopy."""
    import copy

    from wsgemm import nn as wnn

    seen = []
    monkeypatch.setattr(wnn, "linear", lambda x, w, b, act=None: seen.append(act) or x @ w.t())
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    layer = wnn.Linear(16, 8, activation="gelu_tanh")
    layer(torch.randn(2, 16))
    assert seen == ["gelu_tanh"] and "activation=gelu_tanh" in repr(layer)
    monkeypatch.undo()
    x = torch.randn(3, 16)
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, layer.weight, layer.bias),
                                    approximate="tanh")  # fmt: skip
    torch.testing.assert_close(copy.deepcopy(layer)(x), want)
    assert wnn.Linear(16, 8).activation is None
    with pytest.raises(ValueError, match="activation="):
        wnn.Linear(16, 8, activation="tanh")
