"""Per-role timelines of one traced GEMM call (issue #13): ``wsgemm.trace(a, b)`` and
``python -m wsgemm trace``. docs/trace.md says how to read them.

A traced kernel writes a raw buffer (``wsgemm/trace_format.py``); this package
reads it, on the GPU host or anywhere else from a saved ``.npz``:

* ``decode``: the buffer as numpy tables of recorders, events and spans, on one ns clock;
* ``checks``: is it consistent with how the kernels work (stages, tiles, loads before waits)?
* ``activity``: what each recorder does at every instant (shared by the summary and the PNG);
* ``summary``: busy and waiting shares per role, exposed epilogue, tiles per SM, tail, overhead;
* ``chrome``: the Chrome/Perfetto trace; ``plot``: the PNG timeline (matplotlib);
* ``timeline``: ``Timeline``, the object that ties them together, and ``trace``.

The package is not called ``wsgemm.trace``: importing a submodule of that name would bind the
module over the function ``wsgemm.trace`` on the package. numpy is needed (the ``trace``
extra); torch and the DSL only to record (``trace``), not to read a recording.
"""

try:
    import numpy  # noqa: F401
except ModuleNotFoundError as exc:  # the core install has no numpy of its own
    raise ModuleNotFoundError(
        "wsgemm's traces need numpy (and matplotlib for the PNG): pip install 'wsgemm[trace]'",
        name="numpy",
    ) from exc

from .checks import check
from .decode import Decoded, decode
from .timeline import Timeline, trace

__all__ = ["Decoded", "Timeline", "check", "decode", "trace"]
