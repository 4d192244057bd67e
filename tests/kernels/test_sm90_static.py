"""Static facts of the Hopper kernel: config validation, smem stages, registers, arrive counts,
and the epilogue's register-to-output index map, traced without a GPU.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
import pytest
from cutlass.tensor_utils import LayoutEnum
from script_modules import load

from wsgemm.host import choosing
from wsgemm.kernels.common.arrive import ArriveCountError, check_arrive_count
from wsgemm.kernels.common.budget import register_budget
from wsgemm.kernels.sm90.config import (
    DEFAULT_RASTER_GROUP,
    PRODUCER_REGISTERS,
    SCHEDULES,
    SHIPPED_CONFIGS,
    SM90_REGISTERS_PER_SM,
    SM90_SMEM_CAPACITY,
    STATIC_SMEM_BYTES,
    TILE_N_CHOICES,
    TRACED_PRODUCER_REGISTERS,
    Sm90Config,
    check_raster_group,
    register_split,
    stage_counts,
)
from wsgemm.kernels.sm90.kernel import Sm90Gemm, epilogue_subtile_order, mainloop_arrive_terms

F16, BF16, F32 = cutlass.Float16, cutlass.BFloat16, cutlass.Float32
# (A/B, C, accumulator) combinations the kernel accepts.
DTYPES = [(ab, c, F32) for ab in (F16, BF16) for c in (F16, BF16, F32)] + [
    (F16, c, F16) for c in (F16, BF16, F32)
]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"schedule": "stream-k"}, "schedule must be one of"),
        ({"tile_m": 64}, "cooperative tile_m must be one of"),
        ({"tile_m": 256, "tile_n": 192}, "cooperative tile 256x192 is too large"),
        ({"tile_m": 256, "schedule": "pingpong"}, "pingpong tile_m must be one of"),
        ({"tile_n": 80}, "tile_n must be one of"),
        ({"tile_n": 144}, "tile_n must be one of"),  # a 16-step width: swap-AB's only
        ({"tile_n": 88, "swap_ab": True}, r"tile_n must be one of .*\(swap-AB\)"),
        ({"tile_k": 48}, "tile_k must be one of"),
        ({"schedule": "pingpong", "tile_n": 256}, "too large"),
        ({"cluster_m": 4}, "must each be 1 or 2"),
        ({"cluster_n": 0}, "must each be 1 or 2"),
        ({"raster_group": 8}, "unexpected keyword argument 'raster_group'"),
        ({"split_k": -1}, "split_k must be an int"),
        ({"split_k": True}, "split_k must be an int"),
        ({"split_k": 2.0}, "split_k must be an int"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Sm90Config(**kwargs)


def test_every_split_count_compiles_as_one_kernel():
    base = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong")
    assert not base.splits_in_kernel and base.compiled() is base
    for count in (0, 2, 3, 8):
        config = dataclasses.replace(base, split_k=count)
        assert config.splits_in_kernel
        assert config.compiled() == dataclasses.replace(base, split_k=0)
    assert all(c.split_k == 1 for c in SHIPPED_CONFIGS.values())


def test_split_buffers_hold_one_tile_per_unit_and_a_semaphore_per_tile():
    config = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", split_k=0)
    # M = 1 still has one 64-row tile; ragged N: 33 tiles; L = 3
    assert config.split_semaphores(1, 4097, 3) == 2 * 33 * 3  # arrivals, stored partials
    assert config.split_workspace_elements(1, 4097, 3, 4) == 33 * 3 * 4 * 64 * 128
    coop = Sm90Config(tile_m=128, tile_n=256, split_k=0)
    assert coop.split_workspace_elements(129, 256, 1, 2) == 2 * 1 * 2 * 128 * 256


def test_split_k_needs_an_fp32_accumulator():
    config = Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", split_k=0)
    with pytest.raises(ValueError, match="split-K .* needs an fp32 accumulator"):
        Sm90Gemm(config, F16, F16, F16)
    Sm90Gemm(config, F16, F16, F32)
    Sm90Gemm(dataclasses.replace(config, split_k=1), F16, F16, F16)  # no split: fine


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_raster_group_is_a_checked_launch_argument(schedule):
    config = Sm90Config(tile_n=128, cluster_m=2, schedule=schedule)
    assert check_raster_group(0, config) == DEFAULT_RASTER_GROUP[schedule]
    assert check_raster_group(4, config) == 4
    for bad in (3, -2, 2.0):
        with pytest.raises(ValueError, match="positive multiple of cluster_m"):
            check_raster_group(bad, config)


@pytest.mark.parametrize(
    "ab, c, acc, message",
    [
        (BF16, F16, F16, "fp16 accumulation needs fp16 inputs"),
        (F32, F32, F32, "A/B dtype"),
        (F16, cutlass.Int8, F32, "C dtype"),
        (F16, F16, BF16, "accumulator dtype"),
    ],
)
def test_kernel_rejects_bad_dtypes(ab, c, acc, message):
    with pytest.raises(ValueError, match=message):
        Sm90Gemm(SHIPPED_CONFIGS["sm90"], ab, c, acc)


@pytest.mark.parametrize("ab, c, acc", DTYPES)
@pytest.mark.parametrize(
    "config",
    [
        *SHIPPED_CONFIGS.values(),
        Sm90Config(tile_n=128, tile_k=128),
        Sm90Config(tile_n=64, tile_k=32),
        Sm90Config(tile_m=64, tile_n=256, schedule="pingpong"),
    ],
)
def test_smem_fits_and_is_used(config, ab, c, acc):
    gemm = Sm90Gemm(config, ab, c, acc)
    assert gemm.ab_stages >= 2 and 1 <= gemm.epi_stages <= config.num_epi_subtiles
    assert gemm.shared_memory_bytes() + STATIC_SMEM_BYTES <= SM90_SMEM_CAPACITY
    # One more mainloop stage would not fit beside the epilogue's minimum buffers.
    ab_stage = (config.tile_m + config.tile_n) * config.tile_k * 2
    assert gemm.shared_memory_bytes() + STATIC_SMEM_BYTES + ab_stage > SM90_SMEM_CAPACITY


def test_stage_counts_need_two_stages():
    with pytest.raises(ValueError, match="at least 2"):
        stage_counts(120 * 1024, 8 * 1024, 8)


def test_register_split():
    producer, consumer = register_split(2)
    assert (producer, consumer) == (40, 232)
    assert producer % 8 == 0 and consumer % 8 == 0
    assert 128 * (producer + 2 * consumer) <= SM90_REGISTERS_PER_SM
    # setmaxnreg moves registers inside the CTA's launch pool (384 threads x 168), not the SM's
    # 64K: a traced producer's 8 more registers come out of the consumers' share.
    pool = 384 * register_budget(384)
    for p in (PRODUCER_REGISTERS, TRACED_PRODUCER_REGISTERS):
        producer, consumer = register_split(2, producer=p)
        assert 128 * (producer + 2 * consumer) <= pool
    assert register_split(2, producer=TRACED_PRODUCER_REGISTERS) == (48, 224)
    # Gemm instances carry the same split.
    gemm = Sm90Gemm(SHIPPED_CONFIGS["sm90"], F16, F16, F32)
    assert (gemm.producer_regs, gemm.consumer_regs) == (40, 232)


def test_every_epilogue_fits_the_traced_lanes():
    """A traced epilogue keeps subtile e's store-wait times in lane e (``sm90/traced.py``): no
    valid config has more subtiles than a warp has lanes."""
    from wsgemm.kernels.common.trace import LANES

    subtiles = []
    for schedule in SCHEDULES:
        for tile_m in (64, 128, 256):
            for tile_n in TILE_N_CHOICES:
                try:
                    config = Sm90Config(tile_m=tile_m, tile_n=tile_n, schedule=schedule)
                except ValueError:
                    continue
                subtiles.append(config.num_epi_subtiles)
    assert len(subtiles) > 10 and max(subtiles) <= LANES


@pytest.mark.parametrize(
    "schedule, mma_threads, cluster, expected",
    [
        ("cooperative", 256, (1, 1), 8),
        ("cooperative", 256, (2, 1), 16),
        ("cooperative", 256, (2, 2), 24),
        ("pingpong", 128, (1, 1), 4),
        ("pingpong", 128, (2, 1), 8),
        ("pingpong", 128, (1, 2), 8),
    ],
)
def test_mainloop_empty_arrivals_derived(schedule, mma_threads, cluster, expected):
    tile_n = 256 if schedule == "cooperative" else 128
    config = Sm90Config(
        tile_n=tile_n, schedule=schedule, cluster_m=cluster[0], cluster_n=cluster[1]
    )
    gemm = Sm90Gemm(config, F16, F16, F32)
    assert gemm.mainloop_consumer_arrivals(mma_threads) == expected


@pytest.mark.parametrize(
    "schedule, wrong_mma_threads",
    [("cooperative", 128), ("cooperative", 384), ("pingpong", 256)],
)
def test_wrong_mainloop_arrivals_raise(schedule, wrong_mma_threads):
    config = dataclasses.replace(SHIPPED_CONFIGS["sm90"], schedule=schedule, tile_n=128)
    gemm = Sm90Gemm(config, F16, F16, F32)
    with pytest.raises(ArriveCountError, match="sm90 mainloop empty"):
        gemm.mainloop_consumer_arrivals(wrong_mma_threads)


def test_arrive_terms_spell_out_multicast():
    terms = mainloop_arrive_terms(Sm90Config(cluster_m=2))
    assert check_arrive_count("sm90 mainloop empty", 16, terms) == 16
    with pytest.raises(ArriveCountError, match="CTAs writing each stage"):
        check_arrive_count("sm90 mainloop empty", 8, terms)


def _epilogue_mapping(gemm, tiled_mma, r2s, order, threads):
    """For each of ``threads``: (coordinate the MMA computed, coordinate the epilogue writes)
    for each accumulator value, following the kernel's own retile / subtile walk."""
    cfg = gemm.config
    tile = (cfg.tile_m, cfg.tile_n)
    c_tile = cute.make_identity_tensor(tile)
    c_sub = cute.make_identity_tensor((*cfg.epi_tile, 1))
    pairs = []
    for t in threads:
        computed = r2s.retile(tiled_mma.get_slice(t).partition_C(c_tile))
        # st.matrix moves values across lanes: the register side's coordinates are the copy's
        # source partition of the subtile.
        written = r2s.get_slice(t).partition_S(c_sub)[(None, None, None, 0)]
        per_subtile = cute.size(written)
        # the same in every subtile: read once (each read of a traced tensor costs ~1 ms)
        in_subtile = [written[v] for v in range(per_subtile)]
        for e in range(cfg.num_epi_subtiles):
            sub_m, sub_n = order.get_hier_coord(e)
            for v in range(per_subtile):
                m, n, _ = in_subtile[v]
                pairs.append(
                    (
                        computed[e * per_subtile + v],
                        (sub_m * cfg.epi_tile[0] + m, sub_n * cfg.epi_tile[1] + n),
                    )
                )
    return pairs


