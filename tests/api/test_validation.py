"""Every bad input raises the right type with a message naming the argument, what it got and
what is allowed. These run on the CPU: the device checks come last in ``validate`` on purpose."""

import pytest
import torch

from wsgemm import api
from wsgemm.api import validate
from wsgemm.api.overlap import byte_dims, share_bytes

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
        # a named backend on CPU tensors (backend="auto" runs torch's matmul there)
        (t(4, 4), t(4, 4), {"backend": "sm90"}, ValueError, ["a must be a CUDA tensor", "cpu"]),
    ],
)
def test_bad_input_raises(a, b, kw, exc, words):
    with pytest.raises(exc) as info:
        call(a, b, **kw)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value!s}"


def on_cpu(a, b, out=None, **kw):
    """``validate`` with the CPU as the kernels' device: every check runs, the device's too."""
    args = dict(out_dtype=None, accumulate=torch.float32, backend="auto") | kw
    return validate(a, b, out, args["out_dtype"], args["accumulate"], args["backend"],
                    args.get("config"), device_type="cpu")  # fmt: skip


def test_out_aliasing_an_input_is_an_error():
    a = t(8, 8)
    with pytest.raises(ValueError, match="out overlaps a"):
        on_cpu(a, t(8, 8), out=a)
    b = t(8, 16)
    with pytest.raises(ValueError, match="out overlaps b"):
        on_cpu(t(8, 8), b[:, :8], out=b[:, 4:12])


def problem(batch, m, n, k, c_dtype=F16) -> api.Problem:
    """What ``validate`` returns for an accepted fp16 call with an fp32 accumulator."""
    return api.Problem(batch, m, n, k, F16, c_dtype, torch.float32)


def test_interleaved_column_blocks_of_one_buffer_are_not_aliases():
    buf = t(8, 32)  # a fused output: a in columns 0-15, out in columns 16-31
    assert on_cpu(buf[:, :16], t(16, 16), out=buf[:, 16:]) == problem(None, 8, 16, 16)


def test_out_with_repeated_elements_is_an_error():
    with pytest.raises(ValueError, match="stride 0"):
        call(t(2, 4, 4), t(4, 4), out=t(1, 4, 4).expand(2, 4, 4))


@pytest.mark.parametrize(
    "size, stride",
    [((4, 16), (8, 1)), ((4, 4), (8, 8)), ((2, 3, 4), (4, 4, 1)), ((3, 5), (1, 2))],
)
def test_out_whose_rows_overlap_is_an_error(size, stride):
    out = torch.zeros(64, dtype=F16).as_strided(size, stride)
    a, b = t(*size[:-1], 5), t(5, size[-1])
    with pytest.raises(ValueError, match="out's rows overlap in memory"):
        call(a, b, out=out)


def test_out_with_unusual_but_distinct_strides_is_accepted():
    out = torch.zeros(64, dtype=torch.float32).as_strided((3, 3), (2, 3))  # 0 2 4 3 5 7 6 8 10
    assert on_cpu(t(3, 5), t(5, 3), out=out) == problem(None, 3, 3, 5, c_dtype=torch.float32)


def test_disjoint_views_of_one_buffer_are_not_aliases():
    buf = t(3, 8, 8)
    assert on_cpu(buf[0], buf[1], out=buf[2]) == problem(None, 8, 8, 8)
    assert on_cpu(buf[:1], buf[1], out=buf[2:]) == problem(1, 8, 8, 8)  # a batch of 1 stays


def test_disjoint_column_blocks_of_a_large_buffer_are_not_aliases():
    """The old check gave up above 256 MiB of shared span; arithmetic does not need to. The
    buffer (300 MiB of fp16, two rows) is described, not allocated."""
    rows = 2
    cols = (300 << 20) // 2 // rows
    half = cols // 2
    dims = byte_dims((rows, half), (cols, 1), 2)  # the left and the right half of each row
    base = 1 << 40
    assert share_bytes((base, dims), (base + 2 * half, dims)) is False
    assert share_bytes((base, dims), (base + 2 * (half - 1), dims)) is True  # one column shared


