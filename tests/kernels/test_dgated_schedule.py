"""The dgated epilogue's buffer schedule (``kernels/sm90/dgated.py``), walked in plain Python
as ``Sm90Gemm._dgated_epilogue`` issues it: per product subtile a pair of C loads into two of
the E epilogue buffers, both waited for, both stores from the same buffers. Over persistent
tiles (``subtiles_done`` going on) and every buffer count the kernel builds: no load lands in a
buffer whose previous subtile has not been read and stored, or whose store may still be
reading it (the store warp's ``cp.async.bulk.wait_group.read 0`` before a later pair's loads,
or the prefetch's); each buffer's k-th load is the one its k-th wait expects (the mbarrier
phase ``(s // E) & 1``); and the buffer a subtile is read from holds that subtile."""

import cutlass
import pytest

from wsgemm.kernels.epilogue import Epilogue
from wsgemm.kernels.sm90 import dgated
from wsgemm.kernels.sm90.config import Sm90Config
from wsgemm.kernels.sm90.kernel import Sm90Gemm


def _walk(stages: int, pairs: int, tiles: int) -> int:
    """The schedule of ``tiles`` tiles of ``pairs`` product subtiles on ``stages`` buffers;
    returns the subtiles stored. Asserts the invariants of the module docstring."""
    held = {}  # buffer -> [subtile, read, stored]
    loads = dict.fromkeys(range(stages), 0)  # buffer -> loads so far (its mbarrier's phase)
    unread_stores = set()  # buffers whose store the store warp has not waited for

    def load(s: int) -> None:
        b = s % stages
        assert b not in unread_stores, f"subtile {s}: a store may still read buffer {b}"
        if b in held:
            before, read, stored = held[b]
            assert read and stored, f"subtile {s} over {before}, not yet read and stored"
        assert loads[b] == s // stages, f"subtile {s}: load {loads[b]} of buffer {b}"
        loads[b] += 1
        held[b] = [s, False, False]

    done = 0
    for _ in range(tiles):
        unread_stores.clear()  # the prefetch's wait_group.read 0
        for s_out in range(min(stages, 2 * pairs)):
            load(done + s_out)
        for e in range(pairs):
            later = dgated.later_pair(stages, e, pairs)
            if later is not None:
                unread_stores.clear()  # wait_group.read 0: pair e - 1's stores have read
                for h in range(2):
                    load(done + 2 * later + h)
            for s in (done + 2 * e, done + 2 * e + 1):  # both waited for, both read
                b = s % stages
                assert held[b][0] == s, f"subtile {s} read from buffer {b} holding {held[b][0]}"
                held[b][1] = True
            for s in (done + 2 * e, done + 2 * e + 1):  # then both stored
                held[s % stages][2] = True
                unread_stores.add(s % stages)
        done += 2 * pairs
    return done


@pytest.mark.parametrize("stages", [2, 4, 6, 8, 16])
@pytest.mark.parametrize("pairs", [1, 2, 3, 4, 8, 16])
def test_every_pair_loads_into_buffers_read_and_stored_before(stages, pairs):
    assert _walk(stages, pairs, tiles=5) == 5 * 2 * pairs


#: the ping-pong 128x128 tile with its whole tile's pre-activation buffered
WHOLE_TILE = Sm90Config(tile_m=128, tile_n=128, schedule="pingpong", dgated_whole_tile=True)


@pytest.mark.parametrize(
    "config, c_dtype",
    [
        (Sm90Config(), cutlass.Float16),
        (Sm90Config(), cutlass.Float32),
        (Sm90Config(tile_m=128, tile_n=128, schedule="pingpong"), cutlass.BFloat16),
        (Sm90Config(tile_m=128, tile_n=128, schedule="pingpong"), cutlass.Float32),
        (WHOLE_TILE, cutlass.BFloat16),
        (WHOLE_TILE, cutlass.Float32),
    ],
)
def test_a_dgated_kernel_has_an_even_buffer_count(config, c_dtype):
    """The pairs take two buffers each: the kernel rounds its epilogue buffers down to even
    (at least two); with ``dgated_whole_tile`` it takes one for every subtile of its tile (no
    load from its subtile loop: ``dgated``), its ring keeping three stages or more. The walk
    above covers these counts."""
    ab = c_dtype if c_dtype != cutlass.Float32 else cutlass.Float16
    gemm = Sm90Gemm(config, ab, c_dtype, cutlass.Float32,
                    epilogue=Epilogue(activation="silu", dgated=True))  # fmt: skip
    ring, stages = gemm.stage_counts()
    if config.dgated_whole_tile:
        assert stages == 2 * config.num_epi_subtiles == 16 and ring >= 3
        pairs = config.num_epi_subtiles
        assert all(dgated.later_pair(stages, e, pairs) is None for e in range(pairs))
    else:
        assert stages in (2, 4, 6, 8)
