"""The chooser between ``auto``'s kernel and torch.matmul on the GPU (``choosing.route_choice``):
the first call races the two with CUDA events, the result is right whichever won, the decision
is stored and read back by a new dispatcher without timing, and a call captured in a CUDA graph
neither races nor stores. Off Hopper the sm80 kernel races (no table measured it); on an sm_90
GPU the study mode (``against_torch=True``) races the policy's sm90 choice, which is the
issue-27 measurement: run with ``-s --log-cli-level=INFO`` to see the medians. CPU tests of the
same logic: tests/host/test_route_choice.py."""

import pytest
import torch
from operands import assert_within_torch_error

from wsgemm import support
from wsgemm.api import DISPATCHER, Dispatcher, dispatch
from wsgemm.host import choosing
from wsgemm.host.choosing import autotune, route_choice
from wsgemm.host.dispatch import TORCH

pytestmark = pytest.mark.gpu

F16, F32 = torch.float16, torch.float32
DTYPES = ("float16", "float16", "float32")


class CountingTimer:
    def __init__(self):
        self.calls = 0

    def __call__(self, fn):
        self.calls += 1
        return choosing.time_cuda(fn)


def _racing(tmp_path, autotune_on=True):
    """A dispatcher on this GPU that races ``auto``'s kernel against torch.matmul."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cc = torch.cuda.get_device_capability()
    row = support.target(cc)
    if row is None or row.auto_torch:
        pytest.skip(f"no wsgemm kernel runs auto on sm_{cc[0]}{cc[1]}")
    timer = CountingTimer()
    d = Dispatcher(
        DISPATCHER.cache, autotune=autotune_on, tuned=autotune.TunedStore(tmp_path),
        time_call=timer, against_torch=True if cc == (9, 0) else None,
    )  # fmt: skip
    return d, timer


def _operands(m, n, k, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=F16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=F16, generator=gen)
    return a, w.t()


@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (128, 4096, 4096), (4096, 4096, 4096)])
def test_the_race_is_right_stored_and_reused(tmp_path, m, n, k):
    a, b = _operands(m, n, k, m + n + k)
    ref, theirs = torch.matmul(a.double(), b.double()), torch.matmul(a, b)
    d, timer = _racing(tmp_path)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=F16)
    assert dispatch.call(d, a, b, out, None, F32, "auto", None) is out
    assert not torch.isnan(out).any()
    assert_within_torch_error(out, ref, theirs)
    raced = timer.calls  # on sm_90 the sm90 tuner's timings first, then the race
    assert raced >= 2 * route_choice.ROUNDS
    name, sms = d.devices.name(0), d.devices.sm_count(0)
    record = d.tuned.record(name, sms, route_choice.key(m, n, k, 1, DTYPES))
    assert record["entry"] in (TORCH, "sm80", "sm90") and TORCH in record["ms"]
    print(f"M={m} N={n} K={k}: {record}")
    route = d.route("auto", 0, (m, n, k, None), DTYPES)
    assert route.backend == TORCH if record["entry"] == TORCH else route.backend != TORCH

    # the same signature, then a new dispatcher (another process) on the same store: no timing
    assert_within_torch_error(dispatch.call(d, a, b, None, None, F32, "auto", None), ref, theirs)
    d2, timer2 = _racing(tmp_path)
    got = dispatch.call(d2, a, b, None, None, F32, "auto", None)
    assert timer.calls == raced and timer2.calls == 0
    assert_within_torch_error(got, ref, theirs)
    assert d2.route("auto", 0, (m, n, k, None), DTYPES).backend == route.backend
    assert "route: stored measurement" in d2.explain("auto", 0, (m, n, k, None), DTYPES)


def test_a_captured_call_does_not_race(tmp_path):
    a, b = _operands(16, 4096, 4096, 7)
    out = torch.empty(16, 4096, device="cuda", dtype=F16)
    d, timer = _racing(tmp_path)
    torch.matmul(a, b)  # cuBLAS's handle and workspace exist before the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dispatch.call(d, a, b, out, None, F32, "auto", None)  # the default: torch.matmul
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert timer.calls == 0 and not (tmp_path / "autotune").exists() and not d.launchers
    assert_within_torch_error(out, torch.matmul(a.double(), b.double()), torch.matmul(a, b))
    dispatch.call(d, a, b, None, None, F32, "auto", None)  # eager: races now
    assert timer.calls >= 2 * route_choice.ROUNDS


def test_autotune_off_runs_torch_untimed(tmp_path):
    a, b = _operands(256, 1024, 512, 3)
    d, timer = _racing(tmp_path, autotune_on=False)
    got = dispatch.call(d, a, b, None, None, F32, "auto", None)
    assert timer.calls == 0 and d.route("auto", 0, (256, 1024, 512, None), DTYPES).backend == TORCH
    assert torch.equal(got, torch.matmul(a, b))


def test_with_nothing_set_the_race_runs_and_the_menu_is_not_tuned(tmp_path, monkeypatch):
    """The default (no setting, ``WSGEMM_AUTOTUNE`` unset): the race against torch.matmul runs
    (issue #27), the sm90 menu's tuning does not, so the timer sees the race's rounds alone."""
    monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    autotune.environment.cache_clear()
    try:
        a, b = _operands(256, 4096, 4096, 5)
        d, timer = _racing(tmp_path, autotune_on=None)
        assert d.races and not d.autotune
        got = dispatch.call(d, a, b, None, None, F32, "auto", None)
        assert timer.calls == 2 * route_choice.ROUNDS
        assert_within_torch_error(got, torch.matmul(a.double(), b.double()), torch.matmul(a, b))
        name, sms = d.devices.name(0), d.devices.sm_count(0)
        record = d.tuned.record(name, sms, route_choice.key(256, 4096, 4096, 1, DTYPES))
        assert TORCH in record["ms"] and len(record["ms"]) == 2
        print(f"nothing set, M=256 N=4096 K=4096: {record}")
    finally:
        autotune.environment.cache_clear()
