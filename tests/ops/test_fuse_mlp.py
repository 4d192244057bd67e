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

    def __init__(self, hidden=64, ffn=96, act=None, dtype=torch.bfloat16):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
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


@pytest.mark.parametrize(
    "act, name",
    [
        (nn.SiLU(), "silu"),
        (nn.GELU(approximate="tanh"), "gelu_tanh"),
        (nn.GELU(), "gelu"),
        (nn.ReLU(), "relu"),
    ],  # fmt: skip
)
def test_the_fused_forward_runs_one_gated_linear(act, name, monkeypatch):
    calls = []

    def fake_gated_linear(x, weight, activation):
        calls.append((weight.shape, activation))
        y = x.double() @ weight.double().T
        half = weight.shape[0] // 2
        return (torch_activation(activation, y[:, :half]) * y[:, half:]).to(x.dtype)

    monkeypatch.setattr(wnn, "gated_linear", fake_gated_linear)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    torch.manual_seed(1)
    mlp = LlamaMLP(act=act)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    want = mlp(x).double()
    wnn.fuse_gated_mlps(mlp)
    got = mlp(x).double()
    assert calls and calls[-1] == ((192, 64), name)
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_weights_moved_apart_fall_back_to_the_model_forward(monkeypatch):
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: True)
    monkeypatch.setattr(wnn, "gated_linear", lambda *a: pytest.fail("fused path taken"))
    mlp = LlamaMLP()
    wnn.fuse_gated_mlps(mlp)
    mlp.up_proj.weight.data = mlp.up_proj.weight.data.clone()  # no longer adjacent
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(wnn, "_runs_on_wsgemm", lambda x, w: False)
    assert mlp(x).shape == (3, 64)


def test_what_is_not_a_gated_mlp_is_left_alone():
    mlp = LlamaMLP(act=nn.Tanh())
    assert wnn.fuse_gated_mlps(mlp) == []
    biased = LlamaMLP()
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