def _trace_epilogue_mapping(name, c, threads, c_major=LayoutEnum.ROW_MAJOR):
    config = SHIPPED_CONFIGS[name] if isinstance(name, str) else name
    gemm = Sm90Gemm(config, F16, c, F32)
    found = []

    @cute.jit
    def trace():
        tiled_mma = gemm.make_tiled_mma(LayoutEnum.ROW_MAJOR, LayoutEnum.ROW_MAJOR)
        r2s = gemm.make_epilogue_copy(tiled_mma, c_major)
        every = range(cute.size(tiled_mma)) if threads is None else threads
        order = epilogue_subtile_order(gemm.config)
        found.extend(_epilogue_mapping(gemm, tiled_mma, r2s, order, every))

    cute.compile(trace, options="--gpu-arch sm_90a")
    assert all(computed == written for computed, written in found)
    return gemm.config, found


def test_epilogue_writes_each_accumulator_of_a_warp_where_the_mma_computed_it():
    """One warp (st.matrix exchanges values inside a warp) of the ping-pong epilogue with a
    16-bit C; the sweep checks every thread of every schedule."""
    cfg, found = _trace_epilogue_mapping("sm90-pingpong", F16, range(32))
    per_thread = cfg.tile_m * cfg.tile_n // 128  # one warpgroup holds the tile
    assert len({computed for computed, _ in found}) == len(found) == 32 * per_thread


