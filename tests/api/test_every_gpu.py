"""Every CUDA GPU works: on a stand-in of each generation, ``auto`` runs what ``explain`` and
``available_backends`` say (a wsgemm kernel compiled for the target of ``support.TARGETS``, or
torch.matmul with its reason), never raises on fp16/bf16/fp32 operands, and a named backend
that does not run there raises an error naming the GPUs it runs on. Where no table measured
``auto``'s kernel (the sm80 family, off Hopper) torch.matmul runs until autotuning measures the
kernel faster (``choosing.route_choice``; its tests: tests/host/test_route_choice.py)."""

import logging

import pytest
import torch
from op_helpers import fake_cuda
from stand_ins import cpu_dispatcher, matmul, reference
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm.ops  # noqa: F401  (registers torch.ops.wsgemm)
from wsgemm import host, support
from wsgemm.api import dispatch
from wsgemm.host.dispatch import TORCH

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

#: (compute capability, backends that run there, what auto runs on fp16/bf16 operands with
#: autotuning off): a family's kernel ("sm90" family: the policy's menu entry), or torch.matmul
#: (no kernel; or the sm80 kernel, which no table measured there: the chooser's default).
GPUS = [
    ((7, 5), [], TORCH),  # T4
    ((8, 0), ["sm80", "sm80-multistage"], TORCH),  # A100
    ((8, 7), ["sm80", "sm80-multistage"], TORCH),  # Orin
    ((8, 9), ["sm80", "sm80-multistage"], TORCH),  # L4, RTX 40xx
    ((9, 0), ["sm90", "sm90-pingpong", "sm80", "sm80-multistage"], "sm90"),  # H100
    ((10, 0), ["sm80", "sm80-multistage"], TORCH),  # B200
    ((12, 0), ["sm80", "sm80-multistage"], TORCH),  # RTX 50xx
]
#: The kernel family ``auto`` runs where it runs one (measured faster, or never raced).
KERNEL = {(8, 0): "sm80", (8, 7): "sm80", (8, 9): "sm80", (9, 0): "sm90", (12, 0): "sm80"}
IDS = [support.cc_name(cc) for cc, _, _ in GPUS]


def operands(dtype, a_shape=(37, 24), b_shape=(24, 40)):
    torch.manual_seed(0)
    return torch.randn(a_shape).to(dtype), torch.randn(b_shape).to(dtype)


def family(backend: str) -> str:
    return TORCH if backend == TORCH else host.BACKENDS[backend].family


@pytest.mark.parametrize("cc, backends, auto", GPUS, ids=IDS)
def test_available_backends_are_the_tables(cc, backends, auto):
    d = cpu_dispatcher(cc)
    assert d.available_backends() == backends
    row = support.target(cc)
    families = () if row is None else row.families
    assert backends == [n for n in host.shipped_backends() if host.BACKENDS[n].family in families]


@pytest.mark.parametrize("race", [None, False], ids=["default", "kernel"])
@pytest.mark.parametrize("dtype", [F16, BF16, F32])
@pytest.mark.parametrize("cc, backends, auto", GPUS, ids=IDS)
def test_auto_runs_what_explain_says_and_never_raises(cc, backends, auto, dtype, race):
    """With autotuning set off (no race): ``auto``'s kernel, or torch.matmul; ``race`` False
    (``Dispatcher.against_torch``): the kernel where the GPU has one, as ``auto`` runs it once
    measured faster."""
    d = cpu_dispatcher(cc, autotune=False, against_torch=race)
    a, b = operands(dtype)
    expected = TORCH if dtype == F32 else KERNEL.get(cc, TORCH) if race is False else auto
    route = d.route("auto", None, (37, 40, 24, None), (str(dtype)[6:], str(dtype)[6:], "float32"))
    assert family(route.backend) == expected
    text = dispatch.explain(d, a, b, None, None, F32, "auto")
    kernel_line = text.splitlines()[1]
    result = matmul(d, a, b)
    assert result.dtype == dtype and result.shape == (37, 40)
    if expected == TORCH:
        assert kernel_line.startswith("kernel: torch.matmul (")
        assert kernel_line.endswith(f"): {route.reason}")
        assert route.reason in text and not d.cache.variants  # nothing compiled
        assert torch.equal(result, torch.matmul(a, b))
    else:
        assert "torch.matmul" not in text
        assert f"backend {route.backend}" in kernel_line or f"kernel: {route.backend} (" in (
            kernel_line
        )
        # the kernel that ran is the route's, compiled for the table's target of this GPU
        (variant,) = set(d.cache.variants)
        assert (variant.backend, variant.arch) == (route.backend, support.target(cc).arch)
        torch.testing.assert_close(result, reference(a, b, dtype), rtol=0, atol=0)


