"""Host-side checks of the sm80 kernels: configs, budgets, arrive counts, dtypes (no GPU)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import cutlass
import pytest

from wsgemm.kernels.sm80_multistage import Sm80MultistageGemm
from wsgemm.kernels.sm80_ws import Sm80WsGemm
from wsgemm.runtime.arrive import ArriveCountError
from wsgemm.runtime.sm80_tiles import (
    BUFFER_ALIGN_BYTES,
    MAX_REGISTERS_PER_THREAD,
    SHIPPED_CONFIGS,
    SHIPPED_FP16_ACC_CONFIGS,
    Sm80Config,
    ab_smem_bytes,
    accumulator_registers,
    barrier_bytes,
    epilogue_smem_bytes,
    epilogue_tile_n,
    mainloop_registers,
    shipped_config,
    smem_bytes,
    smem_capacity_bytes,
)

F16, BF16, F32 = cutlass.Float16, cutlass.BFloat16, cutlass.Float32
KERNELS = (Sm80WsGemm, Sm80MultistageGemm)


# ---------------------------------------------------------------------------------------------
# Config validation


def test_default_config_is_the_study_tile():
    assert Sm80Config().tile_shape_mnk == (128, 256, 32)
    assert Sm80Config().stages == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tile_m": 96}, "tile_m=96"),
        ({"tile_n": 32}, "tile_n=32"),
        ({"tile_k": 16}, "tile_k=16"),
        ({"tile_k": 48}, "tile_k=48"),
        ({"stages": 2}, r"stages=2 must be in \[3, 8\]"),
        ({"stages": 9}, r"stages=9 must be in \[3, 8\]"),
        ({"tile_m": 128.0}, "must be an int"),
        ({"stages": True}, "must be an int"),
        ({"tile_m": 256, "tile_n": 256, "tile_k": 64, "stages": 3}, "bytes of shared memory"),
    ],
)
def test_bad_config_raises_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sm80Config(**kwargs)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sm80Config().stages = 4


# ---------------------------------------------------------------------------------------------
# Shared-memory budget


@pytest.mark.parametrize("c_dtype", [F16, BF16, F32])
@pytest.mark.parametrize("config", [Sm80Config(), Sm80Config(128, 128, 32, 4)], ids=str)
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


def test_budget_numbers_of_the_two_shipped_tiles():
    big, small = Sm80Config(), Sm80Config(128, 128, 32, 4)
    assert ab_smem_bytes(big, F16) == 3 * (128 + 256) * 32 * 2 == 73728
    assert ab_smem_bytes(small, F16) == 65536
    # fp32 C of 128x256 is 128 KiB: two passes of 128 columns through the 72 KiB ring.
    assert epilogue_tile_n(big, F16, F32) == 128
    assert epilogue_tile_n(big, F16, F16) == 256
    assert epilogue_tile_n(small, F16, F32) == 128
    assert smem_bytes(big, F16, F32, barrier_stages=3) == 1024 + 73728 + 48


@pytest.mark.parametrize("table", [SHIPPED_CONFIGS, SHIPPED_FP16_ACC_CONFIGS])
def test_shipped_configs_fit_every_sm80_family_gpu(table):
    assert set(table) == {"sm80", "sm80-multistage"}
    for config in table.values():
        for c_dtype in (F16, BF16, F32):
            assert smem_bytes(config, F16, c_dtype, barrier_stages=config.stages) <= 101376


# ---------------------------------------------------------------------------------------------
# Registers


def test_fp32_accumulators_of_128x256_cannot_fit_255_registers():
    big = Sm80Config()
    assert accumulator_registers(big, F32) == 256
    assert mainloop_registers(big, F32) > MAX_REGISTERS_PER_THREAD
    assert mainloop_registers(big, F16) < MAX_REGISTERS_PER_THREAD


@pytest.mark.parametrize("name", ["sm80", "sm80-multistage"])
@pytest.mark.parametrize("acc", [F32, F16])
def test_shipped_config_leaves_register_headroom(name, acc):
    config = shipped_config(name, acc)
    # Addresses, predicates and loop state need the rest (measured in SASS: <= 240 in all).
    assert mainloop_registers(config, acc) <= MAX_REGISTERS_PER_THREAD - 30
    # Only the WS kernel's MMA threads are free of load state: they alone fit 128x256.
    assert config.tile_n == (256 if acc is F16 and name == "sm80" else 128)


def test_shipped_config_unknown_name():
    with pytest.raises(ValueError, match="no sm80 kernel named"):
        shipped_config("sm90", F32)


# ---------------------------------------------------------------------------------------------
# Arrive counts


def test_ws_arrive_counts_are_derived_from_the_roles():
    kernel = Sm80WsGemm(Sm80Config(), F16, F16, F32)
    assert kernel.arrive_counts() == (32, 4)
    assert kernel.THREADS == 160


@pytest.mark.parametrize(
    "attribute, wrong, barrier",
    [
        ("FULL_BARRIER_ARRIVALS", 1, "sm80 ab full"),
        ("EMPTY_BARRIER_ARRIVALS", 128, "sm80 ab empty"),
        ("EMPTY_BARRIER_ARRIVALS", 3, "sm80 ab empty"),
    ],
)
def test_wrong_arrive_count_raises(attribute, wrong, barrier):
    broken = type("Broken", (Sm80WsGemm,), {attribute: wrong})
    with pytest.raises(ArriveCountError, match=barrier):
        broken(Sm80Config(), F16, F16, F32).arrive_counts()


def test_arrive_count_follows_the_consumer_warps():
    # Five consumer warps would need five empty arrivals: the count is checked, not assumed.
    five = type("Five", (Sm80WsGemm,), {"CONSUMER_WARPS": 5})
    with pytest.raises(ArriveCountError, match="5 \\(consumer warps\\)"):
        five(Sm80Config(), F16, F16, F32).arrive_counts()


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
    assert Sm80MultistageGemm.THREADS == 128
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
    kernel(shipped_config(kernel.name, F32), ab, c, F32)
    if ab is F16:
        kernel(shipped_config(kernel.name, F16), ab, c, F16)


# ---------------------------------------------------------------------------------------------
# Compile for sm_80 without a GPU and read the SASS (slow: a few seconds per kernel)

_COMPILE = textwrap.dedent(
    """
    import sys
    import cutlass, cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.runtime import make_fake_stream
    from wsgemm.kernels.{module} import {cls} as Kernel
    from wsgemm.runtime.sm80_tiles import shipped_config

    def operand(dtype, unit_first):
        x, k, l = cute.sym_int64(), cute.sym_int64(), cute.sym_int64()
        ld, bs = cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8)
        stride = (1, ld, bs) if unit_first else (ld, 1, bs)
        return make_fake_tensor(dtype, (x, k, l), stride, assumed_align=16)

    f16, f32 = cutlass.Float16, cutlass.Float32
    kernel = Kernel(shipped_config(Kernel.name, f32), f16, f16, f32)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    cute.compile(kernel.kernel, operand(f16, True), operand(f16, False), operand(f16, False),
                 cutlass.Int32(1), stream, options="--enable-tvm-ffi")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, cls, needs",
    [
        (
            "sm80_ws",
            "Sm80WsGemm",
            ("ATOMS.ARRIVE", "ARRIVES.LDGSTSBAR", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80"),
        ),
        (
            "sm80_multistage",
            "Sm80MultistageGemm",
            ("LDGDEPBAR", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80"),
        ),
    ],
)
def test_compiles_for_sm80_without_spills(tmp_path: Path, module, cls, needs):
    env = dict(
        os.environ,
        CUTE_DSL_ARCH="sm_80",
        CUTE_DSL_KEEP="sass",
        CUTE_DSL_DUMP_DIR=str(tmp_path),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    script = _COMPILE.format(module=module, cls=cls)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=600)
    (sass_file,) = tmp_path.glob("*.sass")
    sass = sass_file.read_text()
    opcodes = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    assert not [op for op in opcodes if op.startswith(("LDL", "STL"))], "register spills"
    for prefix in ("HMMA.16816.F32", "LDGSTS.E.BYPASS.LTC128B.128", "LDSM.16.M88.4", "STG.E.128"):
        assert prefix in opcodes
    for text in needs:
        assert text in sass
    if module == "sm80_ws":
        # One block-wide barrier (start-up), none in the main loop.
        assert sass.count("BAR.SYNC.DEFER_BLOCKING 0x0 ") == 1


def test_ctas_per_sm_is_validated_and_becomes_launch_bounds():
    from wsgemm.runtime.sm80_tiles import Sm80Config

    with pytest.raises(ValueError, match="ctas_per_sm"):
        Sm80Config(ctas_per_sm=5)
    assert Sm80Config(tile_n=128, ctas_per_sm=1).launch_bounds(160) == {}
    bounds = Sm80Config(tile_n=64, ctas_per_sm=2).launch_bounds(160)
    assert bounds["min_blocks_per_mp"] == 2 and bounds["max_number_threads"] == [160, 1, 1]
