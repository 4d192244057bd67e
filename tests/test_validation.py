"""Every bad input raises the right type with a message naming the argument, what it got and
what is allowed. These run on the CPU: the device checks come last in ``validate`` on purpose."""

import pytest
import torch

from wsgemm import api
from wsgemm.api import validate

F16 = torch.float16


def t(*shape, dtype=F16):
    return torch.zeros(shape, dtype=dtype)


def call(a, b, **kw):
    # the core (2-D and 3-D); wsgemm.matmul's N-D layer has its own tests (test_torch_op.py)
    return api.matmul(a, b, **kw)


@pytest.mark.parametrize(
    "a, b, kw, exc, words",
    [
        ("x", t(4, 4), {}, TypeError, ["a must be a torch.Tensor", "str"]),
        (t(4, 4), [[1.0]], {}, TypeError, ["b must be a torch.Tensor", "list"]),
        (t(4), t(4, 4), {}, ValueError, ["a must be 2-D", "got 1-D"]),
        (t(4, 4), t(2, 2, 4, 4), {}, ValueError, ["b must be 2-D", "got 4-D"]),
        (t(4, 4, dtype=torch.float32), t(4, 4), {}, TypeError, ["float32", "float16"]),
        (t(4, 4, dtype=torch.int32), t(4, 4, dtype=torch.int32), {}, TypeError, ["int32"]),
        (t(4, 4), t(4, 4, dtype=torch.bfloat16), {}, TypeError, ["same dtype", "bfloat16"]),
        (t(4, 5), t(4, 4), {}, ValueError, ["inner dimensions", "K=5", "K=4"]),
        (t(2, 4, 4), t(3, 4, 4), {}, ValueError, ["batch dimensions", "2", "3"]),
        (t(4, 4), t(4, 4), {"out_dtype": torch.int8}, TypeError, ["out_dtype", "float32"]),
        (t(4, 4), t(4, 4), {"accumulate": torch.bfloat16}, ValueError, ["accumulate"]),
        (
            t(4, 4, dtype=torch.bfloat16),
            t(4, 4, dtype=torch.bfloat16),
            {"accumulate": torch.float16},
            ValueError,
            ["float16 inputs", "bfloat16"],
        ),
        (t(4, 4), t(4, 4), {"out": t(4, 5)}, ValueError, ["out has shape (4, 5)", "(4, 4)"]),
        (t(2, 4, 4), t(4, 4), {"out": t(4, 4)}, ValueError, ["(2, 4, 4)"]),
        (t(4, 4), t(4, 4), {"out": t(4, 4, dtype=torch.int32)}, TypeError, ["out has dtype"]),
        (
            t(4, 4),
            t(4, 4),
            {"out": t(4, 4), "out_dtype": torch.float32},
            TypeError,
            ["out has dtype torch.float16", "out_dtype=torch.float32"],
        ),
        (t(4, 4), t(4, 4), {"out": "no"}, TypeError, ["out must be a torch.Tensor"]),
        (t(4, 4), t(4, 4), {"backend": "cublas"}, ValueError, ["backend='cublas'", "sm90"]),
        (t(4, 4), t(4, 4), {"backend": 3}, TypeError, ["backend must be a str"]),
        (t(4, 4), t(4, 4), {}, ValueError, ["a must be a CUDA tensor", "cpu"]),
    ],
)
def test_bad_input_raises(a, b, kw, exc, words):
    with pytest.raises(exc) as info:
        call(a, b, **kw)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value!s}"


def test_out_aliasing_an_input_is_an_error():
    a = t(8, 8)
    with pytest.raises(ValueError, match="out overlaps a"):
        call(a, t(8, 8), out=a)
    b = t(8, 16)
    with pytest.raises(ValueError, match="out overlaps b"):
        call(t(8, 8), b[:, :8], out=b[:, 4:12])


def test_interleaved_column_blocks_of_one_buffer_are_not_aliases():
    buf = t(8, 32)  # a fused output: a in columns 0-15, out in columns 16-31
    with pytest.raises(ValueError, match="CUDA"):  # passes the overlap check, stops at device
        call(buf[:, :16], t(16, 16), out=buf[:, 16:])


def test_out_with_repeated_elements_is_an_error():
    with pytest.raises(ValueError, match="stride 0"):
        call(t(2, 4, 4), t(4, 4), out=t(1, 4, 4).expand(2, 4, 4))


def test_disjoint_views_of_one_buffer_are_not_aliases():
    buf = t(3, 8, 8)
    with pytest.raises(ValueError, match="CUDA"):  # passes the overlap check, stops at device
        call(buf[0], buf[1], out=buf[2])


@pytest.mark.parametrize(
    "sa, sb, expected",
    [
        ((5, 3), (3, 7), (5, 7)),
        ((2, 5, 3), (3, 7), (2, 5, 7)),
        ((5, 3), (4, 3, 7), (4, 5, 7)),
        ((1, 5, 3), (6, 3, 7), (6, 5, 7)),
        ((0, 3), (3, 7), (0, 7)),
        ((5, 0), (0, 7), (5, 7)),
    ],
)
def test_output_shape_follows_torch_matmul(sa, sb, expected, monkeypatch):
    # stop just before the GPU: everything the CPU can check has been checked
    monkeypatch.setattr("wsgemm.api._pick_backend", lambda backend, device, m, n, batch: "sm90")
    a, b = t(*sa), t(*sb)
    assert torch.matmul(a.float(), b.float()).shape == expected
    monkeypatch.setattr("torch.Tensor.device", property(lambda self: torch.device("cuda", 0)))
    p = validate(a, b, None, None, torch.float32, "auto")
    assert p.out_shape == expected
    assert p.c_dtype == F16 and p.backend == "sm90"


@pytest.mark.parametrize(
    "m, n, batch, expected",
    [
        (128, 6144, 0, "sm90-pingpong"),  # 24 cooperative tiles on 132 SMs
        (128, 28672, 0, "sm90"),  # 112 tiles: enough
        (4096, 4096, 0, "sm90"),
        (128, 4096, 8, "sm90"),  # the batch fills the machine
    ],
)
def test_auto_picks_ping_pong_only_when_cooperative_tiles_leave_sms_idle(m, n, batch, expected):
    from wsgemm.api import auto_sm90

    assert auto_sm90(m, n, batch, 132, ["sm90", "sm90-pingpong"]) == expected
    assert auto_sm90(m, n, batch, 132, ["sm90"]) == "sm90"