@pytest.mark.parametrize(
    "cc, words",
    [
        ((7, 5), "sm_75; wsgemm's kernels need sm_80 or newer"),
        ((10, 0), "sm_100, a tcgen05 GPU"),
        ((10, 3), "sm_103, a tcgen05 GPU"),
        ((13, 0), "sm_130, which wsgemm does not build for yet (it knows sm_80, sm_86, "),
    ],
)
def test_the_torch_route_says_why(cc, words):
    d = cpu_dispatcher(cc)
    a, b = operands(F16)
    assert words in d.torch_reason(None, ("float16", "float16", "float32"))
    assert words in dispatch.explain(d, a, b, None, None, F32, "auto")


@pytest.mark.parametrize("dtype", [F32, F64])
def test_fp32_and_fp64_inputs_go_to_torch_on_every_gpu(dtype):
    for cc in (8, 0), (9, 0):
        d = cpu_dispatcher(cc)
        a, b = operands(dtype, (3, 16, 24), (24, 40))  # a batch against a broadcast matrix
        assert torch.equal(matmul(d, a, b), torch.matmul(a, b))
        why = d.torch_reason(None, (str(dtype)[6:],) * 2 + ("float32",))
        assert why == f"{str(dtype)[6:]} inputs; wsgemm's kernels multiply float16 and bfloat16"
        assert not d.cache.variants


@pytest.mark.parametrize("ab, c", [(F16, F32), (BF16, F32), (F16, BF16), (F32, F16), (F64, F32)])
def test_the_torch_route_keeps_out_dtype_and_rounds_once(ab, c):
    """16-bit inputs into a wider or other output are multiplied in fp32 (exact products,
    fp32 sums) and rounded once, as the kernels do; wider inputs round their own product."""
    d = cpu_dispatcher((7, 5))
    a, b = operands(ab)
    wide = torch.matmul(a.float(), b.float()) if ab.itemsize == 2 else torch.matmul(a, b)
    assert torch.equal(matmul(d, a, b, out_dtype=c), wide.to(c))


@pytest.mark.parametrize("out_dtype", [None, F32])
def test_the_torch_route_writes_out_in_place(out_dtype):
    d = cpu_dispatcher((7, 5))
    a, b = operands(F16)
    out_like = F16 if out_dtype is None else out_dtype
    expected = matmul(d, a, b, out_dtype=out_dtype)
    for _ in range(2):  # the first call, then the signature's launcher
        out = torch.full((40, 37), float("nan"), dtype=out_like).mT  # column-major
        version = out._version
        assert matmul(d, a, b, out=out, out_dtype=out_dtype) is out
        assert torch.equal(out, expected) and out._version > version
    with pytest.raises(ValueError, match="out overlaps a"):
        square = torch.randn(24, 24).half()
        matmul(d, square, square, out=square)


