"""Host-side checks of the sm80 kernels: configs, budgets, arrive counts, dtypes (no GPU)."""

from __future__ import annotations

import dataclasses

import cutlass
import pytest
from sass_checks import assert_clean, assert_sm80_path

from wsgemm import host, support
from wsgemm.kernels.common.arrive import ArriveCountError
from wsgemm.kernels.sm80.config import (
    BUFFER_ALIGN_BYTES,
    MAX_REGISTERS_PER_THREAD,
    SHIPPED_CONFIGS,
    SHIPPED_FP16_ACC_CONFIGS,
    Sm80Config,
    ab_smem_bytes,
    accumulator_registers,
    barrier_bytes,
    epilogue_smem_bytes,
    mainloop_registers,
    register_budget,
    shipped_config,
    smem_bytes,
    smem_capacity_bytes,
)
from wsgemm.kernels.sm80.kernel import column_slices, launch_columns
from wsgemm.kernels.sm80.multistage import Sm80MultistageGemm
from wsgemm.kernels.sm80.specialized import Sm80WsGemm
from wsgemm.support import MAX_GRID_DIM

F16, BF16, F32 = cutlass.Float16, cutlass.BFloat16, cutlass.Float32
KERNELS = (Sm80WsGemm, Sm80MultistageGemm)
#: The default config (4 consumer warps, 160 threads) and the shipped 8-MMA-warp tile.
DEFAULT = Sm80Config()
WIDE = Sm80Config(128, 256, 32, 4, mma_warps_n=4)
#: A 144 KiB ring: more than sm_86/sm_89 hold, within sm_80's and sm_90a's budgets.
BIG = Sm80Config(128, 256, 64, 3, mma_warps_n=4)


# ---------------------------------------------------------------------------------------------
# Config validation


def test_mma_warps_n_sets_the_warp_grid():
    assert (WIDE.mma_warps, WIDE.mma_threads, WIDE.mma_tile_n) == (8, 256, 64)
    # 8 warps of 64x64: the per-warp tile of 128x128 with 2x2 warps.
    assert WIDE.warp_tile_mn == Sm80Config(128, 128, 32, 4).warp_tile_mn == (64, 64)
    assert Sm80Config(tile_n=64, mma_warps_n=4).warp_tile_mn == (64, 16)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tile_m": 80}, "tile_m=80"),
        ({"tile_n": 96}, "128 threads cannot store a 128x96 slab"),
        ({"tile_n": 32}, "tile_n=32"),
        ({"tile_k": 16}, "tile_k=16"),
        ({"tile_k": 48}, "tile_k=48"),
        ({"stages": 2}, r"stages=2 must be in \[3, 8\]"),
        ({"stages": 9}, r"stages=9 must be in \[3, 8\]"),
        ({"tile_m": 128.0}, "must be an int"),
        ({"stages": True}, "must be an int"),
        ({"mma_warps_n": 3}, r"mma_warps_n=3 is not allowed; choose one of \(2, 4\)"),
        ({"mma_warps_n": 8}, "mma_warps_n=8"),
        ({"mma_warps_n": True}, "mma_warps_n=True"),
        ({"mma_warps_m": 1}, r"mma_warps_m=1 is not allowed; choose one of \(2, 4\)"),
        ({"mma_warps_m": 4, "mma_warps_n": 4}, "at most 8 MMA warps"),
        ({"tile_n": 192, "mma_warps_n": 4}, "256 threads cannot store a 128x192 slab"),
        ({"fast_interior": 2}, "fast_interior=2 must be 0 or 1"),
        ({"fast_interior": True}, "fast_interior=True"),
    ],
)
def test_bad_config_raises_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sm80Config(**kwargs)


def test_four_m_warps_fit_the_smallest_allowed_tile():
    assert Sm80Config(tile_m=64, tile_n=128, mma_warps_m=4).warp_tile_mn == (16, 64)


def test_mma_warps_m_sets_the_warp_grid():
    tall = Sm80Config(192, 128, 32, 4, mma_warps_m=4)
    assert (tall.mma_warps, tall.mma_threads, tall.mma_tile_m, tall.mma_tile_n) == (8, 256, 64, 32)
    # Eight warps of 48x64: 96 fp32 accumulators, which fit a 288-thread CTA's 168 registers.
    assert tall.warp_tile_mn == (48, 64)
    assert accumulator_registers(tall, F32) == 96
    assert mainloop_registers(tall, F32) == 96 + 2 * (3 * 4 + 8 * 2) < register_budget(288)


