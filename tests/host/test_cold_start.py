"""A new process whose kernels are in the disk cache: what its first call loads, and that it never
imports the DSL (docs/perf.md, entry 16). One real compile (sm_80, no GPU needed) fills a
cache shared by the tests here; each check runs in a fresh interpreter, where "the DSL was
never imported" means something. The GPU test checks a first call's result the same way."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from background import fresh_interpreter

from wsgemm.host import BACKENDS, needs_vector_extent
from wsgemm.host.compiling import cache, disk, fingerprint, library
from wsgemm.host.registry import Variant

REPO = Path(__file__).resolve().parents[2]
V1 = Variant("sm80-multistage", "sm_80")
# the address entry's run-time arguments (kernels/common/address.py) and the one default
LAUNCH = (
    ("token", "a", "b", "c", "m", "n", "k", "l", "a_ld", "a_batch", "b_ld", "b_batch", "c_ld",
     "c_batch", "max_active_clusters", "raster_group"),
    (0,),
)  # fmt: skip


def fresh_env(cache_dir: Path | None = None) -> dict:
    """A fresh interpreter's environment: this checkout's wsgemm and ``cache_dir`` as its disk
    cache."""
    # prepend: a DSL installed on PYTHONPATH (as on the GPU host) must stay importable
    path = [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.pop("WSGEMM_DISK_CACHE", None)
    if cache_dir is not None:
        env["WSGEMM_CACHE_DIR"] = str(cache_dir)
    return env


def last_line(child: subprocess.Popen) -> str:
    """The last line of a fresh interpreter's stdout; it must exit cleanly."""
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    return out.strip().splitlines()[-1]


def run_fresh(code: str, cache_dir: Path | None = None) -> str:
    """``code``'s last line of stdout in a fresh interpreter (which must exit cleanly), with
    this checkout's wsgemm and ``cache_dir`` as its disk cache."""
    with fresh_interpreter(textwrap.dedent(code), fresh_env(cache_dir)) as child:
        return last_line(child)


_FINGERPRINT = """
    import sys
    from wsgemm.host.compiling import fingerprint as f
    before, quiet = f.fingerprint(), "cutlass" not in sys.modules
    import cutlass
    f.fingerprint.cache_clear()
    print(before == f.fingerprint(), f.check_flavour() == "", quiet)
"""


@pytest.fixture(scope="module", autouse=True)
def fingerprints():
    """The fresh interpreter of ``test_the_fingerprint_is_the_same_before_and_after_the_dsl_is_
    imported`` (it imports the DSL: a second), started with this module's first test so that it
    runs beside the real compile (on the other core) rather than after it; None without the
    DSL."""
    if importlib.util.find_spec("cutlass") is None:
        yield None
        return
    with fresh_interpreter(textwrap.dedent(_FINGERPRINT), fresh_env()) as child:
        yield child


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache holding V1, compiled and stored by this process."""
    pytest.importorskip("cutlass")
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WSGEMM_CACHE_DIR", str(root))
        mp.delenv("WSGEMM_DISK_CACHE", raising=False)
        cache.reset()
        try:
            compiled = cache.CompileCache().get(V1)
            store = cache.open_disk_cache()
            yield root, store, compiled
        finally:
            cache.reset()


def test_real_round_trip_compiles_stores_checks_and_links(warm_cache, monkeypatch):
    """Stored with its launch arguments (and a shared library where a C compiler driver is
    found), linked back in this process; then byte flips inside the embedded cubin and inside
    the host code are caught before linking."""
    from wsgemm import sass

    root, store, compiled = warm_cache
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(root))
    path = store.entry(V1.key())
    entry = store.read(V1.key())
    assert entry is not None and entry.object[:4] == b"\x7fELF" and entry.launch == LAUNCH
    if library.linker() is not None:
        assert entry.library is not None and entry.library[:4] == b"\x7fELF"
    cache.reset()
    fn = cache.CompileCache().get(V1)  # a new in-memory cache: linked from the entry
    # the linked entry, behind its launch defaults, called with kernel views
    assert callable(fn) and fn.fn is not compiled
    payload = entry.object  # the last part: its bytes end the file
    cubin = sass.embedded_cubin(payload)
    assert cubin is not None and sass.kernel_resources(cubin, "")
    header = len(path.read_bytes()) - len(payload)
    code = sass._elf_sections(payload)[".ltext"][0]
    good = path.read_bytes()
    try:
        for offset in (payload.find(cubin) + len(cubin) // 2, code + 16):
            flipped = bytearray(good)
            flipped[header + offset] ^= 0xFF
            path.write_bytes(bytes(flipped))
            with pytest.warns(disk.CacheWarning, match="checksum"):
                assert store.read(V1.key()) is None
            path.write_bytes(good)
            cache.reset()  # each bad entry warns once per process
    finally:
        path.write_bytes(good)
        cache.reset()


_LOAD = """
    import sys, warnings
    import torch
    from wsgemm.api import dispatch
    from wsgemm.host.compiling import cache, disk
    from wsgemm.host.dispatch import Dispatcher, StandInDevices
    from wsgemm.host.registry import Variant

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        form = cache.open_disk_cache().load(Variant("sm80-multistage", "sm_80").key()).form
        # A first call, the CPU posing as an sm_80 GPU: validation, route, plan and the
        # kernel's load run as on a GPU; then the kernel's own argument checks refuse the CPU
        # tensors (so it is the real function, taking the launch defaults)
        d = Dispatcher(devices=StandInDevices(capability=(8, 0)))
        a, b = torch.zeros(64, 32, dtype=torch.float16), torch.zeros(48, 32, dtype=torch.float16)
        try:
            dispatch.call(d, a, b.t(), None, None, torch.float32, "sm80-multistage", None)
            answer = "launched on a CPU tensor?"
        except ValueError as exc:
            answer = "cuda" in str(exc)
    print([str(r.message) for r in record if issubclass(r.category, disk.CacheWarning)])
    print(form, answer, "cutlass" in sys.modules)
