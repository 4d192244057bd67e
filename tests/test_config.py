"""``wsgemm.config`` on the CPU: a block changes what a stand-in H200 chooses and restores it,
the launcher memo keys on the settings, threads and async tasks keep their own, the process
default and the environment variables are the fallbacks, and a bad value is a TypeError."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from stand_ins import F16, F32, cpu_dispatcher, matmul, reference

import wsgemm
from wsgemm import config
from wsgemm.api import dispatch
from wsgemm.host.choosing import autotune, rules
from wsgemm.host.compiling import disk
from wsgemm.host.settings import NAMES, Settings

REPO = Path(__file__).resolve().parents[1]
# A decode problem the policy splits on an H200 (split-K 2), so batch invariance shows.
PROBLEM = (1, 128, 4096, None)
DTYPES = ("float16", "float16", "float32")
SETTERS = {
    "batch_invariant": (config.set_batch_invariant, config.batch_invariant_enabled),
    "autotune": (config.set_autotune, config.autotune_enabled),
    "disk_cache": (config.set_disk_cache, config.disk_cache_enabled),
}


@pytest.fixture(autouse=True)
def workspace_splits(monkeypatch):
    """The policy's splits through the workspace (``registry.CLUSTER_SPLIT_FAMILIES`` off):
    the stand-in kernel records those launches, which these tests count."""
    from wsgemm.host import registry

    monkeypatch.setattr(registry, "CLUSTER_SPLIT_FAMILIES", frozenset())
    rules.forget()
    yield
    rules.forget()


@pytest.fixture(autouse=True)
def environment_defaults(monkeypatch):
    """No switch in the environment, each read afresh; no process default left behind."""
    for name in (rules.ENV_BATCH_INVARIANT, autotune.ENV_AUTOTUNE, "WSGEMM_DISK_CACHE"):
        monkeypatch.delenv(name, raising=False)
    rules._environment.cache_clear()
    autotune.environment.cache_clear()
    yield
    for set_default, _ in SETTERS.values():
        set_default(None)
    rules._environment.cache_clear()
    autotune.environment.cache_clear()


def split_of(d) -> int:
    return d.route("auto", None, PROBLEM, DTYPES).split


def operands():
    torch.manual_seed(0)
    m, n, k, _ = PROBLEM
    return torch.randn(m, k, dtype=F16), torch.randn(k, n, dtype=F16)


# ----------------------------------------------------------------------------- blocks


def test_the_public_name_is_the_module():
    assert wsgemm.config is config and "config" in wsgemm.__all__
    assert set(config.__all__) <= set(dir(config))


def test_a_block_changes_the_choice_and_restores_it():
    d = cpu_dispatcher()
    assert not config.batch_invariant_enabled() and split_of(d) == 2
    with config.batch_invariant(True) as inside:
        assert inside == Settings(batch_invariant=True) == config.current()
        assert config.batch_invariant_enabled() and split_of(d) == 1
        with config.batch_invariant(False):  # blocks nest
            assert split_of(d) == 2
        assert split_of(d) == 1
    assert config.current() == Settings() and split_of(d) == 2


def test_explain_follows_the_block():
    d = cpu_dispatcher()
    a, b = operands()
    outside = dispatch.explain(d, a, b, None, None, F32, "auto")
    with config.batch_invariant(True):
        inside = dispatch.explain(d, a, b, None, None, F32, "auto")
    assert "split-K: 2" in outside and "batch-invariant" not in outside
    assert "split-K: 1 (none)" in inside and "batch-invariant: no split-K" in inside


def test_a_launcher_chosen_outside_a_block_is_not_reused_inside_it():
    d = cpu_dispatcher()
    a, b = operands()
    want = reference(a, b)
    splits = d.cache.kernel.splits  # one record per launch of a split kernel
    torch.testing.assert_close(matmul(d, a, b), want, rtol=0, atol=0)
    assert len(splits) == 1 and splits[-1][2] == 2 and len(d.launchers) == 1
    with config.batch_invariant(True):
        torch.testing.assert_close(matmul(d, a, b), want, rtol=0, atol=0)
        matmul(d, a, b)  # the block's own launcher, kept
    assert len(splits) == 1 and len(d.launchers) == 2
    matmul(d, a, b)  # outside again: the first launcher, split again
    assert len(splits) == 2 and len(d.launchers) == 2


def test_the_dispatchers_own_argument_wins_over_the_setting():
    with config.batch_invariant(True):
        assert split_of(cpu_dispatcher(batch_invariant=False)) == 2
    assert split_of(cpu_dispatcher(batch_invariant=True)) == 1


def test_autotune_block_tunes_and_keys_the_bucket_on_batch_invariance(tmp_path):
    """Inside ``autotune(True)`` the first call times the candidates, under batch invariance
    too, and keeps the choice in the invariant bucket; outside, nothing is timed and the
    tuned choice is not read."""
    timed = []

    def time_call(fn):
        fn()
        timed.append(fn)
        return 1.0

    store = autotune.TunedStore(tmp_path)
    d = cpu_dispatcher(tuned=store, time_call=time_call)
    a, b = torch.randn(128, 128, dtype=F16), torch.randn(128, 256, dtype=F16)
    matmul(d, a, b)
    assert timed == [] and not d.autotune
    with config.autotune(True), config.batch_invariant(True):
        assert d.autotune
        torch.testing.assert_close(matmul(d, a, b), reference(a, b), rtol=0, atol=0)
        assert timed, "the first call inside the block times the candidates"
        count = len(timed)
        matmul(d, a, b)
        assert len(timed) == count  # the block's launcher, kept
        problem, dtypes = (128, 256, 128, None), DTYPES
        assert d.tuned_choice(None, problem, dtypes).source == "tuned"
    key = autotune.bucket(128, 256, 128, 1, DTYPES, invariant=True)
    assert list(store._load("a stand-in GPU", 132)) == [key] and key.endswith("-invariant")
    assert d.tuned_choice(None, problem, dtypes) is None  # tuning off here: not read
    matmul(d, a, b)
    assert len(timed) == count


def test_disk_cache_block(monkeypatch, tmp_path):
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(tmp_path))
    assert config.disk_cache_enabled() and disk.location().root == tmp_path
    with config.disk_cache(False):
        where = disk.location()
        assert not config.disk_cache_enabled()
        assert where.root is None and where.why_not.startswith("off")
        assert "wsgemm.config.disk_cache" in where.why_not
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "off")
    assert not config.disk_cache_enabled() and disk.location().root is None
    with config.disk_cache(True):  # the setting before the environment
        assert config.disk_cache_enabled() and disk.location().root == tmp_path


# ----------------------------------------------------------------------------- isolation


def test_threads_keep_their_own_settings():
    """A block in one thread is invisible to another, each running while the other is
    inside its block; a new thread starts from the process default, not its creator's block."""
    d = cpu_dispatcher()
    inside, seen = threading.Barrier(2), {}

    def worker(name, flag):
        with config.batch_invariant(flag):
            inside.wait()  # both threads are inside their blocks now
            seen[name] = (config.batch_invariant_enabled(), split_of(d))
            inside.wait()

    with config.batch_invariant(True):
        threads = [
            threading.Thread(target=worker, args=("on", True)),
            threading.Thread(target=worker, args=("off", False)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert config.batch_invariant_enabled()
        fresh = []
        t = threading.Thread(target=lambda: fresh.append(config.batch_invariant_enabled()))
        t.start()
        t.join()
    assert seen == {"on": (True, 1), "off": (False, 2)} and fresh == [False]


def test_async_tasks_keep_their_own_settings():
    async def task(flag, log):
        with config.batch_invariant(flag):
            for _ in range(3):
                await asyncio.sleep(0)  # let the other task run inside its block
                log.append(config.batch_invariant_enabled())

    async def both():
        on, off = [], []
        await asyncio.gather(task(True, on), task(False, off))
        return on, off

    assert asyncio.run(both()) == ([True] * 3, [False] * 3)


def test_the_process_default_reaches_every_thread_and_a_block_overrides_it():
    d = cpu_dispatcher()
    config.set_batch_invariant(True)
    seen = []
    t = threading.Thread(
        target=lambda: seen.append((config.batch_invariant_enabled(), split_of(d)))
    )
    t.start()
    t.join()
    assert seen == [(True, 1)]
    with config.batch_invariant(False):
        assert split_of(d) == 2
    config.set_batch_invariant(None)  # back to the environment's default
    assert not config.batch_invariant_enabled() and split_of(d) == 2


@pytest.mark.parametrize("name", NAMES)
def test_each_switch_reads_sets_and_blocks_alike(name):
    set_default, enabled = SETTERS[name]
    block = getattr(config, name)
    assert enabled() is True if name == "disk_cache" else enabled() is False
    for flag in (True, False):
        set_default(flag)
        assert enabled() is flag and getattr(config.current(), name) is flag
        with block(not flag):
            assert enabled() is (not flag)
        assert enabled() is flag
    set_default(None)
    assert getattr(config.current(), name) is None


# ----------------------------------------------------------------------------- the environment


def test_the_environment_variables_are_the_defaults(monkeypatch):
    monkeypatch.setenv(rules.ENV_BATCH_INVARIANT, "1")
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "on")
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "0")
    rules._environment.cache_clear()
    autotune.environment.cache_clear()
    d = cpu_dispatcher()
    assert config.batch_invariant_enabled() and split_of(d) == 1
    assert config.autotune_enabled() and d.autotune and config.race_enabled()
    assert not config.disk_cache_enabled()
    with config.batch_invariant(False), config.autotune(False):
        assert not config.batch_invariant_enabled() and split_of(d) == 2
        assert not config.autotune_enabled() and not d.autotune


