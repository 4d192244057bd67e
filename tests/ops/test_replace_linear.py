"""replace_linear shows what it did, without a GPU: its report (replaced, skipped and why,
falling back and why), the layer's extra_repr, the INFO log lines (one per call of
replace_linear, one per layer on its first fallback), torch.save / torch.load / deepcopy of a
replaced model (subclasses included), and restore_linear."""

import contextlib
import copy
import io
import itertools
import logging
import pickle

import pytest
import torch
from op_helpers import cuda_autocast, fake_cuda, install
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm.nn
from wsgemm.nn import Linear, ReplaceReport, replace_linear, restore_linear

BF16 = torch.bfloat16


class ScaledLinear(nn.Linear):
    """A subclass of nn.Linear at module level, so pickle can name it."""

    def extra_repr(self):
        return "scaled, " + super().extra_repr()


class OwnWsgemmLinear(Linear):
    """A user's own subclass of wsgemm's Linear: not made by replace_linear."""


def fake_linear(in_features, out_features, dtype=BF16, device="cuda"):
    """An nn.Linear whose Parameters are fake tensors on ``device`` (call in FakeTensorMode)."""
    layer = nn.Linear(in_features, out_features, device="meta")
    for name, shape in (("weight", (out_features, in_features)), ("bias", (out_features,))):
        setattr(layer, name, nn.Parameter(torch.empty(shape, dtype=dtype, device=device), False))
    return layer


def toy_model():
    """One layer of each kind: replaced on the GPU, replaced but falling back (CPU fp32, meta
    bf16), skipped (misaligned, float64, a subclass under the default filter, on MPS)."""
    with FakeTensorMode():
        on_gpu, on_mps = fake_linear(64, 128), fake_linear(64, 64, device="mps")
    return nn.ModuleDict(
        {
            "gpu": on_gpu,
            "on_cpu": nn.Linear(64, 64),
            "meta": nn.Linear(64, 64, dtype=BF16, device="meta"),
            "head": nn.Linear(64, 4097, bias=False),  # a vocab-4097 head
            "f64": nn.Linear(64, 64, dtype=torch.float64),
            "scaled": ScaledLinear(64, 64),
            "mps": on_mps,
            "norm": nn.LayerNorm(64),
        }
    )


def kinds(reasons):
    return {name: reason.split(":")[0] for name, reason in reasons.items()}


def test_report_of_a_toy_model():
    model = toy_model()
    report = replace_linear(model)
    assert isinstance(report, ReplaceReport)
    assert report.replaced == ("gpu", "on_cpu", "meta")
    assert kinds(report.falling_back) == {"on_cpu": "device", "meta": "device"}
    assert report.falling_back["on_cpu"] == "device: weight on cpu"
    assert report.falling_back["meta"] == "device: weight on meta"
    assert kinds(report.skipped) == {
        "head": "misaligned",
        "f64": "dtype",
        "scaled": "filtered",
        "mps": "device",
    }
    assert "out_features=4097 is not a multiple of 8" in report.skipped["head"]
    assert "float64" in report.skipped["f64"] and "ScaledLinear" in report.skipped["scaled"]
    assert report.fused == ()  # until gate/up fusion exists
    assert [type(model[name]) for name in report.replaced] == [Linear] * 3
    assert all(type(model[name]) is not Linear for name in report.skipped)


def test_report_reads_as_the_list_of_names():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    report = replace_linear(model)
    assert report == ["0", "2"] and report == ("0", "2") and ["0", "2"] == report
    assert report != ["0"] and len(report) == 2 and report[1] == "2"
    assert list(report) == ["0", "2"] and "2" in report and report.index("2") == 1
    again = replace_linear(model)
    assert again == [] and not again and len(again) == 0
    assert report == ReplaceReport(("0", "2"), (), {}, dict(report.falling_back))
    assert report != again


def test_filter_fn_chooses_among_linears_and_the_size_rules_still_apply():
    with FakeTensorMode():
        keep, drop = fake_linear(64, 64), fake_linear(64, 64)
    model = nn.ModuleDict(
        {
            "keep": keep,
            "drop": drop,
            "scaled": ScaledLinear(64, 64),
            "head": nn.Linear(64, 4097),
            "lazy": nn.LazyLinear(64),
        }
    )
    report = replace_linear(model, filter_fn=lambda layer, name: name != "drop")
    assert report.replaced == ("keep", "scaled")
    assert report.skipped["drop"] == "filtered: filter_fn declined it"
    assert kinds(report.skipped) == {
        "drop": "filtered",
        "head": "misaligned",  # chosen by filter_fn, refused by the size rule
        "lazy": "uninitialized",
    }
    assert type(model["scaled"]).__name__ == "WsgemmScaledLinear"


