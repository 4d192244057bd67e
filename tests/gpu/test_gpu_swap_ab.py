"""Swap-AB on the GPU: the sm90 kernels run C^T = B^T A^T and write the caller's C M-major, for
few-row problems (decode: M = 1..64 tokens) over every dtype, layout, batch, offset and ragged
N and K, with the suite's tolerance (fp64 reference, 2x PyTorch's own error)."""

import random
import zlib

import pytest
import torch
from script_modules import load
from test_gpu_correctness import DTYPES, check

from wsgemm.host import choosing
from wsgemm.kernels.sm90.config import Sm90Config

pytestmark = pytest.mark.gpu

SWAP_CONFIGS = {
    "pp64x8k128": Sm90Config(tile_m=64, tile_n=8, tile_k=128, schedule="pingpong", swap_ab=True),
    "pp64x16k128": Sm90Config(tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True),
    "pp64x8": Sm90Config(tile_m=64, tile_n=8, schedule="pingpong", swap_ab=True),
    "pp64x16": Sm90Config(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True),
    "pp64x32": Sm90Config(tile_m=64, tile_n=32, schedule="pingpong", swap_ab=True),
    "pp64x64c2": Sm90Config(tile_m=64, tile_n=64, cluster_m=2, schedule="pingpong", swap_ab=True),
    "co128x16": Sm90Config(tile_m=128, tile_n=16, schedule="cooperative", swap_ab=True),
    "co128x32c2": Sm90Config(tile_m=128, tile_n=32, cluster_m=2, swap_ab=True),
}
MS = [1, 2, 3, 7, 8, 13, 16, 17, 31, 32, 33, 64]
NK = [8, 13, 64, 97, 128, 129, 257, 640, 1021, 4096]
CASES = 48


# The menu's 16-wide swap entry gets every dtype and layout; the other tiles (each variant a
# compile) three dtypes, K-major tokens and either weight layout.
MENU_CONFIG = "pp64x16k128"
OTHER_CASES = 8


def _cases(seed, everything):
    rng = random.Random(seed)
    return [
        dict(
            m=rng.choice(MS), n=rng.choice(NK), k=rng.choice(NK),
            dtypes=DTYPES[i % (len(DTYPES) if everything else 3)],
            a_col=everything and rng.random() < 0.3, b_col=rng.random() < 0.5,
            batch=rng.choice(["none", "none", "both", "a2b3"]),
            offset=rng.choice([0, 8, 3]), pad=rng.choice([0, 8, 5]), use_out=True,
        )
        for i in range(CASES if everything else OTHER_CASES)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name, index",
    [(MENU_CONFIG, i) for i in range(CASES)]
    + [(n, i) for n in SWAP_CONFIGS if n != MENU_CONFIG for i in range(OTHER_CASES)],
)
def test_swap_random_case(name, index):
    case = _cases(4321 + len(name), name == MENU_CONFIG)[index]
    backend = "sm90-pingpong" if SWAP_CONFIGS[name].pingpong else "sm90"
    check(case, backend, torch.Generator().manual_seed(index), config=SWAP_CONFIGS[name])


@pytest.mark.parametrize("name", ["pp64x16k128", "pp64x8k128", "co128x32c2"])
def test_swap_decode_shapes_and_bits_repeat(name):
    """LLM decode shapes (x @ W.T) at 1 and 16 tokens: correct, and the same bits twice."""
    from wsgemm import api

    cfg = SWAP_CONFIGS[name]
    backend = "sm90-pingpong" if cfg.pingpong else "sm90"
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in [(1, 6144, 4096), (16, 4096, 14336), (16, 28672, 4096)]:
        x = torch.randn(m, k, device="cuda", generator=gen).half()
        w = torch.randn(n, k, device="cuda", generator=gen).half()
        ref = x.double() @ w.double().T
        got = api.matmul(x, w.T, backend=backend, config=cfg)
        again = api.matmul(x, w.T, backend=backend, config=cfg)
        assert torch.equal(got, again)
        err = (got.double() - ref).abs().max().item()
        theirs = (torch.matmul(x, w.T).double() - ref).abs().max().item()
        assert err <= 2 * theirs + 1e-6 * (ref.abs().max().item() + 1.0)


#: The wide swap-AB tiles (docs/perf.md entries 48, 51): 129-1024 tokens in several N tiles, the
#: last one ragged; three on the menu, the others ``tune_menu.DROPPED`` (the tuner times them).
WIDE = [
    e.name for e in (*choosing.MENU, *load("tune_menu").DROPPED) if e.swap_ab and e.tile_n >= 64
]
WIDE_MS = [129, 157, 200, 266, 562, 1021]


@pytest.mark.parametrize("name", WIDE)
@pytest.mark.parametrize("index", range(len(WIDE_MS)))
def test_wide_swap_tile_random_case(name, index):
    e = load("tune_menu").entry(name)
    rng = random.Random(zlib.crc32(name.encode()) + index)
    case = dict(
        m=WIDE_MS[index], n=rng.choice(NK), k=rng.choice(NK), dtypes=DTYPES[index % 3],
        a_col=False, b_col=rng.random() < 0.5, batch=rng.choice(["none", "none", "both"]),
        offset=rng.choice([0, 8]), pad=rng.choice([0, 8]), use_out=True,
    )  # fmt: skip
    check(case, e.backend, torch.Generator().manual_seed(index), config=e.variant_config())