def test_a_256_row_tile_epilogue_writes_each_accumulator_of_a_warp_where_the_mma_computed_it():
    """Each warpgroup holds two 64-row bands of a 256-row cooperative tile: the subtiles are
    128 rows (one band of each warpgroup), walked band after band as the accumulators hold
    them (a 256-row subtile would take two bands' values as one)."""
    cfg, found = _trace_epilogue_mapping(Sm90Config(tile_m=256, tile_n=128), F16, range(32))
    assert cfg.epi_tile == (128, 32)
    per_thread = cfg.tile_m * cfg.tile_n // 256  # two warpgroups hold the tile
    assert len({computed for computed, _ in found}) == len(found) == 32 * per_thread


# A swap-AB tile: 64 weight rows x 16 tokens, one consumer warpgroup, C written M-major.
SWAP_TILE = Sm90Config(tile_m=64, tile_n=16, schedule="pingpong")


def test_a_16_step_swap_tile_has_16_wide_subtiles_and_writes_each_accumulator_in_place():
    """Swap-AB's token tiles in steps of 16 (144 = 9 x 16): 16-column epilogue subtiles where
    32 does not divide the tile, 32 where it does; the transposed epilogue of one warp of a
    128x144 cooperative tile stores each accumulator where the MMA computed it."""
    assert Sm90Config(tile_m=128, tile_n=160, swap_ab=True).epi_tile == (128, 32)
    cfg = Sm90Config(tile_m=128, tile_n=144, cluster_m=2, swap_ab=True)
    assert cfg.epi_tile == (128, 16) and cfg.num_epi_subtiles == 9
    _, found = _trace_epilogue_mapping(cfg, F16, range(32), LayoutEnum.COL_MAJOR)
    assert len({computed for computed, _ in found}) == len(found) == 32 * 128 * 144 // 256


