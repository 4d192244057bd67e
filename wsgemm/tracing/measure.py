"""The tracing overhead that ``record(..., measure=True)`` reports: the recorded call timed on
its traced entry and on the untraced kernel (``meta["traced_us"]``, ``meta["untraced_us"]``)
with CUDA events, the median of ``MEASURE_REPS`` runs after a warm-up."""

from __future__ import annotations

import statistics

import torch

__all__ = ["MEASURE_REPS", "SPIN_CYCLES", "median_us"]

#: GPU cycles of the spin in front of each timed run (about 50 us at 2 GHz: longer than the host
#: takes to launch a call).
SPIN_CYCLES = 100_000
#: Timed runs of each of the traced and untraced call (after one warm-up each).
MEASURE_REPS = 10


def median_us(fn) -> float:
    """Median time of ``fn`` in microseconds, over ``MEASURE_REPS`` runs after a warm-up. Each
    run's start event is queued behind a short spin kernel, so the host's work before its launch
    (argument conversion, which differs between the traced and untraced entries) overlaps the
    GPU's and is not timed: a decode call's kernel is short enough for it to show."""
    fn()
    times = []
    for _ in range(MEASURE_REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)
