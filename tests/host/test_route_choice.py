"""The measured chooser between ``auto``'s kernel and torch.matmul where no table measured the
kernel (``choosing.route_choice``), on the CPU: a stand-in Ampere GPU whose kernel is a float64
product and whose timer is told what each side costs. The winner is stored per GPU model and
bucket and reused without timing; a call that cannot be timed (capture, tracing) or autotuning
off takes the default, torch.matmul; Hopper with its shipped table never races."""

import logging
import types
import warnings

import pytest
import torch
from stand_ins import StandInCache, reference
from torch._subclasses.fake_tensor import FakeTensorMode

from wsgemm.api import Dispatcher, dispatch
from wsgemm.host import choosing
from wsgemm.host.choosing import autotune, route_choice
from wsgemm.host.dispatch import TORCH, StandInDevices

F16, F32 = torch.float16, torch.float32
DTYPES = ("float16", "float16", "float32")
M, N, K = 64, 96, 32
AMPERE = (8, 6)


class RaceTimer:
    """``time_call`` for the stand-in: runs the timed callable once; a stand-in kernel launch
    means the sm80 side, none torch.matmul's; answers the cost given for that side (an
    exception is raised)."""

    def __init__(self, kernel, costs):
        self.kernel, self.costs, self.timed = kernel, costs, []

    def __call__(self, fn):
        before = len(self.kernel.launches)
        fn()
        side = "sm80" if len(self.kernel.launches) > before else TORCH
        self.timed.append(side)
        cost = self.costs.get(side, 1.0)
        if isinstance(cost, Exception):
            raise cost
        return cost


def dispatcher(tmp_path, costs=None, cc=AMPERE, **options):
    cache = StandInCache()
    timer = RaceTimer(cache.kernel, costs or {})
    options = {"autotune": True, "tuned": autotune.TunedStore(tmp_path), **options}
    d = Dispatcher(cache, StandInDevices(cc, 84, name="a stand-in RTX 3090"), time_call=timer,
                   **options)  # fmt: skip
    return d, timer


def operands(m=M, n=N, k=K, dtype=F16):
    gen = torch.Generator().manual_seed(m * 7 + n)
    return (torch.randint(-3, 4, s, generator=gen).to(dtype) for s in ((m, k), (k, n)))


def call(d, a, b, out=None, accumulate=F32):
    return dispatch.call(d, a, b, out, None, accumulate, "auto", None)


def stored(d, m=M, n=N, k=K, batch=1):
    return d.tuned.record("a stand-in RTX 3090", 84, route_choice.key(m, n, k, batch, DTYPES))


@pytest.mark.parametrize(
    "costs, winner", [({"sm80": 2.0, TORCH: 1.0}, TORCH), ({"sm80": 0.5, TORCH: 1.0}, "sm80")]
)
def test_the_first_call_races_and_the_winner_runs_and_is_stored(tmp_path, costs, winner, caplog):
    d, timer = dispatcher(tmp_path, costs)
    a, b = operands()
    caplog.set_level(logging.INFO, logger="wsgemm")
    got = call(d, a, b)
    # interleaved rounds, the order reversed every other round
    assert timer.timed == ["sm80", TORCH, TORCH, "sm80"] * 2 + ["sm80", TORCH]
    assert len(timer.timed) == 2 * route_choice.ROUNDS
    record = stored(d)
    assert record["entry"] == winner and record["ms"] == costs
    torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    launches = len(d.cache.kernel.launches)
    call(d, a, b)  # the winner runs: the kernel launches only when it won
    assert len(d.cache.kernel.launches) == launches + (winner == "sm80")
    (line,) = [r.getMessage() for r in caplog.records if "measured" in r.getMessage()]
    assert "sm80 against torch.matmul for M=64 N=96 K=32" in line
    runs = "torch.matmul" if winner == TORCH else "the sm80 kernel"
    assert f"runs {runs} from now on" in line and "1.0000 ms" in line


def test_a_decision_is_reused_without_measuring_again(tmp_path, monkeypatch):
    d, timer = dispatcher(tmp_path, {"sm80": 2.0, TORCH: 1.0})
    a, b = operands()
    call(d, a, b)
    measured = len(timer.timed)
    # the same signature: its launcher, no route asked, no store read (the hot path)
    with monkeypatch.context() as m:
        m.setattr(d, "route", lambda *args, **kw: pytest.fail("routed twice"))
        m.setattr(d.tuned, "record", lambda *args: pytest.fail("store read on the hot path"))
        torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
    # another signature of the same bucket (M in the same block, out=): the stored decision
    a2, b2 = operands(m=M - 3)
    call(d, a2, b2, out=torch.empty(M - 3, N, dtype=F16))
    # another dispatcher (another process) on the same store
    d2, timer2 = dispatcher(tmp_path, {"sm80": 0.1})
    torch.testing.assert_close(call(d2, a, b), reference(a, b), rtol=0, atol=0)
    assert len(timer.timed) == measured and timer2.timed == []
    assert d2.route("auto", None, (M, N, K, None), DTYPES).backend == TORCH
    # another bucket races again
    call(d, *operands(n=2 * N))
    assert len(timer.timed) == 2 * measured


