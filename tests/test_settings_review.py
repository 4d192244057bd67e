"""The settings review's fixes (``wsgemm.config``, ``wsgemm.host.settings``) on the CPU: a block
object may be entered again, nested in itself and shared by threads and tasks; it restores on
an exception; it decorates functions and coroutine functions (the body inside the block) and
refuses generator functions; and the docs name every ``WSGEMM_*`` variable the code reads."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest

from wsgemm import config
from wsgemm.host import settings
from wsgemm.host.choosing import autotune, rules
from wsgemm.host.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_setting_left(monkeypatch):
    for name in (rules.ENV_BATCH_INVARIANT, autotune.ENV_AUTOTUNE, "WSGEMM_DISK_CACHE"):
        monkeypatch.delenv(name, raising=False)
    rules._environment.cache_clear()
    autotune.environment.cache_clear()
    yield
    for name in settings.NAMES:
        settings.set_default(name, None)
    rules._environment.cache_clear()
    autotune.environment.cache_clear()
    assert config.current() == Settings()


# ----------------------------------------------------------------------------- a kept block


def test_a_kept_block_enters_again():
    """Before: the second ``with`` raised AttributeError ('_GeneratorContextManager' object
    has no attribute 'args')."""
    invariant = config.batch_invariant(True)
    for _ in range(3):
        with invariant as inside:
            assert inside == Settings(batch_invariant=True) and config.batch_invariant_enabled()
        assert config.current() == Settings() and not config.batch_invariant_enabled()


def test_a_kept_block_nests_in_itself_and_in_others():
    on, off = config.batch_invariant(True), config.batch_invariant(False)
    with on:
        with off, config.autotune(True):
            with on:
                assert config.current() == Settings(batch_invariant=True, autotune=True)
            assert config.current() == Settings(batch_invariant=False, autotune=True)
        assert config.current() == Settings(batch_invariant=True)
    assert config.current() == Settings()


def test_a_block_restores_on_an_exception():
    kept = config.autotune(True)
    with pytest.raises(KeyError):
        with config.batch_invariant(True), kept:
            assert config.current() == Settings(batch_invariant=True, autotune=True)
            raise KeyError("boom")
    assert config.current() == Settings()
    with kept:  # still usable after the exception
        assert config.autotune_enabled()
    assert not config.autotune_enabled()


def test_a_shared_block_in_threads_at_once():
    """Each thread enters and exits the one object while the others are inside it; each
    thread's exit restores its own settings (a block object keeps no token of its own)."""
    shared = config.batch_invariant(True)
    barrier, seen, errors = threading.Barrier(4), [], []

    def worker(i):
        try:
            with config.autotune(i % 2 == 0):
                with shared:
                    barrier.wait(timeout=10)  # every thread is inside `shared` now
                    seen.append(config.current())
                    barrier.wait(timeout=10)
                assert config.current() == Settings(autotune=i % 2 == 0)
            assert config.current() == Settings()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(s.autotune for s in seen) == [False, False, True, True]
    assert all(s.batch_invariant for s in seen)


def test_a_shared_block_in_async_tasks():
    shared = config.batch_invariant(True)

    async def task(flag):
        with config.autotune(flag), shared:
            for _ in range(3):
                await asyncio.sleep(0)  # the other task enters `shared` meanwhile
                assert config.current() == Settings(batch_invariant=True, autotune=flag)
        return config.current()

    async def both():
        return await asyncio.gather(task(True), task(False))

    assert asyncio.run(both()) == [Settings(), Settings()]


def test_an_exit_without_an_entry_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="no block is open"):
        config.disk_cache(False).__exit__(None, None, None)
    assert config.current() == Settings()


# ----------------------------------------------------------------------------- as a decorator


def test_a_block_decorates_a_function():
    @config.batch_invariant(True)
    def inside():
        return config.current()

    assert inside() == inside() == Settings(batch_invariant=True)
    assert inside.__name__ == "inside" and config.current() == Settings()


