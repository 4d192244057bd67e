"""The compile cache: variant -> callable, in memory and in the on-disk cache of ``disk.py``
(keyed by the variant and the toolchain fingerprint of ``fingerprint.py``).

A first use of a variant in a process loads its entry from disk (milliseconds) or compiles it
(seconds, logged on the ``wsgemm`` logger at INFO with the variant and the time) and stores it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..registry import Variant
from . import disk, fingerprint, library
from .compile import (
    compile_variant,
    launch_signature,
    operand_majors,
    with_launch_defaults,
    wrap_launch,
)

log = logging.getLogger("wsgemm")

_open_lock = threading.Lock()
_opened: dict[tuple, disk.DiskCache | None] = {}


class CacheError(RuntimeError):
    """An entry could not be put in the on-disk cache (``warm`` reports it)."""


def open_disk_cache() -> disk.DiskCache | None:
    """This process's cache folder, or None when the cache is off or unusable (one warning
    per cause). Opened once per (location, fingerprint)."""
    from .fingerprint import fingerprint

    where = disk.location()
    if where.root is None:
        if not where.why_not.startswith("off"):
            disk.warn_once("location", f"{where.why_not}; compiling in memory")
        return None
    key = (where.root, where.shared, fingerprint())
    with _open_lock:
        if key not in _opened:
            _opened[key] = disk.DiskCache.open(where.root, key[2], where.shared)
        return _opened[key]


def cache_dir() -> Path | None:
    """The folder entries of this toolchain go to, or None when the cache is off or unusable."""
    cache = open_disk_cache()
    return cache.folder if cache is not None else None


def reset() -> None:
    """Forget opened folders and given warnings (tests, or after changing the environment;
    the fingerprint is computed once per process)."""
    with _open_lock:
        _opened.clear()
    _link_failed.clear()
    with disk._warned_lock:
        disk._warned.clear()


def compile_logged(variant: Variant):
    """``compile_variant`` with one INFO line on the ``wsgemm`` logger: a first call that
    compiles blocks for seconds, and this says why."""
    start = time.perf_counter()
    compiled = compile_variant(variant)
    log.info("compiled %s in %.1f s", variant.key(), time.perf_counter() - start)
    return compiled


def export_object(compiled, name: str) -> bytes:
    """The tvm-ffi object file of a compiled kernel, exporting ``name``."""
    with tempfile.TemporaryDirectory(prefix="wsgemm-export-") as folder:
        path = os.path.join(folder, f"{name}.o")
        compiled.export_to_c(path, function_name=name)
        with open(path, "rb") as f:
            return f.read()


def shared_library(obj: bytes) -> bytes | None:
    """``obj`` linked into a shared library that loads without the DSL, or None where none can
    be linked here (said once: INFO without a C compiler driver; a warning if linking fails,
    after which this process links no more)."""
    why = _link_failed[0] if _link_failed else library.why_not_linkable()
    if why:
        if disk.first_time("no-library"):
            log.info("cache entries keep their object only: %s", why)
        return None
    try:
        return library.link(obj)
    except Exception as exc:  # the object alone still loads, through the DSL
        _link_failed.append(f"linking failed ({exc})")
        disk.warn_once("link", f"cannot link a shared library ({exc}); entries keep the object")
        return None


_link_failed: list[str] = []


def store(cache: disk.DiskCache, variant: Variant, compiled) -> tuple[disk.Entry | None, str]:
    """Export (and link) and write ``compiled``: (its entry or None, '' or why it is not
    stored)."""
    key = variant.key()
    try:
        obj = export_object(compiled, disk.entry_name(key))
        launch = launch_signature(variant)
    except Exception as exc:  # the DSL's export failing (TMPDIR full, ...) costs a recompile
        why = f"cannot export {key} ({type(exc).__name__}: {exc})"
        disk.warn_once("export", why)
        return None, why
    why = fingerprint.check_flavour()
    if why:  # the entry would sit under another toolchain's key
        disk.warn_once("flavour", f"not storing compiled kernels: {why}")
        return None, why
    entry = disk.Entry(obj, shared_library(obj), launch)
    return entry, cache.write(key, entry)


def object_bytes(variant: Variant) -> bytes:
    """The verified object of ``variant`` from the disk cache, compiled and stored on a miss
    (``inspect`` reads the cubin inside it)."""
    key = variant.key()
    cache = open_disk_cache()
    if cache is not None:
        entry = cache.read(key)
        if entry is not None:
            return entry.object
        with cache.locked(key):
            entry = cache.read(key)
            if entry is not None:
                return entry.object
            entry, _ = store(cache, variant, compile_logged(variant))
            if entry is not None:
                return entry.object
    return export_object(compile_logged(variant), disk.entry_name(key))


def ensure_on_disk(variant: Variant) -> str:
    """'cached' or 'compiled': ``variant`` has a verified entry now; CacheError if it could not
    be written. Never links: a full cache is checked without running its code."""
    cache = open_disk_cache()
    if cache is None:
        raise CacheError(disk.location().why_not or "the on-disk cache cannot be used")
    key = variant.key()
    if cache.read(key) is not None:
        return "cached"
    with cache.locked(key):
        if cache.read(key) is not None:
            return "cached"
        _, why = store(cache, variant, compile_logged(variant))
    if why:
        raise CacheError(why)
    return "compiled"


class CompileCache:
    """Variant -> ``calls.KernelCall`` (its compiled address entry), in memory and on disk.
    Thread-safe; a failed compile caches nothing. ``compiled``, if given, replaces the disk
    cache and the compiler: ``compiled(variant)`` is the address entry to call (a stand-in's
    no-op, ``wsgemm.api.stand_in``)."""

    def __init__(self, compiled: Callable[[Variant], Callable] | None = None) -> None:
        self._fns: dict[Variant, Callable] = {}
        self._lock = threading.Lock()
        self._compiled = compiled

    def get(self, variant: Variant) -> Callable:
        fn = self._fns.get(variant)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._fns.get(variant)
            if fn is None:
                get = self._compiled or self._load_or_compile
                fn = kernel_call(get(variant), variant)
                self._fns[variant] = fn
        return fn

    def clear(self) -> None:
        with self._lock:
            self._fns.clear()

    def __len__(self) -> int:
        return len(self._fns)

    @staticmethod
    def _load_or_compile(variant: Variant) -> Callable:
        """The variant's address entry taking its launch defaults (``wrap_launch``), whether
        loaded from the disk cache or compiled here (a compiled function takes every launch
        argument: ``kernels.base``)."""
        cache = open_disk_cache()
        if cache is None:
            return with_launch_defaults(compile_logged(variant), variant)
        key = variant.key()
        loaded = cache.load(key)
        if loaded is None:
            with cache.locked(key):
                loaded = cache.load(key)  # another process may have compiled it meanwhile
                if loaded is None:
                    compiled = compile_logged(variant)
                    store(cache, variant, compiled)
                    return with_launch_defaults(compiled, variant)
        log.debug("loaded %s from its %s", key, loaded.form)
        return wrap_launch(loaded.fn, loaded.launch)


def kernel_call(fn: Callable, variant: Variant):
    """``fn``, the compiled address entry of ``variant``, called with kernel views (a
    ``calls.KernelCall``; imported here: ``import wsgemm`` loads neither torch nor the DSL)."""
    import torch

    from .calls import KernelCall

    dtypes = (getattr(torch, variant.ab_dtype), getattr(torch, variant.c_dtype))
    return KernelCall(fn, operand_majors(variant), dtypes)


COMPILE_CACHE = CompileCache()