def test_a_call_that_cannot_be_timed_takes_the_default_and_keeps_no_launcher(tmp_path, monkeypatch):
    """Captured or traced first calls get no ``run`` (``_may_tune``): the default runs, nothing
    is stored, and the signature keeps no launcher, so the next eager call races."""
    d, timer = dispatcher(tmp_path, {"sm80": 0.5, TORCH: 1.0})
    a, b = operands()
    with monkeypatch.context() as m:
        m.setattr(dispatch, "_may_tune", lambda t: False)  # as under a capture
        torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
        route = d.route("auto", None, (M, N, K, None), DTYPES)
    assert (route.backend, route.keep) == (TORCH, False)
    assert timer.timed == [] and stored(d) is None and not d.launchers
    assert not d.cache.kernel.launches  # torch.matmul ran it
    call(d, a, b)  # eager: races, the kernel wins
    assert len(timer.timed) == 2 * route_choice.ROUNDS and stored(d)["entry"] == "sm80"
    with monkeypatch.context() as m:  # a capture after the race runs the stored winner
        m.setattr(dispatch, "_may_tune", lambda t: False)
        route = d.route("auto", None, (M, N, K, None), DTYPES)
    assert (route.backend, route.keep) == ("sm80", True)


def test_the_capture_and_tracing_gates(monkeypatch):
    """``_may_tune``: no ``run`` for fake tensors, under torch.compile's tracing, or for a CUDA
    operand while its stream is captured."""
    with FakeTensorMode():
        assert not dispatch._may_tune(torch.empty(4, 4, dtype=F16))
    cuda_operand = types.SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not dispatch._may_tune(cuda_operand)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert dispatch._may_tune(cuda_operand)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not dispatch._may_tune(cuda_operand)


def test_autotune_off_is_torch_without_timing_or_reading_the_store(tmp_path, caplog):
    store = autotune.TunedStore(tmp_path)
    store.put("a stand-in RTX 3090", 84, route_choice.key(M, N, K, 1, DTYPES), "sm80", 1, {})
    d, timer = dispatcher(tmp_path, autotune=False, tuned=store)
    a, b = operands()
    caplog.set_level(logging.INFO, logger="wsgemm")
    torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
    route = d.route("auto", None, (M, N, K, None), DTYPES)
    assert (route.backend, route.keep) == (TORCH, True)
    assert timer.timed == [] and not d.cache.kernel.launches
    (line,) = [r.getMessage() for r in caplog.records]  # the torch route's line, once per GPU
    assert line.endswith("the sm80 kernel is not measured on this GPU and autotuning is off")
    # the setting is read per call (wsgemm.config), and the launcher memo keys on it
    d_setting, timer = dispatcher(tmp_path / "other", {"sm80": 0.5})
    d_setting._autotune = None
    with choosing_autotune(False):
        call(d_setting, a, b)
    assert timer.timed == []
    with choosing_autotune(True):
        call(d_setting, a, b)
    assert len(timer.timed) == 2 * route_choice.ROUNDS


@pytest.mark.parametrize("word", [None, "0", "1"])
def test_with_nothing_set_the_race_is_on_and_the_menu_tuning_off(tmp_path, monkeypatch, word):
    """Issue #27: where no table measured ``auto``'s kernel, the first call of a bucket races it
    against torch.matmul unless autotuning is turned off (``WSGEMM_AUTOTUNE=0``, a setting);
    the sm90 menu's own tuning stays off unless asked (``WSGEMM_AUTOTUNE=1``, a setting)."""
    if word is None:
        monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    else:
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, word)
    autotune.environment.cache_clear()
    try:
        d, timer = dispatcher(tmp_path, {"sm80": 0.5, TORCH: 1.0}, autotune=None)
        hopper = Dispatcher(StandInCache(), StandInDevices((9, 0), 132))
        assert (d.races, d.autotune) == (word != "0", word == "1")
        assert hopper.autotune == (word == "1")
        a, b = operands()
        torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
        if word == "0":
            assert timer.timed == [] and stored(d) is None and not d.cache.kernel.launches
            assert "autotuning is off" in d.explain("auto", None, (M, N, K, None), DTYPES)
        else:
            assert len(timer.timed) == 2 * route_choice.ROUNDS and stored(d)["entry"] == "sm80"
        with choosing_autotune(False):  # a setting turns the default race off
            assert not d.races and not d.autotune
        with choosing_autotune(True):
            assert d.races and d.autotune
        # on Hopper (its table measured the menu) a call times nothing unless asked
        timer = RaceTimer(hopper.cache.kernel, {})
        hopper.time_call, hopper.tuned = timer, autotune.TunedStore(tmp_path / "hopper")
        call(hopper, *operands(256, 512, 128))  # (24 candidates to tune, when asked)
        assert (timer.timed != []) == (word == "1")
    finally:
        autotune.environment.cache_clear()


