"""The call path on the CPU: a dispatcher posing as a GPU whose kernels are float64 stand-ins.
A repeated call signature runs its prebuilt launcher; it must give what a fresh call gives, for
any data pointers, and must never skip a check that the full validation would fail."""

import dataclasses
import logging

import pytest
import torch
from operands import make
from stand_ins import (
    F16,
    F32,
    LAYOUTS,
    StandInCache,
    StandInKernel,
    cpu_dispatcher,
    matmul,
    reference,
)

from wsgemm import host
from wsgemm.api import Dispatcher, dispatch, validate
from wsgemm.host import choosing
from wsgemm.host.choosing import rules
from wsgemm.host.dispatch import StandInDevices
from wsgemm.kernels.sm90.config import Sm90Config


def hopper_choice(m, n, k, batch=1):
    """What the policy picks for an fp16 problem on the stand-in H200 (132 SMs)."""
    return choosing.choose(m, n, k, batch, "float16", "float16", "float32", 132, (9, 0))


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
        ((9, 0), "auto", "the policy's"),
        ((8, 0), "auto", "sm80"),
        ((8, 9), "auto", "sm80"),
        ((9, 0), "sm80-multistage", "sm80-multistage"),
    ],
)
def test_the_backend_is_chosen_per_device(capability, backend, expected):
    d = cpu_dispatcher(capability, against_torch=False)  # the kernel, not the race's default
    matmul(d, torch.randn(2048, 8).half(), torch.randn(8, 2048).half(), backend=backend)
    (variant,) = d.cache.variants
    if expected == "the policy's":
        expected = hopper_choice(2048, 2048, 8).menu_entry.backend
    assert variant.backend == expected
    assert variant.arch == host.arch_for_capability(capability)


def test_explain_says_which_operands_a_call_copies_and_why(caplog):
    d = hopper()
    a, b = torch.empty(608, 4259, dtype=F16), torch.empty(4259, 3263, dtype=F16)  # TT, misaligned
    with caplog.at_level(logging.DEBUG, logger="wsgemm"):
        line = explain(d, a, b).splitlines()[-1]
        explain(d, a, b, backend="sm90")
    assert not caplog.records  # explain is not a call: no "runs ..." line
    assert "a copied on every call into a K-major buffer (5.2 MB: its leading dimension" in line
    assert "b copied on every call into an N-major buffer (27.8 MB: its leading dimension" in line
    assert "out written to a temporary and copied back on every call" in line
    # swap-AB at one token: the caller's operands, in the caller's modes
    x, w = torch.empty(1, 4096, dtype=F16), torch.empty(8192, 4096, dtype=F16)
    text = explain(d, x, w.t())
    assert "swap-AB" in text
    assert text.endswith("operands: a read in place (K-major); b read in place (K-major); "
                         "out written in place (N-major)")  # fmt: skip
    # cp.async kernels pad K to whole vectors
    line = explain(cpu_dispatcher((8, 0), against_torch=False), torch.empty(64, 100, dtype=F16),
                   torch.empty(100, 64, dtype=F16)).splitlines()[-1]  # fmt: skip
    assert "cp.async kernels need K (and N) in whole 16-byte vectors" in line
    assert not d.cache.variants and not d.launchers
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fa, fb = torch.empty(64, 64, dtype=F16), torch.empty(64, 64, dtype=F16)
        line = explain(d, fa, fb).splitlines()[-1]
    assert line == ("operands: not known for fake tensors (whether one is copied depends on "
                    "its address)")  # fmt: skip
    assert explain(d, torch.empty(64, 0, dtype=F16), torch.empty(0, 32, dtype=F16)).endswith(
        "operands: none read (K = 0: the result is zeros)"
    )