def test_replace_linear_logs_one_summary_line(caplog):
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        report = replace_linear(toy_model())
    lines = [r.getMessage() for r in caplog.records if r.name == "wsgemm"]
    assert lines == [report.summary()]
    assert lines[0] == (
        "replace_linear: 3 replaced, 2 falling back to torch (2 device), 0 fused, "
        "4 skipped (1 device, 1 dtype, 1 filtered, 1 misaligned)"
    )


def test_print_model_differs_before_and_after():
    model = toy_model()
    before = str(model)
    assert "wsgemm" not in before
    replace_linear(model)
    after = str(model)
    assert after != before
    assert after.count("wsgemm=auto") == 3
    assert "(gpu): Linear(in_features=64, out_features=128, bias=True, wsgemm=auto)" in after
    assert "wsgemm=auto, falls back to torch: weight on cpu)" in after
    assert "(head): Linear(in_features=64, out_features=4097, bias=False)" in after


def layer_with(weight):
    layer = Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight, False)
    return layer


def test_extra_repr_names_wsgemm_and_why_it_falls_back():
    with FakeTensorMode():
        half = layer_with(fake_cuda((16, 8), BF16))
        single = layer_with(fake_cuda((16, 8), torch.float32))
        double = layer_with(fake_cuda((16, 8), torch.float64))
        odd = layer_with(fake_cuda((4097, 8), BF16))
    base = "in_features=8, out_features=16, bias=False, wsgemm=auto"
    assert half.extra_repr() == base
    assert (
        single.extra_repr()
        == base + ', falls back to torch: float32 weight outside torch.autocast("cuda")'
    )
    with cuda_autocast(BF16):
        assert single.extra_repr() == base
        assert double.extra_repr() == (
            base + ", falls back to torch: float64 weight (autocast leaves float64 as it is); "
            "wsgemm multiplies torch.float16, torch.bfloat16"
        )
    assert odd.extra_repr().endswith(
        "wsgemm=auto, falls back to torch: out_features=4097 is not a multiple of 8 (whole "
        "16-byte rows), so wsgemm would copy an operand or the output on every call"
    )
    assert Linear(8, 16, device="meta").extra_repr().endswith("falls back to torch: weight on meta")


@pytest.mark.parametrize("autocast", [False, True])
def test_fallback_reason_agrees_with_the_route(autocast):
    """The words (extra_repr, the log) and the route (forward) come from two functions; they
    must agree on every input: a reason exactly where wsgemm does not run."""
    from wsgemm.nn import _fallback_reason, _runs_on_wsgemm

    dtypes = (torch.float16, BF16, torch.float32, torch.float64)
    with FakeTensorMode(), cuda_autocast(BF16) if autocast else contextlib.nullcontext():
        for x_dtype, w_dtype, x_dev, w_dev, out_features in itertools.product(
            dtypes, dtypes, ("cuda", "cpu"), ("cuda", "cpu"), (16, 12)
        ):
            x = torch.empty(4, 8, dtype=x_dtype, device=x_dev)
            w = torch.empty(out_features, 8, dtype=w_dtype, device=w_dev)
            reason = _fallback_reason(w, x)
            assert (reason is None) == _runs_on_wsgemm(x, w), (x, w, reason)


def test_first_fallback_call_logs_one_line_per_layer(caplog):
    torch.manual_seed(3)
    first, second = Linear(8, 16), Linear(16, 8)
    x = torch.randn(2, 8)
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        for _ in range(3):
            second(first(x))
    lines = [r.getMessage() for r in caplog.records if r.name == "wsgemm"]
    assert lines == [
        "Linear(in_features=8, out_features=16) runs torch's F.linear, not wsgemm: weight on cpu "
        "(logged once per layer)",
        "Linear(in_features=16, out_features=8) runs torch's F.linear, not wsgemm: weight on cpu "
        "(logged once per layer)",
    ]


def test_the_wsgemm_path_logs_nothing(monkeypatch, caplog):
    core = install(monkeypatch, fast=True)
    monkeypatch.setattr("wsgemm.nn._runs_on_wsgemm", lambda x, w: True)
    layer = Linear(8, 16, dtype=BF16)
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        layer(torch.randn(2, 8, dtype=BF16))
    assert len(core.calls) == 1 and not [r for r in caplog.records if r.name == "wsgemm"]


