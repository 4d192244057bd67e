"""The call path on the CPU: a dispatcher posing as a GPU whose kernels are float64 stand-ins.
A repeated call signature runs its prebuilt launcher; it must give what a fresh call gives, for
any data pointers, and must never skip a check that the full validation would fail."""

import dataclasses

import pytest
import torch
from operands import make

from wsgemm import host
from wsgemm.api import Dispatcher, dispatch, validate
from wsgemm.host.dispatch import StandInDevices

F16, F32 = torch.float16, torch.float32


class StandInKernel:
    """C[m,n,l] = sum_k A[m,k,l] B[n,k,l] in float64, remembering what each launch was given."""

    def __init__(self):
        self.launches = []

    def __call__(self, a, b, c, clusters):
        self.launches.append((a.data_ptr(), b.data_ptr(), c.data_ptr(), clusters))
        c.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype))


class StandInCache:
    def __init__(self):
        self.kernel = StandInKernel()
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)
        return self.kernel


def cpu_dispatcher(capability=(9, 0)) -> Dispatcher:
    return Dispatcher(StandInCache(), StandInDevices(capability, 132))


def matmul(d, a, b, out=None, out_dtype=None, accumulate=F32, backend="auto", config=None):
    return dispatch.call(d, a, b, out, out_dtype, accumulate, backend, config)


def reference(a, b, dtype=F16):
    return torch.matmul(a.double(), b.double()).to(dtype)


LAYOUTS = [
    # (a shape, b shape, a column-major, b column-major, out given)
    ((64, 32), (32, 48), False, False, False),
    ((64, 32), (32, 48), True, True, True),
    ((37, 29), (29, 13), False, True, True),  # ragged: copies on the way in and out
    ((3, 16, 24), (24, 40), False, False, False),  # folds into one (48, 24) @ (24, 40)
    ((16, 24), (3, 24, 40), False, True, True),  # a broadcast: materialized per batch
    ((2, 16, 8), (2, 8, 16), True, False, True),
]


@pytest.mark.parametrize("sa, sb, a_col, b_col, use_out", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 8, 3])  # elements: 16-byte aligned, aligned, not
def test_a_cached_launcher_gives_what_a_fresh_call_gives(sa, sb, a_col, b_col, use_out, offset):
    d = cpu_dispatcher()
    gen = torch.Generator().manual_seed(sum(sa) + offset)

    def operands(off):
        a = make(sa, F16, "cpu", col_major=a_col, offset=off, gen=gen)
        b = make(sb, F16, "cpu", col_major=b_col, offset=off, gen=gen)
        out = torch.full(reference(a, b).shape, float("nan"), dtype=F16) if use_out else None
        return a, b, out

    first = operands(offset)
    matmul(d, *first)
    assert len(d.launchers) == 1
    for _ in range(3):  # new tensors, new data pointers, same signature
        a, b, out = operands(offset)
        got = matmul(d, a, b, out)
        assert len(d.launchers) == 1, "a repeated signature built a second launcher"
        assert got is out if use_out else got.shape == reference(a, b).shape
        torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)


def test_an_aligned_call_passes_views_and_a_misaligned_one_gets_the_copy_path():
    d = cpu_dispatcher()
    buf = torch.randn(2 * 64 * 64 + 8).half()
    aligned = buf[: 64 * 64].view(64, 64)
    b = torch.randn(64, 64).half()
    matmul(d, aligned, b)
    matmul(d, buf[8 : 8 + 64 * 64].view(64, 64), b)  # 16 bytes on: the same launcher
    assert len(d.launchers) == 1
    assert [launch[0] for launch in d.cache.kernel.launches] == [
        aligned.data_ptr(),
        aligned.data_ptr() + 16,
    ]
    shifted = buf[1 : 1 + 64 * 64].view(64, 64)  # 2 bytes on: same shape and strides
    got = matmul(d, shifted, b)
    assert len(d.launchers) == 2, "a misaligned pointer must not reuse the aligned launcher"
    assert d.cache.kernel.launches[-1][0] != shifted.data_ptr()  # copied into an aligned buffer
    torch.testing.assert_close(got, reference(shifted, b), rtol=0, atol=0)
    again = buf[9 : 9 + 64 * 64].view(64, 64)
    torch.testing.assert_close(matmul(d, again, b), reference(again, b), rtol=0, atol=0)
    assert d.cache.kernel.launches[-1][0] != again.data_ptr()


def test_out_overlap_is_checked_on_every_call():
    d = cpu_dispatcher()
    buf = torch.randn(64, 32).half()  # a in columns 0-15, out in 16-31: a fused layout
    b = torch.randn(16, 16).half()
    matmul(d, buf[:, :16], b, out=buf[:, 16:])
    other = torch.randn(64, 32).half()
    matmul(d, other[:, :16], b, out=other[:, 16:])
    assert len(d.launchers) == 1
    with pytest.raises(ValueError, match="out overlaps a"):  # same signature, 8 columns over a
        matmul(d, other[:, :16], b, out=other[:, 8:24])
    rows = torch.randn(48, 16).half()  # a, b and out as row blocks of one buffer
    matmul(d, rows[:16], rows[16:32], out=rows[32:])
    with pytest.raises(ValueError, match="out overlaps b"):
        matmul(d, rows[:16], rows[16:32], out=rows[16:32])
    assert len(d.launchers) == 2


def _fresh_error(call):
    with pytest.raises(Exception) as info:
        call(cpu_dispatcher())
    return type(info.value), str(info.value)


