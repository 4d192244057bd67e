"""The on-disk compile cache: one file per compiled variant, linked into the process only after
checks, because an entry is code: whatever object sits at an entry's path runs in the caller's
process at the first call.

Layout (``root`` is ``$WSGEMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/wsgemm``, else
``~/.cache/wsgemm``)::

    root/<fingerprint>/<name>.o                 an entry: header + shared library + object
                       <name>.lock              per-entry compile lock (flock)
                       <name>.loading.<random>  exists (and is flocked) while a process links
                       quarantine/              entries that failed a check, for a post-mortem
                       .last-used               touched once per process that uses the folder
    root/.last-prune                            when old folders were last pruned

An entry is ``MAGIC``, one JSON header line (the variant key, the fingerprint, the kernel's
launch arguments, and the form, size and sha256 of each part) and its parts: the kernel as a
tvm-ffi object file, and the same object linked into a shared library where a C compiler driver
was found when it was stored (``library.py``). The library loads without the DSL; the object is
linked by the DSL (the fallback). The rules:

- An entry is read once (a regular file owned by the user, checked before opening, so a FIFO or
  device never blocks), verified against its header, and those verified bytes are linked from a
  private copy: never a second read of the shared path. A failed check quarantines the entry
  and the variant is recompiled.
- A marker exists while a process links an entry; a marker left by a dead process (its flock is
  free) means linking crashed that process, so the entry is quarantined: a bad entry may crash
  one process, never two.
- The cache folders must be owned by the user (or root) and not writable by group or others, as
  ssh treats its keys; otherwise nothing is loaded from them (one warning) unless the user opts
  in with ``WSGEMM_CACHE_SHARED=1``.
- Every failure (read-only, full disk, a file in the way, a too-long path, no home directory,
  another user's entries) degrades to compiling in memory with one warning; nothing here raises
  into ``matmul``.
- A compile holds the entry's lock, so concurrent processes compile each variant once; writes
  are a temporary file renamed into place, so a reader sees all or nothing; temporaries older
  than an hour and fingerprint folders unused for ``PRUNE_AFTER_DAYS`` are removed (at most
  once a day, only when compiling).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from ..settings import FALSE_WORDS, TRUE_WORDS, current
from . import library
from .files import private_copy

try:
    import fcntl
except ImportError:  # not POSIX: no locks and no crash markers, the checksums still hold
    fcntl = None

MAGIC = b"wsgemm-cache-entry 2\n"
# Entries are 30-200 KB; anything far larger is not one of ours (and is not read into memory).
MAX_ENTRY_BYTES = 64 * 2**20
# A compile takes seconds; a lock held this long belongs to a stuck process, so compile anyway.
LOCK_WAIT_S = 600.0
LOCK_POLL_S = 0.05
PRUNE_AFTER_DAYS = 30
PRUNE_EVERY_S = 24 * 3600
# A temporary this old is not being written by anyone: its writer was killed.
STALE_TMP_S = 3600
QUARANTINE_KEEP = 16
_FINGERPRINT_NAME = re.compile(r"[0-9a-f]{16}")


class CacheWarning(UserWarning):
    """The on-disk cache could not be used as asked; wsgemm compiles in memory instead."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def first_time(kind: str) -> bool:
    """True the first time ``kind`` is asked in this process (or since ``cache.reset``)."""
    with _warned_lock:
        if kind in _warned:
            return False
        _warned.add(kind)
        return True


def warn_once(kind: str, message: str) -> None:
    if first_time(kind):
        warnings.warn(f"wsgemm cache: {message}", CacheWarning, stacklevel=3)