def test_the_environment_in_a_fresh_process_and_no_torch_for_config():
    code = (
        "import sys, wsgemm\n"
        "c = wsgemm.config\n"
        "print(c.batch_invariant_enabled(), c.autotune_enabled(), c.disk_cache_enabled(),\n"
        "      sorted(m for m in ('torch', 'cutlass') if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), WSGEMM_BATCH_INVARIANT="1",
               WSGEMM_AUTOTUNE="yes", WSGEMM_DISK_CACHE="off")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False", "[]"]


# ----------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_a_bad_value_is_a_type_error(name, value):
    set_default, _ = SETTERS[name]
    with pytest.raises(
        TypeError, match=rf"{name} must be True, False or None.*{type(value).__name__}"
    ):
        getattr(config, name)(value)  # at the call, before any `with`
    with pytest.raises(TypeError, match=rf"{name} must be True, False or None"):
        set_default(value)
    assert config.current() == Settings()


def test_a_bad_environment_word_is_a_value_error(monkeypatch):
    monkeypatch.setenv(rules.ENV_BATCH_INVARIANT, "yes")
    rules._environment.cache_clear()
    with pytest.raises(ValueError, match="WSGEMM_BATCH_INVARIANT='yes'; allowed: 0 or 1"):
        config.batch_invariant_enabled()
    with config.batch_invariant(True):  # a setting in Python needs no environment
        assert config.batch_invariant_enabled()


def test_an_unknown_setting_is_a_type_error():
    from wsgemm.host import settings

    with pytest.raises(TypeError, match="no setting 'batch_invariance'; the settings: batch_inv"):
        settings.block(batch_invariance=True)


@pytest.mark.parametrize("word, tuning, race", [(None, False, True), ("0", False, False),
                                                ("1", True, True)])  # fmt: skip
def test_one_switch_two_readings(monkeypatch, word, tuning, race):
    """Unset: the Hopper menu's tuning off, the race against torch.matmul (off Hopper) on."""
    if word is not None:
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, word)
    autotune.environment.cache_clear()
    assert (config.autotune_enabled(), config.race_enabled()) == (tuning, race)
    with config.autotune(False):
        assert not config.autotune_enabled() and not config.race_enabled()
    with config.autotune(True):
        assert config.autotune_enabled() and config.race_enabled()
    config.set_autotune(False)
    assert not config.race_enabled()
