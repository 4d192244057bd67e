"""``Sm90Config.epilogue_whole_tile`` (docs/perf.md entry 103): a cooperative tile's plain
epilogue with a shared-memory buffer for every output subtile. What it takes (the schedule, the
epilogues), what it costs the ring, and that the compile key of every other config is what it
was. Its SASS: ``test_compile_sass.test_whole_tile_epilogue_meets_twice_a_tile``; on the GPU:
``tests/gpu/test_gpu_epilogue.py -k whole_tile``."""

import dataclasses

import cutlass
import pytest
from script_modules import load

from wsgemm.kernels.epilogue import Epilogue
from wsgemm.kernels.sm90.config import Sm90Config
from wsgemm.kernels.sm90.kernel import Sm90Gemm

F16, F32 = cutlass.Float16, cutlass.Float32
WHOLE = Sm90Config(epilogue_whole_tile=True)  # the shipped 128x256 cooperative tile


def test_it_is_a_cooperative_tile_s_and_a_bool():
    with pytest.raises(ValueError, match="epilogue_whole_tile must be a bool"):
        Sm90Config(epilogue_whole_tile=1)
    with pytest.raises(ValueError, match="needs schedule='cooperative'"):
        Sm90Config(tile_m=64, tile_n=128, schedule="pingpong", epilogue_whole_tile=True)


def test_the_compile_key_of_every_other_config_is_unchanged():
    assert "epilogue_whole_tile" not in repr(Sm90Config())
    assert repr(WHOLE).endswith("epilogue_whole_tile=True)")
    assert WHOLE != Sm90Config() and hash(WHOLE) != hash(Sm90Config())


@pytest.mark.parametrize(
    "config, out_bytes, stages",
    [
        (WHOLE, 2, (3, 8)),  # 48 KB stages; 8 x 8 KB buffers
        (WHOLE, 4, (2, 8)),  # fp32 out: 8 x 16 KB
        (Sm90Config(), 2, (4, 4)),  # the buffers taken in turn
        (Sm90Config(tile_n=192, cluster_m=2, epilogue_whole_tile=True), 2, (4, 6)),
        (Sm90Config(tile_n=160, swap_ab=True, cluster_m=2, epilogue_whole_tile=True), 2, (5, 5)),
        (Sm90Config(tile_m=256, tile_n=160, epilogue_whole_tile=True), 4, None),
    ],
)
def test_the_buffers_come_off_the_ring(config, out_bytes, stages):
    """Every subtile's buffer first, then the ring's stages; fewer than two refused, as the
    kernel is when built. The kernel budgets with the same function."""
    if stages is None:
        with pytest.raises(ValueError, match="at least 2 are needed"):
            config.plain_stage_counts(2, out_bytes)
        return
    assert config.plain_stage_counts(2, out_bytes) == stages
    c_dtype = F16 if out_bytes == 2 else F32
    assert Sm90Gemm(config, F16, c_dtype, F32).stage_counts() == stages


@pytest.mark.parametrize(
    "epilogue",
    [
        Epilogue(residual=True),
        Epilogue(residual=True, c_tensor=True),
        Epilogue(activation="gelu", preact=True),
        Epilogue(activation="silu", gated=True),
        Epilogue(activation="silu", dgated=True),
        Epilogue(activation="relu", dact=True),
    ],
    ids=lambda e: e.name,
)
def test_only_the_plain_store_path_takes_it(epilogue):
    """A C read, a stored pre-activation or a gated output has its own subtile loop: refused
    (it would change only the compile key). Bias, activation and alpha take it."""
    with pytest.raises(ValueError, match="epilogue_whole_tile is the plain store path's"):
        Sm90Gemm(WHOLE, F16, F16, F32, epilogue=epilogue)
    with pytest.raises(ValueError, match="no tracing"):
        Sm90Gemm(WHOLE, F16, F16, F32, trace=True)
    for fine in (Epilogue(), Epilogue(bias="col", activation="gelu_tanh", scale=True)):
        assert Sm90Gemm(WHOLE, F16, F16, F32, epilogue=fine).stage_counts() == (3, 8)


def test_the_tuner_times_it_on_the_cooperative_entries():
    """``tune_menu.WHOLE_TILE``: each cooperative menu entry with the whole-tile epilogue, where
    the ring keeps three stages with a 16-bit output (``--with-whole-tile``)."""
    tune_menu = load("tune_menu")
    names = [e.name for e in tune_menu.WHOLE_TILE]
    assert "wt-sm90" in names and "wt-swap-cooperative-128x208-c2x1" in names
    assert "wt-cooperative-256x160-c1x2" not in names  # two stages: left out
    for e in tune_menu.WHOLE_TILE:
        plain = tune_menu.entry(e.name.removeprefix("wt-"))
        assert e.config == {**plain.config, "epilogue_whole_tile": True}
        assert e.splits == plain.splits and e.backend == plain.backend
        assert tune_menu.entry(e.name) is e
        assert e.variant_config().plain_stage_counts()[0] >= 3
        if e.splits:  # its split form compiles as the split kernel, whole-tile still
            assert e.variant_config(split=True) == dataclasses.replace(
                e.variant_config(), split_k=0
            )
