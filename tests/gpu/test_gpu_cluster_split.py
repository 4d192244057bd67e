"""Cluster split-K on the GPU (``Sm90Config.cluster_split``, ``kernels/sm90/cluster_split.py``):
forced through ``api.matmul(..., config=...)`` on decode and small-M tiles, against the fp64
reference with the suite's tolerance (twice PyTorch's own error), outputs poisoned first; the
same bits as the workspace split-K with the same ways (both sum the parts in split order);
bitwise repeatable; beside another stream's work; in a CUDA graph.

Run with ``python -m pytest -m gpu tests/gpu/test_gpu_cluster_split.py`` (an H100/H200).
"""

import dataclasses

import pytest
import torch
from operands import assert_product_within_torch_error, make, run_into_poisoned

from wsgemm import api
from wsgemm.kernels.sm90.config import Sm90Config

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

#: name -> (backend, config without the split): the decode swap-AB tiles of the menu, a ping-pong
#: row tile and a cooperative one
TILES = {
    "swap-pingpong-64x16x128": (
        "sm90-pingpong",
        Sm90Config(tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True),
    ),
    "swap-pingpong-64x8x128": (
        "sm90-pingpong",
        Sm90Config(tile_m=64, tile_n=8, tile_k=128, schedule="pingpong", swap_ab=True),
    ),
    "swap-pingpong-64x32": (
        "sm90-pingpong",
        Sm90Config(tile_m=64, tile_n=32, tile_k=64, schedule="pingpong", swap_ab=True),
    ),
    "pingpong-64x128": ("sm90-pingpong", Sm90Config(tile_m=64, tile_n=128, schedule="pingpong")),
    "cooperative-128x64": ("sm90", Sm90Config(tile_m=128, tile_n=64)),
}
# (M, N, K, batch or None)
SHAPES = [
    (1, 2048, 4096, None),  # decode, one token
    (7, 1000, 1021, None),  # ragged N and K
    (16, 4100, 2048, None),  # ragged N past a 64-wide tile
    (33, 384, 256, None),  # few k-tiles: 2 of 128, 4 of 64
    (16, 1000, 777, 3),  # batched
    (200, 520, 1500, None),  # several m-tiles
]
WAYS = [2, 4]


def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernels run on sm_90 only")


