"""Timing: cold-L2 CUDA-event medians, taken round-robin across backends, and their statistics.

One *measurement* of a backend is ``reps`` calls, each preceded by a write of a buffer several
times the L2 (so every call starts with cold L2, as a GEMM inside a model does) and bracketed by
CUDA events; its value is the median of the per-call times. The GPU is first held busy by a
spin kernel long enough for the host to queue every call, so host-side launch overhead never
shows up as a gap between the events. NVML's SM clock and power are sampled while it runs.

The runner takes several measurements of every backend per shape, in *rounds*: each round times
every backend once, in an order rotated by one each round, so slow drifts of the clock and the
board's temperature fall on all backends alike. The ratio to cuBLAS is formed within each round
and summarized across rounds (median, min, max).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .nvml import ClockSampler, Nvml

# Writing 256 MiB evicts the 50-60 MB L2 of a Hopper several times over; a larger L2 gets 4x.
MIN_FLUSH_BYTES = 256 * 2**20
FLUSH_OVER_L2 = 4
# The spin kernel that holds the GPU while the host queues calls: 50% over the host's measured
# queueing time (the clock-sampling thread slows the host a little during a measurement),
# capped so a slow host cannot stall a run for long.
HOLD_MARGIN = 1.5
MAX_HOLD_MS = 200.0
# The estimate times a few calls behind a spin of 10 ms (enough to queue them on any sane host;
# it is lengthened and the calls timed again when it was not).
ESTIMATE_CALLS = 3
ESTIMATE_HOLD_MS = 10.0
# NVML sampling period: clocks move on millisecond scales, and a faster poll would contend for
# the GIL with the thread queueing the calls.
SAMPLE_PERIOD_S = 0.005
# Clock assumed for converting the hold time to spin cycles when NVML gives none; a lower real
# clock only makes the hold longer, which is harmless.
FALLBACK_SM_MHZ = 2000.0


@dataclass(frozen=True)
class Sample:
    """One measurement: the median call time and the clock and power read during it."""

    ms: float
    sm_clock_mhz: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class Estimate:
    """Rough cost of one call: its GPU milliseconds (cold L2), the host's milliseconds to queue
    it, and the GPU milliseconds of the L2 flush and the call together."""

    gpu_ms: float
    host_ms: float
    cycle_ms: float


class Timer(Protocol):
    def estimate(self, fn: Callable[[], object]) -> Estimate:
        """Cost of one call, after the call has been compiled and warmed."""

    def measure(self, fn: Callable[[], object], reps: int, estimate: Estimate) -> Sample:
        """Median time of ``reps`` cold-L2 calls of ``fn``, whose cost ``estimate`` gave."""


def interleaved(timer: Timer, calls: dict, rounds: int, reps: int) -> dict[str, list[Sample]]:
    """Each of ``calls`` (name -> call) estimated once, then timed once per round (``reps``
    cold-L2 calls a sample) in an order rotated each round (``rotated``): each call's samples,
    one per round, taken beside the others' under the same clocks."""
    estimates = {name: timer.estimate(fn) for name, fn in calls.items()}
    samples: dict[str, list[Sample]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in rotated(list(calls), r):
            samples[name].append(timer.measure(calls[name], reps, estimates[name]))
    return samples


def reps_for(estimate_ms: float, target_ms: float, min_reps: int, max_reps: int) -> int:
    """Enough calls for ``target_ms`` of GEMM time, within [min_reps, max_reps]."""
    if estimate_ms <= 0 or not math.isfinite(estimate_ms):
        return max_reps
    return max(min_reps, min(max_reps, math.ceil(target_ms / estimate_ms)))


def rotated(items: list, round_index: int) -> list:
    """``items`` rotated left by ``round_index``: over len(items) rounds each takes every slot."""
    if not items:
        return []
    shift = round_index % len(items)
    return items[shift:] + items[:shift]


def hold_for(estimate: Estimate, reps: int) -> float:
    """The spin (ms) that holds the GPU while the host queues ``reps`` calls: all of them, with
    ``HOLD_MARGIN`` to spare, capped at ``MAX_HOLD_MS``. Holding only for the first call (and
    what the host loses per call where queueing one outlasts running it) left the GPU waiting
    on the host whenever the host slowed down mid-queue, and each call after such a wait was
    timed with its own launch inside its events (docs/perf.md entry 81)."""
    return min(MAX_HOLD_MS, HOLD_MARGIN * (reps + 1) * estimate.host_ms)


class CudaTimer:
    """Cold-L2, CUDA-event timing on the current stream of ``device``."""

    def __init__(self, device, nvml: Nvml | None, l2_bytes: int | None = None):
        import torch

        self._torch = torch
        self._device = device
        self.flush_bytes = max(MIN_FLUSH_BYTES, FLUSH_OVER_L2 * (l2_bytes or 0))
        self._flush = torch.empty(self.flush_bytes, dtype=torch.int8, device=device)
        self._sampler = ClockSampler(nvml, period_s=SAMPLE_PERIOD_S)
        info_mhz = nvml.info().get("sm_max_mhz") if nvml is not None else None
        self._spin_mhz = info_mhz or FALLBACK_SM_MHZ
        self.can_hold = hasattr(torch.cuda, "_sleep")

    def estimate(self, fn: Callable[[], object]) -> Estimate:
        fn()
        hold_ms = ESTIMATE_HOLD_MS
        while True:
            gemm_ms, cycle_ms, host_ms = self._run(fn, ESTIMATE_CALLS, hold_ms, with_cycle=True)
            # Queueing the calls outlasted the hold: the GPU waited on the host, so the times
            # may hold host gaps. Hold longer and take them again.
            needed = HOLD_MARGIN * ESTIMATE_CALLS * host_ms
            if not self.can_hold or needed <= hold_ms or hold_ms >= MAX_HOLD_MS:
                break
            hold_ms = min(MAX_HOLD_MS, 2 * needed)
        return Estimate(gpu_ms=gemm_ms, host_ms=host_ms, cycle_ms=cycle_ms)

    def measure(self, fn: Callable[[], object], reps: int, estimate: Estimate) -> Sample:
        hold_ms = hold_for(estimate, reps)
        self._sampler.start()
        try:
            gemm_ms, _, _ = self._run(fn, reps, hold_ms, with_cycle=False)
        finally:
            clock, power = self._sampler.stop()
        return Sample(ms=gemm_ms, sm_clock_mhz=clock, power_w=power)

    def _run(self, fn, calls: int, hold_ms: float, with_cycle: bool):
        """``calls`` cold-L2 calls behind a ``hold_ms`` spin: median GEMM ms, median ms of
        flush + GEMM (when ``with_cycle``), host ms to queue one call."""
        torch = self._torch
        event = torch.cuda.Event
        marks = [event(enable_timing=True) for _ in range(calls)] if with_cycle else None
        starts = [event(enable_timing=True) for _ in range(calls)]
        ends = [event(enable_timing=True) for _ in range(calls)]
        torch.cuda.synchronize(self._device)
        collecting = gc.isenabled()
        gc.disable()  # no collection pause while the calls are queued (timeit's rule too)
        try:
            if self.can_hold and hold_ms > 0:
                torch.cuda._sleep(int(hold_ms * 1e-3 * self._spin_mhz * 1e6))
            t0 = time.perf_counter()
            for i in range(calls):
                if marks is not None:
                    marks[i].record()
                self._flush.zero_()
                starts[i].record()
                fn()
                ends[i].record()
            host_ms = (time.perf_counter() - t0) * 1e3 / calls
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize(self._device)
        gemm_ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
        cycle_ms = None
        if marks is not None:
            cycle_ms = statistics.median(
                m.elapsed_time(e) for m, e in zip(marks, ends, strict=True)
            )
        return gemm_ms, cycle_ms, host_ms


@dataclass(frozen=True)
class Summary:
    """A backend's measurements on one shape, summarized across rounds."""

    median_ms: float
    round_ms: tuple[float, ...]
    ratio: tuple[float, float, float] | None  # (median, min, max) of cuBLAS time / this time
    sm_clock_mhz: float | None
    power_w: float | None
    pct_of_peak: float | None


def summarize(
    samples: list[Sample],
    baseline: list[Sample] | None,
    flop: int,
    peak_tflops_at: Callable[[float | None], float | None],
) -> Summary:
    """Median over rounds; ratios paired round by round with the baseline's samples."""
    round_ms = tuple(s.ms for s in samples)
    ratio = None
    if baseline is not None and len(baseline) == len(samples):
        ratios = [b.ms / s.ms for b, s in zip(baseline, samples, strict=True) if s.ms > 0]
        if ratios:
            ratio = (statistics.median(ratios), min(ratios), max(ratios))
    pcts = []
    for s in samples:
        peak = peak_tflops_at(s.sm_clock_mhz)
        if peak and s.ms > 0:
            pcts.append(100.0 * flop / (s.ms * 1e9) / peak)
    return Summary(
        median_ms=statistics.median(round_ms),
        round_ms=round_ms,
        ratio=ratio,
        sm_clock_mhz=_median_or_none([s.sm_clock_mhz for s in samples]),
        power_w=_median_or_none([s.power_w for s in samples]),
        pct_of_peak=statistics.median(pcts) if pcts else None,
    )


def tflops(flop: int, ms: float) -> float:
    return flop / (ms * 1e9)


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
