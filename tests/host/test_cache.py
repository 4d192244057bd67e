"""The on-disk compile cache (host/compiling/disk.py, cache.py) on the CPU: hits, misses, every
kind of bad entry, crash markers, ownership and permission checks, degraded caches, locks,
pruning. A stand-in replaces the compiler and the linker (a real round trip is the last test),
so these run in well under a second each."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import warnings

import pytest

from wsgemm.host.compiling import cache, disk, files, fingerprint, library
from wsgemm.host.compiling.calls import KernelCall
from wsgemm.host.registry import Variant

FP = "0123456789abcdef"
V1 = Variant("sm80-multistage", "sm_80")
V2 = Variant("sm80-multistage", "sm_80", "bfloat16")
LAUNCH = (("mA", "mB", "mC", "max_active_clusters", "raster_group"), (0,))


class FakeCompiled:
    """What the stand-in compile returns: exports a small object naming its variant."""

    def __init__(self, variant):
        self.key = variant.key()

    def export_to_c(self, path, function_name):
        with open(path, "wb") as f:
            f.write(payload_of(self.key, function_name))


def compiled_here(fn) -> bool:
    """``fn`` is what the stand-in compile made (wrapped with its launch defaults, as every
    function compiled in the process is: ``kernels.base``), not an entry loaded from disk."""
    return isinstance(getattr(fn, "__wrapped__", None), FakeCompiled)


def payload_of(key: str, name: str) -> bytes:
    # a few KB with a "code" and a "data" part, like an object file
    return b"\x7fOBJ" + name.encode() + b"\0" + key.encode() + bytes(range(256)) * 16


def entry_of(key: str) -> disk.Entry:
    return disk.Entry(payload_of(key, disk.entry_name(key)), None, LAUNCH)


def library_of(obj: bytes) -> bytes:
    """What the stand-in linker makes of an object."""
    return b"\x7fLIB" + obj[::-1]


class World:
    """The cache under test: counts compiles and records the bytes each link received."""

    def __init__(self, root):
        self.root = root
        self.folder = root / FP
        self.compiles: list[str] = []
        self.links: list[bytes] = []  # objects linked through the DSL
        self.libraries: list[bytes] = []  # shared libraries loaded without it

    def get(self, variant=V1):
        """One call of a fresh process: a new in-memory cache, folders opened anew."""
        cache.reset()
        call = cache.CompileCache().get(variant)
        majors = (variant.a_major, variant.b_major, "n")
        assert isinstance(call, KernelCall) and call.majors == majors
        return call.fn  # what was loaded or compiled

    def entry(self, variant=V1):
        return self.folder / f"{disk.entry_name(variant.key())}.o"

    def quarantined(self):
        q = self.folder / "quarantine"
        return sorted(q.iterdir()) if q.is_dir() else []


@pytest.fixture
def world(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    for name in ("WSGEMM_DISK_CACHE", "WSGEMM_CACHE_SHARED", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(root))
    monkeypatch.setattr(fingerprint, "fingerprint", lambda: FP)
    w = World(root)

    def fake_compile(variant, keep=False):
        w.compiles.append(variant.key())
        return FakeCompiled(variant)

    def fake_link(payload, name):
        w.links.append(payload)
        assert name.encode() in payload, "linked an object exporting another name"
        return ("linked", payload)

    def fake_load_library(payload, name):
        w.libraries.append(payload)
        return ("loaded", payload)

    monkeypatch.setattr(cache, "compile_variant", fake_compile)
    monkeypatch.setattr(cache, "launch_signature", lambda variant: LAUNCH)
    monkeypatch.setattr(disk, "link", fake_link)
    monkeypatch.setattr(disk, "link_library", fake_load_library)
    # no C compiler driver in this world (``linking_world`` has one)
    monkeypatch.setattr(library, "why_not_linkable", lambda: "no linker in the test world")
    # a linked stand-in is no kernel: the launch-defaults wrapper
    # (tests/kernels/test_compile_sass.py checks it on a real one) would hide what was linked
    monkeypatch.setattr(cache, "wrap_launch", lambda fn, launch: fn)
    cache.reset()
    yield w
    cache.reset()


def cache_warnings(record) -> list[str]:
    return [str(r.message) for r in record if issubclass(r.category, disk.CacheWarning)]


# ----------------------------------------------------------------------------- hits and misses


def test_miss_compiles_and_stores_then_a_new_process_links_the_verified_bytes(world):
    first = world.get()
    assert compiled_here(first) and world.compiles == [V1.key()]
    data = world.entry().read_bytes()
    assert data.startswith(disk.MAGIC)
    payload = payload_of(V1.key(), disk.entry_name(V1.key()))
    assert data.endswith(payload)
    assert world.get() == ("linked", payload)
    assert world.compiles == [V1.key()] and world.links == [payload]
    assert world.entry().stat().st_mode & 0o777 == 0o600
    assert world.folder.stat().st_mode & 0o777 == 0o700


def test_the_in_memory_cache_compiles_once_per_process(world):
    c = cache.CompileCache()
    assert c.get(V1) is c.get(V1) and len(c) == 1
    assert world.compiles == [V1.key()]


def test_compile_is_logged_with_the_variant_and_time(world, caplog):
    caplog.set_level("INFO", logger="wsgemm")
    world.get()
    lines = [r.getMessage() for r in caplog.records if r.name == "wsgemm"]
    (line,) = [m for m in lines if m.startswith("compiled")]
    assert line.startswith(f"compiled {V1.key()} in ") and line.endswith(" s")
    assert "keep their object only: no linker" in " ".join(lines), "the fallback is not said"


# ----------------------------------------------------------------------------- bad entries


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _payload_start(path) -> int:
    return path.read_bytes().index(b"\n", len(disk.MAGIC)) + 1


CORRUPTIONS = {
    "flip in the data": lambda p: _flip(p, p.stat().st_size - 100),
    "flip in the code": lambda p: _flip(p, _payload_start(p) + 10),
    "flip in the header": lambda p: _flip(p, len(disk.MAGIC) + 15),
    "truncated to half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "truncated to zero": lambda p: p.write_bytes(b""),
    "no header (a bare object)": lambda p: p.write_bytes(p.read_bytes()[_payload_start(p) :]),
    "bytes appended": lambda p: p.write_bytes(p.read_bytes() + b"\0"),
    "random bytes": lambda p: p.write_bytes(os.urandom(5000)),
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupt_entry_is_quarantined_and_recompiled(world, how):
    world.get()
    CORRUPTIONS[how](world.entry())
    bad = world.entry().read_bytes()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert compiled_here(world.get())
    assert world.links == [], "a corrupt entry was linked"
    assert len(world.compiles) == 2
    (moved,) = world.quarantined()
    assert moved.read_bytes() == bad
    (message,) = cache_warnings(record)
    assert "quarantined" in message
    assert world.get()[0] == "linked", "the rewritten entry is good"


def test_an_entry_of_another_variant_under_this_name_is_refused(world):
    world.get(V2)
    os.replace(world.entry(V2), world.entry(V1))
    with pytest.warns(disk.CacheWarning, match="another variant"):
        assert compiled_here(world.get(V1)) and world.links == []
    assert len(world.quarantined()) == 1


def test_a_directory_at_the_entry_path_is_moved_away(world):
    world.folder.mkdir(parents=True)
    world.entry().mkdir()
    (world.entry() / "x").write_text("x")
    with pytest.warns(disk.CacheWarning):
        assert compiled_here(world.get())
    assert world.entry().is_file() and len(world.quarantined()) == 1


def test_a_fifo_at_the_entry_path_never_blocks(world):
    world.folder.mkdir(parents=True)
    os.mkfifo(world.entry())
    done = threading.Event()
    result = []
    thread = threading.Thread(target=lambda: (result.append(world.get()), done.set()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        thread.start()
        assert done.wait(10), "reading a FIFO entry blocked"
    assert compiled_here(result[0]) and world.entry().is_file()


@pytest.mark.parametrize("target", ["/dev/zero", "missing"])
def test_a_symlink_at_the_entry_path_is_not_followed(world, target):
    world.folder.mkdir(parents=True)
    world.entry().symlink_to(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert compiled_here(world.get())
    assert not world.entry().is_symlink() and world.get()[0] == "linked"


# ----------------------------------------------------------------------------- crash markers


def test_an_entry_that_killed_its_process_while_linking_is_quarantined_once(world, monkeypatch):
    world.get()
    pid = os.fork()
    if pid == 0:  # the child dies inside the linker, as a SIGSEGV would end it
        monkeypatch.setattr(disk, "link", lambda payload, name: os._exit(139))
        cache.reset()
        cache.CompileCache().get(V1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 139
    assert list(world.folder.glob("*.loading.*")), "the dead process left its marker"
    with pytest.warns(disk.CacheWarning, match="died while linking"):
        assert compiled_here(world.get())
    assert world.links == [] and len(world.quarantined()) == 1
    assert not list(world.folder.glob("*.loading.*"))
    assert world.get()[0] == "linked"


def test_a_marker_whose_process_is_still_linking_is_left_alone(world):
    world.get()
    marker = world.folder / f"{disk.entry_name(V1.key())}.loading.other"
    with open(marker, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live process linking the same entry right now
        assert world.get()[0] == "linked"
    assert world.quarantined() == [] and marker.exists()


def test_a_clean_link_leaves_no_marker(world):
    world.get()
    world.get()
    assert not list(world.folder.glob("*.loading.*"))


def test_an_entry_that_fails_to_link_is_quarantined(world, monkeypatch):
    world.get()

    def broken(payload, name):
        raise RuntimeError("JITLink: symbol not found")

    monkeypatch.setattr(disk, "link", broken)
    with pytest.warns(disk.CacheWarning, match="does not link"):
        assert compiled_here(world.get())
    assert len(world.quarantined()) == 1


# ----------------------------------------------------------------------------- the two forms


@pytest.fixture
def linking_world(world, monkeypatch):
    """``world`` with a C compiler driver: entries hold a shared library besides the object."""
    links = []

    def fake_link(obj):
        links.append(obj)
        return library_of(obj)

    monkeypatch.setattr(library, "why_not_linkable", lambda: "")
    monkeypatch.setattr(library, "link", fake_link)
    world.linker_runs = links
    return world


def test_an_entry_with_a_library_loads_it_and_never_links_the_object(linking_world):
    w = linking_world
    assert compiled_here(w.get())
    obj = payload_of(V1.key(), disk.entry_name(V1.key()))
    assert w.linker_runs == [obj]
    entry = disk.DiskCache(w.root, FP).read(V1.key())
    assert entry == disk.Entry(obj, library_of(obj), LAUNCH) and entry.form == "library"
    assert w.get() == ("loaded", library_of(obj))
    assert w.libraries == [library_of(obj)] and w.links == []


def test_a_library_that_does_not_load_here_falls_back_to_the_object(linking_world, monkeypatch):
    """A memory file or temporary folder that may not hold code, say: the object still links
    (through the DSL), the entry stays, and the next process tries the library again."""
    w = linking_world
    w.get()

    def refused(payload, name):
        raise OSError("failed to map segment from shared object")

    monkeypatch.setattr(disk, "link_library", refused)
    with pytest.warns(disk.CacheWarning, match="cannot load the shared library.*map segment"):
        assert w.get()[0] == "linked"
    assert w.quarantined() == [] and disk.DiskCache(w.root, FP).read(V1.key()).library


def test_an_entry_whose_library_and_object_both_fail_is_quarantined(linking_world, monkeypatch):
    w = linking_world
    w.get()
    monkeypatch.setattr(disk, "link_library", lambda payload, name: 1 / 0)
    monkeypatch.setattr(disk, "link", lambda payload, name: 1 / 0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert compiled_here(w.get())
    assert any("does not link" in m for m in cache_warnings(record))
    assert len(w.quarantined()) == 1 and len(w.compiles) == 2


def test_a_flip_in_the_library_is_caught_before_loading(linking_world):
    w = linking_world
    w.get()
    _flip(w.entry(), _payload_start(w.entry()) + 10)  # the library is the first part
    with pytest.warns(disk.CacheWarning, match="checksum mismatch in its library"):
        assert compiled_here(w.get())
    assert w.libraries == [] and w.links == [] and len(w.quarantined()) == 1


def test_a_failing_linker_stores_the_object_alone_with_one_warning(linking_world, monkeypatch):
    w = linking_world
    runs = []

    def failing(obj):
        runs.append(obj)
        raise RuntimeError("cc exited with 1: undefined reference to `TVMFFIEnvGetStream'")

    monkeypatch.setattr(library, "link", failing)
    with pytest.warns(disk.CacheWarning, match="cannot link a shared library.*undefined"):
        c = cache.CompileCache()
        c.get(V1)
        c.get(V2)
    assert len(runs) == 1, "a process whose linker failed once tried again"
    assert disk.DiskCache(w.root, FP).read(V2.key()).form == "object"
    assert w.get()[0] == "linked"


def test_a_kernel_compiled_under_another_flavour_than_predicted_is_not_stored(world, monkeypatch):
    """The key names the flavour predicted without the DSL; an entry compiled by a DSL that
    loaded another one would sit under the wrong key."""
    monkeypatch.setattr(fingerprint, "check_flavour", lambda: "the DSL loaded cu12, not cu13")
    with pytest.warns(disk.CacheWarning, match="not storing.*cu12"):
        assert compiled_here(world.get())
    assert not world.entry().exists()
    with pytest.raises(cache.CacheError, match="cu12"):
        cache.ensure_on_disk(V1)


@pytest.mark.parametrize(
    "header",
    [
        {"launch": {"names": ["a b"], "defaults": []}},
        {"launch": {"names": ["a"], "defaults": [0, 0]}},
        {"launch": {"names": ["a"], "defaults": ["0"]}},
        {"parts": [{"form": "library", "size": 1, "sha256": "0"}]},
        {"parts": [{"form": "code", "size": 1, "sha256": "0"}]},
    ],
)
def test_a_header_with_bad_launch_arguments_or_parts_is_refused(header):
    import json

    good = disk.frame(entry_of(V1.key()), V1.key(), FP)
    end = good.index(b"\n", len(disk.MAGIC))
    fields = {**json.loads(good[len(disk.MAGIC) : end]), **header}
    body = good[end + 1 :]
    if "parts" in header:
        body = body[:1]
    data = disk.MAGIC + json.dumps(fields).encode() + b"\n" + body
    with pytest.raises(disk.BadEntry):
        disk.unframe(data, V1.key(), FP)


# ----------------------------------------------------------------------------- trust


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_folder_writable_by_others_is_not_loaded_from(world, mode):
    world.get()
    world.root.chmod(mode)
    with pytest.warns(disk.CacheWarning, match="WSGEMM_CACHE_SHARED"):
        assert compiled_here(world.get())
    assert world.links == []
    world.root.chmod(0o700)


def test_a_shared_cache_is_used_when_the_user_opts_in(world, monkeypatch):
    world.get()
    world.root.chmod(0o777)
    monkeypatch.setenv("WSGEMM_CACHE_SHARED", "1")
    assert world.get()[0] == "linked"


@pytest.mark.skipif(os.getuid() != 0, reason="chown needs root")
def test_another_users_entry_or_folder_is_refused(world, monkeypatch):
    world.get()
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    os.chown(world.root, 4242, -1)
    os.chown(world.folder, 4242, -1)
    os.chown(world.entry(), 4343, -1)
    with pytest.warns(disk.CacheWarning, match="owned by uid 4343"):
        assert compiled_here(world.get())
    assert world.links == [] and len(world.quarantined()) == 1
    os.chown(world.folder, 4343, -1)
    with pytest.warns(disk.CacheWarning, match="owned by uid 4343"):
        assert compiled_here(world.get())


def test_a_group_writable_entry_is_refused(world):
    world.get()
    world.entry().chmod(0o620)
    with pytest.warns(disk.CacheWarning, match="writable by group"):
        assert compiled_here(world.get())
    assert world.links == []


# ----------------------------------------------------------------------------- degraded caches


def _erofs(*args, **kwargs):
    raise OSError(30, "Read-only file system")


def test_a_read_only_cache_loads_good_entries_and_compiles_the_rest_in_memory(world, monkeypatch):
    world.get()
    monkeypatch.setattr(disk.tempfile, "mkstemp", _erofs)
    assert world.get()[0] == "linked", "a read-only cache still serves its entries"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.reset()
        c = cache.CompileCache()
        assert compiled_here(c.get(V2).fn)
        assert compiled_here(c.get(Variant("sm80", "sm_80")).fn)
    (message,) = cache_warnings(record)
    assert "cannot write" in message and "Read-only" in message


def test_a_bad_entry_that_cannot_be_moved_is_skipped_not_raised(world, monkeypatch):
    world.get()
    world.entry().write_bytes(b"junk")
    monkeypatch.setattr(disk.os, "replace", _erofs)
    monkeypatch.setattr(disk.os, "unlink", _erofs)
    monkeypatch.setattr(disk.Path, "unlink", _erofs)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.reset()
        assert compiled_here(cache.CompileCache().get(V1).fn)
    assert any("cannot be moved away" in m for m in cache_warnings(record))
    assert world.entry().read_bytes() == b"junk"


@pytest.mark.parametrize("case", ["root is a file", "folder is a file", "name too long"])
def test_an_unusable_location_compiles_in_memory_with_one_warning(world, monkeypatch, case):
    if case == "root is a file":
        world.root.write_text("a file")
    elif case == "folder is a file":
        world.root.mkdir()
        world.folder.write_text("")
    else:
        monkeypatch.setenv("WSGEMM_CACHE_DIR", str(world.root / ("x" * 300)))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.reset()
        c = cache.CompileCache()
        assert compiled_here(c.get(V1).fn) and compiled_here(c.get(V2).fn)
    (message,) = cache_warnings(record)
    assert "cannot create" in message


def test_a_full_disk_is_one_warning_and_no_partial_entry(world, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def write(self, data):
            self.f.write(data[:100])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.warns(disk.CacheWarning, match="No space left"):
        assert compiled_here(world.get())
    assert not world.entry().exists() and not list(world.folder.glob("*.tmp"))


def test_no_home_directory_compiles_in_memory(world, monkeypatch):
    monkeypatch.delenv("WSGEMM_CACHE_DIR")

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(disk.Path, "home", staticmethod(no_home))
    assert disk.location().root is None
    with pytest.warns(disk.CacheWarning, match="WSGEMM_CACHE_DIR"):
        assert compiled_here(world.get())


@pytest.mark.parametrize("word", ["0", "false", "No", " off ", "OFF\n"])
def test_the_usual_false_words_turn_the_cache_off(world, monkeypatch, word):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", word)
    assert disk.location().root is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled_here(world.get())
    assert not world.root.exists()


@pytest.mark.parametrize("word", ["1", "yes", "on", ""])
def test_true_words_and_empty_keep_it_on(world, monkeypatch, word):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", word)
    assert disk.location().root == world.root


def test_an_unknown_word_keeps_it_on_with_a_warning(world, monkeypatch):
    monkeypatch.setenv("WSGEMM_DISK_CACHE", "maybe")
    with pytest.warns(disk.CacheWarning, match="maybe"):
        assert disk.location().root == world.root


def test_xdg_cache_home_and_a_relative_dir(world, monkeypatch, tmp_path):
    monkeypatch.delenv("WSGEMM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk.location().root == tmp_path / "xdg" / "wsgemm"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WSGEMM_CACHE_DIR", "rel/c")
    assert disk.location().root == tmp_path / "rel" / "c"


# ----------------------------------------------------------------------------- concurrency


def test_a_process_waits_for_the_one_compiling_the_entry_and_loads_its_result(world):
    world.folder.mkdir(parents=True)
    lock = world.folder / f"{disk.entry_name(V1.key())}.lock"
    result = []
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is compiling V1
        cache.reset()
        thread = threading.Thread(target=lambda: result.append(cache.CompileCache().get(V1).fn))
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive() and world.compiles == []
        other = disk.DiskCache(world.root, FP)
        other.write(V1.key(), entry_of(V1.key()))
    thread.join(10)
    assert world.compiles == [], "the waiting process compiled again"
    assert result[0][0] == "linked"


def test_a_concurrent_writer_never_exposes_a_partial_entry(world):
    store = disk.DiskCache.open(world.root, FP)
    payload = disk.Entry(payload_of(V1.key(), "x") * 50, library_of(b"x" * 9000), LAUNCH)
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            got = store.read(V1.key())
            if got is not None:
                seen.append(got == payload)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(50):
        assert store.write(V1.key(), payload) == ""
    stop.set()
    thread.join()
    assert seen and all(seen) and world.quarantined() == []


# ----------------------------------------------------------------------------- housekeeping


def test_prune_removes_stale_temporaries_and_long_unused_folders_only(world):
    world.get()
    now = time.time()
    old, recent, current = (
        world.root / "aaaaaaaaaaaaaaaa",
        world.root / "bbbbbbbbbbbbbbbb",
        world.folder,
    )
    for folder, age_days in ((old, 40), (recent, 3)):
        folder.mkdir()
        (folder / "e.o").write_bytes(b"x")
        (folder / ".last-used").touch()
        t = now - age_days * 86400
        os.utime(folder / ".last-used", (t, t))
        os.utime(folder, (t, t))
    mine = world.root / "notes"
    mine.mkdir()
    os.utime(mine, (now - 400 * 86400,) * 2)
    stale, fresh = current / "x.tmp", current / "y.tmp"
    stale.touch()
    fresh.touch()
    os.utime(stale, (now - 7200, now - 7200))
    disk.DiskCache(world.root, FP).maybe_prune(force=True)
    assert not old.exists() and recent.exists() and current.exists() and mine.exists()
    assert not stale.exists() and fresh.exists() and world.entry().exists()


def test_prune_runs_at_most_once_a_day(world):
    world.get()
    old = world.root / "aaaaaaaaaaaaaaaa"
    old.mkdir()
    os.utime(old, (time.time() - 40 * 86400,) * 2)
    world.get(V2)  # a write, and the first prune happened with the first write
    assert old.exists()


def test_quarantine_keeps_a_bounded_number(world, monkeypatch):
    monkeypatch.setattr(disk, "QUARANTINE_KEEP", 3)
    for _ in range(5):
        world.get()
        world.entry().write_bytes(b"junk")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            world.get()
    assert len(world.quarantined()) == 3


def test_clear_removes_only_the_caches_folders(world):
    world.get()
    (world.root / "notes").mkdir()
    folders, size = disk.clear(world.root)
    assert folders == 1 and size > 0
    assert not world.folder.exists() and (world.root / "notes").exists()


def test_private_copy_holds_exactly_the_bytes_and_leaves_nothing(monkeypatch):
    payload = os.urandom(100_000)
    with files.private_copy(payload) as path:
        with open(path, "rb") as f:
            assert f.read() == payload
    monkeypatch.delattr(os, "memfd_create")
    with files.private_copy(payload) as path:
        assert os.stat(path).st_mode & 0o777 == 0o600
        with open(path, "rb") as f:
            assert f.read() == payload
    assert not os.path.exists(path)


# ----------------------------------------------------------------------------- the key


def _fresh_fingerprint() -> str:
    for memo in (fingerprint.fingerprint, fingerprint._static_facts, fingerprint.dsl_flavour):
        memo.cache_clear()
    return fingerprint.fingerprint()


def test_the_fingerprint_covers_flavour_tvm_ffi_and_compile_settings(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CUTE_DSL_"):
            monkeypatch.delenv(name)
    try:
        base = _fresh_fingerprint()
        facts = fingerprint.key_facts()
        assert facts["dsl_flavour"] in ("cu12", "cu13") and facts["dsl_library"]
        assert facts["tvm_ffi"] != "none" and facts["cutlass_dsl"] != "none"
        assert facts["dsl_settings"] == {}
        for setting in ("LINEINFO", "ARCH", "COMPILER_OPT", "DEBUG", "ENABLE_ASSERTIONS", "NEW"):
            monkeypatch.setenv(f"CUTE_DSL_{setting}", "1")
            assert _fresh_fingerprint() != base, f"CUTE_DSL_{setting} is not in the key"
            monkeypatch.delenv(f"CUTE_DSL_{setting}")
        monkeypatch.setenv("CUTE_DSL_LOG_TO_CONSOLE", "1")  # changes no code
        assert _fresh_fingerprint() == base
        monkeypatch.setattr(fingerprint, "_driver_cuda_major", lambda: 12)
        assert _fresh_fingerprint() != base, "the flavour a CUDA 12 driver gets is not keyed"
    finally:
        monkeypatch.undo()
        _fresh_fingerprint()


def test_the_settings_left_out_of_the_key_are_those_the_dsl_says_change_no_code():
    pytest.importorskip("cutlass")
    from cutlass.cutlass_dsl.cutlass import CuTeDSLEnvironmentManager

    affecting = {
        f"CUTE_DSL_{e.source}"
        for e in CuTeDSLEnvironmentManager._ENV_VAR_SPEC
        if e.affects_compile and isinstance(e.source, str)
    }
    assert affecting and not affecting & fingerprint.NO_CODE
