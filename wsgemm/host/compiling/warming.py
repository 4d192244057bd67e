"""Filling the on-disk cache ahead of time, in worker processes (``cute.compile`` is neither
thread-safe nor re-entrant, so parallelism is by process).

Workers never outlive the ``warm`` that started them, however it ends: they ignore SIGINT (a
terminal's Ctrl-C reaches the whole process group, and the parent alone decides what it means),
the parent stops them when anything interrupts it, and a parent that dies without stopping them
(SIGKILL, a signal it does not handle) takes them with it through the kernel's parent-death
signal on Linux, or a watchdog thread elsewhere. Entries are written atomically, so whatever
was compiled before an interruption stays in the cache."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..registry import Variant

# A compile worker holds the DSL and one kernel's MLIR: ~0.45 GB resident (measured on sm_80 and
# sm_90a variants); budget 0.5 GB each against the memory available now.
WORKER_BYTES = 512 * 2**20
_PR_SET_PDEATHSIG = 1
# How often a worker without the parent-death signal looks for its parent: a dead parent's
# worker compiles on for at most this long.
_WATCHDOG_SECONDS = 1.0
# How long a stopped worker may take to exit on SIGTERM before it is killed.
_STOP_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    """One variant of a warm: 'cached', 'compiled' or 'failed' (with why)."""

    key: str
    status: str
    seconds: float
    error: str = ""


def max_jobs() -> int:
    """Worker processes this machine can hold: one per core, 0.5 GB each of available memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = cores or 1
    available = _available_bytes()
    if available is not None:
        limit = min(limit, available // WORKER_BYTES)
    return max(1, limit)


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def warm_one(variant: Variant) -> Outcome:
    """Make sure ``variant`` has a verified entry on disk (runs in a worker or in-process)."""
    from .cache import ensure_on_disk

    start = time.perf_counter()
    try:
        status = ensure_on_disk(variant)
    except Exception as exc:  # reported per variant; the others go on
        text = str(exc).strip().splitlines()
        return Outcome(variant.key(), "failed", time.perf_counter() - start,
                       f"{type(exc).__name__}: {text[0] if text else ''}")  # fmt: skip
    return Outcome(variant.key(), status, time.perf_counter() - start)


def _end_with_parent(parent: int) -> None:
    """Pool initializer: a worker must not outlive the ``warm`` that started it (a killed parent
    would otherwise leave 0.45 GB workers compiling for minutes). It ignores SIGINT, which a
    terminal's Ctrl-C also sends it: the parent stops it. Linux: the kernel sends SIGTERM when
    the parent exits; elsewhere a watchdog thread ends the worker when its parent changes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before either took effect
        os._exit(1)


def _parent_death_signal() -> bool:
    """Ask Linux for SIGTERM when the parent exits (``prctl(PR_SET_PDEATHSIG)``); False where
    that cannot be had."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCHDOG_SECONDS)
    os._exit(1)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored inside: workers started here inherit it (Python keeps an ignored SIGINT
    at start-up), so a Ctrl-C while one imports is no traceback either; and stopping the
    workers is not cut short by a second Ctrl-C. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(pool, workers) -> None:
    """Cancel what has not started and end the workers now: ``shutdown`` alone would let every
    queued variant compile first."""
    with _sigint_ignored():
        pool.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            p.terminate()
        for p in workers:
            p.join(_STOP_SECONDS)
            if p.is_alive():
                p.kill()
                p.join()
        # then wait for the pool's manager thread, which sees its workers gone and closes its
        # wake-up pipe: left running, it raced the interpreter's exit hook that wakes it (an
        # "Exception ignored ... Bad file descriptor" traceback after warm's one line)
        pool.shutdown(wait=True)


def warm(
    variants: list[Variant],
    jobs: int = 1,
    on_outcome: Callable[[Outcome], None] | None = None,
    task: Callable[[Variant], Outcome] = warm_one,
) -> list[Outcome]:
    """Put every variant in the on-disk cache (``task`` does one), ``jobs`` processes at a time.
    Returns an outcome per variant; a worker that dies fails the variants not yet finished, all
    with one reason. Anything that interrupts the caller (KeyboardInterrupt, or an exception a
    signal handler raises) ends the workers at once and propagates; ``on_outcome`` has seen
    every variant finished before it."""
    report = on_outcome or (lambda _: None)
    outcomes = []
    if jobs <= 1:
        for v in variants:
            outcomes.append(task(v))
            report(outcomes[-1])
        return outcomes
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("spawn")
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_end_with_parent, initargs=(os.getpid(),)
    )
    try:
        with _sigint_ignored():  # the pool starts its workers in submit
            futures = {pool.submit(task, v): v for v in variants}
        for fut in as_completed(futures):
            outcomes.append(fut.result())
            report(outcomes[-1])
    except BrokenProcessPool:
        done = {o.key for o in outcomes}
        why = "a compile worker died (killed, or out of memory?)"
        for v in variants:
            if v.key() not in done:
                outcomes.append(Outcome(v.key(), "failed", 0.0, why))
                report(outcomes[-1])
    except BaseException:
        # the pool's workers are the children started since it was made (it names them only
        # in private)
        _stop(pool, [p for p in multiprocessing.active_children() if p not in others])
        raise
    pool.shutdown()
    return outcomes
