"""``wsgemm.tune`` on the CPU stand-in of an H200: it times every candidate of each problem once
(a stand-in timer), stores the fastest where ``auto`` reads it with autotuning on, reports the
model's pick against the tuned one, and times nothing for a bucket already tuned."""

import pytest
import torch
from stand_ins import F16, cpu_dispatcher

import wsgemm
from wsgemm.api import tune
from wsgemm.host.choosing import autotune


def test_tune_stores_the_fastest_and_auto_reads_it_with_autotuning_on(tmp_path):
    store = autotune.TunedStore(tmp_path)
    timed = []

    def time_call(fn):
        fn()
        timed.append(fn)
        return 3.0 - 0.1 * len(timed)  # each later candidate a little faster: the last wins

    d = cpu_dispatcher(tuned=store, time_call=time_call)
    seen = []
    (r,) = tune([(256, 512, 1024)], dispatcher=d, progress=lambda *a: seen.append(a), top=None)
    problem, dtypes = (256, 512, 1024, None), ("float16", "float16", "float32")
    candidates = d.candidates(None, problem, dtypes)
    assert len(timed) == len(candidates) >= 2 and not r.already
    assert set(r.times_ms) == {f"{c.menu_entry.name}/{c.split}" for c in candidates}
    last = candidates[-1]
    assert r.tuned_pick == f"{last.menu_entry.name}/{last.split}"
    model = d.model_choice(None, problem, dtypes)
    assert r.model_pick == f"{model.menu_entry.name}/{model.split}"
    assert r.gain == pytest.approx(r.times_ms[r.model_pick] / min(r.times_ms.values()))
    assert seen == [(1, 1, r)]
    # auto reads the stored pick while autotuning is on, and only then
    assert d.tuned_choice(None, problem, dtypes) is None
    with wsgemm.config.autotune(True):
        tuned = d.tuned_choice(None, problem, dtypes)
        explained = d.explain("auto", None, problem, dtypes)
    assert tuned.source == "tuned" and f"{tuned.menu_entry.name}/{tuned.split}" == r.tuned_pick
    said = (
        "the cost model picks the same"
        if r.tuned_pick == r.model_pick
        else f"overrides the cost model's pick, {model.menu_entry.name} split {model.split}"
    )
    assert said in explained
    # a second tune of the same bucket (M in 8-row blocks) times nothing and says so
    count = len(timed)
    (again,) = tune([(250, 512, 1024)], dispatcher=d)
    assert len(timed) == count and again.already and again.tuned_pick == r.tuned_pick
    # the store is on disk: another dispatcher (another process) reads the same pick
    other = cpu_dispatcher(tuned=autotune.TunedStore(tmp_path))
    assert other.tuned_record(None, problem, dtypes)["entry"] == last.menu_entry.name


def test_tune_checks_its_arguments():
    d = cpu_dispatcher()
    with pytest.raises(ValueError, match=r"each problem is \(M, N, K\)"):
        tune([(1, 2)], dispatcher=d)
    with pytest.raises(ValueError, match="K must be an int >= 1"):
        tune([(1, 2, 0)], dispatcher=d)
    with pytest.raises(ValueError, match="dtype must be one of"):
        tune([(1, 2, 3)], dtype=torch.float32, dispatcher=d)
    with pytest.raises(ValueError, match="tune times the sm90 menu"):
        tune([(8, 8, 8)], dispatcher=cpu_dispatcher((8, 0)))


def test_a_problem_no_candidate_ran_keeps_the_models_pick(tmp_path):
    """Every candidate failing (a stand-in timer that raises) stores nothing: the result says
    the model's pick stands, with no times, and the AutotuneWarning says why."""

    def time_call(fn):
        raise RuntimeError("no GPU here")

    d = cpu_dispatcher(tuned=autotune.TunedStore(tmp_path), time_call=time_call)
    with pytest.warns(autotune.AutotuneWarning, match="left out"):
        (r,) = tune([(256, 512, 1024)], dispatcher=d, dtype=F16)
    assert r.tuned_pick == r.model_pick and r.times_ms == {} and r.gain is None
    assert d.tuned_record(None, (256, 512, 1024, None), ("float16", "float16", "float32")) is None


def test_tune_refuses_a_dispatcher_that_never_tunes():
    with pytest.raises(ValueError, match="autotune=False"):
        tune([(256, 512, 1024)], dispatcher=cpu_dispatcher(autotune=False))


def test_a_stored_pick_the_menu_no_longer_offers_is_timed_again(tmp_path):
    store = autotune.TunedStore(tmp_path)
    dtypes = ("float16", "float16", "float32")
    key = autotune.bucket(256, 512, 1024, 1, dtypes)
    store.put("a stand-in GPU", 132, key, "a-dropped-entry", 1, {"a-dropped-entry/1": 0.5})
    timed = []
    d = cpu_dispatcher(tuned=store, time_call=lambda fn: timed.append(fn) or 1.0)
    (r,) = tune([(256, 512, 1024)], dispatcher=d)
    assert timed and not r.already and r.tuned_pick != "a-dropped-entry/1"


def test_by_default_tune_times_the_cost_models_fastest_few(tmp_path):
    """``top`` (default ``TOP``): the cost model's fastest candidates, its own pick first."""
    from wsgemm.api import tuning
    from wsgemm.host import choosing

    timed = []
    d = cpu_dispatcher(tuned=autotune.TunedStore(tmp_path),
                       time_call=lambda fn: timed.append(fn) or 1.0)  # fmt: skip
    (r,) = tune([(300, 4096, 4096)], dispatcher=d)
    problem, dtypes = (300, 4096, 4096, None), ("float16", "float16", "float32")
    every = d.candidates(None, problem, dtypes)
    assert len(every) > tuning.TOP and len(timed) == tuning.TOP == len(r.times_ms)
    ranked = choosing.ranked_candidates(300, 4096, 4096, 1, *dtypes, 132, (9, 0))
    assert set(r.times_ms) == {f"{e.name}/{s}" for e, s in ranked[: tuning.TOP]}
    assert r.model_pick in r.times_ms  # the model's own pick is its fastest prediction
    assert set(ranked) == {(c.menu_entry, c.split) for c in every} and len(ranked) == len(every)
    with pytest.raises(ValueError, match="top must be an int >= 1"):
        tune([(8, 8, 8)], dispatcher=d, top=0)


def test_explain_names_a_stored_pick_that_autotuning_off_leaves_unused(tmp_path):
    store = autotune.TunedStore(tmp_path)
    d = cpu_dispatcher(tuned=store, time_call=lambda fn: fn() or 1.0)
    (r,) = tune([(256, 512, 1024)], dispatcher=d)
    problem, dtypes = (256, 512, 1024, None), ("float16", "float16", "float32")
    entry, split = r.tuned_pick.split("/")
    off = d.explain("auto", None, problem, dtypes)
    assert f"tuned: {entry} split {split} is stored" in off and "autotuning is off" in off
    with wsgemm.config.autotune(True):
        on = d.explain("auto", None, problem, dtypes)
    assert "tuned on this GPU" in on and "autotuning is off" not in on


def test_tune_without_a_cuda_gpu_says_so(monkeypatch):
    """The process's dispatcher drives CUDA GPUs: with none visible, a RuntimeError that says
    why (torch's own was an AssertionError, "Torch not compiled with CUDA enabled")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees none here"):
        wsgemm.tune([(128, 4096, 4096)])
