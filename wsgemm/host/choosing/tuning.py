"""The timing loop of on-line tuning (``WSGEMM_AUTOTUNE``, ``autotune``): each candidate the
policy allows is launched once, then timed, on the caller's own operands.

The room launches nothing itself: the caller (``wsgemm.api``, through the dispatcher's
``route``) passes ``run``, which launches one candidate on the call's operands into a scratch
output (compiling and planning it) and returns what to time: a callable that launches its kernel
alone. Timing: ``TIMED_CALLS`` of it back to back between two CUDA events, after one untimed
call, with L2 warm. The first call of a bucket therefore costs the candidates' compiles
(seconds each without a warm disk cache) plus milliseconds of GPU time.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

from .autotune import AutotuneWarning
from .rules import Choice

__all__ = ["TIMED_CALLS", "TUNE_TOP", "time_cuda", "tune"]

#: Calls timed per candidate, back to back between two CUDA events (after one untimed call).
TIMED_CALLS = 10
#: Candidates ``wsgemm.tune`` times per problem by default: the cost model's fastest four (its
#: own pick among them; it picks within 2-3% of the best candidate, docs/perf.md entry 33).
TUNE_TOP = 4
# One tuning at a time in a process: two would time each other's kernels.
_TUNING = threading.Lock()
# The frames between ``tune`` and the caller of ``wsgemm.api.matmul``: the dispatcher's tuning
# step and ``route``, then the API's first call, ``call`` and ``matmul``.
_CALLER = 7


def tune(
    candidates: Sequence[Choice],
    run: Callable[[Choice], Callable[[], object]],
    time_call: Callable[[Callable[[], object]], float] | None = None,
) -> dict[tuple[str, int], float]:
    """Milliseconds per call of each candidate, by (entry name, split): ``run(choice)``
    launches it once and returns what to time, ``time_call`` times that (default
    ``time_cuda``). A candidate whose launch or timing raises is left out with an
    ``AutotuneWarning``. One tuning at a time per process."""
    time_call = time_cuda if time_call is None else time_call
    times = {}
    with _TUNING:
        for choice in candidates:
            try:
                times[(choice.menu_entry.name, choice.split)] = time_call(run(choice))
            except Exception as exc:  # a candidate that cannot run is not a candidate
                warnings.warn(
                    f"wsgemm autotune: {choice.menu_entry.name} with split {choice.split} "
                    f"failed ({type(exc).__name__}: {exc}); left out",
                    AutotuneWarning,
                    stacklevel=_CALLER,
                )
    return times


def time_cuda(fn: Callable[[], object]) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream: one untimed call, then
    ``TIMED_CALLS`` between two events."""
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(TIMED_CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / TIMED_CALLS