MUTATIONS = {
    "a requires grad": lambda a, b, out: (a.clone().requires_grad_(), b, out),
    "out requires grad": lambda a, b, out: (a, b, out.clone().requires_grad_()),
    "a is a negative view": lambda a, b, out: (
        torch.zeros(a.shape, dtype=torch.complex32).conj().imag,
        b,
        out,
    ),
    "a is bfloat16": lambda a, b, out: (a.bfloat16(), b, out),
    "out is float64": lambda a, b, out: (a, b, out.double()),
    "a is on meta": lambda a, b, out: (a.to("meta"), b, out),
    "out is a": lambda a, b, out: (a, b, a),
    "out's rows overlap": lambda a, b, out: (a, b, out.as_strided(out.shape, (8, 1))),
    "b is sparse": lambda a, b, out: (a, b.to_sparse(), out),
    "b is a list": lambda a, b, out: (a, b.tolist(), out),
}


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_known_signature_never_skips_a_check(mutation):
    """After a valid call, a call that differs in one way that validation rejects raises just
    what a fresh dispatcher raises."""
    d = cpu_dispatcher()
    a, b, out = torch.randn(16, 16).half(), torch.randn(16, 16).half(), torch.empty(16, 16).half()
    matmul(d, a, b, out)
    matmul(d, a.clone(), b.clone(), out.clone())
    assert len(d.launchers) == 1
    bad = MUTATIONS[mutation](a, b, out)
    expected = _fresh_error(lambda fresh: matmul(fresh, *bad))
    with pytest.raises(expected[0]) as info:
        matmul(d, *bad)
    assert str(info.value) == expected[1]
    assert len(d.launchers) == 1


def test_grad_mode_is_part_of_the_signature():
    d = cpu_dispatcher()
    a = torch.randn(16, 16).half().requires_grad_()
    b = torch.randn(16, 16).half()
    with torch.no_grad():
        matmul(d, a, b)
        got = matmul(d, a, b)
    assert not got.requires_grad
    with pytest.raises(ValueError, match="a requires grad and grad mode is on"):
        matmul(d, a, b)


def test_a_rejected_call_or_a_failed_compile_stores_nothing():
    d = cpu_dispatcher()
    with pytest.raises(ValueError):
        matmul(d, torch.randn(4, 5).half(), torch.randn(4, 4).half())
    assert not d.launchers

    class FailingCache:
        def get(self, variant):
            raise RuntimeError("the compiler broke")

    broken = Dispatcher(FailingCache(), StandInDevices())
    a = torch.randn(16, 16).half()
    for _ in range(2):  # no half-built state: the second call tries again and fails the same
        with pytest.raises(RuntimeError, match="the compiler broke"):
            matmul(broken, a, a)
    assert not broken.launchers


def test_the_launcher_memo_is_bounded():
    d = cpu_dispatcher()
    d.MAX_LAUNCHERS = 3
    for m in range(1, 7):
        matmul(d, torch.randn(m, 8).half(), torch.randn(8, 8).half())
    assert len(d.launchers) == 3


@pytest.mark.parametrize(
    "capability, backend, expected",
    [
        ((9, 0), "auto", "sm90"),
        ((8, 0), "auto", "sm80"),
        ((8, 9), "auto", "sm80"),
        ((9, 0), "sm80-multistage", "sm80-multistage"),
    ],
)
def test_the_backend_is_chosen_per_device(capability, backend, expected):
    d = cpu_dispatcher(capability)
    matmul(d, torch.randn(2048, 8).half(), torch.randn(8, 2048).half(), backend=backend)
    (variant,) = d.cache.variants
    assert variant.backend == expected
    assert variant.arch == host.arch_for_capability(capability)


@pytest.mark.parametrize(
    "capability, backend, words",
    [((7, 5), "auto", "needs an sm_80"), ((8, 6), "sm90", "needs an sm_90 .Hopper. GPU")],
)
def test_a_gpu_that_cannot_run_the_backend_is_an_error(capability, backend, words):
    d = cpu_dispatcher(capability)
    with pytest.raises(ValueError, match=words):
        matmul(d, torch.randn(8, 8).half(), torch.randn(8, 8).half(), backend=backend)
    assert not d.launchers


def test_a_config_compiles_its_own_variant_and_the_shipped_one_does_not():
    d = cpu_dispatcher()
    shipped = host.BACKENDS["sm90"].config()
    other = dataclasses.replace(shipped, raster_group=2 * shipped.raster_group)
    a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    for config in (None, shipped, other, other):
        torch.testing.assert_close(
            matmul(d, a, b, backend="sm90", config=config), reference(a, b), rtol=0, atol=0
        )
    assert [v.config for v in d.cache.variants] == [None, other]
    assert len(d.launchers) == 3  # the signature has the config in it


def test_validate_is_pure():
    """No device query, no backend choice: the CPU answers every question validate asks."""
    p = validate(torch.zeros(3, 5).half(), torch.zeros(5, 7).half(), None, None, F32, "sm90",
                 device_type="cpu")  # fmt: skip
    assert (p.m, p.n, p.k, p.batch, p.c_dtype) == (3, 7, 5, None, F16)
    assert not hasattr(p, "backend")


def test_a_broken_kernel_module_fails_loudly(monkeypatch):
    broken = host.Backend("broken", "wsgemm.kernels.no_such_module", "Gemm", "sm80")
    monkeypatch.setitem(host.BACKENDS, "broken", broken)
    host.shipped_backends.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError, match="no_such_module"):
            cpu_dispatcher((8, 0)).available_backends()
    finally:
        host.shipped_backends.cache_clear()
