"""Split-K inside the sm90 kernel, on the GPU: forced through ``api.matmul(..., config=...)``
(``Sm90Config.split_k = n``) on each split variant of the menu, against the fp64 reference
with the suite's tolerance (twice PyTorch's own error, ``operands.assert_within_torch_error``);
outputs poisoned first. Then bitwise determinism with the split forced, a side stream, two
streams at once, and a CUDA graph replayed.

The split variants compiled here are the menu's (``choosing.menu_variants``), so after ``warm``
they load from the disk cache; the 2x1-cluster one is extra.
"""

import dataclasses

import pytest
import torch
from operands import assert_product_within_torch_error, make, run_into_poisoned

from wsgemm import api
from wsgemm.host import choosing
from wsgemm.kernels.sm90.config import Sm90Config

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

#: name -> (backend, the split kernel's config, split_k = 0: a count is given per test)
SPLIT_CONFIGS = {
    **{
        name: (choosing.entry(name).backend, choosing.entry(name).variant_config(split=True))
        for name in ("pingpong-64x128-c1x2", "pingpong-64x256-c1x1", "cooperative-128x128-c1x2")
    },
    # a cluster along M: decode tiles leave its second CTA outside C (no fix-up there)
    "cooperative-128x128-c2x1": ("sm90", Sm90Config(tile_n=128, cluster_m=2, split_k=0)),
    # 256 rows, each warpgroup two bands: M = 200 leaves the second band's rows 128..199
    "cooperative-256x128-c1x2": (
        "sm90",
        Sm90Config(tile_m=256, tile_n=128, cluster_n=2, split_k=0),
    ),
}
# (M, N, K, batch or None)
SHAPES = [
    (1, 2048, 4096, None),  # decode, one token
    (7, 1000, 1021, None),  # ragged N, K not divisible by 3 or 8 k-tiles
    (16, 4100, 2048, None),  # ragged N past a 64-wide tile
    (64, 640, 100, None),  # K shorter than splits x tile_k: 2 k-tiles
    (33, 384, 64, None),  # one k-tile: the split clamps to 1
    (16, 1000, 777, 3),  # batched
    (200, 520, 1500, None),  # two m-tiles
]
SPLITS = [2, 3, 4, 8]
# A and B through views: (a column-major, b column-major); tn is x @ W.T of a linear layer
LAYOUTS = {"nn": (False, False), "tn": (False, True), "nt": (True, False), "tt": (True, True)}


def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernels run on sm_90 only")


def _operands(m, n, k, batch, layout, ab=F16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    a_col, b_col = LAYOUTS[layout]
    a = make((*lead, m, k), ab, "cuda", col_major=a_col, gen=gen)
    b = make((*lead, k, n), ab, "cuda", col_major=b_col, gen=gen)
    return a, b


def _run(name, split, a, b, out_dtype=None):
    backend, config = SPLIT_CONFIGS[name]
    return run_into_poisoned(a, b, backend, dataclasses.replace(config, split_k=split), out_dtype)


def _check(got, a, b):
    assert_product_within_torch_error(got, a, b, extra_adds=8)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", [F16, F32])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "name", ["pingpong-64x128-c1x2", "cooperative-128x128-c1x2"], ids=["pingpong", "coop"]
)
def test_forced_split_matches_the_reference(name, layout, out_dtype, shape, split):
    _sm90()
    a, b = _operands(*shape, layout, seed=split)
    _check(_run(name, split, a, b, out_dtype), a, b)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "name", ["pingpong-64x256-c1x1", "cooperative-128x128-c2x1", "cooperative-256x128-c1x2"]
)
def test_forced_split_of_the_other_tiles_and_clusters(name, shape, split):
    _sm90()
    a, b = _operands(*shape, "tn", seed=split)
    _check(_run(name, split, a, b), a, b)


def test_forced_split_in_bf16():
    _sm90()
    a, b = _operands(16, 1000, 1021, None, "tn", ab=BF16)
    _check(_run("pingpong-64x128-c1x2", 3, a, b), a, b)


@pytest.mark.parametrize("name", SPLIT_CONFIGS)
def test_forced_split_is_bitwise_deterministic(name):
    """The finishing unit sums the partials in split order whatever order they arrived in:
    the same bits on every run (arrival order differs run to run)."""
    _sm90()
    for m, n, k, split in [(16, 4096, 4096, 8), (1, 1000, 1021, 3), (200, 520, 1500, 4)]:
        a, b = _operands(m, n, k, None, "tn", seed=m)
        first = _run(name, split, a, b)
        _check(first, a, b)
        for _ in range(5):
            assert torch.equal(_run(name, split, a, b), first)


def test_split_on_side_streams():
    """A split call on a side stream gives the bits of the default stream's; two streams
    running split calls at once each use their own semaphores."""
    _sm90()
    a, b = _operands(16, 4096, 4096, None, "tn")
    name, split = "pingpong-64x128-c1x2", 4
    first = _run(name, split, a, b)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results = {0: [], 1: []}
    for _ in range(8):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                results[i].append(_run(name, split, a, b))
    torch.cuda.synchronize()
    for got in results[0] + results[1]:
        assert torch.equal(got, first)


def _captured(call) -> torch.cuda.CUDAGraph:
    """``call`` run once eagerly (it compiles and binds the launcher, outside the capture),
    then captured in a CUDA graph."""
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _replayed(graph: torch.cuda.CUDAGraph, out: torch.Tensor) -> torch.Tensor:
    """``out`` poisoned, then written by a replay of ``graph``."""
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out


def test_split_under_cuda_graph_capture():
    """Captured once after an eager call (which compiled and cached the launcher), replayed
    twice, and replayed again after new inputs were copied in: each replay gives what an eager
    call gives."""
    _sm90()
    a, b = _operands(16, 4096, 4096, None, "tn")
    name, split = "pingpong-64x128-c1x2", 4
    backend, config = SPLIT_CONFIGS[name]
    config = dataclasses.replace(config, split_k=split)
    out = torch.full((16, 4096), float("nan"), dtype=F16, device="cuda")
    graph = _captured(lambda: api.matmul(a, b, out=out, backend=backend, config=config))
    eager = out.clone()  # the capture itself runs nothing
    for _ in range(2):
        assert torch.equal(_replayed(graph, out), eager)
    new_a, new_b = _operands(16, 4096, 4096, None, "tn", seed=99)
    a.copy_(new_a)
    b.copy_(new_b)
    _check(_replayed(graph, out), a, b)
    assert torch.equal(out, _run(name, split, a, b))
