"""One benchmark run: for each shape, check every backend, then time the right ones interleaved.

Per shape::

    operands  <- randn A, B in the layout (seeded per shape)
    reference <- fp32 A @ B
    for each backend (the baseline, cuBLAS, first: its error sets the others' tolerance):
        poison out with NaN; call once (compiles); compare with the reference
        wrong -> reported with its errors, never timed; raised -> error (or skipped if the
        backend refused the problem with ValueError/NotImplementedError)
        estimate one call's time -> reps for the measurement
    for round in range(rounds):
        for backend in the checked ones, rotated by one each round:
            one measurement (measure.py)
    summarize each backend across rounds, ratios paired with cuBLAS round by round

A grouped problem (``moe.GroupedShape``, the moe suite) runs the same way with its own
operands, contenders and baseline (moe.py), checked against an fp64 product per group.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..support import (
    AB_DTYPES,
    ACC_DTYPES,
    ACCUMULATOR_RULE,
    accumulator_allowed,
    short_name,
    torch_dtype,
)
from . import check, moe, schema
from .backends import BASELINE, EPILOGUES, GATED, Contender, Unavailable, Workload
from .layouts import Layout, make_operands
from .measure import Estimate, Sample, Timer, reps_for, rotated, summarize, tflops
from .suites import Shape

# The benchmark's spelling of the support tables (fp16, bf16 / fp32, fp16).
DTYPES = tuple(short_name(d) for d in AB_DTYPES)
ACCUMULATORS = tuple(short_name(d) for d in ACC_DTYPES)
# Exceptions a backend raises to refuse a problem it does not support (its validation), as
# opposed to failing on one it accepted.
REFUSALS = (ValueError, NotImplementedError)
# Option ranges: beyond these a run is a typo, not a measurement (and --seed must fit torch's
# 64-bit generator seed after adding a shape index).
MAX_ROUNDS = 1000
MAX_REPS = 100_000
MAX_TARGET_MS = 60_000.0
SEED_LIMIT = 2**63


@dataclass(frozen=True)
class Options:
    dtype: str = "fp16"
    accumulate: str = "fp32"
    layout: str = "TN"
    rounds: int = 5
    target_ms: float = 10.0
    min_reps: int = 3
    max_reps: int = 100
    seed: int = 0
    epilogue: str = "none"  # backends.EPILOGUES: what every backend computes after a @ b

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.accumulate not in ACCUMULATORS:
            raise ValueError(f"accumulate must be one of {ACCUMULATORS}, got {self.accumulate!r}")
        if not accumulator_allowed(self.dtype, self.accumulate):
            raise ValueError(f"accumulate {self.accumulate} with {self.dtype}: {ACCUMULATOR_RULE}")
        Layout(self.layout)
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds must be in [1, {MAX_ROUNDS}], got {self.rounds}")
        if not (math.isfinite(self.target_ms) and 0 < self.target_ms <= MAX_TARGET_MS):
            raise ValueError(f"target_ms must be in (0, {MAX_TARGET_MS:g}], got {self.target_ms}")
        if not 1 <= self.min_reps <= self.max_reps <= MAX_REPS:
            raise ValueError(
                f"need 1 <= min_reps <= max_reps <= {MAX_REPS}, got {self.min_reps} and "
                f"{self.max_reps}"
            )
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(
                f"epilogue must be one of {', '.join(EPILOGUES)}, got {self.epilogue!r}"
            )

    def to_dict(self, suite: str, backends: list[str]) -> dict:
        return {
            "suite": suite,
            "dtype": self.dtype,
            "accumulate": self.accumulate,
            "layout": self.layout,
            "backends": backends,
            "rounds": self.rounds,
            "target_ms": self.target_ms,
            "min_reps": self.min_reps,
            "max_reps": self.max_reps,
            "seed": self.seed,
            "epilogue": self.epilogue,
        }


class FatalCudaError(RuntimeError):
    """A backend broke the CUDA context; nothing after it in this process can run."""


@dataclass
class _Outcome:
    """One backend on one shape, as the run goes."""

    status: str = "ok"
    note: str = ""
    call: Callable[[], object] | None = None
    estimate: Estimate | None = None
    reps: int | None = None
    errors: check.Errors | None = None
    tolerance: check.Tolerance | None = None
    samples: list[Sample] = field(default_factory=list)

    def fail(self, status: str, note: str) -> None:
        self.status, self.note, self.call, self.samples = status, note, None, []


@dataclass
class RunOutput:
    rows: list[dict]
    clocks_mhz: list[float]
    aborted: str | None = None


@dataclass(frozen=True)
class _Context:
    """What every step of a run needs."""

    backends: list[Contender]
    options: Options
    timer: Timer
    device: object  # torch.device
    on_step: Callable[[str], None]
    baseline: str = BASELINE


@dataclass(frozen=True)
class _Inputs:
    """One shape's operands, what every backend is handed, and how far an output is from the
    answer it must give."""

    shape: Shape
    problem: Workload
    dtype: object  # torch dtype of A, B and the output
    errors: Callable[[object], check.Errors]  # an (M, N) output's errors


def run(
    shapes: list[Shape],
    backends: list[Contender],
    unavailable: list[Unavailable],
    options: Options,
    timer: Timer,
    device,
    peak_tflops_at: Callable[[float | None], float | None],
    on_step: Callable[[str], None] | None = None,
    baseline: str = BASELINE,
) -> RunOutput:
    """Check and time every backend on every shape; stops early only if CUDA breaks. A shape
    that fails outside a backend (its operands do not fit in memory, ...) gets error rows and
    the run goes on, so the rows measured before it are never lost. Ratios are to
    ``baseline``, which must be the first backend (cuBLAS; the moe suite's is another)."""
    import torch

    if not backends or backends[0].name != baseline:
        raise ValueError(f"the first backend must be the baseline {baseline!r}")
    ctx = _Context(backends, options, timer, torch.device(device), on_step or _quiet, baseline)
    output = RunOutput(rows=[], clocks_mhz=[])
    with _full_precision_cublas_reductions(torch):
        for index, shape in enumerate(shapes):
            try:
                outcomes, aborted = _run_shape(ctx, index, shape)
            except Exception as exc:
                outcomes = {backend.name: _Outcome() for backend in backends}
                _abandon(outcomes, f"shape failed: {_describe(exc)}")
                aborted = None
                if not _context_alive(ctx.device):
                    aborted = f"CUDA context lost on {shape.label}: {_describe(exc)}"
            output.rows += _rows(
                shape, backends, unavailable, outcomes, options, peak_tflops_at, baseline
            )
            output.clocks_mhz += [
                s.sm_clock_mhz
                for o in outcomes.values()
                for s in o.samples
                if s.sm_clock_mhz is not None
            ]
            if aborted:
                output.aborted = aborted
                break
    return output


def _quiet(step: str) -> None:
    pass


def _run_shape(ctx: _Context, index: int, shape: Shape):
    """Check every backend on ``shape``, then time the right ones; (outcomes, abort reason)."""
    ctx.on_step(f"{shape.label}: checking")
    outcomes = {backend.name: _Outcome() for backend in ctx.backends}
    inputs = _inputs(ctx, index, shape)
    try:
        for backend in ctx.backends:
            baseline = outcomes[ctx.baseline]
            tolerance = check.model_tolerance(ctx.options.dtype, ctx.options.accumulate, shape.k)
            if backend.name != ctx.baseline and baseline.status == "ok":
                tolerance = check.tolerance(tolerance, baseline.errors)
            outcome = outcomes[backend.name]
            _check(ctx, backend, inputs, tolerance, outcome)
            if outcome.status == "ok":
                _estimate(outcome, ctx.timer, ctx.options)
    except FatalCudaError as exc:
        _abandon(outcomes, str(exc))
        return outcomes, str(exc)
    del inputs  # the fp32 M x N reference goes before the timing rounds
    timed = [name for name, o in outcomes.items() if o.status == "ok"]
    for round_index in range(ctx.options.rounds):
        ctx.on_step(f"{shape.label}: round {round_index + 1}/{ctx.options.rounds}")
        for name in rotated(timed, round_index):
            outcome = outcomes[name]
            if outcome.status != "ok":
                continue
            try:
                outcome.samples.append(
                    ctx.timer.measure(outcome.call, outcome.reps, outcome.estimate)
                )
            except Exception as exc:
                outcome.fail("error", f"failed while timed: {_describe(exc)}")
                if not _context_alive(ctx.device):
                    message = f"CUDA context lost while timing {name} on {shape.label}"
                    _abandon(outcomes, message)
                    return outcomes, message
    return outcomes, None


def _inputs(ctx: _Context, index: int, shape: Shape) -> _Inputs:
    import torch

    options = ctx.options
    generator = torch.Generator(device=ctx.device)
    generator.manual_seed(options.seed + index)
    dtype = torch_dtype(options.dtype)
    if isinstance(shape, moe.GroupedShape):
        grouped = moe.workload(shape, dtype, ctx.device, generator)
        return _Inputs(shape, grouped, dtype, lambda out: moe.errors(out, grouped))
    layout = Layout(shape.layout or options.layout)
    a, b = make_operands(layout, shape.m, shape.n, shape.k, dtype, ctx.device, generator)
    accumulate = torch_dtype(options.accumulate)
    has_bias, activation = EPILOGUES[options.epilogue]
    bias = None
    if has_bias:
        bias = torch.randn(shape.n, generator=generator, device=ctx.device).to(dtype)
    residual = None
    if options.epilogue == "residual":
        residual = torch.randn(shape.m, shape.n, generator=generator, device=ctx.device).to(dtype)
    gated = GATED.get(options.epilogue)
    problem = Workload(a, b, accumulate, options.accumulate, bias, activation, residual, gated)
    ref = check.reference(a, b, bias, activation)
    if residual is not None:
        ref += residual.float()
    if gated is not None:  # (an odd N is refused by _check)
        from wsgemm import api

        half = shape.n // 2
        ref = api.torch_activation(gated, ref[:, :half]) * ref[:, half : 2 * half]
    return _Inputs(shape, problem, dtype, lambda out: check.errors(out, ref))


def _check(ctx: _Context, backend: Contender, inputs: _Inputs, tolerance, outcome: _Outcome):
    import torch

    reason = backend.skip(inputs.problem)
    if reason:
        outcome.fail("skipped", reason)
        return
    shape = inputs.shape
    n_out = shape.n
    if getattr(inputs.problem, "gated", None) is not None:  # (a moe workload has none)
        if shape.n % 2:
            outcome.fail("skipped", f"a gated unit halves N: N={shape.n} is odd")
            return
        n_out = shape.n // 2
    out_shape = getattr(shape, "out_shape", (shape.m, n_out))  # a moe shape's: its own
    out = torch.empty(out_shape, dtype=inputs.dtype, device=ctx.device)
    residual = getattr(inputs.problem, "residual", None)  # (a moe workload has none)
    if residual is not None:  # C's values: the checked call adds a @ b to them
        out.copy_(residual)
    else:
        check.poison(out)
    try:
        call = backend.make(inputs.problem, out)
        produced = call()  # the first call compiles (or autotunes): checked here, never timed
        _sync(ctx.device)
        if backend.returns_output:
            if getattr(produced, "shape", None) != out.shape:
                outcome.fail("error", f"returned {_shape_of(produced)}, not {tuple(out.shape)}")
                return
            out = produced
    except REFUSALS as exc:
        outcome.fail("skipped", f"unsupported: {_describe(exc)}")
        return
    except Exception as exc:
        outcome.fail("error", _describe(exc))
        if not _context_alive(ctx.device):
            lost = f"CUDA context lost after {backend.name} on {shape.label}"
            raise FatalCudaError(lost) from exc
        return
    outcome.errors = inputs.errors(out)
    factor = getattr(backend, "error_factor", 1.0)
    if factor != 1.0:
        tolerance = check.Tolerance(rel=tolerance.rel * factor, peak=tolerance.peak * factor)
    outcome.tolerance = tolerance
    verdict = tolerance.verdict(outcome.errors)
    if verdict:
        outcome.fail("wrong", verdict)
        return
    outcome.call = call


def _estimate(outcome: _Outcome, timer: Timer, options: Options) -> None:
    try:
        outcome.estimate = timer.estimate(outcome.call)
    except Exception as exc:
        outcome.fail("error", f"failed in warm-up: {_describe(exc)}")
        return
    outcome.reps = reps_for(
        outcome.estimate.gpu_ms, options.target_ms, options.min_reps, options.max_reps
    )


def _abandon(outcomes: dict[str, _Outcome], message: str) -> None:
    for outcome in outcomes.values():
        if outcome.status == "ok":
            outcome.fail("error", f"not run: {message}")


def _rows(
    shape, backends, unavailable, outcomes, options, peak_tflops_at, baseline_name=BASELINE
) -> list[dict]:
    layout = shape.layout or options.layout
    common = dict(dtype=options.dtype, layout=layout, accumulate=options.accumulate)
    baseline = outcomes[baseline_name]
    baseline_samples = baseline.samples if baseline.status == "ok" else None
    rows = []
    for backend in backends:
        o = outcomes[backend.name]
        error = _error_dict(o)
        if o.status != "ok":
            rows.append(
                schema.result(
                    shape, backend=backend.name, status=o.status, note=o.note, error=error, **common
                )
            )
            continue
        s = summarize(o.samples, baseline_samples, shape.flop, peak_tflops_at)
        ratio = None
        if s.ratio is not None:
            ratio = {"median": s.ratio[0], "min": s.ratio[1], "max": s.ratio[2]}
        rows.append(
            schema.result(
                shape,
                backend=backend.name,
                status="ok",
                median_ms=s.median_ms,
                tflops=tflops(shape.flop, s.median_ms),
                ratio_to_cublas=ratio,
                sm_clock_mhz=s.sm_clock_mhz,
                power_w=s.power_w,
                pct_of_peak=s.pct_of_peak,
                reps=o.reps,
                round_ms=list(s.round_ms),
                error=error,
                **common,
            )
        )
    for missing in unavailable:
        rows.append(
            schema.result(
                shape, backend=missing.name, status="skipped", note=missing.reason, **common
            )
        )
    return rows


def _error_dict(o: _Outcome) -> dict | None:
    if o.errors is None or o.tolerance is None:
        return None

    def finite(x):
        return x if math.isfinite(x) else None

    return {
        "rel": finite(o.errors.rel),
        "peak": finite(o.errors.peak),
        "tol_rel": o.tolerance.rel,
        "tol_peak": o.tolerance.peak,
    }


def _shape_of(value) -> str:
    shape = getattr(value, "shape", None)
    return type(value).__name__ if shape is None else str(tuple(shape))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _context_alive(device) -> bool:
    """After an exception: can this process still run CUDA work (a sticky error says no)?"""
    import torch

    try:
        _sync(device)
        torch.ones(1, device=device).add_(1)
        _sync(device)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _full_precision_cublas_reductions(torch):
    """cuBLAS may reduce split-K partial sums in fp16/bf16 unless told not to; an "fp32
    accumulate" baseline must accumulate in fp32 end to end, as our kernels do."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = False
    m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