def _env_word(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None else raw.strip().lower()


@dataclasses.dataclass(frozen=True)
class Location:
    """Where the cache is, or why there is none."""

    root: Path | None
    why_not: str = ""
    shared: bool = False


def enabled() -> bool:
    """Whether the disk cache is switched on here: ``wsgemm.config.disk_cache``'s setting in
    this thread or task, else ``WSGEMM_DISK_CACHE`` (on unless one of the false words)."""
    asked = current().disk_cache
    return _env_word("WSGEMM_DISK_CACHE") not in FALSE_WORDS if asked is None else asked


def location() -> Location:
    """The cache root from the environment; never raises. ``wsgemm.config.disk_cache`` (this
    thread's or task's setting) decides on or off before ``WSGEMM_DISK_CACHE``, which is read
    at each call (a compile asks once)."""
    asked = current().disk_cache
    if asked is False:
        return Location(None, "off (wsgemm.config.disk_cache is False)")
    word = None if asked else _env_word("WSGEMM_DISK_CACHE")
    if word in FALSE_WORDS:
        return Location(None, f"off (WSGEMM_DISK_CACHE={os.environ['WSGEMM_DISK_CACHE']!r})")
    if word and word not in TRUE_WORDS:
        warn_once(
            "disk-cache-word",
            f"WSGEMM_DISK_CACHE={os.environ['WSGEMM_DISK_CACHE']!r} is not one of "
            f"{', '.join(sorted(FALSE_WORDS | TRUE_WORDS))}; the cache stays on",
        )
    shared = _env_word("WSGEMM_CACHE_SHARED") in TRUE_WORDS
    explicit = os.environ.get("WSGEMM_CACHE_DIR")
    if explicit:
        return Location(Path(os.path.abspath(explicit)), shared=shared)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Location(Path(xdg) / "wsgemm", shared=shared)
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):
        home = None
    if home is None or not home.is_absolute() or str(home) == "/":
        return Location(None, "no home directory: set WSGEMM_CACHE_DIR", shared=shared)
    return Location(home / ".cache" / "wsgemm", shared=shared)


def entry_name(key: str) -> str:
    """The entry's file stem and the object's exported function name."""
    return "wsgemm_" + hashlib.sha256(key.encode()).hexdigest()[:24]


class BadEntry(Exception):
    """An entry that failed a check; the message says which."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """What an entry holds: the kernel's exported object (always), the same code linked into a
    shared library (None where none could be linked when it was stored: ``library.py``), and
    the names and defaults of its launch arguments (a function loaded from disk keeps no
    Python defaults)."""

    object: bytes
    library: bytes | None = None
    launch: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())

    @property
    def form(self) -> str:
        return "library" if self.library is not None else "object"


def frame(entry: Entry, key: str, fingerprint: str) -> bytes:
    parts = [("library", entry.library), ("object", entry.object)]
    parts = [(form, data) for form, data in parts if data is not None]
    names, defaults = entry.launch
    header = {
        "key": key,
        "fingerprint": fingerprint,
        "launch": {"names": list(names), "defaults": list(defaults)},
        "parts": [
            {"form": form, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for form, data in parts
        ],
    }
    body = b"".join(data for _, data in parts)
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def unframe(data: bytes, key: str, fingerprint: str) -> Entry:
    """The contents of an entry's bytes, after checking them against its header; else
    BadEntry."""
    if not data.startswith(MAGIC):
        raise BadEntry("not a wsgemm cache entry (no header)")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise BadEntry("truncated header")
    try:
        header = json.loads(data[len(MAGIC) : end])
        entry_key, entry_fp = header["key"], header["fingerprint"]
        launch = _launch_of(header["launch"])
        parts = [(p["form"], p["size"], p["sha256"]) for p in header["parts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadEntry(f"unreadable header ({exc})") from None
    if (entry_key, entry_fp) != (key, fingerprint):
        raise BadEntry(f"header names another variant or toolchain ({entry_key}, {entry_fp})")
    body = data[end + 1 :]
    expected = sum(size for _, size, _ in parts if isinstance(size, int))
    if len(body) != expected:
        raise BadEntry(f"size {len(body)} B, the header says {expected} B (truncated?)")
    forms: dict[str, bytes] = {}
    offset = 0
    for form, size, digest in parts:
        if form not in ("object", "library") or form in forms or not isinstance(size, int):
            raise BadEntry(f"unreadable header (part {form!r} of {size!r} B)")
        forms[form] = body[offset : offset + size]
        offset += size
        if hashlib.sha256(forms[form]).hexdigest() != digest:
            raise BadEntry(
                f"checksum mismatch in its {form} (the entry's bytes changed after it was written)"
            )
    if "object" not in forms:
        raise BadEntry("unreadable header (no object)")
    return Entry(forms["object"], forms.get("library"), launch)


def _launch_of(launch: dict) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    names, defaults = launch["names"], launch["defaults"]
    if not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"launch names {names!r}")
    if len(defaults) > len(names) or not all(d is None or type(d) is int for d in defaults):
        raise ValueError(f"launch defaults {defaults!r}")
    return tuple(names), tuple(defaults)


def link(payload: bytes, name: str) -> Callable:
    """Link a verified object into this process through the DSL (LLVM JITLink, in-process;
    imports the DSL) and return its tvm-ffi function."""
    import cutlass.cute as cute

    with private_copy(payload) as path:
        module = cute.runtime.load_module(path, enable_tvm_ffi=True)
    return getattr(module, name)


def link_library(payload: bytes, name: str) -> Callable:
    """Load a verified shared library through tvm-ffi (no DSL) and return its function."""
    return library.load(payload, name)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A kernel linked from an entry: its tvm-ffi function, the entry's launch arguments
    (``Entry.launch``) and the form it came from ('library' or 'object')."""

    fn: Callable
    launch: tuple[tuple[str, ...], tuple[int, ...]]
    form: str


