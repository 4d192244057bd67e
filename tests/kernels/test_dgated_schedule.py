"""The dgated epilogue's buffer schedule (``kernels/sm90/dgated.py``), walked in plain Python
as ``Sm90Gemm._dgated_epilogue`` and its loads issue it: per product subtile a pair of C loads
into two of the E epilogue buffers, both waited for, both stores from the same buffers. Over
persistent tiles (``subtiles_done`` going on), in both forms (the ping-pong tile's whole tile
loaded at its epilogue's start; the cooperative tile's loader warp): no load lands in a buffer
whose previous subtile has not been read and stored, or whose store may still be reading it;
each buffer's k-th load is the one its k-th wait expects (the mbarrier phase ``(s // E) &
1``); and the buffer a subtile is read from holds that subtile."""

import random

import cutlass
import pytest

from wsgemm.kernels.epilogue import Epilogue
from wsgemm.kernels.sm90.config import Sm90Config
from wsgemm.kernels.sm90.kernel import Sm90Gemm


def _walk_whole(pairs: int, tiles: int) -> int:
    """The ping-pong tile's schedule: ``tiles`` tiles of ``pairs`` product subtiles, a buffer
    for each of a tile's 2 x ``pairs`` output subtiles, all loaded at its epilogue's start
    (``dgated.prefetch``, after ``cp.async.bulk.wait_group.read 0``), none from its subtile
    loop; returns the subtiles stored. Asserts the invariants of the module docstring."""
    stages = 2 * pairs
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
        for s_out in range(stages):
            load(done + s_out)
        for e in range(pairs):
            for s in (done + 2 * e, done + 2 * e + 1):  # both waited for, both read
                b = s % stages
                assert held[b][0] == s, f"subtile {s} read from buffer {b} holding {held[b][0]}"
                held[b][1] = True
            for s in (done + 2 * e, done + 2 * e + 1):  # then both stored
                held[s % stages][2] = True
                unread_stores.add(s % stages)
        done += 2 * pairs
    return done


def _walk_loader(stages: int, pairs: int, tiles: int, seed: int, frees: int = 1) -> int:
    """The cooperative tile's loader-warp form (``Sm90Gemm.dgated_loader`` and
    ``_dgated_epilogue``), its two agents interleaved at random: the loader warp loads
    subtile s once buffer s % E's ``free`` mbarrier has (s // E) arrivals; the epilogue, per
    pair P, has its store warp wait for its stores to have read (``wait_group.read 0``) and
    arrive on the two buffers of pair P - 1, then waits for both of pair P's loads, reads and
    stores them (at a tile's first pair the kernel frees the last tile's last pair under the
    mainloop, ``residual_prefetch``: the same point in this order). Asserts no load
    overwrites a subtile not yet read, stored and read by its store; each wait sees the
    arrival count it waits for, never one more (an mbarrier waits on a phase's parity);
    neither agent ever waits for good. Returns the subtiles stored. ``frees``: the pair the
    store warp frees, this many back (1, the kernel's; 0 plants a bug the walk must catch)."""
    rng = random.Random(seed)
    total = 2 * pairs * tiles
    held: dict = {}  # buffer -> [subtile, read, stored, store has read it]
    full = dict.fromkeys(range(stages), 0)  # completed loads of each buffer
    free = dict.fromkeys(range(stages), 0)  # the store warp's arrivals on each buffer
    loaded = stored_pairs = 0
    freed = False  # whether pair `stored_pairs`'s store warp step has run

    def loader_step() -> bool:
        nonlocal loaded
        b, use = loaded % stages, loaded // stages
        if free[b] < use:
            return False
        assert free[b] == use, f"buffer {b}: {free[b]} arrivals for use {use}: parity aliased"
        if b in held:
            assert held[b][1:] == [True, True, True], f"subtile {loaded} over {held[b]}"
        held[b] = [loaded, False, False, False]
        full[b] += 1
        loaded += 1
        return True

    def epilogue_step() -> bool:
        nonlocal stored_pairs, freed
        p = stored_pairs
        if not freed:  # the store warp: its stores have read; pair p - 1's buffers are free
            for entry in held.values():
                if entry[2]:
                    entry[3] = True
            if p >= frees:
                for s in (2 * (p - frees), 2 * (p - frees) + 1):
                    free[s % stages] += 1
            freed = True
            return True
        for s in (2 * p, 2 * p + 1):
            b, use = s % stages, s // stages
            if full[b] <= use:
                return False
            assert full[b] == use + 1, f"subtile {s}: buffer {b} loaded {full[b]} times"
        for s in (2 * p, 2 * p + 1):
            assert held[s % stages][0] == s
            held[s % stages][1] = True
        for s in (2 * p, 2 * p + 1):
            held[s % stages][2] = True
        stored_pairs += 1
        freed = False
        return True

    while stored_pairs < total // 2:
        agents = [loader_step] if loaded < total else []
        agents.append(epilogue_step)
        rng.shuffle(agents)
        assert any(step() for step in agents), f"deadlock at pair {stored_pairs}, load {loaded}"
    return 2 * stored_pairs


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("stages, pairs", [(2, 1), (2, 8), (4, 8), (4, 3), (6, 8), (8, 8)])
def test_the_loader_warp_loads_into_buffers_read_and_stored_before(stages, pairs, seed):
    assert _walk_loader(stages, pairs, tiles=4, seed=seed) == 4 * 2 * pairs


