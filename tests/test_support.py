"""The support rules and hardware facts: one table, every vocabulary, no DSL or torch at import."""

import subprocess
import sys

import cutlass
import pytest
import torch

from wsgemm import support


@pytest.mark.parametrize("name", support.ELEMENT_BYTES)
def test_every_vocabulary_names_the_same_dtype(name):
    spellings = (
        name,
        support.SHORT_NAMES[name],
        getattr(torch, name),
        support.cutlass_dtype(name),
    )
    assert {support.dtype_name(s) for s in spellings} == {name}
    assert support.torch_dtype(support.short_name(name)) is getattr(torch, name)
    assert support.element_bytes(name) * 8 == support.cutlass_dtype(name).width
    assert support.vector_elems(name) * support.element_bytes(name) == support.VECTOR_BYTES


@pytest.mark.parametrize("dtype", ["int8", torch.int8, cutlass.Int8, "fp8", None])
def test_unknown_dtype_says_what_is_known(dtype):
    with pytest.raises(ValueError, match="known: float16, bfloat16, float32"):
        support.dtype_name(dtype)


# What a user may type for each dtype on any command line.
TYPED = {
    "float16": ("fp16", "float16", "half", "FP16", "Float16"),
    "bfloat16": ("bf16", "bfloat16", "BF16"),
    "float32": ("fp32", "float32"),
}


@pytest.mark.parametrize("vocabulary", [lambda d: d, support.short_name], ids=["long", "short"])
@pytest.mark.parametrize("allowed", [support.AB_DTYPES, support.C_DTYPES, support.ACC_DTYPES])
def test_a_dtype_option_takes_every_spelling_and_answers_in_its_own(allowed, vocabulary):
    import argparse

    own = tuple(vocabulary(d) for d in allowed)
    parse = support.dtype_option(own)
    for name, typed in TYPED.items():
        for text in typed:
            if name in allowed:
                assert parse(text) == vocabulary(name)
            else:
                with pytest.raises(argparse.ArgumentTypeError, match=f"got '{text}'"):
                    parse(text)
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse("fp8")
    for name in allowed:  # the error names each allowed dtype, as the option spells it first
        assert f"{vocabulary(name)} (" in str(info.value)


@pytest.mark.parametrize("ab", support.AB_DTYPES)
@pytest.mark.parametrize("acc", support.ACC_DTYPES)
def test_accumulator_rule_is_one_function_in_every_vocabulary(ab, acc):
    allowed = support.accumulator_allowed(ab, acc)
    assert allowed == (acc == "float32" or ab == "float16")
    for spell in (support.short_name, support.torch_dtype, support.cutlass_dtype):
        assert support.accumulator_allowed(spell(ab), spell(acc)) == allowed
    assert (support.dtype_error(ab, "float32", acc) is None) == allowed


@pytest.mark.parametrize(
    "ab, c, acc, message",
    [
        ("bfloat16", "float16", "float16", "fp16 accumulation needs fp16 inputs"),
        ("float32", "float32", "float32", "A/B dtype float32 is not supported"),
        (torch.float16, torch.int8, torch.float32, "C dtype torch.int8 .* allowed: float16"),
        (cutlass.Float16, cutlass.Float16, cutlass.BFloat16, "accumulator dtype BFloat16"),
    ],
)
def test_check_dtypes_says_what_is_allowed(ab, c, acc, message):
    with pytest.raises(ValueError, match=message):
        support.check_dtypes(ab, c, acc)


def test_hardware_facts_agree_with_each_other():
    assert support.THREADS_PER_WARPGROUP == support.WARP_SIZE * support.WARPS_PER_WARPGROUP
    assert support.VECTOR_BITS == 8 * support.VECTOR_BYTES
    assert support.smem_per_block("sm_90a") == 227 * 1024
    assert min(support.SMEM_PER_BLOCK.values()) == support.smem_per_block("sm_89")
    with pytest.raises(ValueError, match="unknown target 'sm_100'; known: sm_80, "):
        support.smem_per_block("sm_100")
    ids = [int(b) for b in support.BarrierId]
    assert ids[0] == 0 and len(set(ids)) == len(ids)
    # Ping-pong uses base + warpgroup (0 or 1): the ranges of two ids must not overlap.
    per_warpgroup = [support.BarrierId.EPILOGUE, support.BarrierId.MMA_ORDER]
    per_warpgroup.append(support.BarrierId.EPI_ORDER)
    spans = {b + wg for b in per_warpgroup for wg in (0, 1)}
    assert len(spans) == 2 * len(per_warpgroup) and max(spans) < 16  # 16 named barriers


def test_smem_per_block_is_one_row_per_target():
    kib = 1024
    # The CUDA programming guide's maximum shared memory per thread block (the SM's less the
    # 1 KiB the driver reserves per block), per target.
    guide = {
        "sm_80": 163, "sm_86": 99, "sm_87": 163, "sm_89": 99, "sm_90a": 227,
        "sm_100a": 227, "sm_103a": 227, "sm_110a": 227, "sm_120a": 99, "sm_121a": 99,
    }  # fmt: skip
    assert support.SMEM_PER_BLOCK == {arch: n * kib for arch, n in guide.items()}
    assert support.SMEM_PER_BLOCK == {t.arch: t.smem_per_block for t in support.TARGETS}
    assert len({t.cc for t in support.TARGETS}) == len(support.TARGETS)
    for t in support.TARGETS:  # each target's name is its compute capability's
        assert support.arch_major(t.arch) == t.cc[0]
        assert t.arch.rstrip("a") == support.cc_name(t.cc)
        assert support.target(t.cc) is t
    assert support.archs_from(8) == tuple(guide)
    assert support.archs_from(10) == ("sm_100a", "sm_103a", "sm_110a", "sm_120a", "sm_121a")
    assert support.smallest_smem_per_block(support.archs_from(8)) == 99 * kib
    assert support.smallest_smem_per_block(["sm_80", "sm_87", "sm_90a"]) == 163 * kib
    with pytest.raises(ValueError, match="unknown target 'sm_75'"):
        support.smallest_smem_per_block(["sm_80", "sm_75"])
    assert support.has_mbarrier_try_wait("sm_120a") and not support.has_mbarrier_try_wait("sm_87")


def test_targets_say_where_each_family_runs_and_what_auto_runs():
    assert support.target((7, 5)) is None and support.target((8, 8)) is None
    assert support.family_gpus("sm90") == "sm_90 (H100, H200, GH200)"
    assert support.family_gpus("sm80").startswith("sm_80 (A100, A30), sm_86 (")
    assert all("sm80" in t.families for t in support.TARGETS)
    # auto runs torch.matmul on the tcgen05 GPUs and a wsgemm kernel everywhere else
    torch_ccs = {t.cc for t in support.TARGETS if t.auto_torch}
    assert torch_ccs == {(10, 0), (10, 3), (11, 0)}
    assert all(t.auto_torch == support.TCGEN05_REASON for t in support.TARGETS if t.auto_torch)


def test_import_wsgemm_loads_neither_the_dsl_nor_kernels():
    code = (
        "import sys, wsgemm, wsgemm.support, wsgemm.host; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass' "
        "or m.startswith('wsgemm.kernels')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