def test_the_torch_route_is_kept_per_signature_and_logged_once(caplog, monkeypatch):
    d = cpu_dispatcher((7, 5))
    caplog.set_level(logging.INFO, logger="wsgemm")
    a, b = operands(F16)
    first = matmul(d, a, b)
    assert len(d.launchers) == 1
    # a repeated signature asks the dispatcher nothing: its launcher calls torch
    monkeypatch.setattr(d, "route", lambda *args, **kw: pytest.fail("routed twice"))
    assert torch.equal(matmul(d, a, b), first)
    monkeypatch.undo()
    matmul(d, *operands(F16, (8, 16), (16, 8)))  # another signature, the same reason
    matmul(d, *operands(F32))  # another reason
    lines = [r.getMessage() for r in caplog.records if r.name == "wsgemm"]
    assert len(lines) == 2
    why = d.torch_reason(None, ("float16", "float16", "float32"))
    assert lines[0] == f"cpu: backend='auto' runs torch.matmul (fallback): {why}"
    assert "float32 inputs" in lines[1]


def test_the_torch_route_refuses_an_fp16_accumulator():
    a, b = operands(F16)
    with pytest.raises(ValueError, match="backend='auto' runs torch.matmul here .*sm_75"):
        matmul(cpu_dispatcher((7, 5)), a, b, accumulate=F16)
    with pytest.raises(ValueError, match="torch.matmul, which accumulates in fp32"):
        matmul(cpu_dispatcher((9, 0)), *operands(F32), accumulate=F16)
    # where a wsgemm kernel runs, the fp16 accumulator is its own
    assert matmul(cpu_dispatcher((8, 9)), a, b, accumulate=F16).dtype == F16


def test_the_torch_route_refuses_what_the_kernels_refuse():
    d = cpu_dispatcher((7, 5))
    a, b = operands(F32)
    with pytest.raises(ValueError, match="requires grad"):
        matmul(d, a.requires_grad_(), b)
    with pytest.raises(TypeError, match="same dtype"):
        matmul(d, a.detach(), b.double())
    assert not d.launchers


@pytest.mark.parametrize(
    "cc, backend, words",
    [
        ((7, 5), "sm80", r"runs on sm_80 \(A100, A30\), sm_86 .*sm_121 .*; .* is sm_75"),
        ((10, 0), "sm90", r"runs on sm_90 \(H100, H200, GH200\); a stand-in GPU is sm_100"),
        ((12, 0), "sm90-pingpong", r"runs on sm_90 .*; a stand-in GPU is sm_120"),
    ],
)
def test_a_named_backend_off_its_gpus_names_them(cc, backend, words):
    d = cpu_dispatcher(cc)
    with pytest.raises(ValueError, match=words):
        matmul(d, *operands(F16), backend=backend)
    with pytest.raises(TypeError, match="backend='auto' also takes"):
        matmul(d, *operands(F32), backend=backend)
    assert not d.launchers


def test_a_named_sm80_kernel_runs_on_a_tcgen05_gpu():
    """auto is torch on sm_100; the mma.sync kernels stay available by name, built for it."""
    d = cpu_dispatcher((10, 0))
    a, b = operands(BF16)
    torch.testing.assert_close(matmul(d, a, b, backend="sm80"), reference(a, b, BF16))
    assert [(v.backend, v.arch) for v in d.cache.variants] == [("sm80", "sm_100a")]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_the_op_takes_fp32_and_fp64_under_auto_on_fake_tensors(dtype):
    with FakeTensorMode():
        a, b = fake_cuda((2, 8, 32), dtype), fake_cuda((32, 16), dtype)
        assert torch.ops.wsgemm.matmul(a, b).dtype == dtype
        assert torch.ops.wsgemm.matmul(a, b, out_dtype=F16).dtype == F16
        with pytest.raises(TypeError, match=str(dtype)):
            torch.ops.wsgemm.matmul(a, b, backend="sm80")
        with pytest.raises(ValueError, match="accumulates in fp32"):
            torch.ops.wsgemm.matmul(a, b, accumulate=F16)