def _is_dir(path: Path) -> bool:
    try:  # Path.is_dir raises on some errors, e.g. a name too long
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _drop_marker(marker: tuple[int, str]) -> None:
    fd, path = marker
    with contextlib.suppress(OSError):
        os.unlink(path)  # before close: a reader that then gets the lock sees st_nlink == 0
    os.close(fd)  # and knows this link ended cleanly


def _remove(path: Path) -> None:
    """Delete a file, a link or a folder (never what a link points to); OSError if it stays."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _is_private(st: os.stat_result) -> str:
    """Why a folder or entry with this stat cannot be trusted, or ''."""
    if st.st_uid not in (os.getuid(), 0):  # root's files: root can change ours anyway
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by group or others (mode {stat.filemode(st.st_mode)})"
    return ""


def folder_problem(folder: Path, shared: bool) -> str:
    """Why cache folder ``folder`` (the root or a fingerprint folder) is refused, or "": not a
    directory, or, unless ``shared``, not private to the user."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        return f"cannot use {folder} ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a directory"
    why = "" if shared else _is_private(st)
    if why:
        return (
            f"not loading code from {folder}: {why}. A cache entry runs in your "
            "process; set WSGEMM_CACHE_SHARED=1 to trust a shared cache"
        )
    return ""


def refusal(where: Location, fingerprint: str) -> str:
    """Why a process of this ``fingerprint`` would not use the cache at ``where``, or "": what
    ``DiskCache.open`` warns of, asked of the folders that exist, creating nothing (``cache
    info``)."""
    if where.root is None:
        return where.why_not
    for folder in (where.root, where.root / fingerprint):
        if os.path.lexists(folder):
            problem = folder_problem(folder, where.shared)
            if problem:
                return problem
    return ""


