"""What a cached kernel object depends on besides its variant.

Everything that can change the bytes ``cute.compile`` + ``export_to_c`` produce, or whether they
link and run in this process, goes into one fingerprint; the on-disk cache keeps one folder per
fingerprint, so a change of any of them is a clean miss, never a stale hit:

- wsgemm's kernel and host sources and its rules module (support.py);
- Python (major.minor: the DSL traces Python bytecode);
- the DSL: its version, the toolkit flavour it loaded (cu12 or cu13, picked at import from the
  driver), the CUDA version it was built with and the digest of its compiler library;
- apache-tvm-ffi (the entries are tvm-ffi objects linked against libtvm_ffi);
- every DSL environment setting the DSL itself marks ``affects_compile`` (``CUTE_DSL_LINEINFO``,
  ``_ARCH``, ``_COMPILER_OPT``, ``_DEBUG``, ``_ENABLE_ASSERTIONS``, ...), read from the DSL's own
  declaration so a setting added in a later DSL is covered too.

torch is not in it: the entries never touch torch (tensors arrive through DLPack at call time).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from pathlib import Path

# CUTE_DSL_* settings that are computed rather than read, plus the one variable they read.
_EXTRA_SETTINGS = ("CUTE_DSL_LIBS",)


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _source_digest() -> str:
    h = hashlib.sha256()
    root = _package_root()
    # the kernels, the host code that compiles them, and the rules module both import
    paths = [p for sub in ("kernels", "host") for p in sorted((root / sub).rglob("*.py"))]
    for path in [*paths, root / "support.py"]:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def dsl_flavour() -> str:
    """``cu12`` or ``cu13``: the toolkit flavour of the compiler library the DSL loaded (it has
    both in a ``[cu13]`` install and picks at import from the driver, the newest without one)."""
    import cutlass  # noqa: F401  (loads the flavoured library)

    lib = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    m = re.search(r"_cutlass_ir\.(cu\d+)\.", getattr(lib, "__file__", "") or "")
    return m.group(1) if m else "unknown"


def _dsl_library_digest(flavour: str) -> str:
    """The DSL's own build-time digest of its compiler library (``DSO_SHA256``), if it has one."""
    try:
        module = __import__(
            f"cutlass._mlir._mlir_libs._cutlass_ir_version_{flavour}", fromlist=["DSO_SHA256"]
        )
        return ",".join(sorted(getattr(module, "DSO_SHA256", {}).values()))
    except ImportError:
        return ""


def dsl_settings() -> dict[str, str]:
    """The compile-affecting ``CUTE_DSL_*`` variables that are set, as raw strings."""
    names = set(_EXTRA_SETTINGS)
    try:
        from cutlass.cutlass_dsl.cutlass import CuTeDSLEnvironmentManager

        for entry in CuTeDSLEnvironmentManager._ENV_VAR_SPEC:
            if entry.affects_compile and isinstance(entry.source, str):
                names.add(f"CUTE_DSL_{entry.source}")
    except (ImportError, AttributeError):
        # A DSL that no longer declares its settings this way: fall back to every CUTE_DSL_*
        # variable (over-keying only costs a recompile).
        names |= {k for k in os.environ if k.startswith("CUTE_DSL_")}
    return {k: os.environ[k] for k in sorted(names) if k in os.environ}


def _cuda_version(cutlass) -> str:
    v = getattr(cutlass, "CUDA_VERSION", None)
    return f"{v.major}.{v.minor}" if hasattr(v, "major") else str(v)


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.cache
def toolchain() -> dict:
    """The facts the fingerprint is made of (``python -m wsgemm cache info`` prints them)."""
    import cutlass

    flavour = dsl_flavour()
    return {
        "python": "{}.{}".format(*sys.version_info[:2]),
        "python_impl": sys.implementation.name,
        "cutlass_dsl": getattr(cutlass, "__version__", "?"),
        "dsl_flavour": flavour,
        "dsl_cuda": _cuda_version(cutlass),
        "dsl_library": _dsl_library_digest(flavour),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "dsl_settings": dsl_settings(),
        "sources": _source_digest(),
    }


@functools.cache
def fingerprint() -> str:
    """16 hex digits naming the on-disk cache folder of this process's toolchain."""
    facts = toolchain()
    h = hashlib.sha256()
    for key in sorted(facts):
        h.update(f"{key}={facts[key]!r}\n".encode())
    return h.hexdigest()[:16]
