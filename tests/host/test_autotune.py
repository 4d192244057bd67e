"""WSGEMM_AUTOTUNE on the CPU: a dispatcher posing as an H200 whose kernels are float64
stand-ins and whose timer is told what each candidate costs. The first call of a problem times
the policy's candidates and runs the fastest; the choice is kept on disk per GPU model and
bucket, read back by a new dispatcher, and never taken while tuning is not allowed."""

import json
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from wsgemm.api import Dispatcher, dispatch
from wsgemm.host import choosing
from wsgemm.host.choosing import autotune
from wsgemm.host.dispatch import StandInDevices

F16, F32 = torch.float16, torch.float32
M, N, K = 128, 256, 128  # several menu entries fit, the product is cheap in float64


class TimedCache:
    """Kernels that compute the product in float64 and log (variant, split) per launch."""

    def __init__(self):
        self.launched = []

    def get(self, variant):
        def kernel(a, b, c, clusters, raster_group=0, split=1, workspace=None, sems=None):
            self.launched.append((variant, split))
            c.copy_(torch.einsum("mkl,nkl->mnl", a.double(), b.double()).to(c.dtype))

        return kernel


def entry_of(variant, split) -> str:
    for e in choosing.MENU:
        if split > 1 and not e.splits:
            continue
        if e.backend == variant.backend and e.variant_config(split=split > 1) == variant.config:
            return e.name
    raise AssertionError(f"{variant} is no menu entry")


class Timer:
    """``time_call`` for the stand-in: runs the call once and answers the cost given for the
    candidate it launched (1.0 ms when not given)."""

    def __init__(self, cache, costs):
        self.cache, self.costs, self.timed = cache, costs, []

    def __call__(self, fn):
        fn()
        variant, split = self.cache.launched[-1]
        candidate = (entry_of(variant, split), split)
        self.timed.append(candidate)
        cost = self.costs.get(candidate, 1.0)
        if isinstance(cost, Exception):
            raise cost
        return cost


def tuned_dispatcher(tmp_path, costs=None, **options):
    cache = TimedCache()
    timer = Timer(cache, costs or {})
    d = Dispatcher(
        cache, StandInDevices((9, 0), 132), autotune=True, tuned=autotune.TunedStore(tmp_path),
        time_call=timer, **options,
    )  # fmt: skip
    return d, cache, timer


def operands(m=M, n=N, k=K, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, s, generator=gen).to(F16) for s in ((m, k), (k, n)))


def call(d, a, b, out=None):
    return dispatch.call(d, a, b, out, None, F32, "auto", None)


def candidates(m=M, n=N, k=K):
    return choosing.candidates(m, n, k, 1, "float16", "float16", "float32", 132, (9, 0))


def test_the_fastest_candidate_runs_and_is_kept_on_disk(tmp_path):
    names = [(e.name, s) for e, s in candidates()]
    assert len(names) >= 3
    fastest = names[-1]  # not what the policy would pick first
    d, cache, timer = tuned_dispatcher(tmp_path, {fastest: 0.5})
    a, b = operands()
    before = dispatch.explain(d, a, b, None, None, F32, "auto")
    assert f"the first call times these {len(names)} candidates" in before
    assert timer.timed == []  # explaining runs nothing
    out = call(d, a, b)
    assert torch.equal(out, (a.double() @ b.double()).to(F16))
    assert sorted(timer.timed) == sorted(names)  # every candidate timed once
    variant, split = cache.launched[-1]
    assert (entry_of(variant, split), split) == fastest  # and the call ran the fastest
    (path,) = (tmp_path / "autotune").glob("*.json")
    stored = json.loads(path.read_text())
    key = autotune.bucket(M, N, K, 1, ("float16", "float16", "float32"))
    assert stored["choices"][key]["entry"] == fastest[0]
    assert stored["choices"][key]["split"] == fastest[1]
    assert stored["sm_count"] == 132

    # A later call of the signature runs the launcher, a new problem in the same M block too.
    timer.timed.clear()
    call(d, a, b)
    a2, _ = operands(m=M - 5)
    call(d, a2, b)
    assert timer.timed == []

    # A new process (dispatcher) reads the choice and times nothing.
    d2, cache2, timer2 = tuned_dispatcher(tmp_path)
    call(d2, a, b)
    assert timer2.timed == []
    assert (entry_of(*cache2.launched[-1]), cache2.launched[-1][1]) == fastest
    text = dispatch.explain(d2, a, b, None, None, F32, "auto")
    assert "tuned on this GPU" in text and fastest[0] in text


def test_autotuning_is_off_unless_asked(tmp_path):
    cache = TimedCache()
    timer = Timer(cache, {})
    d = Dispatcher(cache, StandInDevices((9, 0), 132), autotune=False,
                   tuned=autotune.TunedStore(tmp_path), time_call=timer)  # fmt: skip
    a, b = operands()
    call(d, a, b)
    assert timer.timed == [] and not (tmp_path / "autotune").exists()
    with pytest.raises(TypeError, match="autotune must be a bool"):
        Dispatcher(cache, StandInDevices(), autotune="yes")