def test_a_call_that_cannot_race_keeps_its_default_until_a_race_decides(tmp_path):
    """A call with alpha or a residual is not raced (``_run_candidate`` times the plain
    product): with nothing set off Hopper it takes torch.matmul and keeps a provisional
    launcher, so its later calls do not pay the first call again; a plain call of the same
    bucket races, and its decision drops the provisional launchers: the next scaled call runs
    the winner."""
    d, timer = dispatcher(tmp_path, {"sm80": 0.5, TORCH: 1.0}, autotune=None)
    a, b = operands()
    c = torch.randint(-3, 4, (M, N), generator=torch.Generator().manual_seed(5)).to(F16)
    want = {"alpha": (2 * reference(a, b, torch.float64)).half(),
            "residual": (reference(a, b, torch.float64) + 3 * c.double()).half()}  # fmt: skip

    def scaled(kind):
        out = torch.empty(M, N, dtype=F16)
        alpha, beta, cc = (2.0, 0.0, None) if kind == "alpha" else (1.0, 3.0, c)
        got = dispatch.call_scaled(d, a, b, out, None, F32, "auto", None, None, None, cc, alpha,
                                   beta)  # fmt: skip
        torch.testing.assert_close(got, want[kind], rtol=0, atol=0)

    for kind in ("alpha", "residual") * 2:
        scaled(kind)
    assert timer.timed == [] and stored(d) is None and not d.cache.kernel.launches
    kept = len(d.launchers)
    assert kept >= 2 and d._provisional == set(d.launchers)
    call(d, a, b)  # the plain call races: sm80 wins and is stored
    assert len(timer.timed) == 2 * route_choice.ROUNDS and stored(d)["entry"] == "sm80"
    assert not d._provisional
    for kind in ("alpha", "residual"):
        launches = len(d.cache.kernel.launches)
        scaled(kind)  # asks again: the stored decision, the kernel
        assert len(d.cache.kernel.launches) == launches + 1
    assert timer.timed.count("sm80") == route_choice.ROUNDS  # no second race


def choosing_autotune(flag):
    import wsgemm.config

    return wsgemm.config.autotune(flag)


@pytest.mark.parametrize("why", ["fp16 accumulator", "batch invariance", "empty problem"])
def test_where_torch_is_no_candidate_the_kernel_runs_untimed(tmp_path, why):
    d, timer = dispatcher(tmp_path, {"sm80": 5.0}, batch_invariant=why == "batch invariance")
    a, b = operands(k=0 if why == "empty problem" else K)
    accumulate = F16 if why == "fp16 accumulator" else F32
    got = call(d, a, b, accumulate=accumulate)
    dtypes = ("float16", "float16", "float16" if why == "fp16 accumulator" else "float32")
    problem = (M, N, 0 if why == "empty problem" else K, None)
    route = d.route("auto", None, problem, dtypes)
    assert route.backend == "sm80" and "no candidate" in route.reason
    assert timer.timed == [] and not (tmp_path / "autotune").exists()
    if why != "empty problem":
        assert d.cache.kernel.launches
        torch.testing.assert_close(got, reference(a, b), rtol=0, atol=0)
    else:
        assert torch.equal(got, torch.zeros(M, N, dtype=F16))


def test_hopper_with_its_shipped_table_never_races(tmp_path):
    d, timer = dispatcher(tmp_path, cc=(9, 0))
    plain = Dispatcher(StandInCache(), StandInDevices((9, 0), 84), autotune=False)
    a, b = operands()
    for m, n, k in ((M, N, K), (1, 4096, 4096), (4096, 4096, 64)):
        assert not d.races_torch(None, "sm90")
        route = plain.route("auto", None, (m, n, k, None), DTYPES)
        assert route.backend != TORCH and route.reason == ""
        assert "route:" not in d.explain("auto", None, (m, n, k, None), DTYPES)
    call(d, a, b)  # the sm90 tuner may time its candidates; torch.matmul is never one
    assert TORCH not in timer.timed and stored(d) is None


