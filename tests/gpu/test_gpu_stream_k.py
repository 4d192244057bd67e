"""Stream-K inside the sm90 kernel, on the GPU (``Sm90Config.stream_k``; the schedule is
``kernels.common.scheduler``'s, modelled on the host in ``tests/kernels/test_scheduler.py``): forced
through ``api.matmul(..., config=...)`` against the fp64 reference with the suite's tolerance,
outputs poisoned first, on shapes whose grids leave a partial wave (stream-K's case), fewer
tiles than SMs, one k-tile, ragged M/N/K, batches and every layout; then bitwise determinism
(each tile's parts are summed in K order, whatever order they arrive in) and a CUDA graph.

Not on the menu: no policy choice runs it yet, and these variants compile in-process.
"""

import pytest
import torch
from operands import run_into_poisoned
from test_gpu_splitk import LAYOUTS, _captured, _check, _operands, _replayed, _sm90

from wsgemm import api
from wsgemm.kernels.sm90.config import Sm90Config

pytestmark = pytest.mark.gpu

F16, F32 = torch.float16, torch.float32

CONFIGS = {
    "pp128x128c2x1": ("sm90-pingpong", Sm90Config(tile_m=128, tile_n=128, cluster_m=2,
                                                  schedule="pingpong", stream_k=True)),
    "coop128x256c2x1": ("sm90", Sm90Config(tile_m=128, tile_n=256, cluster_m=2, stream_k=True)),
    "pp64x128c1x2": ("sm90-pingpong", Sm90Config(tile_m=64, tile_n=128, cluster_n=2,
                                                 schedule="pingpong", stream_k=True)),
    "coop256x128c1x2": ("sm90", Sm90Config(tile_m=256, tile_n=128, cluster_n=2, stream_k=True)),
    # no cluster: what ``wsgemm trace --stream-k`` traced at 615x8192x4096 (docs/perf.md 108)
    "coop128x256c1x1": ("sm90", Sm90Config(tile_m=128, tile_n=256, stream_k=True)),
    # in teams (Sm90Config.stream_k_teams, docs/perf.md entry 105): the cluster rows of a
    # column share one range
    "teams-pp128x128c2x1": ("sm90-pingpong", Sm90Config(tile_m=128, tile_n=128, cluster_m=2,
                            schedule="pingpong", stream_k=True, stream_k_teams=True)),
    "teams-coop128x256c2x1": ("sm90", Sm90Config(tile_m=128, tile_n=256, cluster_m=2,
                                                 stream_k=True, stream_k_teams=True)),
    "teams-coop128x256c1x2": ("sm90", Sm90Config(tile_m=128, tile_n=256, cluster_n=2,
                                                 stream_k=True, stream_k_teams=True)),
}  # fmt: skip
# (M, N, K, batch or None)
SHAPES = [
    (2888, 2072, 1504, None),  # 1.6 waves of 128x256 tiles: a partial wave and one whole shared
    (4472, 1928, 680, None),  # 2.1 waves, short K
    (1128, 1968, 4056, None),  # fewer tiles than SMs: all shared
    (1000, 520, 64, None),  # one k-tile: too short to share
    (300, 1000, 1021, 3),  # batched, ragged K
    (129, 4100, 777, None),  # ragged M and N past a tile
    (16, 4096, 4096, None),  # decode-sized M
    (1000, 2072, 1504, None),  # all shared; a 256-row tile's last rows end in its second band
    (615, 8192, 4096, None),  # entry 104's traced shape: 1.21 waves of 128x256, 3 cluster rows
]


def _run(name, a, b, out_dtype=F16):
    return run_into_poisoned(a, b, *CONFIGS[name], out_dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", CONFIGS)
def test_stream_k_matches_the_reference(name, layout, shape):
    _sm90()
    a, b = _operands(*shape, layout, seed=len(name))
    _check(_run(name, a, b), a, b)


@pytest.mark.parametrize("name", CONFIGS)
def test_stream_k_with_an_fp32_output(name):
    _sm90()
    a, b = _operands(2888, 2072, 1504, None, "tn")
    _check(_run(name, a, b, F32), a, b)


@pytest.mark.parametrize("name", CONFIGS)
def test_stream_k_is_bitwise_deterministic(name):
    _sm90()
    for shape in [(2888, 2072, 1504, None), (1128, 1968, 4056, None)]:
        a, b = _operands(*shape, "tn")
        first = _run(name, a, b).clone()
        for _ in range(4):
            assert torch.equal(_run(name, a, b), first)


def test_stream_k_in_a_cuda_graph():
    """Captured and replayed: the semaphores the graph's call uses start zero on every
    replay (the kernel leaves them zero), the workspace is the graph pool's."""
    _sm90()
    a, b = _operands(2888, 2072, 1504, None, "tn")
    want = _run("pp128x128c2x1", a, b).clone()
    out = torch.empty_like(want)
    backend, config = CONFIGS["pp128x128c2x1"]
    graph = _captured(lambda: api.matmul(a, b, out=out, backend=backend, config=config))
    for _ in range(3):
        assert torch.equal(_replayed(graph, out), want)


@pytest.mark.parametrize("name", ["pp128x128c2x1", "coop128x256c2x1"])
def test_no_deadlock_beside_a_kernel_on_another_stream(name):
    """The finisher waits only on units that drew a ticket before it (``split_k.fixup``):
    with other streams' kernels holding SMs while the stream-K grid is launched (so not every
    CTA of it is resident at once), every call still completes, with the right result."""
    _sm90()
    a, b = _operands(2888, 2072, 1504, None, "tn", seed=3)
    others = [torch.cuda.Stream() for _ in range(3)]
    x = torch.randn(8192, 8192, device="cuda", dtype=F16)
    for _ in range(3):
        for s in others:
            with torch.cuda.stream(s):
                for _ in range(4):
                    torch.mm(x, x)  # long kernels that fill the GPU beside ours
        got = _run(name, a, b)
        torch.cuda.synchronize()  # a deadlock would hang here (the suite's timeout fails it)
        _check(got, a, b)
