"""What a cached kernel depends on besides its variant.

Everything that can change the bytes ``cute.compile`` + ``export_to_c`` produce, or whether they
link and run in this process, goes into one fingerprint; the on-disk cache keeps one folder per
fingerprint, so a change of any of them is a clean miss, never a stale hit:

- wsgemm's kernel and host sources and its rules module (support.py);
- Python (major.minor: the DSL traces Python bytecode);
- the DSL: its version, the toolkit flavour it loads (cu12 or cu13, picked at import from the
  driver) and the build digest of that flavour's compiler library;
- apache-tvm-ffi (the entries are tvm-ffi objects linked against libtvm_ffi);
- every ``CUTE_DSL_*`` setting but those the DSL declares to change no code (``NO_CODE``).

All of it is read without importing the DSL (``import cutlass`` takes most of a second): a
process that finds its kernels in the cache never imports it (docs/perf.md, entry 16). So the
flavour is predicted the way the DSL picks it, and a compile checks the prediction
(``check_flavour``) before its entry is stored.

torch is not in it: the entries never touch torch (tensors arrive through DLPack at call time).
"""

from __future__ import annotations

import ast
import ctypes
import functools
import hashlib
import os
import re
import sys
from importlib import metadata, util
from pathlib import Path

# CUTE_DSL_* settings the DSL (4.8.1) declares ``affects_compile=False``: logging, dumps, its own
# caches, warnings. Any other CUTE_DSL_* variable, including one a later DSL adds, is keyed:
# over-keying costs a recompile, under-keying a stale kernel (tests/host/test_cache.py checks this
# list against the DSL's declaration).
NO_CODE = frozenset(
    f"CUTE_DSL_{name}"
    for name in (
        "JIT_TIME_PROFILING", "LOG_TO_CONSOLE", "LOG_TO_FILE", "LOG_LEVEL",
        "PRINT_AFTER_PREPROCESSOR", "PRINT_IR", "SHOW_STACKTRACE", "FILTER_STACKTRACE",
        "NO_CACHE", "JIT_CACHE_MAX_ELEMS", "DUMP_DIR", "CACHE_DIR", "KEEP", "KEEP_IR",
        "KEEP_PTX", "KEEP_CUBIN", "KEEP_SASS", "WARNINGS_IGNORE",
        "ENABLE_OPTIMIZATION_WARNINGS", "DISABLE_FILE_CACHING",
    )
)  # fmt: skip
_FLAVOUR_FILE = re.compile(r"^_cutlass_ir\.cu(\d+)\..*\.so$")


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _source_digest() -> str:
    h = hashlib.sha256()
    root = _package_root()
    # the kernels, the host code that compiles them, and the leaf modules the kernels import
    paths = [p for sub in ("kernels", "host") for p in sorted((root / sub).rglob("*.py"))]
    for path in [*paths, root / "support.py", root / "trace_format.py"]:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def dsl_libs_folder() -> Path | None:
    """The DSL's ``_mlir_libs`` folder (its compiler libraries), found without importing it."""
    try:
        spec = util.find_spec("cutlass")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "_mlir" / "_mlir_libs"
    return folder if folder.is_dir() else None


def _driver_cuda_major() -> int | None:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000
    except (OSError, AttributeError):
        pass
    return None


@functools.cache
def dsl_flavour() -> str:
    """``cu12`` or ``cu13``: the toolkit flavour of the compiler library the DSL loads. A
    ``[cu13]`` install has both and the DSL picks at import: the newest the driver supports,
    the newest without a driver. This predicts its pick without importing it."""
    folder = dsl_libs_folder()
    installed = set()
    if folder is not None:
        for entry in folder.iterdir():
            m = _FLAVOUR_FILE.match(entry.name)
            if m:
                installed.add(int(m.group(1)))
    driver = _driver_cuda_major()
    usable = sorted((v for v in installed if driver is None or v <= driver), reverse=True)
    return f"cu{usable[0]}" if usable else "unknown"


def loaded_flavour() -> str | None:
    """The flavour the DSL actually loaded, if it is imported (else None)."""
    lib = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    m = re.search(r"_cutlass_ir\.(cu\d+)\.", getattr(lib, "__file__", "") or "")
    return m.group(1) if m else None


def check_flavour() -> str:
    """'' if the DSL (imported) loaded the predicted flavour, else why an entry it compiled
    must not be stored under this fingerprint."""
    loaded = loaded_flavour()
    if loaded is None or loaded == dsl_flavour():
        return ""
    return f"the DSL loaded {loaded}, but {dsl_flavour()} was predicted for the cache key"


def _dsl_library_digest(flavour: str) -> str:
    """The DSL's own build-time digest of its compiler library (``DSO_SHA256`` in
    ``_cutlass_ir_version_<flavour>.py``), read as data, not imported."""
    folder = dsl_libs_folder()
    if folder is None:
        return ""
    try:
        tree = ast.parse((folder / f"_cutlass_ir_version_{flavour}.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DSO_SHA256" for t in node.targets
        ):
            try:
                digests = ast.literal_eval(node.value)
                return ",".join(sorted(str(v) for v in digests.values()))
            except (ValueError, AttributeError):
                return ""
    return ""


def dsl_settings() -> dict[str, str]:
    """The ``CUTE_DSL_*`` variables that are set and may change code, as raw strings."""
    names = sorted(k for k in os.environ if k.startswith("CUTE_DSL_") and k not in NO_CODE)
    return {k: os.environ[k] for k in names}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.cache
def _static_facts() -> dict:
    flavour = dsl_flavour()
    return {
        "python": "{}.{}".format(*sys.version_info[:2]),
        "python_impl": sys.implementation.name,
        "cutlass_dsl": _version("nvidia-cutlass-dsl"),
        "dsl_flavour": flavour,
        "dsl_library": _dsl_library_digest(flavour),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "sources": _source_digest(),
    }


def key_facts() -> dict:
    """The facts the fingerprint is made of (no DSL import)."""
    return {**_static_facts(), "dsl_settings": dsl_settings()}


def toolchain() -> dict:
    """``key_facts`` and, for ``python -m wsgemm cache info``, the CUDA version the DSL was
    built with (this one imports the DSL)."""
    import cutlass

    v = getattr(cutlass, "CUDA_VERSION", None)
    cuda = f"{v.major}.{v.minor}" if hasattr(v, "major") else str(v)
    return {**key_facts(), "dsl_cuda": cuda}


@functools.cache
def fingerprint() -> str:
    """16 hex digits naming the on-disk cache folder of this process's toolchain (computed
    once per process)."""
    facts = key_facts()
    h = hashlib.sha256()
    for key in sorted(facts):
        h.update(f"{key}={facts[key]!r}\n".encode())
    return h.hexdigest()[:16]