def test_smem_budget_is_the_compile_archs():
    # No arch: the smallest of the family's, so the config runs on every GPU it serves.
    assert smem_capacity_bytes() == 99 * 1024 == min(support.SMEM_PER_BLOCK.values())
    assert smem_capacity_bytes("sm_80") == 163 * 1024
    assert smem_capacity_bytes("sm_86") == smem_capacity_bytes("sm_89") == 99 * 1024
    assert smem_capacity_bytes("sm_90a") == 227 * 1024
    assert 99 * 1024 < smem_bytes(BIG, F16, F16, barrier_stages=3) <= 163 * 1024
    for arch in ("sm_80", "sm_90a"):
        BIG.check_smem(arch)
    with pytest.raises(ValueError, match=r"at most 101376 are allowed \(the smallest of sm_80, "):
        BIG.check_smem()
    with pytest.raises(ValueError, match=r"needs 148528 bytes .* at most 101376 .* \(sm_89\)"):
        BIG.check_smem("sm_89")
    with pytest.raises(ValueError, match=r"at most 232448 are allowed \(sm_90a\)"):
        Sm80Config(256, 256, 64, 4, mma_warps_n=4).check_smem("sm_90a")
    # the later targets of support.TARGETS: Orin's as sm_80's, Blackwell's as Hopper's or Ada's
    assert smem_capacity_bytes("sm_87") == 163 * 1024
    assert smem_capacity_bytes("sm_100a") == smem_capacity_bytes("sm_110a") == 227 * 1024
    assert smem_capacity_bytes("sm_120a") == smem_capacity_bytes("sm_121a") == 99 * 1024
    with pytest.raises(ValueError, match="unknown target 'sm_75'"):
        smem_capacity_bytes("sm_75")


def test_a_new_target_is_one_row_of_the_support_table(monkeypatch):
    # Later targets join the family through support's table alone (a hypothetical sm_130a).
    monkeypatch.setitem(support.SMEM_PER_BLOCK, "sm_130a", 163 * 1024)
    assert smem_capacity_bytes("sm_130a") == 163 * 1024
    BIG.check_smem("sm_130a")
    # A target with less shared memory than sm_89's lowers the budget of every config built
    # without an arch (a hypothetical 64 KiB part; the shipped configs would no longer fit).
    monkeypatch.setitem(support.SMEM_PER_BLOCK, "sm_130a", 64 * 1024)
    assert smem_capacity_bytes() == 64 * 1024
    with pytest.raises(ValueError, match=r"at most 65536 are allowed \(the smallest of .*sm_130a"):
        shipped_config("sm80", F32).check_smem()