@pytest.mark.filterwarnings("ignore:Sparse CSR:UserWarning", "ignore:The PyTorch API of nested")
@pytest.mark.parametrize("where", ["a", "b", "out"])
@pytest.mark.parametrize(
    "kind, exc, words",
    [
        ("meta", ValueError, ["must be a CPU tensor", "meta"]),
        ("sparse", TypeError, ["layout torch.sparse_coo", "to_dense()"]),
        ("csr", TypeError, ["layout torch.sparse_csr"]),
        ("nested", TypeError, ["nested tensor"]),
    ],
)
def test_odd_tensors_get_our_typed_errors(where, kind, exc, words):
    def odd(shape):
        if kind == "meta":
            return torch.zeros(shape, dtype=F16, device="meta")
        if kind == "sparse":
            return torch.zeros(shape, dtype=F16).to_sparse()
        if kind == "csr":
            return torch.zeros(shape, dtype=F16).to_sparse_csr()
        return torch.nested.nested_tensor([torch.zeros(shape, dtype=F16)] * 2)

    args = {"a": t(4, 4), "b": t(4, 4), "out": t(4, 4)}
    args[where] = odd((4, 4))
    with pytest.raises(exc) as info:
        on_cpu(args["a"], args["b"], out=args["out"])
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value!s}"
    with pytest.raises(exc):  # the same through matmul (the device check names CUDA there)
        call(args["a"], args["b"], out=args["out"])


def test_meta_tensors_everywhere_stop_at_the_device_check():
    meta = torch.zeros(4, 4, dtype=F16, device="meta")
    with pytest.raises(ValueError, match="a must be a CUDA tensor, got a tensor on meta"):
        call(meta, meta, out=torch.zeros(4, 4, dtype=F16, device="meta"))


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        ({"accumulate": []}, TypeError, ["accumulate must be a torch.dtype", "list"]),
        ({"accumulate": "float32"}, TypeError, ["accumulate must be a torch.dtype", "str"]),
        ({"out_dtype": []}, TypeError, ["out_dtype must be a torch.dtype", "list"]),
        ({"out_dtype": "float16"}, TypeError, ["out_dtype must be a torch.dtype", "str"]),
        ({"config": object()}, ValueError, ["config=", "named backend", "auto"]),
        ({"config": object(), "backend": "sm90"}, TypeError, ["config", "Sm90Config", "object"]),
    ],
)
def test_arguments_of_the_wrong_kind(kw, exc, words):
    with pytest.raises(exc) as info:
        call(t(4, 4), t(4, 4), **kw)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value!s}"


@pytest.mark.parametrize("where", ["a", "b", "out"])
def test_requires_grad_with_grad_mode_on_is_an_error(where):
    args = {"a": t(4, 4), "b": t(4, 4), "out": t(4, 4)}
    args[where].requires_grad_()
    with pytest.raises(ValueError, match=f"{where} requires grad and grad mode is on"):
        on_cpu(args["a"], args["b"], out=args["out"])
    with torch.no_grad():  # the op layer's call: no gradients asked for, none dropped
        assert on_cpu(args["a"], args["b"], out=args["out"]) == problem(None, 4, 4, 4)
    assert on_cpu(args["a"].detach(), args["b"].detach(), out=args["out"].detach()) == problem(
        None, 4, 4, 4
    )


def test_parameters_are_inputs_that_require_grad():
    w = torch.nn.Parameter(t(4, 4))
    with pytest.raises(ValueError, match="b requires grad"):
        on_cpu(t(4, 4), w)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("where", ["a", "b", "out"])
def test_negative_views_are_refused(where):
    neg = torch.zeros(4, 4, dtype=torch.complex32).conj().imag
    assert neg.dtype == F16 and neg.is_neg()
    args = {"a": t(4, 4), "b": t(4, 4), "out": t(4, 4)}
    args[where] = neg
    with pytest.raises(ValueError, match=f"{where} is a negative view"):
        on_cpu(args["a"], args["b"], out=args["out"])


