"""``wsgemm.explain`` (``ops.explain``) for every operand shape ``wsgemm.matmul`` takes, without a
GPU: 1-D operands and any number of batch dimensions are folded as ``matmul`` folds them
(``ops._folded``), then explained by the core (``wsgemm.api.explain``) on the folded views, after
one line saying how; 2-D and 3-D calls keep the core's text; shapes ``matmul`` refuses raise its
ValueError; a fold that would copy a real tensor is explained on meta stand-ins."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import wsgemm
from wsgemm import api, ops

F16 = torch.float16


def meta(*shape, dtype=F16):
    return torch.empty(shape, dtype=dtype, device="meta")


def split(text: str) -> tuple[str, str]:
    """(the fold line, the core's text after it)."""
    line, rest = text.split("\n", 1)
    assert line.startswith("N-D: "), text
    return line, rest


def kernel(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("kernel: "))


def test_the_public_explain_is_the_ops_layers_and_2d_3d_text_is_the_cores():
    assert wsgemm.explain is ops.explain
    for a, b, kw in [
        (meta(300, 4096), meta(4096, 8192), {}),
        (meta(6, 64, 128), meta(128, 256), {}),
        (meta(64, 128), meta(6, 128, 256), dict(bias=meta(256), activation="gelu")),
        (meta(6, 64, 128), meta(6, 128, 256), dict(out=meta(6, 64, 256), c=meta(256), alpha=2.0)),
    ]:
        assert wsgemm.explain(a, b, **kw) == api.explain(a, b, **kw)
    # the core itself still takes 2-D and 3-D only
    with pytest.raises(ValueError, match="a must be 2-D"):
        api.explain(meta(2, 3, 64, 128), meta(128, 256))


def test_a_4d_batch_against_a_2d_weight_runs_as_a_batch_of_6():
    line, rest = split(wsgemm.explain(meta(2, 3, 64, 128), meta(128, 256)))
    assert line == (
        "N-D: a (2, 3, 64, 128) @ b (128, 256) runs as a batch of 6: (6, 64, 128) @ (128, 256)"
    )
    assert "M=64 N=256 K=128 batch=6" in rest
    assert rest == wsgemm.explain(meta(6, 64, 128), meta(128, 256))


@pytest.mark.parametrize(
    "a, b, a3, b3, how",
    [((2, 3, 64, 128), (2, 3, 128, 256), (6, 64, 128), (6, 128, 256), "a batch of 6"),
     ((5, 1, 2, 64, 128), (2, 128, 256), None, None, "a batch of 10"),
     ((1, 1, 64, 128), (128, 256), (64, 128), (128, 256), "one (64, 128) @ (128, 256) product"),
     ((64, 128), (1, 1, 128, 256), (64, 128), (128, 256), "one (64, 128) @ (128, 256) product"),
     ((64, 128), (2, 3, 128, 256), (64, 128), (6, 128, 256), "a batch of 6"),
     ((2, 1, 64, 128), (4, 128, 256), (8, 64, 128), (8, 128, 256), "a batch of 8")],
)  # fmt: skip
def test_batches_fold_as_matmul_folds_them(a, b, a3, b3, how):
    line, rest = split(wsgemm.explain(meta(*a), meta(*b)))
    assert how in line
    if a3 is not None:  # the same kernel, text and all, as the 2-D/3-D call matmul makes
        assert rest == wsgemm.explain(meta(*a3), meta(*b3))


@pytest.mark.parametrize(
    "a, b, a3, b3, problem",
    [((128,), (128, 256), (1, 128), (128, 256), "M=1 N=256 K=128 batch=1"),
     ((64, 128), (128,), (64, 128), (128, 1), "M=64 N=1 K=128 batch=1"),
     ((128,), (128,), (1, 128), (128, 1), "M=1 N=1 K=128 batch=1"),
     ((128,), (2, 3, 128, 256), (1, 128), (6, 128, 256), "M=1 N=256 K=128 batch=6"),
     ((2, 3, 64, 128), (128,), (6, 64, 128), (128, 1), "M=64 N=1 K=128 batch=6")],
)  # fmt: skip
def test_1d_operands(a, b, a3, b3, problem):
    line, rest = split(wsgemm.explain(meta(*a), meta(*b)))
    assert f"{a3} @ {b3}".replace(",)", ")") in line.replace(",)", ")")
    assert problem in rest
    assert rest == wsgemm.explain(meta(*a3), meta(*b3))
    assert kernel(rest) == kernel(wsgemm.explain(meta(*a3), meta(*b3)))


def test_a_broadcast_batch_is_copied_and_says_so():
    line, rest = split(wsgemm.explain(meta(2, 1, 64, 128), meta(3, 128, 256)))
    assert "runs as a batch of 6: (6, 64, 128) @ (6, 128, 256)" in line
    a_note = "a copied into a (6, 64, 128) tensor first: its batch (2, 1) broadcasts to (2, 3)"
    b_note = "b copied into a (6, 128, 256) tensor first: its batch (3,) broadcasts to (2, 3)"
    assert a_note in line and b_note in line
    # the copies are dense row-major batches, as the fold makes them
    assert rest == wsgemm.explain(meta(6, 64, 128), meta(6, 128, 256))


def test_batch_dimensions_that_do_not_collapse_are_copied_and_say_so():
    a = meta(3, 2, 64, 128).transpose(0, 1)  # (2, 3, 64, 128), batch strides (8192, 24576)
    line, rest = split(wsgemm.explain(a, meta(128, 256)))
    assert "a copied into a (6, 64, 128) tensor first: its batch dimensions do not collapse" in line
    assert "b copied" not in line
    assert rest == wsgemm.explain(meta(6, 64, 128), meta(128, 256))
    # a batch that collapses is a view: nothing copied
    assert "copied" not in wsgemm.explain(meta(2, 3, 64, 128), meta(128, 256)).splitlines()[0]


def test_out_of_the_nd_shape():
    a, b = meta(2, 3, 64, 128), meta(128, 256)
    line, rest = split(wsgemm.explain(a, b, out=meta(2, 3, 64, 256)))
    assert line.endswith("; out written in place as (6, 64, 256)")
    assert rest == wsgemm.explain(meta(6, 64, 128), b, out=meta(6, 64, 256))
    # an out whose batch dimensions do not collapse: the result is copied into it
    scattered = meta(3, 2, 64, 256).transpose(0, 1)
    line, rest = split(wsgemm.explain(a, b, out=scattered))
    assert "out's batch dimensions do not collapse into one" in line
    assert "then copied into out" in line
    assert rest == wsgemm.explain(meta(6, 64, 128), b)
    # an out of the wrong shape or dtype: matmul's errors
    with pytest.raises(ValueError, match=r"out has shape \(6, 64, 256\); this product needs"):
        wsgemm.explain(a, b, out=meta(6, 64, 256))
    with pytest.raises(TypeError, match="out has dtype"):
        wsgemm.explain(a, b, out=meta(2, 3, 64, 256, dtype=torch.float64))


def test_bias_and_activation():
    a, b, a3 = meta(2, 3, 64, 128), meta(128, 256), meta(6, 64, 128)
    text = wsgemm.explain(a, b, bias=meta(256), activation="relu")
    line, rest = split(text)
    assert "a bias per column then relu" in rest
    assert rest == wsgemm.explain(a3, b, bias=meta(256), activation="relu")
    assert kernel(rest) == kernel(wsgemm.explain(a3, b, bias=meta(256), activation="relu"))
    # a row bias of a 2-D @ 1-D product: the result's rows are the core's rows
    _, rest = split(wsgemm.explain(meta(64, 128), meta(128), bias=meta(64), activation="silu"))
    assert "M=64 N=1 K=128" in rest and "a bias per row then silu" in rest
    # a bias that does not fit the N-D result: matmul's error, in the N-D shape's words
    with pytest.raises(ValueError, match=r"bias has shape \(64,\); for an output of shape "
                                         r"\(2, 3, 64, 256\)"):  # fmt: skip
        wsgemm.explain(a, b, bias=meta(64))
    with pytest.raises(ValueError, match="the same for every batch"):
        wsgemm.explain(a, b, bias=meta(3, 1, 256))


def test_a_residual_and_alpha_beta():
    a, b = meta(2, 3, 64, 128), meta(128, 256)
    out = meta(2, 3, 64, 256)
    line, rest = split(wsgemm.explain(a, b, out=out, c=out, alpha=2.0, beta=0.5))
    assert "c copied" not in line
    assert "c: out itself" in rest and "alpha = 2 times the product then plus beta = 0.5" in rest
    out3 = meta(6, 64, 256)
    assert rest == wsgemm.explain(meta(6, 64, 128), b, out=out3, c=out3, alpha=2.0, beta=0.5)
    # a c that broadcasts folds to a view (stride 0): the core says it copies it into the result
    line, rest = split(wsgemm.explain(a, b, c=meta(256), beta=0.5))
    assert "copied" not in line and "c: copied into a new result first" in rest
    # a c whose batch does not collapse is copied by the fold
    c = meta(3, 2, 64, 256).transpose(0, 1)
    line, _ = split(wsgemm.explain(a, b, c=c))
    assert "c copied into a (6, 64, 256) tensor first: its batch dimensions do not collapse" in line
    with pytest.raises(ValueError, match=r"c has shape \(5, 256\), which does not broadcast"):
        wsgemm.explain(a, b, c=meta(5, 256))


@pytest.mark.parametrize(
    "a, b, kw, match",
    [((2, 3, 64, 128), (129, 256), {}, "inner dimensions differ"),
     ((2, 3, 64, 128), (2, 128, 256), {}, "batch dimensions do not broadcast"),
     ((), (128,), {}, "at least 1-D"),
     ((128,), (64,), {}, "inner dimensions differ"),
     ((2, 3, 64, 128), (128, 256), dict(activation="nope"), "activation='nope' is not one of")],
)  # fmt: skip
def test_wrong_shapes_raise_matmuls_value_errors(a, b, kw, match):
    a, b = meta(*a), meta(*b)
    with pytest.raises(ValueError, match=match) as explained:
        wsgemm.explain(a, b, **kw)
    with pytest.raises(ValueError) as ran:  # (on meta tensors: the op's fake implementation)
        wsgemm.matmul(a, b, **kw)
    assert str(explained.value) == str(ran.value)


def test_grouped_gated_and_row_scale_keep_the_cores_road():
    with pytest.raises(ValueError, match="row_scale is grouped_mm's"):
        wsgemm.explain(meta(2, 3, 64, 128), meta(128, 256), row_scale=meta(64))
    a3, b3 = meta(4, 64, 128), meta(4, 128, 256)
    assert wsgemm.explain(a3, b3, grouped=True) == api.explain(a3, b3, grouped=True)


def test_fake_cuda_tensors():
    with FakeTensorMode():
        a = torch.empty(2, 3, 64, 128, dtype=F16, device="cuda")
        b = torch.empty(128, 256, dtype=F16, device="cuda")
        line, rest = split(wsgemm.explain(a, b, out=torch.empty(2, 3, 64, 256, dtype=F16,
                                                                 device="cuda")))  # fmt: skip
    assert "a batch of 6" in line and "M=64 N=256 K=128 batch=6" in rest


class _Allocations(TorchDispatchMode):
    """The ops that return a tensor with memory of its own (not a view of one passed in)."""

    def __init__(self, *tensors):
        super().__init__()
        self.known = {t.untyped_storage().data_ptr() for t in tensors}
        self.made: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() > 0:
                if t.untyped_storage().data_ptr() not in self.known:
                    self.made.append(str(func))
        return result


def test_real_tensors_that_the_fold_would_copy_are_explained_on_meta_stand_ins():
    """CPU tensors on a stand-in GPU (``cc``): the fold's copies are made of meta stand-ins,
    and the answer is the one for meta tensors of the same shapes and strides."""
    a = torch.empty(2, 1, 64, 128, dtype=F16)
    b = torch.empty(3, 128, 256, dtype=F16)
    with _Allocations(a, b) as seen:
        text = wsgemm.explain(a, b, cc=(9, 0))
    assert seen.made == []
    line, rest = split(text)
    assert "a copied into a (6, 64, 128) tensor first" in line
    assert "explained on meta stand-ins of the tensors (explain copies nothing)" in line
    on_meta = wsgemm.explain(meta(2, 1, 64, 128), meta(3, 128, 256), cc=(9, 0))
    assert "stand-ins" not in on_meta  # (meta tensors are folded as they are)
    assert line.startswith(split(on_meta)[0] + "; ") and rest == split(on_meta)[1]
    # nothing to copy: the real tensors' views themselves, no stand-ins
    a = torch.empty(2, 3, 64, 128, dtype=F16)
    with _Allocations(a, b) as seen:
        line, rest = split(wsgemm.explain(a, b[0], cc=(9, 0)))
    assert seen.made == [] and "stand-ins" not in line
    assert rest == wsgemm.explain(torch.empty(6, 64, 128, dtype=F16), b[0], cc=(9, 0))


def test_the_cli_explains_a_shape_still(capsys):
    from wsgemm import cli

    assert cli.main(["explain", "--shape", "300,4096,8192"]) == 0
    assert "M=300 N=4096 K=8192" in capsys.readouterr().out