"""


def _start_loading(cache_dir: Path) -> subprocess.Popen:
    """A new process that loads V1 from ``cache_dir`` (``_loaded`` reads what it prints)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), WSGEMM_CACHE_DIR=str(cache_dir))
    env.pop("WSGEMM_DISK_CACHE", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_LOAD)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _loaded(child: subprocess.Popen) -> tuple[str, str]:
    """(what a new process that loaded V1 printed, its cache warnings)."""
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    warned, result = out.strip().splitlines()[-2:]
    return result, warned


@pytest.fixture(scope="module")
def loads(warm_cache, tmp_path_factory):
    """The new processes of the tests below, started side by side (each imports torch, two
    the DSL: seconds each): ``{name: (cache folder, process)}``. "library": the warm cache
    as stored; "object only": its entry without the library, as stored where no C compiler
    driver was found; "bad library": a library that dlopen refuses (not an ELF file at all,
    with a valid checksum)."""
    root, store, _ = warm_cache
    entry = store.read(V1.key())
    folders = {"library": root}
    for name, lib in (("object only", None), ("bad library", b"not a library")):
        folders[name] = tmp_path_factory.mktemp("cache")
        other = disk.DiskCache.open(folders[name], store.fingerprint)
        assert other.write(V1.key(), disk.Entry(entry.object, lib, entry.launch)) == ""
    if library.linker() is None:
        del folders["library"]
    children = {name: (folder, _start_loading(folder)) for name, folder in folders.items()}
    yield children
    for _, child in children.values():
        if child.poll() is None:
            child.kill()
            child.communicate()


@pytest.mark.skipif(library.linker() is None, reason="no C compiler driver to link a library")
def test_a_new_process_first_call_loads_its_kernel_without_the_dsl(loads):
    _, child = loads["library"]
    assert _loaded(child) == ("library True False", "[]")


def test_without_its_library_an_entry_loads_through_the_dsl(loads):
    """The fallback where no C compiler driver was found when the entry was stored."""
    _, child = loads["object only"]
    assert _loaded(child) == ("object True True", "[]")


def test_a_library_that_does_not_load_falls_back_to_the_object(loads):
    """A library that dlopen refuses: one warning, the object links through the DSL, the
    entry is kept."""
    folder, child = loads["bad library"]
    result, warned = _loaded(child)
    assert result == "object True True"
    assert "cannot load the shared library" in warned and "through the DSL" in warned
    assert list(folder.glob("*/quarantine/*")) == []


def test_the_fingerprint_is_the_same_before_and_after_the_dsl_is_imported(fingerprints):
    """A process that loads its kernels never imports the DSL, one that compiles does: both
    must name the same folder, and the flavour predicted must be the one the DSL loads."""
    pytest.importorskip("cutlass")
    assert last_line(fingerprints) == "True True True"


def test_the_registry_knows_which_kernels_need_vector_extents_without_importing_them():
    pytest.importorskip("cutlass")
    for name, backend in BACKENDS.items():
        assert needs_vector_extent(name) == backend.kernel_class().needs_vector_extent, name


def test_the_runtime_library_found_without_the_dsl_is_the_one_it_uses():
    pytest.importorskip("cutlass")
    from cutlass.runtime import find_runtime_libraries

    ours, (theirs, *_) = library.runtime_library(), find_runtime_libraries(enable_tvm_ffi=False)
    assert ours is not None and os.path.samefile(ours, theirs)
    assert fingerprint.check_flavour() == ""


# ----------------------------------------------------------------------------------------- GPU

_GPU_FIRST_CALL = """
    import sys
    import torch
    from operands import assert_within_torch_error
    torch.cuda.init()
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(257, 129, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(129, 383, device="cuda", dtype=torch.float16, generator=gen)
    import wsgemm
    out = torch.full((257, 383), float("nan"), device="cuda", dtype=torch.float16)
    wsgemm.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
    assert_within_torch_error(out, a.double() @ b.double(), a @ b)
    print("cutlass" in sys.modules)
"""


@pytest.mark.gpu
def test_a_new_process_first_call_from_the_disk_cache_is_right_and_skips_the_dsl(tmp_path):
    """The first process compiles and stores; the second finds the kernel on disk: its result
    is checked (poisoned output, 2x PyTorch's error) and, with a C compiler driver, the DSL
    was never imported. Times nothing: scripts/cold_start.py measures."""
    run_fresh(_GPU_FIRST_CALL, tmp_path)  # compiles (imports the DSL) and stores
    imported = run_fresh(_GPU_FIRST_CALL, tmp_path)
    assert imported == str(library.linker() is None)
    assert list(tmp_path.glob("*/quarantine/*")) == []
    headers = [p.read_bytes().split(b"\n")[1] for p in tmp_path.glob("*/*.o")]
    forms = {part["form"] for h in headers for part in json.loads(h)["parts"]}
    assert forms == ({"object"} if library.linker() is None else {"object", "library"})
