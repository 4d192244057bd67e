"""GPU: kernels freshly compiled and kernels loaded from the on-disk cache, called on a side
stream and inside a CUDA graph (results checked after replay), and two processes filling one
empty cache at once (each variant compiled once, every entry loadable).

Tolerance as in test_gpu_correctness.py: twice PyTorch's own error against a float64 reference,
plus a small eps; outputs are poisoned with NaN first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from operands import assert_within_torch_error

import wsgemm
from wsgemm.host import COMPILE_CACHE
from wsgemm.host.compiling import cache

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
M, N, K = 257, 383, 129  # ragged: no tile divides them


def _forget_kernels() -> None:
    """A process with nothing in memory: the next call loads from disk or compiles."""
    from wsgemm import api

    COMPILE_CACHE.clear()
    api.DISPATCHER.forget()  # its launchers hold kernels too
    cache.reset()


@pytest.fixture(params=["fresh", "disk"])
def source(request, tmp_path, monkeypatch):
    """'fresh': the first call compiles; 'disk': it links the entry a previous process wrote."""
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("WSGEMM_DISK_CACHE", raising=False)
    _forget_kernels()
    if request.param == "disk":
        a, b = _operands(torch.float16, seed=99)
        wsgemm.matmul(a, b)
        torch.cuda.synchronize()
        assert list(tmp_path.glob("*/*.o")), "nothing was written to the disk cache"
        _forget_kernels()
    compiles = []
    compile_logged = cache.compile_logged

    def counted(variant):
        compiles.append(variant.key())
        return compile_logged(variant)

    monkeypatch.setattr(cache, "compile_logged", counted)
    yield request.param
    assert bool(compiles) == (request.param == "fresh"), compiles
    if request.param == "fresh":
        assert list(tmp_path.glob("*/*.o")), "the compiled kernel was not stored"
    _forget_kernels()


def _operands(dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=gen)
    return a, b


def _check(got, a, b):
    assert not torch.isnan(got).any(), "unwritten (poisoned) output elements"
    assert_within_torch_error(got, torch.matmul(a.double(), b.double()), torch.matmul(a, b))


def test_a_call_on_a_side_stream(source):
    a, b = _operands(torch.float16, seed=1)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wsgemm.matmul(a, b, out=out)
    side.synchronize()
    _check(out, a, b)


def test_a_call_captured_in_a_cuda_graph_and_replayed(source):
    a, b = _operands(torch.float16, seed=2)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture: this call compiles or loads
        wsgemm.matmul(a, b, out=out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wsgemm.matmul(a, b, out=out)
    new_a, new_b = _operands(torch.float16, seed=3)
    a.copy_(new_a)
    b.copy_(new_b)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, new_a, new_b)
    a.mul_(-0.5)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, new_a * -0.5, new_b)


_WORKER = textwrap.dedent("""
    import logging, sys
    import torch, wsgemm

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("wsgemm").addHandler(handler)
    logging.getLogger("wsgemm").setLevel(logging.INFO)
    for dtype in (torch.float16, torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(7)
        a = torch.randn(300, 200, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(200, 100, device="cuda", dtype=dtype, generator=gen)
        got = wsgemm.matmul(a, b).double()
        ref = a.double() @ b.double()
        err = (got - ref).abs().max().item()
        torch_err = ((a @ b).double() - ref).abs().max().item()
        assert err <= 2 * torch_err + 1e-6 * (ref.abs().max().item() + 1), (dtype, err)
    print(sum(m.startswith("compiled") for m in messages))
""")


def test_two_processes_fill_one_empty_cache_at_once(tmp_path):
    env = dict(
        os.environ,
        WSGEMM_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("WSGEMM_DISK_CACHE", None)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)

    def start():
        return subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    procs = [start(), start()]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
    compiles = [int(out.split()[-1]) for out, _ in results]
    assert sum(compiles) == 2, f"each of the 2 variants compiled once, got {compiles}"
    folder = tmp_path / "cache"
    assert len(list(folder.glob("*/*.o"))) == 2
    assert not list(folder.glob("*/*.tmp")) and not list(folder.glob("*/quarantine/*"))
    out, err = start().communicate(timeout=600)
    assert out.split()[-1] == "0", f"a third process compiled again: {err}"