@pytest.mark.parametrize(
    "sa, sb, expected",
    [
        ((5, 3), (3, 7), (5, 7)),
        ((2, 5, 3), (3, 7), (2, 5, 7)),
        ((5, 3), (4, 3, 7), (4, 5, 7)),
        ((1, 5, 3), (6, 3, 7), (6, 5, 7)),
        ((1, 5, 3), (3, 7), (1, 5, 7)),  # a batch of 1 against a matrix stays a batch
        ((5, 3), (1, 3, 7), (1, 5, 7)),
        ((1, 5, 3), (1, 3, 7), (1, 5, 7)),
        ((1, 5, 3), (0, 3, 7), (0, 5, 7)),
        ((0, 3), (3, 7), (0, 7)),
        ((5, 0), (0, 7), (5, 7)),
    ],
)
def test_output_shape_follows_torch_matmul(sa, sb, expected):
    a, b = t(*sa), t(*sb)
    assert torch.matmul(a.float(), b.float()).shape == expected
    p = on_cpu(a, b)
    assert p.out_shape == expected
    assert p.c_dtype == F16 and p.acc_dtype == torch.float32


# ----------------------------------------------------------------------------- one set of checks

META = dict(dtype=F16, device="meta")


@pytest.mark.parametrize(
    "sa, sb, out, kw",
    [
        ((4, 5), (4, 4), None, {}),
        ((2, 4, 4), (3, 4, 4), None, {}),
        ((4, 4), (4, 4), None, {"out_dtype": torch.int8}),
        ((4, 4), (4, 4), None, {"accumulate": torch.bfloat16}),
        ((4, 4), (4, 4), None, {"accumulate": "float32"}),
        ((4, 4), (4, 4), None, {"backend": "cublas"}),
        ((4, 4), (4, 4), None, {"backend": 3}),
        ((4, 4), (4, 4), ((4, 5), F16), {}),
        ((2, 4, 4), (4, 4), ((2, 4, 4), torch.float32), {"out_dtype": F16}),
        ((4, 4), (4, 4), ((4, 4), torch.int32), {}),
    ],
)
def test_the_core_and_the_torch_op_refuse_in_the_same_words(sa, sb, out, kw):
    """One set of checks: ``validate`` (the core's), ``wsgemm.matmul`` on CPU tensors (the torch
    op's real road) and ``check_static`` on meta tensors (its fake road) raise the same error
    with the same message."""
    from wsgemm import ops
    from wsgemm.api.validate import check_static

    def operands(device):
        a, b = (torch.zeros(s, dtype=F16, device=device) for s in (sa, sb))
        return a, b, None if out is None else torch.zeros(out[0], dtype=out[1], device=device)

    options = dict(out_dtype=None, accumulate=torch.float32, backend="auto") | kw
    a, b, c = operands("cpu")
    calls = (
        lambda: on_cpu(a, b, out=c, **options),
        lambda: ops.matmul(a, b, out=c, **options),
        lambda: check_static(*operands("meta"), **options),
    )
    errors = []
    for call_ in calls:
        with pytest.raises((TypeError, ValueError)) as info:
            call_()
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1] == errors[2]


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((7,), (7,)),
        ((3, 7), (7,)),
        ((7,), (2, 7, 5)),
        ((2, 1, 3, 7), (4, 7, 5)),
        ((0, 3, 7), (7, 5)),
    ],
)
def test_check_static_gives_torch_matmuls_shape_on_meta_tensors(sa, sb):
    """The torch op's fake road: any rank, no data, no device."""
    from wsgemm.api.validate import check_static

    a, b = torch.zeros(sa, **META), torch.zeros(sb, **META)
    expected = torch.matmul(torch.zeros(sa), torch.zeros(sb)).shape
    assert check_static(a, b, None, None, torch.float32, "auto") == tuple(expected)


def test_the_core_takes_two_and_three_dimensions_only():
    """The one rule ``validate`` adds to ``check_static``'s: a 1-D or 4-D operand is the torch
    op's to fold, which ``check_static`` accepts."""
    from wsgemm.api.validate import check_static

    a, b = t(2, 1, 3, 7), t(7, 5)
    assert check_static(a, b, None, None, torch.float32, "auto") == (2, 1, 3, 5)
    with pytest.raises(ValueError, match="a must be 2-D .* or 3-D .*, got 4-D"):
        on_cpu(a, b)
