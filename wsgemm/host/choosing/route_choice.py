"""Where wsgemm has not measured its kernel: ``backend="auto"`` between that kernel and
torch.matmul, measured once per GPU model and bucket and kept in the tuned store.

wsgemm promises to be at least as fast as torch.matmul. The shipped tables (``table``) measure
the sm90 menu on the H200 (any sm_90 part takes the nearest), so on every other GPU the kernel
``auto`` runs, the sm80 family's (Ampere, Ada, Orin, consumer Blackwell), is one nobody has
measured there; on the H200 it runs at 0.49-0.57x of cuBLAS (docs/perf.md). There the
dispatcher asks this room (``decide``) what runs, the family's kernel or torch.matmul:

* torch.matmul is no candidate in batch-invariant mode (cuBLAS does not promise it) or with an
  fp16 accumulator (one fp16 running sum, which only wsgemm's kernels give): the kernel runs;
* autotuning turned off (``wsgemm.config.autotune(False)``, ``set_autotune(False)`` or
  ``WSGEMM_AUTOTUNE=0``): ``DEFAULT``, torch.matmul, timing nothing. Of the two it is the only
  one that cannot break the promise without a measurement; the kernel stays available by
  name (``backend="sm80"``). The store is not read either (as for the sm90 tuned choices:
  off means no measured picks);
* otherwise, **by default** (nothing set; the sm90 menu's tuning is off unless asked, this
  race is on unless turned off: ``Dispatcher.races``): this bucket's stored decision; else
  the first call outside a CUDA-graph
  capture, torch.compile's tracing and fake tensors races the two (``race``: each launched
  once on the call's operands, then ``ROUNDS`` interleaved rounds of the caller's timer, the
  median of each) and keeps the faster (``remember``: torch.matmul unless the kernel is
  strictly faster) for this GPU model. A call that cannot race (a captured or traced first
  call) takes ``DEFAULT`` (source ``NOT_YET``) and the dispatcher keeps no launcher for its
  signature, so the next eager call races.

The key is the sm90 tuner's bucket (``autotune.bucket``: M in ``M_QUANTUM``-row blocks, N, K,
batch, dtypes) after ``PREFIX``, in the same store file per GPU model: no bucket key starts
with it, so a route decision and a tuned menu choice never read each other's record. The
record names the winner (the family or ``TORCH``) and keeps both medians.

Pure Python, as the rest of the room: no torch, no DSL (the caller's timer times).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .autotune import AutotuneWarning, TunedStore, bucket
from .table import table_for, tables
from .tuning import _TUNING

__all__ = [
    "DEFAULT",
    "NOT_YET",
    "NO_CHOICE",
    "PREFIX",
    "ROUNDS",
    "STORED",
    "TORCH",
    "RouteDecision",
    "decide",
    "excluded",
    "key",
    "measured",
    "race",
    "remember",
]

#: What runs where torch.matmul does: the dispatcher's ``TORCH`` route.
TORCH = "torch"
#: The answer without a measurement: torch.matmul, never slower than torch (the docstring).
DEFAULT = TORCH
#: The store keys of route decisions: this, then the tuner's bucket (which starts with "m").
PREFIX = "route-"
#: Interleaved rounds a race times each of the two (the median counts): a clock boost or a
#: neighbour's burst in one round moves one sample, not the decision.
ROUNDS = 5
# The family the shipped tables measure: every menu entry is an sm90 kernel.
MENU_FAMILY = "sm90"
# Where a decision comes from, as ``explain`` says it.
STORED = "stored measurement"
NOT_YET = "not measured yet"
DEFAULT_SOURCE = "default"
NO_CHOICE = "no choice"
# The frames between a race's warning and the caller of ``wsgemm.api.matmul``: ``race``, the
# dispatcher's race and its chooser step, ``route``, then the API's first call, ``call`` and
# ``matmul``.
_CALLER = 8


@dataclass(frozen=True)
class RouteDecision:
    """What ``auto`` runs where its kernel is unmeasured: ``runs`` (the family or ``TORCH``),
    ``source`` (``STORED``, ``DEFAULT_SOURCE``, ``NOT_YET`` or ``NO_CHOICE``), ``reason`` (a
    short line: the route's reason, the torch route's log line) and ``detail`` (what
    ``explain`` adds: the medians, the bucket, how to change it); ``times``: the stored
    medians, ms per call by candidate."""

    runs: str
    source: str
    reason: str
    detail: str
    times: Mapping[str, float] | None = None


def measured(family: str, sm_count: int, cc: tuple[int, int]) -> bool:
    """Whether a shipped table measured ``family``'s kernels on this GPU (the sm90 menu on an
    sm_90 part): there the policy's choice runs and no race is needed."""
    return family == MENU_FAMILY and table_for(tables(None), sm_count, cc) is not None


def key(m: int, n: int, k: int, batch: int, dtypes: tuple[str, str, str], mufu: int = 0) -> str:
    """The store key of a problem's route decision (a fused activation's apart: ``bucket``)."""
    return PREFIX + bucket(m, n, k, batch, dtypes, mufu=mufu)


