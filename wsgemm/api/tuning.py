"""``wsgemm.tune``: the user's own shapes timed on the user's GPU, the fastest kept where
``auto`` reads it (issue #24 item 3; ``python -m wsgemm tune`` is its command line).

Each problem ``x (M, K) @ W (N, K).T`` is timed by the dispatcher's on-line tuner
(``Dispatcher.tune_problem``, the timing a first call makes with autotuning on) on random
operands: the cost model's ``top`` fastest candidates (default ``TOP``; None: every fitting
menu entry and split), the fastest stored per GPU model and bucket (docs/policy.md,
"On-line tuning"), the same store later calls read while autotuning is on. A bucket already
tuned is not timed again. The result says, per problem, the cost model's own pick and the
tuned one with their measured times: the gain of tuning.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .. import host
from ..host.dispatch import DISPATCHER, Dispatcher, autotuning
from ..support import AB_DTYPES, dtype_name
from . import dispatch
from .validate import validate

__all__ = ["TOP", "TuneResult", "tune"]

#: Candidates timed per problem by default (``host.TUNE_TOP``).
TOP = host.TUNE_TOP


@dataclass(frozen=True)
class TuneResult:
    """One problem's tuning: the cost model's pick and the stored (fastest) one, each as
    "entry/split", and every candidate's milliseconds per call as timed (warm L2)."""

    m: int
    n: int
    k: int
    dtype: torch.dtype
    model_pick: str
    tuned_pick: str
    times_ms: dict[str, float]
    already: bool  # the bucket was tuned before this call: nothing was timed

    @property
    def gain(self) -> float | None:
        """The model's pick's time over the tuned pick's (above 1: tuning made it faster);
        None where the model's pick was not timed."""
        model, tuned = self.times_ms.get(self.model_pick), self.times_ms.get(self.tuned_pick)
        return model / tuned if model and tuned else None


def tune(
    problems: Iterable[tuple[int, int, int]],
    *,
    dtype: torch.dtype = torch.float16,
    device: torch.device | int | str | None = None,
    dispatcher: Dispatcher | None = None,
    progress: Callable[[int, int, TuneResult], None] | None = None,
    top: int | None = TOP,
) -> list[TuneResult]:
    """Time ``auto``'s candidates for each ``(M, N, K)`` (``x (M, K) @ W (N, K).T``, ``dtype``
    in, fp32 accumulation, ``dtype`` out) on ``device`` (default the current CUDA device) and
    store the fastest where ``auto`` reads it while autotuning is on (``WSGEMM_AUTOTUNE=1`` or
    ``wsgemm.config.autotune(True)``). ``progress(done, total, result)`` is called after each.
    ``top``: how many candidates, the cost model's fastest first (None: every one the policy
    allows; each new one costs its compile the first time).

    Needs a Hopper (sm_90) GPU: the candidates are its menu's. Elsewhere ``auto`` chooses
    between the sm80 kernel and torch.matmul, which autotuning decides on the first call of
    each bucket (docs/policy.md, "Off Hopper"). Compiling the candidates' kernels takes a few
    seconds each the first time (``python -m wsgemm warm`` compiles them all in parallel).
    """
    d = DISPATCHER if dispatcher is None else dispatcher
    if not isinstance(dtype, torch.dtype) or dtype_name(dtype) not in AB_DTYPES:
        names = ", ".join(f"torch.{d}" for d in AB_DTYPES)
        raise ValueError(f"tune: dtype must be one of {names}, got {dtype}")
    problems = [_problem(p) for p in problems]
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"tune: top must be an int >= 1 or None (every candidate), got {top!r}")
    if d.devices.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "tune times kernels on a CUDA GPU, and torch sees none here "
            "(torch.cuda.is_available() is False); run it on the GPU that will run the model"
        )
    index = d.device_index(device)
    cc = d.devices.capability(index)
    if cc != (9, 0):
        raise ValueError(
            f"tune times the sm90 menu; {d.devices.name(index)} is sm_{cc[0]}{cc[1]} (where "
            "auto runs the sm80 kernel, it races it against torch.matmul on the first call of "
            "each bucket, unless autotuning is set off: WSGEMM_AUTOTUNE=0)"
        )
    with autotuning(True):
        if not d.autotune:  # the dispatcher's own switch wins over the per-call block
            raise ValueError("tune: this dispatcher was made with autotune=False; it times nothing")
    where = torch.device(d.devices.type) if index is None else torch.device(d.devices.type, index)
    dtypes = (dtype_name(dtype), dtype_name(dtype), "float32")
    results = []
    for done, (m, n, k) in enumerate(problems, 1):
        problem = (m, n, k, None)
        model = d.model_choice(index, problem, dtypes)
        with autotuning(True):  # a stored pick the menu no longer offers is not one
            before = d.tuned_choice(index, problem, dtypes)
        if before is None:
            gen = torch.Generator(device=where).manual_seed(m * 131 + n * 7 + k)
            x = torch.randn(m, k, generator=gen, device=where).to(dtype)
            w = torch.randn(n, k, generator=gen, device=where).to(dtype)
            wt = w.t()
            p = validate(x, wt, None, None, torch.float32, "auto", None, device_type=d.devices.type)
            run = functools.partial(dispatch._run_candidate, d, x, wt, p, None)
            d.tune_problem(index, problem, dtypes, run, top)
            del x, w, wt
        record = d.tuned_record(index, problem, dtypes)
        if record is None:  # fewer than two candidates, or none ran: the model's pick stands
            record = {"entry": model.menu_entry.name, "split": model.split, "ms": {}}
        result = TuneResult(
            m, n, k, dtype,
            model_pick=f"{model.menu_entry.name}/{model.split}",
            tuned_pick=f"{record['entry']}/{record['split']}",
            times_ms=dict(record.get("ms", {})),
            already=before is not None,
        )  # fmt: skip
        results.append(result)
        if progress is not None:
            progress(done, len(problems), result)
    return results


def geomean_gain(results: list[TuneResult]) -> float | None:
    """The geometric mean of the results' gains (those with both picks timed)."""
    gains = [r.gain for r in results if r.gain]
    return math.exp(sum(map(math.log, gains)) / len(gains)) if gains else None


def _problem(p) -> tuple[int, int, int]:
    try:
        m, n, k = p
    except (TypeError, ValueError):
        raise ValueError(f"tune: each problem is (M, N, K), got {p!r}") from None
    for name, v in zip("MNK", (m, n, k), strict=True):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"tune: {name} must be an int >= 1, got {v!r} in {p!r}")
    return m, n, k