def test_transposed_epilogue_writes_each_accumulator_of_a_warp_where_the_mma_computed_it():
    """The M-major (swap-AB) epilogue: transposed st.matrix into a column-major subtile."""
    cfg, found = _trace_epilogue_mapping(SWAP_TILE, F16, range(32), LayoutEnum.COL_MAJOR)
    per_thread = cfg.tile_m * cfg.tile_n // 128
    assert len({computed for computed, _ in found}) == len(found) == 32 * per_thread


@pytest.mark.sweep
@pytest.mark.parametrize("c_major", [LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR])
@pytest.mark.parametrize(
    "name, c",
    # st.matrix (16-bit C) moves values across lanes; plain st.shared (fp32 C) does not.
    [
        ("sm90", F16),
        ("sm90-pingpong", F16),
        ("sm90-pingpong", F32),
        (SWAP_TILE, F16),
        (SWAP_TILE, F32),
        (Sm90Config(tile_m=128, tile_n=32), F16),
        # session 9's tiles: 256 rows, and widths that are odd multiples of 32
        (Sm90Config(tile_m=256, tile_n=160), F16),
        (Sm90Config(tile_m=256, tile_n=128), F32),
        (Sm90Config(tile_m=128, tile_n=224), F16),
        (Sm90Config(tile_m=64, tile_n=96, schedule="pingpong"), F16),
    ],
)
def test_epilogue_writes_each_accumulator_where_the_mma_computed_it(name, c, c_major):
    cfg, found = _trace_epilogue_mapping(name, c, None, c_major)
    assert len(found) == cfg.tile_m * cfg.tile_n
    assert len({computed for computed, _ in found}) == cfg.tile_m * cfg.tile_n


def _menu_tiles():
    """Each distinct tile of the menu and its dropped list: (tile_m, tile_n, schedule, swap)."""
    entries = choosing.MENU + load("tune_menu").DROPPED
    return list(
        dict.fromkeys((e.tile_m, e.tile_n, e.config["schedule"], e.swap_ab) for e in entries)
    )


@pytest.mark.sweep
@pytest.mark.parametrize(
    "tile", _menu_tiles(), ids=lambda t: "{}x{}-{}{}".format(*t[:3], "-swap" * t[3])
)
def test_every_menu_tile_writes_each_accumulator_where_the_mma_computed_it(tile):
    """Every entry the policy may run or the tuner times, 16-bit C (swap-AB: M-major): a new
    entry's epilogue mapping is checked before any GPU runs it."""
    tile_m, tile_n, schedule, swap = tile
    config = Sm90Config(tile_m=tile_m, tile_n=tile_n, schedule=schedule, swap_ab=swap)
    c_major = LayoutEnum.COL_MAJOR if swap else LayoutEnum.ROW_MAJOR
    cfg, found = _trace_epilogue_mapping(config, F16, None, c_major)
    assert len({computed for computed, _ in found}) == len(found) == cfg.tile_m * cfg.tile_n
