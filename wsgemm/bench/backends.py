"""The GEMM implementations the benchmark times, behind one small interface.

A ``Contender`` (one GEMM implementation in the race) turns a ``Workload`` and a preallocated
output into a zero-argument call that writes ``a @ b`` into that output; the runner checks the
call's result, then times the call. Names:

* ``cublas``: ``torch.matmul`` (cuBLAS), the baseline every ratio is taken against, with
  cuBLAS's reduced-precision split-K reduction turned off (the runner's setting: fp32 end to
  end, as our kernels accumulate).
* ``cublas-rpr``: ``torch.matmul`` with that reduction allowed, torch's own default for fp16
  and bf16: its ratio to ``cublas`` is what the baseline's setting changes.
* ``wsgemm:auto``: ``wsgemm.matmul(..., backend="auto")``, what users call: wsgemm's own
  choice of kernel per problem. It is the first row after cuBLAS in every table and summary.
* ``wsgemm:<backend>``: ``wsgemm.matmul(..., backend=<backend>)`` for each name
  ``wsgemm.available_backends()`` lists (``sm90``, ``sm90-pingpong``, ``sm80``, ...).
  Selecting ``wsgemm`` runs ``wsgemm:auto`` and then each of these.
* ``triton``: our persistent autotuned Triton matmul (``wsgemm.bench.triton_matmul``).
* ``quack``: ``quack.gemm_interface.gemm`` with its heuristic config (``tuned=False``);
  ``quack-tuned`` lets QuACK autotune, which compiles every config it has (minutes), so it is
  only run when asked for by name.

Every import here is lazy: a backend whose package is missing is reported, not fatal.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

BASELINE = "cublas"
AUTO = "wsgemm:auto"
# "wsgemm" stands for wsgemm:auto followed by every named backend the device runs.
DEFAULT_SELECTION = ("cublas", "wsgemm", "triton", "quack")
SELECTABLE = ("all", "cublas", "cublas-rpr", "wsgemm", "wsgemm:<name>", "triton", "quack",
              "quack-tuned")  # fmt: skip
RPR = "cublas-rpr"


def leading_first(names: list[str], baseline: str = BASELINE) -> list[str]:
    """``names`` with the baseline (cuBLAS; the moe suite's is another), then wsgemm:auto,
    moved to the front (a stable reorder)."""
    leading = (baseline, AUTO)
    return sorted(names, key=lambda n: leading.index(n) if n in leading else len(leading))


#: ``--epilogue``'s names: (adds a bias per column, the activation after it). "residual" is
#: ``out += a @ b`` in place (``Workload.residual``: C's values before the checked call);
#: "swiglu" and "geglu" the gated units ``act(y[:, :N/2]) * y[:, N/2:]`` of ``y = a @ b``
#: (``Workload.gated``; ``GATED``: their activations), an output half as wide.
EPILOGUES = {
    "none": (False, None),
    "bias": (True, None),
    "bias_relu": (True, "relu"),
    "bias_gelu": (True, "gelu"),
    "bias_gelu_tanh": (True, "gelu_tanh"),
    "bias_silu": (True, "silu"),
    "gelu_tanh": (False, "gelu_tanh"),
    "silu": (False, "silu"),
    "residual": (False, None),
    "swiglu": (False, None),
    "geglu": (False, None),
}
GATED = {"swiglu": "silu", "geglu": "gelu_tanh"}


@dataclass(frozen=True)
class Workload:
    """What every backend computes: ``out = activation(a @ b + bias)`` with ``accumulate``
    accumulators (no bias and no activation: ``out = a @ b``)."""

    a: object  # torch.Tensor (M, K), a view in the benchmark's layout
    b: object  # torch.Tensor (K, N)
    accumulate: object  # torch.float32 or torch.float16
    accumulate_name: str  # "fp32" or "fp16"
    bias: object = None  # torch.Tensor (N,) of the inputs' dtype, or None
    activation: str | None = None  # wsgemm.matmul's activation names
    # "residual": C (M, N), what ``out`` holds before the checked call, which adds a @ b to it
    # in place (every timed call adds again: only its time counts)
    residual: object = None
    # "swiglu"/"geglu": the gated unit's activation (``GATED``); the output is (M, N / 2)
    gated: str | None = None

    @property
    def plain(self) -> bool:
        return (
            self.bias is None and self.activation is None and self.residual is None
            and self.gated is None
        )  # fmt: skip


def _no_epilogue(problem: Workload) -> str | None:
    if problem.plain:
        return None
    return "no fused epilogue (bias, activation, residual) in this contender"


Call = Callable[[], object]


def _never(problem: Workload) -> str | None:
    return None


@dataclass(frozen=True)
class Contender:
    """``make(problem, out)`` returns the call to check and time; ``skip(problem)`` says why a
    problem is outside what the backend supports (None when it is not). A contender with no
    ``out=`` (``torch._grouped_mm``) has ``returns_output``: its call's return value is checked
    instead of ``out``."""

    name: str
    make: Callable[[Workload, object], Call]
    skip: Callable[[Workload], str | None] = field(default=_never)
    returns_output: bool = False
    # its results are checked against this many times the tolerance (a contender that rounds
    # on purpose: cublas-rpr's partial sums in the inputs' dtype)
    error_factor: float = 1.0


@dataclass(frozen=True)
class Unavailable:
    """A requested backend that cannot run here, and why (shown in the header and the table)."""

    name: str
    reason: str


def cublas() -> Contender:
    """torch.matmul; with an epilogue, torch's unfused path: ``torch.addmm`` (cuBLASLt adds the
    bias in its epilogue), then the activation in place; a residual, ``out.addmm_(a, b)``
    (cuBLASLt reads C in its epilogue)."""

    def make(problem: Workload, out) -> Call:
        import torch

        from wsgemm import api

        a, b, bias, act = problem.a, problem.b, problem.bias, problem.activation
        if problem.plain:
            return lambda: torch.matmul(a, b, out=out)
        if problem.residual is not None:
            return lambda: out.addmm_(a, b)
        if problem.gated is not None:  # torch's unfused gated unit: the product, then its halves
            half = b.shape[1] // 2

            def gated():
                y = torch.matmul(a, b)
                return torch.mul(api.torch_activation(problem.gated, y[:, :half]), y[:, half:],
                                 out=out)  # fmt: skip

            return gated

        def unfused():
            if bias is None:
                torch.matmul(a, b, out=out)
            else:
                torch.addmm(bias, a, b, out=out)
            api.activate_(out, act)

        return unfused

    return Contender(BASELINE, make)


def cublas_rpr() -> Contender:
    """``torch.matmul`` with cuBLAS allowed to reduce split-K partial sums in the inputs' dtype
    (``allow_{fp16,bf16}_reduced_precision_reduction``, torch's default), set around each call
    and restored (the runner turns it off for the run)."""

    def make(problem: Workload, out) -> Call:
        import torch

        m = torch.backends.cuda.matmul
        a, b = problem.a, problem.b

        def call():
            saved = (m.allow_fp16_reduced_precision_reduction,
                     m.allow_bf16_reduced_precision_reduction)  # fmt: skip
            m.allow_fp16_reduced_precision_reduction = True
            m.allow_bf16_reduced_precision_reduction = True
            try:
                return torch.matmul(a, b, out=out)
            finally:
                m.allow_fp16_reduced_precision_reduction = saved[0]
                m.allow_bf16_reduced_precision_reduction = saved[1]

        return call

    # its partial sums rounded to the inputs' dtype: a few times the fp32-reduced baseline's
    # error on split-K shapes; checked against 4x the tolerance (garbage still fails)
    return Contender(RPR, make, _no_epilogue, error_factor=4.0)


def wsgemm_backend(kernel: str) -> Contender:
    def make(problem: Workload, out) -> Call:
        import wsgemm

        a, b, acc = problem.a, problem.b, problem.accumulate
        if problem.plain:
            return lambda: wsgemm.matmul(a, b, out=out, accumulate=acc, backend=kernel)
        if problem.residual is not None:  # the in-place residual: C is out itself
            return lambda: wsgemm.matmul(a, b, out=out, accumulate=acc, backend=kernel, c=out)
        if problem.gated is not None:  # one weight [w_gate; w_up] (N, K): b is its transpose
            weight, act = b.t(), problem.gated
            return lambda: wsgemm.gated_linear(a, weight, act)  # no out=: returns its own
        bias, act = problem.bias, problem.activation
        return lambda: wsgemm.matmul(
            a, b, out=out, accumulate=acc, backend=kernel, bias=bias, activation=act
        )

    def skip(problem: Workload) -> str | None:
        if problem.gated is not None and kernel != "auto":
            return "gated_linear runs auto's kernel (no backend argument)"
        return None

    # every call returns its output (``out`` itself, but gated_linear's own tensor)
    return Contender(f"wsgemm:{kernel}", make, skip, returns_output=True)


def parse_candidate(kernel: str) -> tuple[str, dict]:
    """``"sm90{cluster_m=1,raster_group=4}"`` -> ("sm90", {"cluster_m": 1, "raster_group": 4}):
    a wsgemm backend with its shipped config changed in the named fields, for tuning sweeps."""
    if "{" not in kernel:
        return kernel, {}
    base, _, rest = kernel.partition("{")
    if not rest.endswith("}"):
        raise ValueError(f"candidate {kernel!r} must look like name{{field=value,...}}")
    overrides = {}
    for item in filter(None, rest[:-1].split(",")):
        field_name, _, value = item.partition("=")
        overrides[field_name.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return base, overrides


def wsgemm_candidate(kernel: str) -> Contender:
    """A wsgemm backend run with a changed config (see ``parse_candidate``), through
    ``wsgemm.api.matmul(..., config=...)``."""
    base, overrides = parse_candidate(kernel)

    def make(problem: Workload, out) -> Call:
        import dataclasses

        from wsgemm import api

        a, b, acc = problem.a, problem.b, problem.accumulate
        shipped = api.shipped_config(base, acc)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(shipped)}
        if unknown:  # raster_group, say, is a launch argument now, not a config field
            raise ValueError(
                f"{kernel}: {', '.join(sorted(unknown))} not fields of {type(shipped).__name__}; "
                f"fields: {', '.join(f.name for f in dataclasses.fields(shipped))}"
            )
        config = dataclasses.replace(shipped, **overrides)
        bias, act = problem.bias, problem.activation
        return lambda: api.matmul(
            a, b, out=out, accumulate=acc, backend=base, config=config, bias=bias, activation=act
        )

    def skip(problem: Workload) -> str | None:
        if problem.residual is not None or problem.gated is not None:
            return "a config variant runs bias and activation epilogues only"
        return None

    return Contender(f"wsgemm:{kernel}", make, skip)


def triton_backend() -> Contender:
    def make(problem: Workload, out) -> Call:
        from . import triton_matmul

        a, b, acc = problem.a, problem.b, problem.accumulate
        return lambda: triton_matmul.matmul(a, b, out=out, accumulate=acc)

    return Contender("triton", make, _no_epilogue)


def quack_backend(tuned: bool) -> Contender:
    def make(problem: Workload, out) -> Call:
        from quack.gemm_interface import gemm

        a, b = problem.a, problem.b
        return lambda: gemm(a, b, out=out, tuned=tuned)

    def skip(problem: Workload) -> str | None:
        if problem.accumulate_name != "fp32":
            return "QuACK accumulates in fp32 only"
        return _no_epilogue(problem)

    return Contender("quack-tuned" if tuned else "quack", make, skip)


def resolve(selection: list[str], device) -> tuple[list[Contender], list[Unavailable]]:
    """Backends for the names in ``selection`` (see ``SELECTABLE``): cuBLAS always first, then
    wsgemm:auto when selected, then the others in the order given."""
    names = _expand(selection)
    backends = [cublas()]
    missing: list[Unavailable] = []
    wsgemm_names, wsgemm_problem = [], None
    if any(name.startswith("wsgemm") for name in names):
        wsgemm_names, wsgemm_problem = _wsgemm_kernels(device)
    for name in names:
        if name == BASELINE:
            continue
        if name == RPR:
            backends.append(cublas_rpr())
        elif name == "wsgemm":
            if wsgemm_problem and AUTO not in names:  # else already said under wsgemm:auto
                missing.append(Unavailable("wsgemm", wsgemm_problem))
            backends += [wsgemm_backend(k) for k in wsgemm_names]
        elif name.startswith("wsgemm:"):
            kernel = name.split(":", 1)[1]
            if wsgemm_problem:
                missing.append(Unavailable(name, wsgemm_problem))
            elif "{" in kernel and parse_candidate(kernel)[0] in wsgemm_names:
                backends.append(wsgemm_candidate(kernel))
            elif kernel != "auto" and kernel not in wsgemm_names:
                listed = ", ".join(wsgemm_names) or "none"
                missing.append(Unavailable(name, f"not available here (available: {listed})"))
            else:
                backends.append(wsgemm_backend(kernel))
        elif name == "triton":
            problem = _import_problem("triton")
            if problem:
                missing.append(Unavailable(name, problem))
            else:
                backends.append(triton_backend())
        elif name in ("quack", "quack-tuned"):
            problem = _import_problem("quack.gemm_interface", attribute="gemm")
            if problem:
                missing.append(Unavailable(name, problem))
            else:
                backends.append(quack_backend(tuned=name == "quack-tuned"))
    unique = {b.name: b for b in backends}
    return list(unique.values()), missing


def _expand(selection: list[str]) -> list[str]:
    """The selected names, ``all`` spelled out and ``wsgemm`` preceded by ``wsgemm:auto``, in
    report order (``leading_first``); ValueError for an unknown name."""
    names: list[str] = []
    for item in selection:
        item = item.strip()
        if not item:
            continue
        for name in DEFAULT_SELECTION if item == "all" else (item,):
            if name == "wsgemm":
                names.append(AUTO)
            names.append(name)
    for item in names:
        if item in ("cublas", RPR, "wsgemm", "triton", "quack", "quack-tuned") or (
            item.startswith("wsgemm:") and len(item) > len("wsgemm:")
        ):
            continue
        raise ValueError(f"unknown backend {item!r}; choose from {', '.join(SELECTABLE)}")
    return leading_first(list(dict.fromkeys(names)))


def _wsgemm_kernels(device) -> tuple[list[str], str | None]:
    """wsgemm's backends that run on ``device``, or why we cannot know."""
    try:
        import wsgemm

        kernels = list(wsgemm.available_backends(device))
    except Exception as exc:  # an unbuilt or broken package must not stop the other backends
        return [], f"wsgemm.available_backends failed: {_describe(exc)}"
    if not kernels:
        return [], "wsgemm.available_backends lists no backend for this device"
    return kernels, None


def _import_problem(module: str, attribute: str | None = None) -> str | None:
    try:
        imported = importlib.import_module(module)
        if attribute is not None:
            getattr(imported, attribute)
    except Exception as exc:
        return f"import failed: {_describe(exc)}"
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
