"""GPU correctness: random cases against a float64 reference, per backend.

Tolerance: twice the error PyTorch itself makes for the same dtypes (its own matmul, or, for fp16
accumulation which torch does not expose, an emulation that rounds the running sum to fp16 after
every 16-deep k-step, as the tensor cores do), plus a small eps. Outputs are poisoned with NaN
first so an unwritten element fails.
"""

import random
import zlib

import pytest
import torch
from operands import assert_within_torch_error, fp32_accumulation_bound, make
from script_modules import load

import wsgemm
from wsgemm.host import choosing

pytestmark = pytest.mark.gpu

# (ab dtype, out dtype or None for the input dtype, accumulate)
DTYPES = [
    (torch.float16, None, torch.float32),
    (torch.bfloat16, None, torch.float32),
    (torch.float16, torch.float32, torch.float32),
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.float16, torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.float16, torch.float32),
    (torch.float16, None, torch.float16),
    (torch.float16, torch.float32, torch.float16),
]
DIMS = [1, 2, 3, 7, 8, 13, 16, 31, 64, 97, 127, 128, 129, 191, 256, 257, 383, 512, 640, 1021]
BATCH = ["none", "both", "a3b2", "a2b3", "a1b3"]
CASES_PER_BACKEND = 320


def _cases(seed: int):
    rng = random.Random(seed)
    cases = []
    for i in range(CASES_PER_BACKEND):
        m, n, k = (rng.choice(DIMS) for _ in range(3))
        if i % 40 == 0:  # a few large, tile-crossing problems
            m, n, k = rng.choice([(2048, 1536, 1024), (1031, 2053, 777), (4096, 256, 4096)])
        cases.append(
            dict(
                m=m, n=n, k=k,
                dtypes=DTYPES[i % len(DTYPES)],
                a_col=rng.random() < 0.5,
                b_col=rng.random() < 0.5,
                batch=rng.choice(BATCH) if i % 3 else "none",
                offset=rng.choice([0, 0, 8, 3]),
                pad=rng.choice([0, 0, 8, 5]),
                use_out=i % 2 == 0,
            )
        )  # fmt: skip
    return cases


def _backends():
    names = wsgemm.available_backends() if torch.cuda.is_available() else []
    return names or ["sm90"]


def _operands(case, gen):
    ab = case["dtypes"][0]
    lb = {"none": (None, None), "both": (3, 3), "a3b2": (3, None), "a2b3": (None, 3)}
    la, lb_ = lb.get(case["batch"], (1, 3))
    sa = ((la,) if la else ()) + (case["m"], case["k"])
    sb = ((lb_,) if lb_ else ()) + (case["k"], case["n"])
    kw = dict(offset=case["offset"], pad=case["pad"], gen=gen)
    a = make(sa, ab, "cuda", col_major=case["a_col"], **kw)
    b = make(sb, ab, "cuda", col_major=case["b_col"], **kw)
    return a, b


def _fp16_accumulate_emulation(a, b, out_dtype):
    acc = None
    for k0 in range(0, a.shape[-1], 16):
        part = torch.matmul(a[..., k0 : k0 + 16].float(), b[..., k0 : k0 + 16, :].float())
        acc = part.half() if acc is None else (acc.float() + part).half()
    return acc.to(out_dtype)


def _torch_same_dtypes(a, b, out_dtype, acc):
    if acc == torch.float16:
        return _fp16_accumulate_emulation(a, b, out_dtype)
    if out_dtype == torch.float32:
        return torch.matmul(a.float(), b.float())
    return torch.matmul(a, b).to(out_dtype)


def check(case, backend, gen, config=None):
    """One case; ``config`` (an ``Sm80Config``) runs a non-shipped config through
    ``api.matmul(..., config=)``, the benchmark's path, with ``out=`` given."""
    ab, out_dtype, acc = case["dtypes"]
    a, b = _operands(case, gen)
    ref = torch.matmul(a.double(), b.double())
    want_dtype = out_dtype or ab
    kwargs = dict(out_dtype=out_dtype, accumulate=acc, backend=backend)
    if config is not None:
        from wsgemm import api

        out = torch.full(ref.shape, float("nan"), dtype=want_dtype, device="cuda")
        got = api.matmul(a, b, out=out, config=config, **kwargs)
    elif case["use_out"]:
        out = torch.full(ref.shape, float("nan"), dtype=want_dtype, device="cuda")
        got = wsgemm.matmul(a, b, out=out, **kwargs)
        assert got is out
    else:
        # poison what the allocator will hand out next
        torch.full((ref.numel() + 4096,), float("nan"), dtype=want_dtype, device="cuda")
        got = wsgemm.matmul(a, b, **kwargs)
    assert got.shape == ref.shape and got.dtype == want_dtype
    assert not torch.isnan(got).any(), "unwritten (poisoned) output elements"
    theirs = _torch_same_dtypes(a, b, want_dtype, acc)
    # An fp32 output shows the tensor cores' fp32 running sum unrounded, which a K of a few
    # thousand can take past twice cuBLAS's fp32 error (a swap-AB case at K = 4096: 1.2e-3
    # against 2 x 5.8e-5); the textbook bound on that sum is the slack, as for autograd.
    slack = fp32_accumulation_bound(a, b) if want_dtype == torch.float32 else 0.0
    assert_within_torch_error(got, ref, theirs, slack=slack)
    return got


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("index", range(CASES_PER_BACKEND))
def test_random_case(backend, index):
    case = _cases(1234)[index]
    if case["dtypes"][2] == torch.float16 and case["dtypes"][0] != torch.float16:
        pytest.fail("case table invariant broken")
    gen = torch.Generator().manual_seed(index)
    check(case, backend, gen)