@pytest.mark.parametrize("tile_mn, vectors", [(64, 8), (96, 4), (128, 8), (192, 8), (256, 8)])
def test_mn_major_atoms_are_conflict_free_for_ldmatrix(tile_mn, vectors):
    from wsgemm.kernels.sm80.plan import mn_atom_vectors

    assert mn_atom_vectors(tile_mn, F16) == mn_atom_vectors(tile_mn, BF16) == vectors
    assert tile_mn % (vectors * 8) == 0  # whole atoms
    bits = vectors.bit_length() - 1  # Swizzle<bits, 3, 3> on an (8 * vectors) x 8 atom

    def swizzle(offset):
        return offset ^ (((offset >> 6) & ((1 << bits) - 1)) << 3)

    # ldmatrix.trans reads one 16-byte chunk of 8 consecutive k-rows: 8 bank groups.
    for chunk in range(vectors):
        groups = {(2 * swizzle(k * vectors * 8 + chunk * 8) // 16) % 8 for k in range(8)}
        assert len(groups) == 8


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sm80Config().stages = 4


# ---------------------------------------------------------------------------------------------
# Shared-memory budget


@pytest.mark.parametrize("c_dtype", [F16, BF16, F32])
@pytest.mark.parametrize(
    "config",
    [DEFAULT, Sm80Config(128, 128, 32, 4), WIDE, Sm80Config(128, 128, 32, 4, mma_warps_n=4)],
    ids=str,
)
def test_epilogue_reuses_the_ab_ring(config, c_dtype):
    ab = ab_smem_bytes(config, F16)
    epi = epilogue_smem_bytes(config, F16, c_dtype)
    assert epi <= ab
    ws = Sm80WsGemm(config, F16, c_dtype, F32).shared_memory_bytes()
    ms = Sm80MultistageGemm(config, F16, c_dtype, F32).shared_memory_bytes()
    assert ws == BUFFER_ALIGN_BYTES + max(ab, epi) + barrier_bytes(config.stages)
    assert ms == BUFFER_ALIGN_BYTES + max(ab, epi)
    assert ws < BUFFER_ALIGN_BYTES + ab + epi  # max, not sum
    assert ws <= smem_capacity_bytes()


@pytest.mark.parametrize("table", [SHIPPED_CONFIGS, SHIPPED_FP16_ACC_CONFIGS])
def test_shipped_configs_fit_every_sm80_family_gpu(table):
    assert set(table) == {"sm80", "sm80-multistage"}
    # The ablation compares like with like: same tile, stages and MMA warps; only how each
    # kernel loads interior tiles is its own measured best.
    assert table["sm80"] == dataclasses.replace(table["sm80-multistage"], fast_interior=1)
    for config in table.values():
        config.check_smem()
        for c_dtype in (F16, BF16, F32):
            assert smem_bytes(config, F16, c_dtype, barrier_stages=config.stages) <= 101376
        for arch in support.SMEM_PER_BLOCK:
            for kernel in KERNELS:
                assert kernel(config, F16, F32, F32, arch).gpu_arch == arch


# ---------------------------------------------------------------------------------------------
# Registers


def test_fp32_accumulators_of_128x256_cannot_fit_255_registers():
    big = Sm80Config()
    assert accumulator_registers(big, F32) == 256
    assert mainloop_registers(big, F32) > MAX_REGISTERS_PER_THREAD
    assert mainloop_registers(big, F16) < MAX_REGISTERS_PER_THREAD


@pytest.mark.parametrize(
    "threads, ctas, budget",
    [(128, 2, 255), (160, 1, 255), (256, 1, 255), (160, 2, 168), (288, 1, 168), (256, 2, 128)],
)
def test_register_budget_counts_warps_per_sub_partition(threads, ctas, budget):
    # Measured with ptxas 13.0 (-arch=sm_80, .reqntid/.minnctapersm): 288 threads are
    # budgeted like 384, not like 288 (65536 / 288 would allow 227).
    assert register_budget(threads, ctas) == budget


def test_eight_consumer_warps_of_64x64_fp32_do_not_fit_the_ws_budget():
    ws = Sm80WsGemm(WIDE, F16, F16, F32)
    assert ws.threads == 288
    assert mainloop_registers(WIDE, F32) == 128 + 64 > register_budget(ws.threads)
    assert mainloop_registers(WIDE, F16) == 64 + 64 < register_budget(ws.threads)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("acc", [F32, F16])
def test_shipped_config_leaves_register_headroom(kernel, acc):
    config = shipped_config(kernel.name, acc)
    budget = register_budget(kernel(config, F16, F16, acc).threads)
    # Addresses, predicates and loop state need the rest (measured in SASS: <= 175 in all).
    assert mainloop_registers(config, acc) <= budget - 30


def test_shipped_config_unknown_name():
    with pytest.raises(ValueError, match="no sm80 kernel named"):
        shipped_config("sm90", F32)


# ---------------------------------------------------------------------------------------------
# Arrive counts


@pytest.mark.parametrize(
    "config, counts, threads",
    [(DEFAULT, (32, 128), 160), (WIDE, (32, 256), 288)],
    ids=["default", "wide"],
)
def test_ws_arrive_counts_are_derived_from_the_roles(config, counts, threads):
    kernel = Sm80WsGemm(config, F16, F16, F32)
    assert kernel.arrive_counts() == counts
    assert kernel.threads == threads
    assert kernel.consumer_warps == config.mma_warps


@pytest.mark.parametrize("config", [DEFAULT, WIDE], ids=["default", "wide"])
@pytest.mark.parametrize(
    "attribute, wrong, barrier",
    [
        ("full_barrier_arrivals", lambda self: 1, "sm80 ab full"),
        ("full_barrier_arrivals", lambda self: 64, "sm80 ab full"),
        ("RELEASE_LANES_PER_WARP", 1, "sm80 ab empty"),
        ("empty_barrier_arrivals", lambda self: 4 * self.config.mma_warps, "sm80 ab empty"),
        ("empty_barrier_arrivals", lambda self: self.config.mma_warps - 1, "sm80 ab empty"),
    ],
)
def test_wrong_arrive_count_raises(config, attribute, wrong, barrier):
    broken = type("Broken", (Sm80WsGemm,), {attribute: wrong})
    with pytest.raises(ArriveCountError, match=barrier):
        broken(config, F16, F16, F32).arrive_counts()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("arch", ["sm_86", "sm_89", "sm_120a", "sm_121a"])
def test_a_config_beyond_an_archs_shared_memory_is_refused_for_it(kernel, arch):
    with pytest.raises(ValueError, match=f"at most 101376 are allowed \\({arch}\\)"):
        kernel(BIG, F16, F16, F32, arch)
    for fits in ("sm_80", "sm_87", "sm_90a", "sm_100a"):
        assert kernel(BIG, F16, F16, F32, fits).shared_memory_bytes() <= smem_capacity_bytes(fits)


def test_the_producer_is_one_warp_before_the_consumers():
    kernel = Sm80WsGemm(WIDE, F16, F16, F32)
    assert (kernel.PRODUCER_WARPS, kernel.load_threads, kernel.consumer_warps) == (1, 32, 8)
    assert kernel.threads == 32 * (1 + WIDE.mma_warps)


def test_declaring_one_release_lane_fails_the_trace():
    # Every consumer thread releases; declaring one lane per warp without changing the
    # barrier's count is caught while tracing, not left to hang.
    assert Sm80WsGemm.RELEASE_LANES_PER_WARP == 32
    one = type("One", (Sm80WsGemm,), {"RELEASE_LANES_PER_WARP": 1})
    with pytest.raises(ArriveCountError, match="sm80 ab empty"):
        one(DEFAULT, F16, F16, F32).arrive_counts()


def test_arrive_counts_follow_the_launched_consumer_warps():
    # A 160-thread launch of the 8-warp tile: its four consumer warps would never complete an
    # 8-arrival empty phase, and the epilogue barrier would wait for 256 threads.
    short = type("Short", (Sm80WsGemm,), {"threads": 160})
    with pytest.raises(ArriveCountError, match="4 \\(consumer warps\\)"):
        short(WIDE, F16, F16, F32).arrive_counts()
    four = type("Four", (Sm80WsGemm,), {"empty_barrier_arrivals": lambda self: 128})
    with pytest.raises(ArriveCountError, match="epilogue named barrier"):
        type("Both", (short, four), {})(WIDE, F16, F16, F32).arrive_counts()


# ---------------------------------------------------------------------------------------------
# Contract: names, dtypes


def test_contract_attributes():
    assert (Sm80WsGemm.name, Sm80WsGemm.arch, Sm80WsGemm.needs_vector_extent) == (
        "sm80",
        "sm_80",
        True,
    )
    assert Sm80MultistageGemm.name == "sm80-multistage"
    assert Sm80MultistageGemm.needs_vector_extent
    assert Sm80MultistageGemm(DEFAULT, F16, F16, F32).threads == 128
    assert Sm80MultistageGemm(WIDE, F16, F16, F32).threads == 256
    for cls in KERNELS:
        for section in ("Roles", "Pipelines", "Per-role timeline"):
            assert section in cls.__doc__


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "ab, c, acc, message",
    [
        (BF16, BF16, F16, "fp16 accumulation needs fp16 inputs"),
        (F32, F32, F32, "A/B dtype"),
        (F16, cutlass.Int8, F32, "C dtype"),
        (F16, F16, BF16, "accumulator dtype"),
    ],
)
def test_bad_dtypes_raise(kernel, ab, c, acc, message):
    with pytest.raises(ValueError, match=message):
        kernel(Sm80Config(), ab, c, acc)


@pytest.mark.parametrize("kernel", KERNELS)
def test_config_type_is_checked(kernel):
    with pytest.raises(ValueError, match="takes an Sm80Config"):
        kernel((128, 256, 32, 3), F16, F16, F32)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ab", [F16, BF16])
@pytest.mark.parametrize("c", [F16, BF16, F32])
def test_allowed_dtypes(kernel, ab, c):
    accs = [F32, F16] if ab is F16 else [F32]  # support.ACCUMULATOR_RULE
    for acc in accs:
        assert support.dtype_error(ab, c, acc) is None
        config = shipped_config(kernel.name, acc)
        k = kernel(config, ab, c, acc)
        assert (k.config, k.ab_dtype, k.c_dtype, k.acc_dtype) == (config, ab, c, acc)
        assert k.gpu_arch == "sm_80" and not k.trace
        # Every allowed C dtype fits the shipped ring on every target: the epilogue reuses it.
        assert k.shared_memory_bytes() <= smem_capacity_bytes()
        assert k.threads == config.mma_threads + (32 if kernel is Sm80WsGemm else 0)


# ---------------------------------------------------------------------------------------------
# Studied (non-shipped) configs compile spill-free with their hardware path (the sweep)

_M_K = dict(a_major="m", b_major="k")


@pytest.mark.sweep
@pytest.mark.parametrize(
    "backend, config, acc",
    [
        ("sm80", shipped_config("sm80", F16), "float16"),
        ("sm80-multistage", shipped_config("sm80-multistage", F16), "float16"),
        # The 160-thread default config (4 consumer warps of 64x128), fp16 accumulators.
        ("sm80", DEFAULT, "float16"),
        # Eight consumer warps of 48x64 keep fp32 accumulators within a 288-thread CTA's 168.
        ("sm80", Sm80Config(192, 128, 32, 4, mma_warps_m=4), "float32"),
        # The baseline with the unpredicated loop copy for interior tiles.
        ("sm80-multistage", dataclasses.replace(WIDE, fast_interior=1), "float16"),
        # 96-row tiles: the M-major A operand in 64-byte shared rows.
        ("sm80", Sm80Config(96, 128, 64, 3), "float32"),
        ("sm80-multistage", Sm80Config(96, 128, 64, 3), "float32"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_studied_config_compiles_for_sm80_without_spills(compiled, backend, config, acc):
    v = host.Variant(backend, "sm_80", "float16", "float16", acc, config=config, **_M_K)
    r = compiled(v).report
    assert_sm80_path(r, acc, config.mma_threads, specialized=backend == "sm80")
    assert_clean(r)


def test_ctas_per_sm_is_validated_and_becomes_launch_bounds():
    with pytest.raises(ValueError, match="ctas_per_sm"):
        Sm80Config(ctas_per_sm=5)
    assert Sm80Config(tile_n=128, ctas_per_sm=1).launch_bounds(160) == {}
    bounds = Sm80Config(tile_n=64, ctas_per_sm=2).launch_bounds(160)
    assert bounds["min_blocks_per_mp"] == 2 and bounds["max_number_threads"] == [160, 1, 1]


# ---------------------------------------------------------------------------------------------
# Launch grid


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("acc", [F32, F16])
def test_column_slices_keep_every_launch_within_grid_y(kernel, acc):
    # Grid y holds 65535 n tiles; a wider C goes out in launches over column slices.
    config = shipped_config(kernel.name, acc)
    cols = launch_columns(config)
    assert cols // config.tile_n == MAX_GRID_DIM[1] and cols % config.tile_n == 0
    for n in (8, cols - 8, cols, cols + 8, 3 * cols + 136):
        slices = column_slices(n, config)
        assert len(slices) == -(-n // cols)
        # Every column once, in order; every launch's n tiles fit grid y; every slice starts
        # on a whole tile (so on a 16-byte boundary) and is a whole number of vectors wide.
        assert [f for f, _ in slices] == list(range(0, n, cols))
        assert sum(w for _, w in slices) == n
        for first, width in slices:
            assert -(-width // config.tile_n) <= MAX_GRID_DIM[1]
            assert first % config.tile_n == 0 and width % 8 == 0