def test_against_torch_races_on_hopper_too(tmp_path):
    """The H200 study (its sm90 choice against torch.matmul): ``against_torch=True``."""
    d, timer = dispatcher(tmp_path, {TORCH: 0.1, "sm80": 1.0}, cc=(9, 0), against_torch=True)
    a, b = operands()
    torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
    assert timer.timed[-2 * route_choice.ROUNDS :].count(TORCH) == route_choice.ROUNDS
    record = d.tuned.record("a stand-in RTX 3090", 84, route_choice.key(M, N, K, 1, DTYPES))
    assert record["entry"] == TORCH and set(record["ms"]) == {"sm90", TORCH}
    never, _ = dispatcher(tmp_path / "never", cc=AMPERE, against_torch=False)
    assert never.route("auto", None, (M, N, K, None), DTYPES).backend == "sm80"
    with pytest.raises(TypeError, match="against_torch must be a bool"):
        dispatcher(tmp_path, against_torch="yes")


def test_the_store_keys_do_not_collide_with_tuned_choices(tmp_path):
    store = autotune.TunedStore(tmp_path)
    gpu, sms = "a stand-in RTX 3090", 84
    route_key = route_choice.key(M, N, K, 1, DTYPES)
    tuned_key = autotune.bucket(M, N, K, 1, DTYPES)
    assert route_key == route_choice.PREFIX + tuned_key and not tuned_key.startswith("route-")
    choice = choosing.choose(M, N, K, 1, *DTYPES, sms, (9, 0))
    choosing.remember(store, gpu, sms, M, N, K, 1, DTYPES, False,
                      {(choice.menu_entry.name, choice.split): 1.0})  # fmt: skip
    route_choice.remember(store, gpu, sms, (M, N, K, 1), DTYPES, "sm80", {"sm80": 1, TORCH: 2})
    assert store.get(gpu, sms, tuned_key) == (choice.menu_entry.name, choice.split)
    assert store.get(gpu, sms, route_key) == ("sm80", 1)
    tuned = choosing.tuned_choice(store, gpu, sms, (9, 0), M, N, K, 1, DTYPES, False)
    assert tuned.menu_entry == choice.menu_entry
    # each reads only its own record: a menu entry is no route decision
    store.put(gpu, sms, route_key, choice.menu_entry.name, 1, {})
    decision = route_choice.decide(store, gpu, sms, (M, N, K, 1), DTYPES, "sm80", race=True,
                                   invariant=False)  # fmt: skip
    assert decision.source == route_choice.NOT_YET


def test_explain_names_the_decision_and_where_it_came_from(tmp_path):
    problem = (M, N, K, None)
    off, _ = dispatcher(tmp_path, autotune=False)
    text = off.explain("auto", None, problem, DTYPES)
    assert "kernel: torch.matmul (not the sm80 kernel): the sm80 kernel is not measured" in text
    assert "\nroute: default: " in text and "set_autotune(True)" in text
    d, _ = dispatcher(tmp_path, {"sm80": 0.25, TORCH: 0.5})
    assert "\nroute: not measured yet: " in d.explain("auto", None, problem, DTYPES)
    call(d, *operands())
    text = d.explain("auto", None, problem, DTYPES)
    assert "kernel: sm80 (" in text
    assert "\nroute: stored measurement: the sm80 kernel measured faster than torch.matmul" in text
    assert "sm80 0.2500 ms, torch.matmul 0.5000 ms" in text
    assert route_choice.key(M, N, K, 1, DTYPES) in text
    full = dispatch.explain(d, *operands(), None, None, F32, "auto")
    assert "route: stored measurement" in full and full.splitlines()[-1].startswith("operands: ")
    invariant, _ = dispatcher(tmp_path, batch_invariant=True)
    assert "\nroute: no choice: torch.matmul is no candidate here: batch-invariant" in (
        invariant.explain("auto", None, problem, DTYPES)
    )


def test_a_side_that_fails_is_left_out(tmp_path):
    d, timer = dispatcher(tmp_path, {"sm80": RuntimeError("no kernel image"), TORCH: 1.0})
    a, b = operands()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(call(d, a, b), reference(a, b), rtol=0, atol=0)
    assert any("sm80 failed against the other route" in str(w.message) for w in caught)
    assert stored(d)["entry"] == TORCH and stored(d)["ms"] == {TORCH: 1.0}


def test_the_race_takes_medians(tmp_path):
    """One slow round (a clock dip) moves one sample of five, not the decision."""
    samples = iter([1.0, 0.9, 9.0, 0.9, 1.0, 0.9, 1.0, 0.9, 1.0, 0.9])
    times = route_choice.race({"sm80": lambda: "sm80", TORCH: lambda: TORCH},
                              lambda fn: next(samples))  # fmt: skip
    assert times == {"sm80": 1.0, TORCH: 0.9}
    assert route_choice.race({}, lambda fn: 1.0) == {}