def test_a_signature_whose_operands_are_copied_says_so_once_at_info(caplog):
    d = hopper()
    a, b = torch.randn(48, 37).half(), torch.randn(37, 29).half()  # TT, rows of 37 and 29
    with caplog.at_level(logging.INFO, logger="wsgemm"):
        matmul(d, a, b)
        matmul(d, a, b)
        matmul(d, torch.randn(48, 64).half(), torch.randn(64, 32).half())  # aligned: silent
        matmul(d, torch.randn(48, 0).half(), torch.randn(0, 29).half())  # K = 0: nothing runs
    (record,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert record.getMessage() == (
        "M=48 N=29 K=37: operands: a copied on every call into a K-major buffer (3.8 kB: its "
        "leading dimension, 37 elements, is not a multiple of 8); b copied on every call into "
        "an N-major buffer (2.4 kB: its leading dimension, 29 elements, is not a multiple of "
        "8); out written to a temporary and copied back on every call (its leading dimension, "
        "29 elements, is not a multiple of 8)"
    )


@pytest.mark.parametrize(
    "capability, backend, words",
    [
        ((7, 5), "sm80", r"runs on sm_80 \(A100, A30\), sm_86 .*; a stand-in GPU is sm_75"),
        ((8, 6), "sm90", r"runs on sm_90 \(H100, H200, GH200\); a stand-in GPU is sm_86"),
    ],
)
def test_a_gpu_that_cannot_run_the_backend_is_an_error(capability, backend, words):
    d = cpu_dispatcher(capability)
    with pytest.raises(ValueError, match=words):
        matmul(d, torch.randn(8, 8).half(), torch.randn(8, 8).half(), backend=backend)
    assert not d.launchers


def test_a_config_compiles_its_own_variant_and_the_shipped_one_does_not():
    d = cpu_dispatcher()
    shipped = host.BACKENDS["sm90"].config()
    other = dataclasses.replace(shipped, tile_n=128)
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
        # listed (no import to list a backend), then loud at first use, never silently gone
        assert "broken" in cpu_dispatcher((8, 0)).available_backends()
        with pytest.raises(ModuleNotFoundError, match="no_such_module"):
            host.BACKENDS["broken"].kernel_class()
    finally:
        host.shipped_backends.cache_clear()


# ----------------------------------------------------------------------------- auto and the policy


class NoOpCache(StandInCache):
    """Kernels that only count their launches: for problems too large for a float64 CPU product
    when only the choice is under test."""

    def get(self, variant):
        self.variants.append(variant)
        return lambda a, b, c, clusters, *split_args: self.kernel.launches.append(clusters)


def hopper(cache=None, **options) -> Dispatcher:
    return Dispatcher(cache or StandInCache(), StandInDevices((9, 0), 132), **options)


@pytest.fixture
def choose_calls(monkeypatch):
    """Every ``choosing.choose`` call's (m, n, k, batch), the real answer returned."""
    calls = []
    real = choosing.choose

    def counted(m, n, k, batch, *rest, **kw):
        calls.append((m, n, k, batch))
        return real(m, n, k, batch, *rest, **kw)

    monkeypatch.setattr(choosing, "choose", counted)
    return calls


def force_split(monkeypatch, name: str, split: int) -> list:
    """``choosing.choose`` answers ``name`` with ``split`` for every problem; returns its calls."""
    calls = []

    def forced(m, n, k, batch, *rest, **kw):
        calls.append((m, n, k, batch))
        return choosing.Choice(choosing.entry(name), split, "forced by the test", "test")

    monkeypatch.setattr(choosing, "choose", forced)
    return calls


def integers(shape, gen, dtype=F16):
    """Small integers: every partial and total sum is exact in fp16 and fp32, so a split product
    must equal the float64 one bit for bit."""
    return torch.randint(-3, 4, shape, generator=gen).to(dtype)


@pytest.mark.parametrize(
    "m, n, k, batch",
    [
        (1, 4096, 14336, None),
        (16, 4096, 4096, None),
        (128, 4096, 14336, None),
        (128, 6144, 4096, None),
        (4096, 4096, 4096, None),
        (128, 4096, 512, 8),
    ],
    ids=["decode-split", "decode", "m128-split", "m128", "large", "batched"],
)
def test_auto_runs_the_entry_and_split_the_policy_chooses(m, n, k, batch, choose_calls):
    d = hopper(NoOpCache())
    lead = () if batch is None else (batch,)
    a, b = torch.empty(*lead, m, k, dtype=F16), torch.empty(*lead, k, n, dtype=F16)
    matmul(d, a, b)
    batch = batch or 1
    choice = hopper_choice(m, n, k, batch)
    assert choose_calls == [(m, n, k, batch)] * 2  # the call's, then this test's
    (variant,) = d.cache.variants
    e = choice.menu_entry
    # a split runs over a cluster where the registry says so (the decode tiles), else the
    # entry's split-K variant, which writes C itself
    from wsgemm.host import registry

    in_cluster = registry.cluster_split_config(e, choice.split, k, "float16")
    want = in_cluster if in_cluster is not None else e.variant_config(choice.split > 1)
    assert (variant.backend, variant.config) == (e.backend, want)
    assert (in_cluster is not None) == (m <= 16)  # the decode splits, over a cluster
    assert variant.c_dtype == "float16"
    assert d.cache.kernel.launches == [132 // host.cluster_size(variant.kernel_config())]


LAYOUTS_SPLIT = [
    # (a shape, b shape, a column-major, b column-major, out: None | "rows" | "cols" | "slice")
    ((5, 48), (48, 24), False, False, None),
    ((5, 48), (48, 24), True, True, "rows"),
    ((37, 40), (40, 29), False, True, "cols"),  # ragged: copies in, a temporary C out
    ((37, 200), (200, 29), True, False, "slice"),  # 4 k-tiles of 64
    ((3, 16, 48), (3, 48, 40), False, False, "rows"),
    ((3, 16, 48), (48, 40), False, True, None),  # folds into one (48, 48) @ (48, 40)
]


def _out(kind, shape, dtype):
    if kind is None:
        return None
    if kind == "rows":
        return torch.full(shape, float("nan"), dtype=dtype)
    if kind == "cols":  # column-major: the kernel writes a temporary, copied back
        return torch.full(shape[::-1], float("nan"), dtype=dtype).transpose(-1, -2)
    wide = torch.full((*shape[:-1], shape[-1] + 5), float("nan"), dtype=dtype)
    return wide[..., 3 : 3 + shape[-1]]  # a column slice: an unaligned base and row stride


def _check_split_launch(d, config, split):
    """Every launch of the split kernel got the count, a workspace of one tile per unit of the
    clamped split, and zeroed semaphores, one per tile."""
    assert d.cache.kernel.splits
    for (m, k, batch), (_, n, _), got_split, workspace, sems in d.cache.kernel.splits:
        assert got_split == split
        clamped = min(split, -(-k // config.tile_k))
        tiles = -(-m // config.tile_m) * -(-n // config.tile_n) * batch
        want = tiles * clamped * config.tile_m * config.tile_n if clamped > 1 else 1
        assert workspace.dtype == torch.float32 and workspace.numel() == want
        assert sems.dtype == torch.int32 and sems.numel() >= tiles and not sems.any()


@pytest.mark.parametrize("sa, sb, a_col, b_col, out_kind", LAYOUTS_SPLIT)
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("out_dtype", [F16, F32])
def test_a_split_choice_runs_the_split_variant_with_its_buffers(
    sa, sb, a_col, b_col, out_kind, split, out_dtype, monkeypatch
):
    calls = force_split(monkeypatch, "pingpong-64x128-c1x2", split)
    d = hopper()
    gen = torch.Generator().manual_seed(split + len(sa))
    for _ in range(3):  # the first call, then the launcher: new tensors, same signature
        a = integers(sa, gen)
        b = integers(sb, gen)
        if a_col:
            a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
        if b_col:
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        want = torch.matmul(a.double(), b.double()).to(out_dtype)
        out = _out(out_kind, tuple(want.shape), out_dtype)
        got = matmul(d, a, b, out, out_dtype=None if out is not None else out_dtype)
        assert got is out if out is not None else got.dtype == out_dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(calls) == 1 and len(d.launchers) == 1
    config = choosing.entry("pingpong-64x128-c1x2").variant_config(split=True)
    assert {(v.backend, v.config) for v in d.cache.variants} == {("sm90-pingpong", config)}
    assert {v.c_dtype for v in d.cache.variants} == {str(out_dtype).removeprefix("torch.")}
    _check_split_launch(d, config, split)


@pytest.mark.parametrize("split", [2, 3, 8])
def test_a_config_forces_a_split(split):
    d = hopper()
    gen = torch.Generator().manual_seed(split)
    a, b = integers((16, 200), gen), integers((200, 136), gen)
    config = Sm90Config(tile_m=64, tile_n=128, cluster_n=2, schedule="pingpong", split_k=split)
    for _ in range(2):
        got = matmul(d, a, b, backend="sm90-pingpong", config=config)
        torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    route = d.route("sm90-pingpong", None, (16, 136, 200, None), ("float16",) * 2 + ("float32",),
                    config)  # fmt: skip
    assert (route.split, route.config) == (split, dataclasses.replace(config, split_k=0))
    (variant,) = {v for v in d.cache.variants}
    assert variant.config == dataclasses.replace(config, split_k=0)  # one kernel for any count
    _check_split_launch(d, config, split)  # 4 k-tiles: split 8 runs 4 ways


@pytest.mark.parametrize(
    "shape_a, shape_b",
    [((16, 200), (200, 136)), ((300, 4100), (4100, 520)), ((3, 16, 48), (3, 48, 40))],
)
def test_a_stream_k_config_runs_the_split_kernel_with_its_schedule_s_buffers(shape_a, shape_b):
    d = hopper()
    gen = torch.Generator().manual_seed(len(shape_a))
    a, b = integers(shape_a, gen), integers(shape_b, gen)
    config = Sm90Config(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong", stream_k=True)
    for _ in range(2):
        got = matmul(d, a, b, backend="sm90-pingpong", config=config)
        torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    m, k, n = shape_a[-2], shape_a[-1], shape_b[-1]
    batch = shape_a[0] if len(shape_a) == 3 else None
    route = d.route("sm90-pingpong", None, (m, n, k, batch), ("float16",) * 2 + ("float32",),
                    config)  # fmt: skip
    compiled = dataclasses.replace(config, split_k=0)
    assert (route.split, route.config) == (1, compiled)
    assert {v.config for v in d.cache.variants} == {compiled}
    clusters = 132 // 2
    for (m, k, batch), (_, n, _), _, workspace, sems in d.cache.kernel.splits:
        want = config.stream_k_workspace_elements(m, n, k, batch, clusters)
        assert workspace.dtype == torch.float32 and workspace.numel() == max(want, 1)
        tiles = -(-m // config.tile_m) * -(-n // config.tile_n) * batch
        assert sems.dtype == torch.int32 and sems.numel() >= tiles and not sems.any()


def test_stream_k_workspace_holds_the_schedule_s_slots():
    from wsgemm.kernels.common.scheduler import stream_k_slots

    config = Sm90Config(tile_m=128, tile_n=256, cluster_m=2, stream_k=True)
    # 2712 x 3592: 22 x 15 tiles, 11 x 15 = 165 cluster tiles on 66 clusters: one wave whole,
    # 33 + 66 shared (the partial wave and the wave before it)
    tiles, per_tile = stream_k_slots(165, -(-2920 // 64), 66)
    assert tiles == 165 - 66 and 2 <= per_tile <= 3
    words = config.stream_k_workspace_elements(2712, 3592, 2920, 1, 66)
    assert words == tiles * 2 * per_tile * 128 * 256
    # whole waves only: nothing shared, nothing stored
    assert config.stream_k_workspace_elements(2 * 128 * 66, 256, 4096, 1, 66) == 0


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(stream_k=True, split_k=4), "stream_k=True chooses its own splits"),
        (dict(stream_k=1), "stream_k must be a bool"),
    ],
)
def test_a_bad_stream_k_config_is_refused_when_built(fields, message):
    with pytest.raises(ValueError, match=message):
        Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", **fields)


def test_stream_k_needs_fp32_accumulation():
    config = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", stream_k=True)
    a, b = torch.randn(16, 64).half(), torch.randn(64, 32).half()
    with pytest.raises(ValueError, match="stream_k=True needs accumulate=torch.float32"):
        matmul(hopper(), a, b, accumulate=F16, backend="sm90-pingpong", config=config)


def test_stream_k_refuses_a_k_its_int32_schedule_cannot_hold():
    from wsgemm.host.workspace import split_buffer_sizes

    config = Sm90Config(tile_m=128, tile_n=256, stream_k=True)
    assert split_buffer_sizes(config, 1, 256, 256, 4096, 1, 132)[0] == 1
    with pytest.raises(ValueError, match="overflows its int32 schedule"):
        split_buffer_sizes(config, 1, 256, 256, 64 * 2**31 // 132**2, 1, 132)
    # K that passes k_tiles x clusters^2, but 263 tiles (all shared: under two waves) x 80k
    # k-tiles x 132 ranges does not fit: the schedule's own largest product is checked
    k = 80_000 * 64
    assert 80_000 * 132**2 < 2**31 <= (263 + 1) * 80_000 * 132
    with pytest.raises(ValueError, match="overflows its int32 schedule"):
        split_buffer_sizes(config, 1, 263 * 128, 256, k, 1, 132)
    assert split_buffer_sizes(config, 1, 100 * 128, 256, 8_000 * 64, 1, 132)[0] == 1


@pytest.mark.parametrize(
    "split_k, accumulate, message",
    [
        (0, F32, "split_k=0 names the compiled split-K kernel"),
        (2, F16, "split_k=2 needs accumulate=torch.float32"),
    ],
)
def test_a_bad_split_config_is_refused(split_k, accumulate, message):
    config = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", split_k=split_k)
    a, b = torch.randn(16, 64).half(), torch.randn(64, 32).half()
    with pytest.raises(ValueError, match=message):
        matmul(hopper(), a, b, accumulate=accumulate, backend="sm90-pingpong", config=config)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(cluster_split=3), "cluster_split must be one of"),
        (dict(cluster_split=True), "cluster_split must be one of"),
        (dict(cluster_split=2, split_k=2), "cluster_split splits K over the CTAs"),
        (dict(cluster_split=2, stream_k=True), "cluster_split splits K over the CTAs"),
        (dict(cluster_split=2, cluster_n=2), "cluster_split splits K over the CTAs"),
        (dict(cluster_split=2), None),
    ],
)
def test_a_bad_cluster_split_config_is_refused_when_built(fields, message):
    fields = {"tile_m": 64, "tile_n": 128, "schedule": "pingpong", **fields}
    if message is None:  # a good one, beside the bad
        Sm90Config(**fields)
        return
    with pytest.raises(ValueError, match=message):
        Sm90Config(**fields)


def test_a_cluster_split_has_its_own_cache_key_and_cluster_size():
    """The compile cache tells a cluster split from the same tile unsplit; an unsplit config
    keeps the key (repr) it had before the field existed; the launch counts its CTAs."""
    plain = Sm90Config(tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True)
    split = dataclasses.replace(plain, cluster_split=4)
    assert "cluster_split" not in repr(plain) and "cluster_split=4" in repr(split)
    assert plain.cluster_size == 1 and split.cluster_size == 4
    # rank 0 holds one fp32 tile per other rank and ping-pong warpgroup
    assert split.cluster_split_bytes() == 3 * 2 * 64 * 16 * 4 and plain.cluster_split_bytes() == 0
    big = Sm90Config(tile_m=128, tile_n=256, cluster_split=2)
    assert not big.cluster_split_fits()  # a whole 128 KB partial: no ring left


@pytest.mark.parametrize(
    "k, accumulate, message",
    [
        (64, F32, "cluster_split=2 gives each CTA of a cluster at least one k-tile"),
        (256, F16, "cluster_split=2 needs accumulate=torch.float32"),
    ],
)
def test_a_cluster_split_the_problem_cannot_take_is_refused(k, accumulate, message):
    config = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", cluster_split=2)
    a, b = torch.randn(16, k).half(), torch.randn(k, 32).half()
    with pytest.raises(ValueError, match=message):
        matmul(hopper(), a, b, accumulate=accumulate, backend="sm90-pingpong", config=config)


def test_a_cluster_split_launches_a_cluster_per_tile_and_no_workspace():
    """Forced by ``config=``: the kernel gets no split count, workspace or semaphores (its
    partials meet in shared memory) and a grid of clusters of ``ways`` CTAs."""
    config = Sm90Config(tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True,
                        cluster_split=4)  # fmt: skip
    d = hopper()
    a, b = torch.randn(3, 1024).half(), torch.randn(1024, 200).half()
    got = matmul(d, a, b, backend="sm90-pingpong", config=config)
    torch.testing.assert_close(got, reference(a, b), rtol=2e-3, atol=2e-3)
    assert [launch[3] for launch in d.cache.kernel.launches] == [132 // 4]
    assert d.cache.kernel.splits == []  # no workspace passed
    (variant,) = d.cache.variants
    assert variant.config.cluster_split == 4


def test_a_repeated_signature_never_asks_the_policy_again(choose_calls):
    d = hopper()
    a, b = torch.randn(64, 32).half(), torch.randn(32, 48).half()
    odd = torch.randn(64, 33).half()[:, :32]  # unaligned rows: the copy path's launcher
    for _ in range(3):
        matmul(d, a, b)
        matmul(d, odd, b)
        matmul(d, a, b, out=torch.empty(64, 48).half())
    assert len(choose_calls) == 3 == len(d.launchers)
    matmul(d, torch.randn(65, 32).half(), b)  # a new signature: one more choice
    assert len(choose_calls) == 4


@pytest.mark.parametrize("backend", ["sm90", "sm90-pingpong"])
def test_explicit_backends_never_split_nor_ask_the_policy(backend, monkeypatch):
    calls = force_split(monkeypatch, "pingpong-64x128-c1x2", 4)
    d = hopper()
    a, b = torch.randn(16, 64).half(), torch.randn(64, 32).half()
    got = matmul(d, a, b, backend=backend)
    torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    assert not calls
    (variant,) = d.cache.variants
    assert (variant.backend, variant.c_dtype, variant.config) == (backend, "float16", None)
    assert len(d.cache.kernel.launches) == 1
    assert d.route(backend, None, (16, 32, 64, None), ("float16",) * 2 + ("float32",)).split == 1


def test_batch_invariant_mode_never_splits(monkeypatch):
    m, n, k = 1, 4096, 14336
    dtypes = ("float16", "float16", "float32")
    assert hopper().route("auto", None, (m, n, k, None), dtypes).k_parts > 1  # the table splits
    assert hopper(batch_invariant=True).route("auto", None, (m, n, k, None), dtypes).k_parts == 1
    monkeypatch.setenv(choosing.ENV_BATCH_INVARIANT, "1")
    rules._environment.cache_clear()
    try:
        assert hopper().route("auto", None, (m, n, k, None), dtypes).k_parts == 1
        free = hopper(batch_invariant=False)
        assert free.route("auto", None, (m, n, k, None), dtypes).k_parts > 1
    finally:
        monkeypatch.delenv(choosing.ENV_BATCH_INVARIANT)
        rules._environment.cache_clear()
    with pytest.raises(TypeError, match="batch_invariant must be a bool"):
        hopper(batch_invariant="yes")


def test_a_new_signature_logs_its_choice_once(caplog):
    d = hopper()
    a, b = torch.randn(16, 64).half(), torch.randn(64, 32).half()
    with caplog.at_level(logging.DEBUG, logger="wsgemm"):
        matmul(d, a, b)
        matmul(d, a, b)
    (record,) = [r for r in caplog.records if r.name == "wsgemm"]
    choice = hopper_choice(16, 32, 64)
    assert f"runs {choice.menu_entry.name} with split 1 for M=16 N=32 K=64" in record.message
    assert choice.reason in record.message


def explain(d, a, b, out=None, out_dtype=None, accumulate=F32, backend="auto"):
    return dispatch.explain(d, a, b, out, out_dtype, accumulate, backend)


def test_explain_says_what_auto_runs_and_why_without_compiling():
    d = hopper()
    a, b = torch.empty(16, 14336, dtype=F16), torch.empty(14336, 4096, dtype=F16)
    text = explain(d, a, b)
    said = choosing.explain(16, 4096, 14336, 1, "float16", "float16", "float32", 132, (9, 0))
    operands = "a read in place (K-major); b read in place (N-major); out written in place"
    assert text == f"{said}\noperands: {operands} (N-major)"
    choice = hopper_choice(16, 4096, 14336)
    assert choice.menu_entry.name in text and f"split-K: {choice.split}" in text
    assert not d.cache.variants and not d.launchers  # nothing compiled, nothing remembered
    batched = explain(d, torch.empty(3, 16, 64, dtype=F16), torch.empty(64, 32, dtype=F16),
                      out_dtype=F32)  # fmt: skip
    assert "M=16 N=32 K=64 batch=3" in batched and "float32 output" in batched


@pytest.mark.parametrize(
    "capability, backend, words",
    [
        ((9, 0), "sm90-pingpong", "backend='sm90-pingpong' named: its shipped config, never split"),
        ((8, 0), "auto", "auto on sm_80: the sm80 kernel"),
    ],
)
def test_explain_outside_the_menu(capability, backend, words):
    d = cpu_dispatcher(capability, against_torch=False)  # the kernel, not the race's default
    text = explain(d, torch.empty(16, 64, dtype=F16), torch.empty(64, 32, dtype=F16),
                   backend=backend)  # fmt: skip
    config = host.BACKENDS[backend if backend != "auto" else "sm80"].config()
    assert words in text and "split-K: 1 (none)" in text
    assert f"{config.tile_m}x{config.tile_n}x{config.tile_k} tile" in text
    assert not d.cache.variants


@pytest.mark.parametrize("mutation", ["a is bfloat16", "out is float64", "b is a list"])
def test_explain_validates_as_matmul_does(mutation):
    a, b, out = torch.randn(16, 16).half(), torch.randn(16, 16).half(), torch.empty(16, 16).half()
    bad = MUTATIONS[mutation](a, b, out)
    expected = _fresh_error(lambda fresh: matmul(fresh, *bad))
    with pytest.raises(expected[0]) as info:
        explain(cpu_dispatcher(), *bad)
    assert str(info.value) == expected[1]


def test_forget_drops_launchers_and_kernels():
    d = cpu_dispatcher()
    a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    matmul(d, a, b, backend="sm90")
    assert d.launchers and len(d.cache.variants) == 1
    d.forget()
    assert not d.launchers
    torch.testing.assert_close(matmul(d, a, b, backend="sm90"), reference(a, b), rtol=0, atol=0)
    assert len(d.cache.variants) == 2  # asked its cache again


def test_out_is_marked_changed_for_autograd():
    """A kernel's write is invisible to autograd: the core bumps out's version counter (first
    call and cached launcher alike), so a graph that saved out refuses stale values."""

    class Unseen(StandInKernel):  # writes as a kernel does: no version bump of its own
        def __call__(self, a, b, c, clusters):
            c.data.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype))

    d = cpu_dispatcher()
    d.cache.kernel = Unseen()
    a, b = torch.randn(16, 8).half(), torch.randn(8, 24).half()
    out = torch.empty(16, 24).half()
    for _ in range(2):
        before = out._version
        matmul(d, a, b, out=out, backend="sm90")
        assert out._version > before
    torch.testing.assert_close(out, reference(a, b), rtol=0, atol=0)


def test_clusters_of_more_than_two_ctas_ask_the_driver_once(monkeypatch, caplog):
    """A cluster of 4 lies in one GPC: the persistent grid launches what the driver says fits
    at once (never more than sm_count // 4), asked once per (device, size); 1 and 2 are the SM
    count's; a driver without the query gives the SM count's, with a warning."""
    import contextlib

    import cutlass.utils

    from wsgemm.host.dispatch import CudaDevices

    asked = []

    class FakeInfo:
        def __init__(self, index):
            self.index = index

        def get_max_active_clusters(self, size):
            asked.append((self.index, size))
            return 32

    monkeypatch.setattr(cutlass.utils, "HardwareInfo", FakeInfo)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    d = CudaDevices()
    d._facts[0] = ((9, 0), 132, "a stand-in H100")
    assert (d.clusters(0, 1), d.clusters(0, 2)) == (132, 66)
    assert d.clusters(0, 4) == d.clusters(0, 4) == 32 and asked == [(0, 4)]

    class Broken(FakeInfo):
        def get_max_active_clusters(self, size):
            raise RuntimeError("CUDA Driver version < 11.8")

    monkeypatch.setattr(cutlass.utils, "HardwareInfo", Broken)
    d = CudaDevices()
    d._facts[0] = ((9, 0), 132, "a stand-in H100")
    with caplog.at_level(logging.WARNING, logger="wsgemm"):
        assert d.clusters(0, 4) == 33
    assert "occupancy query failed" in caplog.text


@pytest.mark.parametrize(
    "name, split, k, c_dtype, cluster",
    [
        ("swap-pingpong-64x16x128-c1x1", 2, 4096, "float16", True),
        ("swap-pingpong-64x16x128-c1x1", 4, 4096, "float32", True),
        ("swap-pingpong-64x16x128-c1x1", 8, 4096, "float16", False),  # 2 or 4 ways only
        ("swap-pingpong-64x16x128-c1x1", 4, 384, "float16", False),  # 3 k-tiles for 4 ranks
        ("pingpong-64x128-c1x2", 2, 4096, "float16", False),  # a multicast cluster already
        ("pingpong-64x256-c1x1", 4, 4096, "float16", False),  # 3 x 128 KB of buffers
        ("pingpong-64x256-c1x1", 2, 4096, "float16", False),  # a 64 KB partial: not measured
    ],
)
def test_a_policy_split_runs_as_a_cluster_split_where_the_switch_and_the_tile_allow(
    monkeypatch, name, split, k, c_dtype, cluster
):
    """``registry.CLUSTER_SPLIT_FAMILIES`` on (main's): a policy split of 2 or 4 on a
    1x1-cluster entry whose receive buffers fit runs as a cluster split (no launch split
    count); every other split through the workspace, as with the switch off."""
    from wsgemm.host import registry

    choice = choosing.Choice(choosing.entry(name), split, "forced by the test", "test")
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    off = Dispatcher.choice_route(choice, k, c_dtype)
    assert off.split == split and getattr(off.config, "cluster_split", 1) == 1
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset({"sm90"}))
    on = Dispatcher.choice_route(choice, k, c_dtype)
    if cluster:
        assert on.split == 1 and on.config.cluster_split == split and not on.config.splits_in_kernel
        assert on.config == dataclasses.replace(choice.menu_entry.variant_config(),
                                                cluster_split=split)  # fmt: skip
    else:
        assert on == off


def test_the_policy_prices_a_split_in_the_form_it_runs(monkeypatch):
    """With the switch on (main's), the split candidates of the decode tiles are priced as cluster
    splits (``cost.features(cluster_split=True)``, its own constant and margin), so a split
    the workspace's price and margin left out can win: (5, 1536, 4096) unsplit -> 4 ways."""
    from wsgemm.host import registry
    from wsgemm.host.choosing import rules

    shape = (5, 1536, 4096, 1, "float16", "float16", "float32", 132, (9, 0))
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    rules.forget()
    off = choosing.choose(*shape)
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset({"sm90"}))
    rules.forget()
    try:
        on = choosing.choose(*shape)
    finally:
        monkeypatch.undo()
        rules.forget()
    assert off.source == on.source == "model"
    assert off.split == 1 and on.split == 4 and on.menu_entry.swap_ab
    for c in (off, on):
        for name, split, p in c.predictions:
            assert p.features.cluster_split == (c is on and split > 1), (name, split)
    assert rules._margin(on.predictions[0][2].features) == rules.CLUSTER_SPLIT_MARGIN


def test_explain_says_a_split_runs_over_a_cluster(monkeypatch):
    from wsgemm.host import registry
    from wsgemm.host.choosing import wording

    choice = choosing.Choice(choosing.entry("swap-pingpong-64x16x128-c1x1"), 2, "forced", "test")
    args = (16, 4096, 4096, 1, "float16", "float16", "float32", 132, (9, 0))
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    assert "split-K: 2 (in the kernel, fp32 partials)" in wording.describe(choice, *args)
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset({"sm90"}))
    assert "split-K: 2 over a cluster of 2 CTAs" in wording.describe(choice, *args)
    # 4 ways: the 30 clusters of 4 a 132-SM GH100 runs at once, not 33
    four = choosing.Choice(choosing.entry("swap-pingpong-64x8x128-c1x1"), 4, "forced", "test")
    text = wording.describe(four, 8, 8192, 4096, *args[3:])
    assert (
        "grid: 128 tiles x 4 splits for 132 SMs (120 CTAs at once in clusters of 4): "
        "4.27 waves" in text
    )