def _operands(m, n, k, batch, ab=F16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    a = make((*lead, m, k), ab, "cuda", gen=gen)
    b = make((*lead, k, n), ab, "cuda", col_major=True, gen=gen)  # x @ W.T
    return a, b


def _run(name, a, b, out_dtype=None, epilogue=None, **fields):
    """``a @ b`` on tile ``name`` with ``fields`` in its config (and ``epilogue``: a bias and an
    activation), into a poisoned result."""
    backend, config = TILES[name]
    config = dataclasses.replace(config, **fields)
    return run_into_poisoned(a, b, backend, config, out_dtype, **(epilogue or {}))


def _check(got, a, b):
    assert_product_within_torch_error(got, a, b, extra_adds=4)


#: (tile, ways) whose receive buffers leave the ring too little shared memory: refused when built
TOO_BIG = {("pingpong-64x128", 4)}


def _fits(name, k, ways):
    if ways > -(-k // TILES[name][1].tile_k):
        pytest.skip("fewer k-tiles than ways: refused (tests/host)")
    if (name, ways) in TOO_BIG:
        pytest.skip("its receive buffers do not fit beside two ring stages (the next test)")


def test_a_cluster_split_too_big_for_shared_memory_is_refused_by_name():
    _sm90()
    a, b = _operands(16, 1000, 1024, None)
    with pytest.raises(ValueError, match="cluster_split=4 on a 64x128 tile: rank 0's receive"):
        _run("pingpong-64x128", a, b, cluster_split=4)


@pytest.mark.parametrize("ways", WAYS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", TILES)
def test_cluster_split_matches_the_reference(name, shape, ways):
    _sm90()
    _fits(name, shape[2], ways)
    a, b = _operands(*shape, seed=ways)
    _check(_run(name, a, b, cluster_split=ways), a, b)


@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_cluster_split_out_dtypes(out_dtype):
    _sm90()
    a, b = _operands(16, 4100, 2048, None, ab=BF16 if out_dtype == BF16 else F16)
    _check(_run("swap-pingpong-64x16x128", a, b, out_dtype, cluster_split=4), a, b)


@pytest.mark.parametrize("ways", WAYS)
@pytest.mark.parametrize("name", ["swap-pingpong-64x16x128", "cooperative-128x64"])
def test_cluster_split_has_the_workspace_splits_bits(name, ways):
    """Both sum part 0 + part 1 + ... in split order over the same k-ranges: the same bits."""
    _sm90()
    for m, n, k in [(1, 2048, 4096), (16, 4100, 2048), (200, 520, 1500)]:
        a, b = _operands(m, n, k, None, seed=m)
        ours = _run(name, a, b, cluster_split=ways)
        theirs = _run(name, a, b, split_k=ways)
        assert torch.equal(ours, theirs)


#: (tile, ways) run over several tiles a consumer unit: a ping-pong row tile, a cooperative one
#: and the decode tile
SEVERAL_TILES = [
    ("pingpong-64x128", 2),
    ("cooperative-128x64", 4),
    ("swap-pingpong-64x16x128", 2),
]


@pytest.mark.parametrize("name, ways", SEVERAL_TILES, ids=lambda v: str(v))
@pytest.mark.parametrize(
    "shape", [(300, 4096, 4096, None), (2048, 4096, 4096, None)],
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
def test_cluster_split_over_several_tiles_a_unit_has_the_workspace_splits_bits(name, ways, shape):
    """Several tiles a CTA (the mbarriers' phases go on across tiles): the reference's values,
    the bits of the workspace split with the same ways, and the same bits again."""
    _sm90()
    a, b = _operands(*shape, seed=ways)
    got = _run(name, a, b, cluster_split=ways)
    _check(got, a, b)
    assert torch.equal(got, _run(name, a, b, split_k=ways))
    assert torch.equal(got, _run(name, a, b, cluster_split=ways))


def test_cluster_split_is_bitwise_repeatable_and_runs_beside_another_stream():
    """The same bits on every run, also while a long product runs on another stream."""
    _sm90()
    a, b = _operands(16, 4096, 4096, None)
    first = _run("swap-pingpong-64x16x128", a, b, cluster_split=4)
    _check(first, a, b)
    side = torch.cuda.Stream()
    big = torch.randn(8192, 8192, device="cuda", dtype=F16)
    side.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        with torch.cuda.stream(side):
            big @ big
        assert torch.equal(_run("swap-pingpong-64x16x128", a, b, cluster_split=4), first)
    torch.cuda.synchronize()


def test_cluster_split_under_cuda_graph_capture():
    """Captured after an eager call (test_gpu_splitk's helpers), replayed, and replayed again
    after new inputs were copied in: each replay gives what an eager call gives."""
    from test_gpu_splitk import _captured, _replayed

    _sm90()
    a, b = _operands(16, 4096, 4096, None)
    backend, config = TILES["swap-pingpong-64x16x128"]
    config = dataclasses.replace(config, cluster_split=2)
    out = torch.full((16, 4096), float("nan"), dtype=F16, device="cuda")
    graph = _captured(lambda: api.matmul(a, b, out=out, backend=backend, config=config))
    eager = out.clone()  # the capture itself runs nothing
    assert torch.equal(_replayed(graph, out), eager)
    new_a, new_b = _operands(16, 4096, 4096, None, seed=99)
    a.copy_(new_a)
    b.copy_(new_b)
    _check(_replayed(graph, out), a, b)


@pytest.mark.parametrize("activation", [None, "gelu_tanh", "silu"])
@pytest.mark.parametrize("name, ways", [("swap-pingpong-64x16x128", 2),
                                        ("swap-pingpong-64x8x128", 4),
                                        ("cooperative-128x64", 2)])  # fmt: skip
def test_cluster_split_epilogue_bias_and_activation(monkeypatch, name, ways, activation):
    """A bias (per output column: a row bias of the swap-AB problem) and an activation on the
    cluster split kernel, rank 0's epilogue after the sum (``registry.
    CLUSTER_SPLIT_EPILOGUE_FAMILIES``, switched on here): float64's values, the workspace
    split's bits."""
    from op_helpers import addmm_reference

    from wsgemm.host import registry

    _sm90()
    monkeypatch.setattr(registry, "CLUSTER_SPLIT_EPILOGUE_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    for m, n, k in [(5, 1000, 1021), (16, 4100, 2048)]:
        a, b = _operands(m, n, k, None, seed=ways)
        epilogue = dict(bias=torch.randn(n, device="cuda").to(F16), activation=activation)
        outs = {
            "cluster": _run(name, a, b, epilogue=epilogue, cluster_split=ways),
            "workspace": _run(name, a, b, epilogue=epilogue, split_k=ways),
        }
        want = addmm_reference(a, b, None, 1.0, 0.0, epilogue["bias"], activation).to(F16)
        torch.testing.assert_close(outs["cluster"].double(), want.double(), rtol=4e-3, atol=4e-3)
        assert torch.equal(outs["cluster"], outs["workspace"])


@pytest.mark.parametrize(
    "name, ways, ab, out_dtype, row_bias, alpha",
    [
        ("swap-pingpong-64x32", 2, F16, None, False, 1.0),  # the 64x32 tile
        ("swap-pingpong-64x16x128", 2, torch.bfloat16, None, False, 1.0),  # bf16
        ("swap-pingpong-64x8x128", 4, F16, torch.float32, False, 1.0),  # an fp32 result
        ("swap-pingpong-64x16x128", 4, F16, None, True, 1.0),  # a per-row bias (m, 1)
        ("swap-pingpong-64x8x128", 2, F16, None, False, 0.5),  # alpha alone
        ("swap-pingpong-64x32", 4, torch.bfloat16, torch.float32, True, 2.0),  # all of them
    ],
)  # fmt: skip
def test_cluster_split_epilogue_beyond_a_column_bias(name, ways, ab, out_dtype, row_bias, alpha):
    """What else ``CLUSTER_SPLIT_EPILOGUE_FAMILIES`` (on since the nine cases above passed, docs/
    perf.md entry 104) lets ``auto`` run over a cluster: alpha (the ``scale`` epilogue), a
    per-row bias (the swap-AB kernel's bias along its columns), bf16 operands, an fp32 result
    and the 64x32 tile, with silu: float64's values, the workspace split's bits."""
    from op_helpers import addmm_reference

    _sm90()
    for m, n, k in [(5, 1000, 1021), (16, 4100, 2048)]:
        a, b = _operands(m, n, k, None, ab=ab, seed=ways)
        bias = torch.randn((m, 1) if row_bias else (n,), device="cuda").to(ab)
        epilogue = dict(bias=bias, activation="silu", alpha=alpha)
        outs = {
            "cluster": _run(name, a, b, out_dtype, epilogue=epilogue, cluster_split=ways),
            "workspace": _run(name, a, b, out_dtype, epilogue=epilogue, split_k=ways),
        }
        want = addmm_reference(a, b, None, alpha, 0.0, bias, "silu")
        got = outs["cluster"].double()
        torch.testing.assert_close(got, want.to(out_dtype or ab).double(), rtol=8e-3, atol=8e-3)
        assert torch.equal(outs["cluster"], outs["workspace"])