def test_the_loader_walk_catches_a_pair_freed_before_its_stores():
    """The walk's own check: a store warp freeing the pair it is about to store (not the one
    before) lets the loader overwrite it, on some interleaving of every buffer count."""
    for stages, pairs in ((2, 8), (4, 8), (8, 8)):
        caught = 0
        for seed in range(20):
            try:
                _walk_loader(stages, pairs, tiles=4, seed=seed, frees=0)
            except AssertionError:
                caught += 1
        assert caught > 0, (stages, pairs)


@pytest.mark.parametrize("pairs", [1, 2, 3, 4, 8])
def test_the_whole_tile_loads_into_buffers_read_and_stored_before(pairs):
    assert _walk_whole(pairs, tiles=5) == 5 * 2 * pairs


@pytest.mark.parametrize(
    "config, c_dtype",
    [
        (Sm90Config(), cutlass.Float16),
        (Sm90Config(), cutlass.Float32),
        (Sm90Config(tile_m=128, tile_n=128, schedule="pingpong"), cutlass.BFloat16),
        (Sm90Config(tile_m=128, tile_n=128, schedule="pingpong"), cutlass.Float32),
    ],
)
def test_a_dgated_kernel_has_its_schedule_s_buffers(config, c_dtype):
    """The pairs take two buffers each: a cooperative kernel rounds its epilogue buffers down
    to even (at least two) and has a loader warp; a ping-pong one takes a buffer for every
    subtile of its tile (no load from its subtile loop: ``dgated``), its ring keeping three
    stages or more, and no loader warp. The walks above cover these counts."""
    ab = c_dtype if c_dtype != cutlass.Float32 else cutlass.Float16
    gemm = Sm90Gemm(config, ab, c_dtype, cutlass.Float32,
                    epilogue=Epilogue(activation="silu", dgated=True))  # fmt: skip
    ring, stages = gemm.stage_counts()
    assert gemm._dgated_loader is not config.pingpong
    if config.pingpong:
        assert stages == 2 * config.num_epi_subtiles == 16 and ring >= 3
    else:
        assert stages in (2, 4)


def test_only_a_dgated_kernel_has_a_loader_warp():
    """The loader warp is a cooperative dgated kernel's: another epilogue on the same tile
    (a dact one reads its pre-activation the same way, from the store warp) has none."""
    for epilogue in (Epilogue(), Epilogue(activation="silu", dact=True)):
        gemm = Sm90Gemm(Sm90Config(), cutlass.Float16, cutlass.Float16, cutlass.Float32,
                        epilogue=epilogue)  # fmt: skip
        assert not gemm._dgated_loader
