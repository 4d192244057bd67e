"""The shared-library form of a cache entry: loaded through tvm-ffi without the DSL.

An exported kernel is a relocatable object (``export_to_c``). The DSL links one into a process
with its in-process linker (LLVM JITLink), which needs ``import cutlass``: most of a second of a
new process's first call (docs/perf.md, entry 16). Linked once more at store time by the
system's C compiler driver into a shared library, the same code loads with ``dlopen`` through
tvm-ffi, which a call needs anyway, plus the DSL's C runtime library (``libcute_dsl_runtime``,
a plain shared library): no Python of the DSL at all.

Linux only. Where no compiler driver is found (``$CC``, ``cc``, ``gcc``, ``clang``), or it
fails, an entry keeps only its object and loads through the DSL as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import files, fingerprint

RUNTIME_NAME = "libcute_dsl_runtime.so"
# Linking one kernel takes ~40 ms; a driver this slow is stuck.
LINK_TIMEOUT_S = 120.0

_lock = threading.Lock()
_runtime: ctypes.CDLL | None = None
# Loaded libraries and the descriptors of their private copies, for the life of the process:
# dlopen matches an already loaded library by path, so a closed descriptor's number, reused for
# another entry's copy, would hand back the old library.
_held: list = []
_serial = itertools.count()


def supported() -> bool:
    return sys.platform.startswith("linux")


def runtime_library() -> Path | None:
    """The DSL's C runtime library, found without importing the DSL as the DSL finds it:
    ``$CUTE_DSL_LIBS`` if set, else ``lib/`` or ``cu<N>/lib/`` (N: the flavour) in a folder
    above the DSL's package. None if there is none."""
    listed = os.environ.get("CUTE_DSL_LIBS")
    if listed:
        for path in listed.split(os.pathsep):
            if path.endswith(RUNTIME_NAME) and os.path.isfile(path):
                return Path(path)
        return None
    folder = fingerprint.dsl_libs_folder()
    if folder is None:
        return None
    flavour = fingerprint.dsl_flavour()
    for ancestor in folder.resolve().parents:
        for sub in ("lib", f"{flavour}/lib"):
            candidate = ancestor / sub / RUNTIME_NAME
            if candidate.is_file():
                return candidate
    return None


def linker() -> list[str] | None:
    """The C compiler driver that links shared libraries here (``$CC`` first), or None."""
    cc = os.environ.get("CC")
    words = shlex.split(cc) if cc else []
    if words and shutil.which(words[0]):
        return [shutil.which(words[0]), *words[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def why_not_linkable() -> str:
    """'' if ``link`` can run in this process (the DSL is imported: a compile just ran), else
    why not, for an entry that then keeps its object only."""
    if not supported():
        return f"shared-library entries are Linux only ({sys.platform})"
    if linker() is None:
        return "no C compiler driver (cc, gcc, clang or $CC) to link a shared library"
    ours = runtime_library()
    try:
        from cutlass.runtime import find_runtime_libraries

        theirs = find_runtime_libraries(enable_tvm_ffi=False)
    except Exception as exc:  # a DSL that finds its runtime another way: keep the object
        return f"cannot ask the DSL for its runtime library ({type(exc).__name__}: {exc})"
    if ours is None or not theirs or not _same_file(ours, theirs[0]):
        return f"the DSL's runtime library is {theirs or 'not found'}, expected {ours}"
    return fingerprint.check_flavour()


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def link(object_bytes: bytes) -> bytes:
    """A shared library of an exported tvm-ffi object, every symbol resolved now (``-z defs``,
    ``-z now``) against the DSL's runtime and libtvm_ffi. Raises RuntimeError on failure."""
    import tvm_ffi.libinfo

    runtime = runtime_library()
    cc = linker()
    if runtime is None or cc is None:
        raise RuntimeError("no runtime library or no C compiler driver")
    with tempfile.TemporaryDirectory(prefix="wsgemm-link-") as folder:
        obj, lib = os.path.join(folder, "k.o"), os.path.join(folder, "k.so")
        with open(obj, "wb") as f:
            f.write(object_bytes)
        # by path: DT_NEEDED records the libraries' sonames, matched at load time against the
        # copies ``load`` opens first, so the library carries no search path
        command = [
            *cc, "-shared", "-o", lib, obj, str(runtime), tvm_ffi.libinfo.find_libtvm_ffi(),
            "-Wl,-z,defs", "-Wl,-z,now",
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, timeout=LINK_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"{cc[0]} failed to run ({exc})") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{cc[0]} exited with {done.returncode}: {' / '.join(tail)}")
        with open(lib, "rb") as f:
            return f.read()


def _open_runtime() -> None:
    """Open the DSL's runtime library once; a loaded entry's dependency on it (by soname)
    then resolves to this copy."""
    global _runtime
    if _runtime is None:
        path = runtime_library()
        if path is None:
            raise OSError("the DSL's runtime library (libcute_dsl_runtime.so) is not found")
        _runtime = ctypes.CDLL(str(path))


def load(payload: bytes, name: str):
    """The tvm-ffi function ``name`` of a verified shared library, loaded from a private copy
    of ``payload`` (never from the cache's path): an anonymous memory file, else (no memfd, or
    one that may not hold code) a 0600 temporary file. Raises the last failure."""
    import tvm_ffi

    loader = tvm_ffi.get_global_func("ffi.Module.load_from_file.so")
    with _lock:
        _open_runtime()
        error: BaseException = OSError("no private copy could be made")
        for copy in (_memory_copy, _file_copy):
            try:
                fd, path = copy(payload, name)
            except OSError as exc:
                error = exc
                continue
            try:
                # tvm-ffi's loader for ".so" files, called directly: a copy's path may have
                # no suffix
                module = loader(path, "so")
                fn = module[name]
            except Exception as exc:
                _discard(fd, path)
                error = exc
                continue
            if fd is None:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # loaded: the mapping outlives the name
            _held.append((module, fd))
            return fn
        raise error


def _memory_copy(payload: bytes, name: str) -> tuple[int, str]:
    return files.memory_file(payload, f"wsgemm-{name}")


def _file_copy(payload: bytes, name: str) -> tuple[None, str]:
    # a name never used before in this process (see ``_held``)
    prefix = f"wsgemm-{name}-{os.getpid()}-{next(_serial)}-"
    return None, files.temporary_file(payload, prefix, ".so")


def _discard(fd: int | None, path: str) -> None:
    with contextlib.suppress(OSError):
        if fd is not None:
            os.close(fd)
        else:
            os.unlink(path)