class DiskCache:
    """One fingerprint folder of the cache. Every method degrades instead of raising."""

    def __init__(self, root: Path, fingerprint: str, shared: bool = False):
        self.root = root
        self.fingerprint = fingerprint
        self.folder = root / fingerprint
        self.shared = shared
        self._bad: set[str] = set()  # entries this process could neither trust nor move away
        umask = os.umask(0o22)
        os.umask(umask)
        self._file_mode = (0o666 & ~umask) if shared else 0o600
        self._dir_mode = (0o777 & ~umask) if shared else 0o700

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, root: Path, fingerprint: str, shared: bool = False) -> DiskCache | None:
        """The cache folder, created if need be, or None (after one warning) when it cannot be
        used or trusted."""
        cache = cls(root, fingerprint, shared)
        problem = cache._prepare()
        if problem:
            warn_once("open", f"{problem}; compiling in memory")
            return None
        return cache

    def _prepare(self) -> str:
        try:
            self.root.mkdir(mode=self._dir_mode, parents=True, exist_ok=True)
            self.folder.mkdir(mode=self._dir_mode, exist_ok=True)
        except OSError as exc:
            if not _is_dir(self.folder):
                return f"cannot create {self.folder} ({exc.strerror or exc})"
        for folder in (self.root, self.folder):
            problem = folder_problem(folder, self.shared)
            if problem:
                return problem
        with contextlib.suppress(OSError):
            stamp = self.folder / ".last-used"
            stamp.touch(mode=self._file_mode)
            os.utime(stamp)
        return ""

    def entry(self, key: str) -> Path:
        return self.folder / f"{entry_name(key)}.o"

    # ------------------------------------------------------------------ reading

    def read(self, key: str) -> Entry | None:
        """``key``'s verified entry, or None (a bad entry is quarantined)."""
        name = entry_name(key)
        if name in self._bad:
            return None
        path = self.folder / f"{name}.o"
        self._check_crash_markers(name, path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            warn_once("read", f"cannot read {path} ({exc.strerror or exc}); compiling in memory")
            return None
        try:
            data = self._read_trusted(path, st)
            return unframe(data, key, self.fingerprint)
        except BadEntry as exc:
            self.quarantine(path, str(exc), st.st_ino)
        except OSError as exc:
            self.quarantine(path, f"unreadable ({exc.strerror or exc})", st.st_ino)
        return None

    def _read_trusted(self, path: Path, st: os.stat_result) -> bytes:
        self._check_entry_stat(st)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise BadEntry("replaced while being opened")
            self._check_entry_stat(opened)
            data = f.read(MAX_ENTRY_BYTES + 1)
        if len(data) > MAX_ENTRY_BYTES:
            raise BadEntry("larger than any entry")
        return data

    def _check_entry_stat(self, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry("not a regular file")
        if st.st_size > MAX_ENTRY_BYTES:
            raise BadEntry(f"{st.st_size} B, larger than any entry")
        why = "" if self.shared else _is_private(st)
        if why:
            raise BadEntry(f"untrusted: {why}")

    def load(self, key: str) -> Loaded | None:
        """``key``'s kernel linked from its entry, or None on a miss or a bad entry. The
        shared library is loaded if the entry has one; if it does not load here (a memory
        file or temporary folder that may not hold code, a missing runtime library), the
        object is linked through the DSL instead. An object that does not link is bad."""
        entry = self.read(key)
        if entry is None:
            return None
        name = entry_name(key)
        path = self.folder / f"{name}.o"
        with self._linking(name):
            if entry.library is not None:
                try:
                    return Loaded(link_library(entry.library, name), entry.launch, "library")
                except Exception as exc:
                    warn_once(
                        "library",
                        f"cannot load the shared library of {path} ({type(exc).__name__}: "
                        f"{exc}); linking its object through the DSL (a slower first call)",
                    )
            try:
                return Loaded(link(entry.object, name), entry.launch, "object")
            except Exception as exc:  # a verified entry that does not link: toolchain mismatch
                why = f"does not link ({type(exc).__name__}: {exc})"
        self.quarantine(path, why)
        return None

    @contextlib.contextmanager
    def _linking(self, name: str) -> Iterator[None]:
        """Hold a flocked marker while linking. If this process dies inside, the marker stays
        with its lock free, and the next reader quarantines the entry."""
        marker = None
        if fcntl is not None:
            with contextlib.suppress(OSError):  # a read-only cache: link without a marker
                marker = tempfile.mkstemp(prefix=f"{name}.loading.", dir=self.folder)
            if marker is not None:
                try:
                    os.fchmod(marker[0], self._file_mode | 0o444)
                    fcntl.flock(marker[0], fcntl.LOCK_EX)
                except OSError:  # an unlocked marker would read as a crash: drop it
                    _drop_marker(marker)
                    marker = None
        try:
            yield
        finally:
            if marker is not None:
                _drop_marker(marker)

    def _check_crash_markers(self, name: str, path: Path) -> None:
        if fcntl is None:
            return
        try:
            markers = list(self.folder.glob(f"{name}.loading.*"))
        except OSError:
            return
        for marker in markers:
            try:
                fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its process is alive and linking now
                if os.fstat(fd).st_nlink == 0:
                    continue  # it finished cleanly while we looked
                self.quarantine(path, "a process died while linking it")
                with contextlib.suppress(OSError):
                    os.unlink(marker)
            finally:
                os.close(fd)

    def quarantine(self, path: Path, reason: str, ino: int | None = None) -> None:
        """Move a bad entry aside (or delete it); if neither works, skip it in this process."""
        name = path.stem
        try:
            if ino is not None and os.lstat(path).st_ino != ino:
                return  # replaced by a fresh entry since it was read
        except FileNotFoundError:
            return
        except OSError:
            pass
        moved = False
        with contextlib.suppress(OSError):
            qdir = self.folder / "quarantine"
            qdir.mkdir(mode=self._dir_mode, exist_ok=True)
            os.replace(path, qdir / f"{name}.{time.time_ns()}.bad")
            moved = True
            self._trim_quarantine(qdir)
        if not moved:
            with contextlib.suppress(OSError):
                _remove(path)
                moved = True
        if not moved:
            self._bad.add(name)
        where = "quarantined" if moved else "cannot be moved away, skipped in this process"
        warn_once(f"bad:{name}", f"entry {path} {where}: {reason}; recompiling")

    @staticmethod
    def _trim_quarantine(qdir: Path) -> None:
        files = sorted(qdir.iterdir(), key=lambda p: p.lstat().st_mtime)
        for old in files[:-QUARANTINE_KEEP]:
            with contextlib.suppress(OSError):
                _remove(old)

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold ``key``'s compile lock (best effort: a cache that cannot hold a lock compiles
        unlocked, a lock held past LOCK_WAIT_S is ignored)."""
        fd = None
        if fcntl is not None:
            path = self.folder / f"{entry_name(key)}.lock"
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            with contextlib.suppress(OSError):
                fd = os.open(path, flags, self._file_mode)
                if not stat.S_ISREG(os.fstat(fd).st_mode) or not self._wait_for_lock(fd):
                    os.close(fd)
                    fd = None
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)

    @staticmethod
    def _wait_for_lock(fd: int) -> bool:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    warn_once("lock", f"a compile lock was held for {LOCK_WAIT_S:.0f} s")
                    return False
                time.sleep(LOCK_POLL_S)
            except OSError:
                return False  # e.g. no locks on this file system

    def write(self, key: str, entry: Entry) -> str:
        """Store ``entry`` as ``key``'s; '' on success, else why not (one warning)."""
        path = self.entry(key)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{path.stem}.", suffix=".tmp", dir=self.folder)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), self._file_mode)
                f.write(frame(entry, key, self.fingerprint))
            os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
            tmp = None
        except OSError as exc:
            why = f"cannot write {path} ({exc.strerror or exc})"
            warn_once("write", f"{why}; the kernel is compiled in memory only")
            return why
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self.maybe_prune()
        return ""

    def probe_writable(self) -> str:
        """'' if an entry could be written now, else why not (for ``warm``)."""
        try:
            fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=self.folder)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            return f"cannot write to {self.folder} ({exc.strerror or exc})"
        return ""

    # ------------------------------------------------------------------ housekeeping

    def maybe_prune(self, now: float | None = None, force: bool = False) -> None:
        """At most once a day: remove stale temporaries here and fingerprint folders that no
        process has used for PRUNE_AFTER_DAYS (another environment's recent folder stays)."""
        now = time.time() if now is None else now
        stamp = self.root / ".last-prune"
        with contextlib.suppress(OSError):
            if not force and now - stamp.stat().st_mtime < PRUNE_EVERY_S:
                return
        with contextlib.suppress(OSError):
            stamp.touch(mode=self._file_mode)
            os.utime(stamp, (now, now))
        with contextlib.suppress(OSError):
            for tmp in self.folder.glob("*.tmp"):
                with contextlib.suppress(OSError):
                    if now - tmp.lstat().st_mtime > STALE_TMP_S:
                        tmp.unlink()
        for folder in fingerprint_folders(self.root):
            if folder.name == self.fingerprint:
                continue
            if now - last_used(folder) > PRUNE_AFTER_DAYS * 86400:
                shutil.rmtree(folder, ignore_errors=True)


def fingerprint_folders(root: Path) -> list[Path]:
    """The cache's own folders under ``root`` (nothing else there is ever touched)."""
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    return sorted(
        p
        for p in children
        if _FINGERPRINT_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    )


def last_used(folder: Path) -> float:
    times = []
    for p in (folder / ".last-used", folder):
        with contextlib.suppress(OSError):
            times.append(p.stat().st_mtime)
    return max(times, default=0.0)


def folder_info(folder: Path) -> dict:
    entries = [p for p in folder.glob("*.o") if p.is_file()]
    qdir = folder / "quarantine"
    quarantined = list(qdir.iterdir()) if qdir.is_dir() else []
    return {
        "fingerprint": folder.name,
        "entries": len(entries),
        "bytes": sum(p.stat().st_size for p in entries),
        "quarantined": len(quarantined),
        "last_used": last_used(folder),
    }


def clear(root: Path) -> tuple[int, int]:
    """Remove every fingerprint folder under ``root``: (folders, bytes) removed."""
    removed = size = 0
    for folder in fingerprint_folders(root):
        size += sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(folder, ignore_errors=True)
        removed += not folder.exists()
    with contextlib.suppress(OSError):
        (root / ".last-prune").unlink()
    return removed, size
