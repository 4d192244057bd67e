"""Tracing, one wing above the API (issue #13): ``wsgemm.trace(a, b)`` records what each warp
role did during one GEMM call; ``python -m wsgemm trace`` does it from the command line.
docs/trace.md says how to read a recording.

A traced kernel writes a raw buffer (``wsgemm/trace_format.py``, the one format the kernels and
this package share). Recording one (torch, the DSL and a CUDA GPU):

* ``plan``: the buffer's size (which CTAs record, events per row) and the traced compile;
* ``record``: one call, validated and planned as ``matmul`` does, run on its kernel's traced
  variant; ``measure``: that call timed traced and untraced (the tracing overhead).

Reading one, on the GPU host or anywhere else from a saved ``.npz`` (numpy only):

* ``decoding``: the buffer as numpy tables of recorders, events and spans, on one ns clock;
* ``checks``: is it consistent with how the kernels work (stages, tiles, loads before waits)?
* ``activity``: what each recorder does at every instant (shared by the summary and the PNG);
* ``summary``: busy and waiting shares per role, exposed epilogue, tiles per SM, tail, overhead;
* ``chrome``: the Chrome/Perfetto trace; ``plot``: the PNG timeline (matplotlib);
* ``timeline``: ``Timeline``, the object that ties them together, and ``trace``;
* ``cli``: the ``trace`` subcommand, which ``wsgemm.cli`` dispatches to.

Names that would shadow each other are avoided on purpose: the package is not ``wsgemm.trace``
(importing a submodule binds it on its parent, over the function ``wsgemm.trace``), and the
decoder module is not ``decode`` (over the function ``decode`` below). The public names load
on first use, so importing ``cli`` (every ``python -m wsgemm`` start) does not load numpy.
"""

import importlib

__all__ = ["Decoded", "Timeline", "check", "decode", "trace", "trace_gated_grad", "trace_grouped"]

# Where each public name lives.
_PUBLIC = {
    "Decoded": "decoding",
    "Timeline": "timeline",
    "check": "checks",
    "decode": "decoding",
    "trace": "timeline",
    "trace_gated_grad": "timeline",
    "trace_grouped": "timeline",
}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f".{_PUBLIC[name]}", __name__)
    except ModuleNotFoundError as exc:  # the core install has no numpy of its own
        if exc.name != "numpy":
            raise
        raise ModuleNotFoundError(
            "wsgemm's traces need numpy (and matplotlib for the PNG): pip install 'wsgemm[trace]'",
            name="numpy",
        ) from exc
    value = globals()[name] = getattr(module, name)
    return value


def __dir__():
    return sorted({*globals(), *__all__})