def test_compiled_fallback_is_one_graph_without_the_log(caplog):
    """The first-fallback note is eager-only: fullgraph compile of a CPU layer does not break."""
    torch._dynamo.reset()
    layer = Linear(8, 16)
    x = torch.randn(2, 8)
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        y = torch.compile(layer, backend="eager", fullgraph=True)(x)
    assert torch.equal(y, nn.functional.linear(x, layer.weight, layer.bias))
    assert layer not in wsgemm.nn._FELL_BACK


def replaced_model():
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.GELU(), ScaledLinear(16, 16), nn.Linear(16, 8), nn.Linear(8, 16)
    )
    model[4].weight = model[0].weight  # tied
    names = replace_linear(model, filter_fn=lambda layer, name: True)
    assert names == ["0", "2", "3", "4"]
    return model


def same_model(got, want):
    assert [type(m) for m in got.modules()] == [type(m) for m in want.modules()]
    assert str(got) == str(want)
    assert list(got.state_dict()) == list(want.state_dict())
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters(), strict=True):
        assert type(p) is nn.Parameter and torch.equal(p, q) and p is not q, name
    assert got[4].weight is got[0].weight
    x = torch.randn(3, 8)
    assert torch.equal(got(x), want(x))


def test_pickle_names_only_importable_classes():
    data = pickle.dumps(replaced_model())
    assert b"WsgemmScaledLinear" not in data and b"ScaledLinear" in data


def test_torch_save_and_load_of_a_replaced_model():
    model = replaced_model()
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    same_model(loaded, model)
    assert isinstance(loaded[2], ScaledLinear) and isinstance(loaded[2], Linear)


def test_load_in_a_fresh_process_makes_the_wsgemm_class_again(monkeypatch):
    data = pickle.dumps(replaced_model())
    # A fresh process has made no wsgemm class for ScaledLinear yet.
    monkeypatch.setattr(wsgemm.nn, "_SWAPPED", {nn.Linear: Linear})
    monkeypatch.setattr(wsgemm.nn, "_TORCH_CLASS", {Linear: nn.Linear})
    loaded = pickle.loads(data)
    scaled = loaded[2]
    assert type(scaled).__name__ == "WsgemmScaledLinear" and type(scaled).__mro__[1:3] == (
        Linear,
        ScaledLinear,
    )
    assert repr(scaled).startswith("WsgemmScaledLinear(scaled, in_features=16")
    assert restore_linear(loaded) == ["0", "2", "3", "4"] and type(scaled) is ScaledLinear


def test_deepcopy_of_a_replaced_model():
    model = replaced_model()
    same_model(copy.deepcopy(model), model)
    layer = Linear(8, 8)
    twin = copy.deepcopy(layer)
    assert type(twin) is Linear and torch.equal(twin.weight, layer.weight)


def test_a_users_own_subclass_of_linear_pickles_as_itself():
    layer = OwnWsgemmLinear(8, 8)
    assert type(pickle.loads(pickle.dumps(layer))) is OwnWsgemmLinear
    assert type(copy.deepcopy(layer)) is OwnWsgemmLinear
    assert restore_linear(layer) == [] and type(layer) is OwnWsgemmLinear


def test_restore_linear_undoes_replace_linear():
    model = nn.Sequential(nn.Linear(8, 16), ScaledLinear(16, 16), nn.Linear(16, 12), nn.ReLU())
    before = str(model)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    fired = []
    model[0].register_forward_hook(lambda *args: fired.append(1))
    report = replace_linear(model, filter_fn=lambda layer, name: True)
    assert report == ["0", "1"] and str(model) != before

    assert restore_linear(model) == ["0", "1"]
    assert [type(m) for m in model] == [nn.Linear, ScaledLinear, nn.Linear, nn.ReLU]
    assert str(model) == before
    assert all(p is params[name] for name, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    model(torch.randn(2, 8))
    assert fired == [1]
    assert restore_linear(model) == []
    assert restore_linear(Linear(8, 8)) == [""]  # Linear itself goes back to nn.Linear


def test_restore_linear_bad_input():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got str"):
        restore_linear("model")


def test_public_names():
    assert wsgemm.nn.ReplaceReport is ReplaceReport and wsgemm.nn.restore_linear is restore_linear