def test_the_environment_switch(monkeypatch):
    autotune.environment.cache_clear()
    try:
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, "1")
        assert autotune.environment() is True and autotune.asked(None) is True
        assert autotune.asked(False) is False  # a setting says first
        autotune.environment.cache_clear()
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, "off")
        assert autotune.environment() is False and autotune.asked(True) is True
        autotune.environment.cache_clear()
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, "perhaps")
        with pytest.warns(autotune.AutotuneWarning, match="it is ignored"):
            assert autotune.environment() is None
        autotune.environment.cache_clear()
        monkeypatch.delenv(autotune.ENV_AUTOTUNE)
        assert autotune.environment() is None and autotune.asked(None) is None
    finally:
        autotune.environment.cache_clear()


def test_a_candidate_that_fails_is_left_out(tmp_path):
    names = [(e.name, s) for e, s in candidates()]
    broken, fastest = names[0], names[1]
    d, cache, _ = tuned_dispatcher(tmp_path, {broken: RuntimeError("no"), fastest: 0.1})
    a, b = operands()
    with pytest.warns(autotune.AutotuneWarning, match="failed") as record:
        out = call(d, a, b)
    assert record[0].filename == __file__  # the line that called (``call`` plays api.matmul)
    assert torch.equal(out, (a.double() @ b.double()).to(F16))
    assert (entry_of(*cache.launched[-1]), cache.launched[-1][1]) == fastest


def test_a_route_asked_without_run_is_the_policys(tmp_path):
    """The API passes ``run`` only where a call may be timed (``_may_tune``): without it (a
    captured or traced call, ``explain``) the route is the policy's and nothing is timed."""
    d, _, timer = tuned_dispatcher(tmp_path)
    dtypes = ("float16", "float16", "float32")
    route = d.route("auto", None, (M, N, K, None), dtypes)
    assert route.choice.source in ("table", "model") and timer.timed == []
    assert not (tmp_path / "autotune").exists()


def test_nothing_is_tuned_on_fake_tensors_or_while_compiling(monkeypatch):
    with FakeTensorMode():
        fake = torch.empty(4, 4, dtype=F16)
    assert not dispatch._may_tune(fake)
    real = torch.empty(4, 4, dtype=F16)
    assert dispatch._may_tune(real)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not dispatch._may_tune(real)


def test_a_stale_choice_is_ignored_and_a_bad_file_set_aside(tmp_path):
    store = autotune.TunedStore(tmp_path)
    dtypes = ("float16", "float16", "float32")
    key = autotune.bucket(M, N, K, 1, dtypes)
    store.put("H200", 132, key, "no-such-entry", 1, {})
    args = (store, "H200", 132, (9, 0), M, N, K, 1, dtypes)
    assert autotune.tuned_choice(*args) is None  # not a candidate: the policy decides
    e, split = candidates()[0]
    store.put("H200", 132, key, e.name, split, {})
    assert autotune.tuned_choice(*args).menu_entry == e

    (path,) = (tmp_path / "autotune").glob("*.json")
    for bad in ("{not json", "[]", "null", '{"schema": 1, "choices": []}'):
        path.write_text(bad)
        with pytest.warns(autotune.AutotuneWarning, match="set aside"):
            assert autotune.TunedStore(tmp_path).get("H200", 132, key) is None
        assert path.with_suffix(".bad").exists() and not path.exists()


def test_batch_invariant_mode_tunes_its_own_bucket(tmp_path):
    """Its candidates differ (no split): a choice made in one mode never answers the other."""
    d = ("float16", "float16", "float32")
    assert autotune.bucket(M, N, K, 1, d) != autotune.bucket(M, N, K, 1, d, invariant=True)
    plain, _, t1 = tuned_dispatcher(tmp_path, batch_invariant=False)
    invariant, _, t2 = tuned_dispatcher(tmp_path, batch_invariant=True)
    a, b = operands()
    call(plain, a, b)
    call(invariant, a, b)
    assert t1.timed and t2.timed  # each mode tuned
    assert all(split == 1 for _, split in t2.timed)
    again, _, t3 = tuned_dispatcher(tmp_path, batch_invariant=False)
    call(again, a, b)
    assert t3.timed == []  # the plain mode's choice is still there


def test_without_a_cache_root_choices_stay_in_memory(monkeypatch):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "0")
    store = autotune.TunedStore()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.put("H200", 132, "k", "sm90", 1, {})
    assert store.get("H200", 132, "k") == ("sm90", 1)


