"""Filling the on-disk cache ahead of time, in worker processes (``cute.compile`` is neither
thread-safe nor re-entrant, so parallelism is by process)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..registry import Variant

# A compile worker holds the DSL and one kernel's MLIR: ~0.45 GB resident (measured on sm_80 and
# sm_90a variants); budget 0.5 GB each against the memory available now.
WORKER_BYTES = 512 * 2**20
_PR_SET_PDEATHSIG = 1


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
    would otherwise leave 0.45 GB workers running). Linux: the kernel sends SIGTERM when the
    parent exits; elsewhere the worker exits at its next task if the parent is gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def warm(
    variants: list[Variant],
    jobs: int = 1,
    on_outcome: Callable[[Outcome], None] | None = None,
    task: Callable[[Variant], Outcome] = warm_one,
) -> list[Outcome]:
    """Put every variant in the on-disk cache (``task`` does one), ``jobs`` processes at a time.
    Returns an outcome per variant; a worker that dies fails the variants not yet finished, all
    with one reason."""
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
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_end_with_parent, initargs=(os.getpid(),)
    ) as pool:
        futures = {pool.submit(task, v): v for v in variants}
        try:
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
    return outcomes
