"""WSGEMM_AUTOTUNE on the GPU: the tuned call is right, its choice is stored and read back by a
new dispatcher without timing, every candidate it timed was a real kernel, and a call captured
in a CUDA graph neither tunes nor allocates (the policy's choice runs). CPU tests of the same
logic: tests/host/test_autotune.py."""

import pytest
import torch
from operands import assert_within_torch_error

from wsgemm.api import DISPATCHER, Dispatcher, dispatch
from wsgemm.host import choosing
from wsgemm.host.choosing import autotune

pytestmark = pytest.mark.gpu

F16, F32 = torch.float16, torch.float32


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 menu needs an sm_90 GPU")


class CountingTimer:
    def __init__(self):
        self.calls = 0

    def __call__(self, fn):
        self.calls += 1
        return choosing.time_cuda(fn)


def tuned(tmp_path):
    timer = CountingTimer()
    d = Dispatcher(DISPATCHER.cache, autotune=True, tuned=autotune.TunedStore(tmp_path),
                   time_call=timer)  # fmt: skip
    return d, timer


@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 6144, 4096), (128, 4096, 4096)])
def test_a_tuned_call_is_right_and_its_choice_kept(tmp_path, m, n, k):
    _hopper()
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=F16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=F16, generator=gen)
    d, timer = tuned(tmp_path)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=F16)
    got = dispatch.call(d, a, w.t(), out, None, F32, "auto", None)
    assert got is out and not torch.isnan(out).any()
    ref = torch.matmul(a.double(), w.t().double())
    assert_within_torch_error(out, ref, torch.matmul(a, w.t()))
    assert timer.calls >= 2
    problem, dtypes = (m, n, k, None), ("float16", "float16", "float32")
    choice = d.tuned_choice(0, problem, dtypes)
    assert choice is not None and choice.source == "tuned"

    d2, timer2 = tuned(tmp_path)
    got2 = dispatch.call(d2, a, w.t(), None, None, F32, "auto", None)
    assert timer2.calls == 0
    assert_within_torch_error(got2, ref, torch.matmul(a, w.t()))
    assert d2.route("auto", 0, problem, dtypes).choice.source == "tuned"


def test_a_call_captured_in_a_cuda_graph_does_not_tune(tmp_path):
    _hopper()
    a = torch.randn(16, 4096, device="cuda", dtype=F16)
    w = torch.randn(4096, 4096, device="cuda", dtype=F16)
    out = torch.empty(16, 4096, device="cuda", dtype=F16)
    d, timer = tuned(tmp_path)
    # compile the policy's kernel outside the capture (a first compile is not capturable)
    policy_route = d.route("auto", 0, (16, 4096, 4096, None), ("float16", "float16", "float32"))
    d.kernel(policy_route.backend, 0, ("float16", "float16", "float32"), "k", "k",
             policy_route.config)  # fmt: skip
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dispatch.call(d, a, w.t(), out, None, F32, "auto", None)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert timer.calls == 0 and not (tmp_path / "autotune").exists()
    assert_within_torch_error(out, torch.matmul(a.double(), w.t().double()), torch.matmul(a, w.t()))


def test_tune_times_a_model_layer_and_auto_runs_its_pick(tmp_path):
    """``wsgemm.tune`` on the GPU: every candidate timed (real times), the fastest stored, and
    a later ``auto`` call with autotuning on runs it, right."""
    _hopper()
    from wsgemm import config
    from wsgemm.api import tune

    timer = CountingTimer()  # autotuning left as the process has it: tune turns it on per call
    d = Dispatcher(DISPATCHER.cache, tuned=autotune.TunedStore(tmp_path), time_call=timer)
    (r,) = tune([(300, 4096, 4096)], dispatcher=d)
    assert timer.calls == len(r.times_ms) >= 2 and all(t > 0 for t in r.times_ms.values())
    assert r.times_ms[r.tuned_pick] == min(r.times_ms.values()) and r.gain >= 1.0
    a = torch.randn(300, 4096, device="cuda", dtype=F16)
    w = torch.randn(4096, 4096, device="cuda", dtype=F16)
    with config.autotune(True):
        choice = d.tuned_choice(0, (300, 4096, 4096, None), ("float16", "float16", "float32"))
        got = dispatch.call(d, a, w.t(), None, None, F32, "auto", None)
    assert f"{choice.menu_entry.name}/{choice.split}" == r.tuned_pick
    assert timer.calls == len(r.times_ms)  # read, not timed again
    assert_within_torch_error(got, torch.matmul(a.double(), w.t().double()), torch.matmul(a, w.t()))