def test_the_bucket_is_the_policys():
    d = ("float16", "float16", "float32")
    q = choosing.M_QUANTUM
    assert autotune.bucket(1, 64, 64, 1, d) == autotune.bucket(q, 64, 64, 1, d)
    assert autotune.bucket(q, 64, 64, 1, d) != autotune.bucket(q + 1, 64, 64, 1, d)
    assert autotune.fastest({("sm90", 1): 2.0, ("sm90-pingpong", 1): 1.0}) == ("sm90-pingpong", 1)
    # a tie goes to the earlier menu entry
    assert autotune.fastest({("sm90-pingpong", 1): 1.0, ("sm90", 1): 1.0}) == ("sm90", 1)


class EpilogueTimedCache(TimedCache):
    """``TimedCache`` whose kernels take a fused epilogue's launch arguments and apply the
    variant's activation (float64)."""

    def get(self, variant):
        from wsgemm.api.epilogue import Epilogue, torch_activation

        act = Epilogue.parse(variant.epilogue).activation

        def kernel(a, b, c, clusters, raster_group=0, split=1, workspace=None, sems=None,
                   *epilogue_args):  # fmt: skip
            self.launched.append((variant, split))
            y = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
            c.copy_(torch_activation(act, y).to(c.dtype))

        return kernel


def test_a_fused_activation_tunes_its_own_bucket(tmp_path):
    """Its candidates are timed with the activation (``run`` launches the fused kernel): a
    pick made with silu fused never answers a plain call, nor a plain pick a silu call."""
    dt = ("float16", "float16", "float32")
    plain_key, silu_key = (autotune.bucket(M, N, K, 1, dt, mufu=m) for m in (0, 2))
    assert plain_key != silu_key and silu_key.endswith("-mufu2")
    cache = EpilogueTimedCache()
    timer = Timer(cache, {})
    d = Dispatcher(cache, StandInDevices((9, 0), 132), autotune=True,
                   tuned=autotune.TunedStore(tmp_path), time_call=timer)  # fmt: skip
    a, b = operands()
    out = dispatch.call(d, a, b, None, None, F32, "auto", None, None, "silu")
    assert torch.equal(out, torch.nn.functional.silu(a.double() @ b.double()).to(F16))
    assert timer.timed and all(v.epilogue == "silu" for v, _ in cache.launched)
    (path,) = (tmp_path / "autotune").glob("*.json")
    assert set(json.loads(path.read_text())["choices"]) == {silu_key}
    timer.timed.clear()
    call(d, a, b)  # the plain call: its own bucket, tuned afresh
    assert timer.timed
    assert set(json.loads(path.read_text())["choices"]) == {silu_key, plain_key}


def test_explain_says_where_an_activation_calls_pick_comes_from(tmp_path):
    """explain answers from the activation's own bucket: with only the plain bucket tuned (as
    ``wsgemm tune`` fills it) its first call times its own candidates; once its bucket is
    tuned, that pick (found by reviews: explain read the plain bucket, and sliced a reason it
    did not extend)."""
    cache = EpilogueTimedCache()
    d = Dispatcher(cache, StandInDevices((9, 0), 132), autotune=True,
                   tuned=autotune.TunedStore(tmp_path), time_call=Timer(cache, {}))  # fmt: skip
    a, b = operands()
    call(d, a, b)  # the plain bucket only
    text = dispatch.explain(d, a, b, None, None, F32, "auto", None, "silu")
    assert "the first call times these" in text and "tuned on this GPU" not in text, text
    dispatch.call(d, a, b, None, None, F32, "auto", None, None, "silu")  # its own bucket
    text = dispatch.explain(d, a, b, None, None, F32, "auto", None, "silu")
    assert "tuned on this GPU" in text and "-mufu2" in text and "first call times" not in text
    silu, plain = (
        d.route("auto", None, (M, N, K, None), ("float16", "float16", "float32"), quiet=True,
                mufu=mufu).choice
        for mufu in (2, 0)
    )  # fmt: skip
    assert (silu.menu_entry, silu.split) == (plain.menu_entry, plain.split)  # every time 1.0
    assert "with its activation" not in dispatch.explain(d, a, b, None, None, F32, "auto",
                                                         None, "silu")  # fmt: skip


def test_a_fused_activation_races_torch_in_its_own_bucket(tmp_path):
    """Where the kernel races torch.matmul (no table measured it), a silu call's race (both
    sides with silu) answers only silu calls: a plain call runs its own (found by a review)."""
    cache = EpilogueTimedCache()
    torch_side = []

    def time_call(fn):
        before = len(cache.launched)
        fn()
        torch_side.append(len(cache.launched) == before)
        return 0.5 if torch_side[-1] else 1.0  # torch wins

    d = Dispatcher(cache, StandInDevices((9, 0), 132), autotune=True, against_torch=True,
                   tuned=autotune.TunedStore(tmp_path), time_call=time_call)  # fmt: skip
    a, b = operands()
    dispatch.call(d, a, b, None, None, F32, "auto", None, None, "silu")
    assert any(torch_side)
    torch_side.clear()
    call(d, a, b)
    assert any(torch_side), "the plain call took the silu call's race without its own"
