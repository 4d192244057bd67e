"""The compile cache: variant -> callable, in memory and in an on-disk object-file cache keyed
by the variant and a fingerprint of the kernel sources and toolchain versions."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .compile import compile_variant, with_launch_defaults
from .registry import Variant


@functools.cache
def _source_fingerprint() -> str:
    """Kernel sources plus toolchain versions: any change invalidates the on-disk cache."""
    import cutlass

    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for sub in ("kernels", "runtime", "host"):
        for path in sorted((root / sub).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    h.update(f"{sys.version_info[:2]} cutlass-dsl={getattr(cutlass, '__version__', '?')}".encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path | None:
    """``$WSGEMM_CACHE_DIR`` or ``~/.cache/wsgemm``; ``WSGEMM_DISK_CACHE=0`` turns it off."""
    if os.environ.get("WSGEMM_DISK_CACHE", "1") == "0":
        return None
    base = os.environ.get("WSGEMM_CACHE_DIR") or Path.home() / ".cache" / "wsgemm"
    return Path(base) / _source_fingerprint()


class CompileCache:
    """Variant -> callable, in memory and on disk. Thread-safe; a failed compile caches nothing."""

    def __init__(self) -> None:
        self._fns: dict[Variant, Callable] = {}
        self._lock = threading.Lock()

    def get(self, variant: Variant) -> Callable:
        fn = self._fns.get(variant)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._fns.get(variant)
            if fn is None:
                fn = self._load_or_compile(variant)
                self._fns[variant] = fn
        return fn

    def clear(self) -> None:
        with self._lock:
            self._fns.clear()

    def __len__(self) -> int:
        return len(self._fns)

    def _load_or_compile(self, variant: Variant) -> Callable:
        import cutlass.cute as cute

        folder = cache_dir()
        name = "wsgemm_" + hashlib.sha256(variant.key().encode()).hexdigest()[:24]
        path = folder / f"{name}.o" if folder else None
        if path is not None and path.exists():
            try:
                loaded = getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), name)
                return with_launch_defaults(loaded, variant)
            except Exception:  # a truncated or stale object is a miss, not an error
                path.unlink(missing_ok=True)
        compiled = compile_variant(variant)
        if path is not None:
            tmp = None
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".o.tmp")
                os.close(fd)
                compiled.export_to_c(tmp, function_name=name)
                os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
                tmp = None
            except Exception:  # a failed export only costs a recompile in the next process
                pass
            finally:
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)
        return compiled


COMPILE_CACHE = CompileCache()


def _warm_one(variant: Variant) -> str:
    COMPILE_CACHE.get(variant)
    return variant.key()


def warm(variants: list[Variant], jobs: int = 1, progress: Callable[[str], None] | None = None):
    """Compile ``variants`` into the on-disk cache, ``jobs`` processes at a time (cute.compile is
    neither thread-safe nor re-entrant, so parallelism is by process)."""
    if cache_dir() is None:
        raise ValueError("the on-disk cache is off (WSGEMM_DISK_CACHE=0): nothing to warm")
    report = progress or (lambda _: None)
    if jobs <= 1:
        for v in variants:
            report(_warm_one(v))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(_warm_one, v) for v in variants]):
            report(fut.result())