def _studied_configs():
    """Non-shipped sm80 configs the performance log measures (docs/perf.md entries 9-10): a
    config whose ring fits only the shared memory of some archs (``Sm80Config.check_smem``)
    runs where the GPU's arch has room for it."""
    from wsgemm.kernels.sm80.config import Sm80Config

    return {
        "ws-96x128-2ctas": ("sm80", Sm80Config(96, 128, 64, 3, ctas_per_sm=2)),
        "ms-96x128": ("sm80-multistage", Sm80Config(96, 128, 64, 3, ctas_per_sm=2)),
        "ms-128x256x64": ("sm80-multistage", Sm80Config(128, 256, 64, 3, mma_warps_n=4)),
    }


STUDIED_CASES = 48


@pytest.mark.parametrize("name", ["ws-96x128-2ctas", "ms-96x128", "ms-128x256x64"])
@pytest.mark.parametrize("index", range(STUDIED_CASES))
def test_studied_config_random_case(name, index):
    from wsgemm.host import arch_for_capability

    backend, config = _studied_configs()[name]
    try:
        config.check_smem(arch_for_capability(torch.cuda.get_device_capability()))
    except ValueError as exc:
        pytest.skip(f"does not fit this GPU: {exc}")
    case = _cases(4321)[index]
    if case["dtypes"][2] == torch.float16:
        # the studied configs are fp32-accumulator ones
        case = dict(case, dtypes=(case["dtypes"][0], case["dtypes"][1], torch.float32))
    check(case, backend, torch.Generator().manual_seed(index), config)


MENU_CASES = 40
# The non-shipped tiles of the menu and of its dropped list (swap-AB, split-K and stream-K have
# their own GPU fuzz): each config through api.matmul(config=), as the tuner times it.
MENU_TILES = [
    e.name
    for e in choosing.MENU + load("tune_menu").DROPPED
    if not e.shipped and not e.swap_ab and not e.config.get("stream_k")
]


@pytest.mark.parametrize("name", MENU_TILES)
@pytest.mark.parametrize("index", range(MENU_CASES))
def test_menu_entry_random_case(name, index):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 menu runs on sm_90 only")
    e = load("tune_menu").entry(name)  # a dropped one too
    case = _cases(zlib.crc32(name.encode()))[index]
    check(case, e.backend, torch.Generator().manual_seed(index), e.variant_config())


@pytest.mark.parametrize("backend", _backends())
def test_bitwise_deterministic(backend):
    gen = torch.Generator().manual_seed(7)
    a = make((1031, 777), torch.float16, "cuda", gen=gen)
    b = make((777, 2053), torch.float16, "cuda", gen=gen)
    first = wsgemm.matmul(a, b, backend=backend)
    for _ in range(3):
        assert torch.equal(wsgemm.matmul(a, b, backend=backend), first)


@pytest.mark.parametrize("backend", _backends())
def test_zero_sizes_follow_torch(backend):
    for sa, sb in [((0, 8), (8, 5)), ((5, 8), (8, 0)), ((5, 0), (0, 7)), ((2, 0, 4), (4, 3))]:
        a = torch.randn(sa, dtype=torch.float16, device="cuda")
        b = torch.randn(sb, dtype=torch.float16, device="cuda")
        got = wsgemm.matmul(a, b, backend=backend)
        torch.testing.assert_close(got, torch.matmul(a, b))


def test_failed_call_leaves_nothing_broken():
    a = torch.randn(64, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError):
        wsgemm.matmul(a, a[:32])
    torch.testing.assert_close(wsgemm.matmul(a, a), torch.matmul(a, a), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", [b for b in _backends() if b != "auto"])
def test_new_shape_does_not_recompile(backend):
    """A named backend's kernel takes any M, N, K: a new shape reuses its compile. (``auto`` may
    choose another menu entry for another shape, which is a compile of its own.)"""
    from wsgemm import host

    a = torch.randn(100, 64, dtype=torch.float16, device="cuda")
    wsgemm.matmul(a, a.t(), backend=backend)
    before = len(host.COMPILE_CACHE)
    for m in (33, 257, 1000):
        x = torch.randn(m, 64, dtype=torch.float16, device="cuda")
        wsgemm.matmul(x, a.t(), backend=backend)
    assert len(host.COMPILE_CACHE) == before


@pytest.mark.parametrize("backend", _backends())
def test_batch_larger_than_one_grid_dimension(backend):
    a = torch.randn(70000, 2, 8, dtype=torch.float16, device="cuda")
    b = torch.randn(70000, 8, 8, dtype=torch.float16, device="cuda")
    got = wsgemm.matmul(a, b, backend=backend)
    torch.testing.assert_close(got, torch.matmul(a, b), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", ["sm80", "sm80-multistage"])
def test_more_n_tiles_than_grid_y_holds(backend):
    """An sm80 grid with more n tiles than grid y holds (65,537 tiles of 128, ragged) runs as
    several column slices (``kernels.sm80.kernel.column_slices``) and is right."""
    from wsgemm.kernels.sm80.config import shipped_config

    if backend not in wsgemm.available_backends():
        pytest.skip(f"{backend} does not run on this GPU")
    import cutlass

    n = 65535 * shipped_config(backend, cutlass.Float32).tile_n + 136
    case = dict(
        m=33, n=n, k=40, dtypes=(torch.float16, None, torch.float32), a_col=False, b_col=False,
        batch="none", offset=0, pad=0, use_out=True,
    )  # fmt: skip
    check(case, backend, torch.Generator().manual_seed(0))