def test_a_block_decorates_a_coroutine_function():
    """Before: the block held while the coroutine object was made, and its body ran outside
    it (False, silently)."""

    @config.batch_invariant(True)
    async def handler():
        await asyncio.sleep(0)
        return config.batch_invariant_enabled()

    async def main():
        got = await handler()
        return got, config.batch_invariant_enabled()

    assert asyncio.run(main()) == (True, False)


def test_a_block_refuses_a_generator_function():
    """Before: the body ran outside the block (a generator decorated: False, silently)."""
    with pytest.raises(TypeError, match="cannot decorate the generator function"):

        @config.batch_invariant(True)
        def rows():
            yield config.batch_invariant_enabled()

    with pytest.raises(TypeError, match="cannot decorate the generator function"):

        @config.autotune(False)
        async def stream():
            yield 1

    with pytest.raises(TypeError, match="decorates a function, got int"):
        config.autotune(True)(3)


def test_bad_values_still_fail_before_any_with():
    with pytest.raises(TypeError, match="batch_invariant must be True, False or None.*str 'on'"):
        config.batch_invariant("on")
    with pytest.raises(TypeError, match="no setting 'autotuning'; the settings: "):
        settings.block(autotuning=True)


# ----------------------------------------------------------------------------- the docs


def _documented() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    read = set()
    for path in (ROOT / "wsgemm").rglob("*.py"):
        read |= set(re.findall(r"[\"'](WSGEMM_[A-Z_]+)[\"']", path.read_text()))
    documented = set(re.findall(r"\bWSGEMM_[A-Z_]+", _documented()))
    assert read == documented, (read - documented, documented - read)


def test_the_docs_say_batch_invariant_takes_0_or_1(monkeypatch):
    """``WSGEMM_BATCH_INVARIANT`` takes ``0`` or ``1`` alone (``choosing.rules``), unlike the
    other switches' words; the README and policy.md say so (the README said "=1 (the
    default", which read as on by default)."""
    text = " ".join(_documented().split())
    assert text.count("`WSGEMM_BATCH_INVARIANT=1` (") >= 2
    assert "`0`, the default, or `1`, no other word" in text
    assert "`WSGEMM_BATCH_INVARIANT=1` (the default" not in text
    for word, want in (("0", False), ("1", True), ("", False)):
        monkeypatch.setenv(rules.ENV_BATCH_INVARIANT, word)
        rules._environment.cache_clear()
        assert config.batch_invariant_enabled() is want
    monkeypatch.setenv(rules.ENV_BATCH_INVARIANT, "on")
    rules._environment.cache_clear()
    with pytest.raises(ValueError, match="allowed: 0 or 1"):
        config.batch_invariant_enabled()


# ----------------------------------------------------------------------------- found beside it


def test_a_python_setting_needs_no_valid_environment_word(monkeypatch):
    """A bad ``WSGEMM_BATCH_INVARIANT`` word raised in every ``choose``, even where Python set
    the switch (``choose`` read the table path from the same check): now only where the word
    decides."""
    monkeypatch.setenv(rules.ENV_BATCH_INVARIANT, "yes")
    rules._environment.cache_clear()
    problem = (1, 128, 4096, 1, "float16", "float16", "float32", 132, (9, 0))
    with config.batch_invariant(True):
        assert rules.choose(*problem).split == 1
    assert rules.choose(*problem, batch_invariant=False) is not None
    with pytest.raises(ValueError, match="allowed: 0 or 1"):
        rules.choose(*problem)


def test_the_tuned_store_follows_the_disk_cache_setting(monkeypatch, tmp_path):
    """The tuned-choice store kept what the disk-cache setting said at its first read: read
    first inside ``disk_cache(False)`` it never saw the file after; read first with the cache
    on it kept serving the file's choices inside ``disk_cache(False)``."""
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(tmp_path))
    autotune.TunedStore().put("H200", 132, "bucket", "sm90", 1, {"sm90": 0.1})
    store = autotune.TunedStore()
    with config.disk_cache(False):
        assert store.get("H200", 132, "bucket") is None
    assert store.get("H200", 132, "bucket") == ("sm90", 1)
    with config.disk_cache(False):
        assert store.get("H200", 132, "bucket") is None
