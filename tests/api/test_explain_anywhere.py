"""``wsgemm.explain`` without a GPU (issue #27 item 6): meta and fake tensors, a stand-in GPU
named by ``cc`` and ``sm_count``, zero sizes; the CLI's ``explain --shape`` with a zero size."""

import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import wsgemm

F16 = torch.float16


def meta(*shape):
    return torch.empty(*shape, dtype=F16, device="meta")


def test_meta_tensors_get_a_stand_in_h200_without_a_gpu():
    text = wsgemm.explain(meta(300, 4096), meta(4096, 8192))
    assert "sm_90 with 132 SMs" in text and "kernel: " in text


@pytest.mark.parametrize(
    "cc, sms, kernel",
    [((8, 9), 128, "kernel: torch.matmul (not the sm80 kernel)"),
     ((10, 0), 148, "torch.matmul (fallback)"),
     ((9, 0), 114, "backend sm90")],
)  # fmt: skip
def test_cc_and_sm_count_answer_for_another_gpu(cc, sms, kernel):
    text = wsgemm.explain(meta(300, 4096), meta(4096, 8192), cc=cc, sm_count=sms)
    assert f"sm_{cc[0]}{cc[1]} with {sms} SMs" in text and kernel in text


def test_fake_cuda_tensors_and_zero_sizes():
    with FakeTensorMode():
        a = torch.empty(0, 64, dtype=F16, device="cuda")
        b = torch.empty(64, 128, dtype=F16, device="cuda")
        text = wsgemm.explain(a, b)
    assert "M=0 N=128 K=64" in text
    assert "K=0" in wsgemm.explain(meta(16, 0), meta(0, 32)) and "zeros" in wsgemm.explain(
        meta(16, 0), meta(0, 32)
    )


@pytest.mark.parametrize(
    "kw, error", [(dict(cc=9), TypeError), (dict(cc=(9, "0")), TypeError),
                  (dict(sm_count=0), ValueError)],
)  # fmt: skip
def test_a_bad_stand_in_is_refused(kw, error):
    with pytest.raises(error):
        wsgemm.explain(meta(8, 8), meta(8, 8), **kw)


def test_the_cli_explains_a_zero_size():
    out = subprocess.run(
        [sys.executable, "-m", "wsgemm", "explain", "--shape", "0,4096,4096"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "empty" in out


def test_explain_says_when_batch_invariance_cannot_be_kept():
    """fp32 inputs (or a GPU without a wsgemm kernel) run torch.matmul, which does not promise
    batch invariance: explain says so rather than staying silent."""
    a = torch.empty(16, 32, dtype=torch.float32, device="meta")
    b = torch.empty(32, 64, dtype=torch.float32, device="meta")
    with wsgemm.config.batch_invariant(True):
        text = wsgemm.explain(a, b)
    assert "torch.matmul (fallback)" in text and "batch invariance: asked for" in text
    assert "batch invariance" not in wsgemm.explain(a, b)


def test_the_cli_explains_a_grouped_call_with_its_tile_map(capsys):
    """``explain --groups``: grouped_mm's 2D x 3D form of those group rows, its kernel and its
    tile map (in process: the subprocess of the test above costs an import of torch)."""
    from wsgemm import cli

    assert cli.main(["explain", "--shape", "700,512,64", "--groups", "300,0,1,389",
                     "--dtype", "bf16"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "wsgemm.grouped_mm of 4 groups" in out and "grouped (ragged M)" in out
    assert "group 3: rows 301-689 (389): 4 x 4 tiles" in out and "tile map" in out
    assert cli.main(["explain", "--shape", "7,512,64", "--groups", "300,0"]) != 0
    assert "more than M=7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["explain", "--shape", "7,512,64", "--groups", "3,-1"])