def excluded(dtypes: tuple[str, str, str], invariant: bool) -> str | None:
    """Why torch.matmul may not run a problem in the kernel's place, or None. (``decide``
    also races nothing for an empty problem: neither multiplies.)"""
    if invariant:
        return "batch-invariant mode, which torch.matmul (cuBLAS) does not promise"
    if dtypes[2] != "float32":
        return f"a {dtypes[2]} accumulator, which only wsgemm's kernels give"
    return None


def decide(
    store: TunedStore,
    device: str,
    sm_count: int,
    problem: tuple[int, int, int, int],
    dtypes: tuple[str, str, str],
    family: str,
    *,
    race: bool,
    invariant: bool,
    mufu: int = 0,
) -> RouteDecision:
    """What runs ``problem`` (M, N, K, batch) on GPU model ``device`` without a race: the
    module docstring's order. ``NOT_YET`` is the one answer a race may replace."""
    kernel = f"the {family} kernel"
    why_not = excluded(dtypes, invariant)
    if why_not is None and 0 in problem:
        why_not = "an empty problem (nothing to multiply)"
    if why_not is not None:
        reason = f"torch.matmul is no candidate here: {why_not}"
        return RouteDecision(family, NO_CHOICE, reason, f"{kernel} runs")
    if not race:
        reason = f"{kernel} is not measured on this GPU and autotuning is off"
        detail = (
            "torch.matmul runs, which cannot be slower than torch; with autotuning on "
            "(wsgemm.config.set_autotune(True) or WSGEMM_AUTOTUNE=1, or neither switch set: "
            "the default here) the first call of a bucket measures both; "
            f"backend={family!r} runs the kernel"
        )
        return RouteDecision(DEFAULT, DEFAULT_SOURCE, reason, detail)
    name = key(*problem, dtypes, mufu)
    record = store.record(device, sm_count, name)
    times = record.get("ms") if record else None
    if record and record.get("entry") in (family, TORCH) and isinstance(times, dict):
        winner = record["entry"]
        return RouteDecision(winner, STORED, _won(winner, family), _detail(name, times), times)
    reason = f"{kernel} is not measured on this GPU yet"
    detail = (
        "the first call outside a CUDA-graph capture and torch.compile's tracing "
        "times it against torch.matmul and keeps the faster; until then torch.matmul "
        "(wsgemm.config.set_autotune(False) or WSGEMM_AUTOTUNE=0: torch.matmul, untimed)"
    )
    return RouteDecision(DEFAULT, NOT_YET, reason, detail)


def race(
    candidates: Mapping[str, Callable[[], Callable[[], object]]],
    time_call: Callable[[Callable[[], object]], float],
    rounds: int = ROUNDS,
) -> dict[str, float]:
    """The median ms per call of each candidate: ``candidates[name]()`` launches it once
    (compiling and planning it) and returns what to time; then ``rounds`` rounds time each
    once with ``time_call``, in turn, the order reversed every other round (neither always goes
    first after the other). A candidate whose launch or timing raises is left out with an
    ``AutotuneWarning``. One tuning or race at a time per process (``tuning``)."""
    with _TUNING:
        timed, samples = {}, {}
        for name, launch in candidates.items():
            try:
                timed[name] = launch()
            except Exception as exc:  # a candidate that cannot run is not a candidate
                _left_out(name, exc)
        samples = {name: [] for name in timed}
        for r in range(rounds):
            for name in list(timed) if r % 2 == 0 else list(reversed(timed)):
                if name not in samples:
                    continue
                try:
                    samples[name].append(time_call(timed[name]))
                except Exception as exc:
                    _left_out(name, exc)
                    del samples[name]
    return {name: statistics.median(s) for name, s in samples.items() if s}


def _left_out(name: str, exc: Exception) -> None:
    warnings.warn(
        f"wsgemm autotune: {name} failed against the other route ({type(exc).__name__}: {exc}); "
        "left out",
        AutotuneWarning,
        stacklevel=_CALLER,
    )


def remember(
    store: TunedStore,
    device: str,
    sm_count: int,
    problem: tuple[int, int, int, int],
    dtypes: tuple[str, str, str],
    family: str,
    times: Mapping[str, float],
    mufu: int = 0,
) -> RouteDecision:
    """Keep the winner of ``times`` (``race``'s) for this bucket and return it as the stored
    decision: the family's kernel only when strictly faster than torch.matmul (a tie keeps the
    promise's side)."""
    winner = family if times.get(family, math.inf) < times.get(TORCH, math.inf) else TORCH
    record = {name: round(t, 5) for name, t in times.items()}
    name = key(*problem, dtypes, mufu)
    store.put(device, sm_count, name, winner, 1, record)
    return RouteDecision(winner, STORED, _won(winner, family), _detail(name, record), record)


def _won(winner: str, family: str) -> str:
    if winner == TORCH:
        return f"torch.matmul measured faster than the {family} kernel on this GPU"
    return f"the {family} kernel measured faster than torch.matmul on this GPU"


def _detail(name: str, times: Mapping[str, float]) -> str:
    said = ", ".join(
        f"{'torch.matmul' if c == TORCH else c} {t:.4f} ms" for c, t in sorted(times.items())
    )
    return f"per call, the median of {ROUNDS} interleaved rounds: {said} (bucket {name})"