@pytest.mark.parametrize(
    "fields, acc, message",
    [
        (
            dict(tile_n=128, cluster_split=4),
            "Float32",
            "cluster_split=4 on a 64x128 tile: rank 0's",
        ),
        (
            dict(tile_n=16, cluster_split=2),
            "Float16",
            "a cluster split .* needs an fp32 accumulator",
        ),
    ],
)
def test_a_cluster_split_kernel_that_cannot_be_built_says_why(fields, acc, message):
    """Refused when the kernel is built (no GPU needed): receive buffers that leave the ring
    fewer than two stages, an fp16 accumulator."""
    import cutlass

    from wsgemm.kernels.sm90.kernel import Sm90Gemm

    config = Sm90Config(tile_m=64, schedule="pingpong", **fields)
    with pytest.raises(ValueError, match=message):
        Sm90Gemm(config, cutlass.Float16, cutlass.Float16, getattr(cutlass, acc))


def test_registry_switches_set_for_a_block_and_put_back():
    """``registry.switches``: the named family switches for the block, restored after it (an
    exception too); a name that is no switch raises and sets nothing."""
    from wsgemm.host import registry

    before = registry.CLUSTER_SPLIT_FAMILIES, registry.DACT_FAMILIES
    with registry.switches(CLUSTER_SPLIT_FAMILIES=frozenset(), DACT_FAMILIES=frozenset({"x"})):
        assert registry.CLUSTER_SPLIT_FAMILIES == frozenset()
        assert registry.DACT_FAMILIES == frozenset({"x"})
    assert (registry.CLUSTER_SPLIT_FAMILIES, registry.DACT_FAMILIES) == before
    with pytest.raises(RuntimeError), registry.switches(DACT_FAMILIES=frozenset()):
        raise RuntimeError
    assert registry.DACT_FAMILIES == before[1]
    for bad in ("MENU", "NO_SUCH_FAMILIES"):
        with pytest.raises(ValueError, match="is not a host.registry family switch"):
            with registry.switches(**{bad: frozenset(), "DACT_FAMILIES": frozenset()}):
                pass
    assert registry.DACT_FAMILIES == before[1]
