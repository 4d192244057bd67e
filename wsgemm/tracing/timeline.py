"""``wsgemm.trace(a, b)``: run one traced call and get its ``Timeline``; ``Timeline.from_raw``
reads a saved recording (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

from wsgemm.trace_format import RawTrace

from . import chrome, plot, summary
from .checks import check
from .decoding import Decoded, decode

__all__ = ["Timeline", "trace", "trace_gated_grad", "trace_grouped"]


class Timeline:
    """One traced call: the recording (``raw``), its tables (``recorders``, ``events``,
    ``spans``: numpy structured arrays, fields in ``wsgemm.tracing.decoding``) and what they
    show (``check``, ``summary``, ``to_chrome``, ``plot``). Times are ns from the earliest
    recorder's start."""

    def __init__(self, raw: RawTrace):
        self.raw = raw
        self.decoded: Decoded = decode(raw)
        self._problems: list[str] | None = None

    @classmethod
    def from_raw(cls, source: str | Path | RawTrace) -> Timeline:
        """From a ``RawTrace`` or a file it was saved to (``raw.npz``): ValueError if the file
        is not one."""
        return cls(source if isinstance(source, RawTrace) else RawTrace.load(source))

    @property
    def meta(self) -> dict:
        return self.decoded.meta

    @property
    def recorders(self):
        return self.decoded.recorders

    @property
    def events(self):
        return self.decoded.events

    @property
    def spans(self):
        return self.decoded.spans

    def check(self) -> list[str]:
        """The recording's inconsistencies, one sentence each (``wsgemm.tracing.checks``)."""
        if self._problems is None:
            self._problems = check(self.decoded)
        return list(self._problems)

    def summary(self) -> dict:
        """The numbers (``wsgemm.tracing.summary``), with ``check``'s problems."""
        return summary.summarize(self.decoded, self.check())

    def title(self) -> str:
        """One line naming the call: backend, shape, dtype, layout, tile, device."""
        return summary.title(self.meta)

    def to_chrome(self, path: str | Path) -> Path:
        """Write a Chrome/Perfetto trace (JSON) to ``path``."""
        return chrome.write_chrome(self.decoded, path, self.check())

    def plot(self, path: str | Path, sms=None) -> Path:
        """Write the PNG timeline of the SMs ``sms`` (ids; default the first few)."""
        return plot.plot(self.decoded, path, sms=sms, title=self.title())

    def write_summary(self, path: str | Path) -> Path:
        """Write ``summary()`` as JSON to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.summary(), indent=2) + "\n")
        return path

    def save(self, path: str | Path) -> Path:
        """Write the recording (``.npz``) that ``from_raw`` reads back."""
        return self.raw.save(path)

    def __repr__(self) -> str:
        d = self.decoded
        return (
            f"Timeline({self.title()}: {len(d.recorders)} recorders, {len(d.events)} events, "
            f"{d.duration_ns / 1000:.2f} us)"
        )


def trace(a, b, **options) -> Timeline:
    """Run ``wsgemm.api.matmul(a, b, ...)`` once on the traced variant of its kernel and return
    the per-role timeline of that call (a ``Timeline``: ``.summary()``, ``.check()``,
    ``.to_chrome(path)``, ``.plot(path)``, ``.save(path)``). Needs a CUDA GPU. ``options`` are
    ``wsgemm.tracing.record.record``'s (backend, config, out_dtype, accumulate, out, capacity,
    max_ctas, measure, split_k), documented there."""
    from .record import record  # torch and the kernels only when something is recorded

    return Timeline(record(a, b, **options))


def trace_gated_grad(dy, w_down, preact, activation="silu", **options) -> Timeline:
    """``trace`` of ``wsgemm.api.gated.gated_grad(dy, w_down, preact, activation)``: the dh
    GEMM of a ``GatedMLP`` backward with the unit's gradient fused into its epilogue. Needs a
    CUDA GPU. ``options``: ``record_gated_grad``'s (capacity, max_ctas,
    measure)."""
    from .record import record_gated_grad

    return Timeline(record_gated_grad(dy, w_down, preact, activation, **options))


def trace_grouped(a, b, offs, **options) -> Timeline:
    """``trace`` of ``wsgemm.grouped_mm(a, b, offs)``'s 2D x 3D form: the per-role timeline of
    one call of its grouped kernel, each tile's fetch naming its group (``tile_l``) and its
    tile inside the group (``tile_m``). Needs a CUDA GPU. ``options``:
    ``wsgemm.tracing.record.record_grouped``'s (backend, out_dtype, capacity, max_ctas,
    measure)."""
    from .record import record_grouped

    return Timeline(record_grouped(a, b, offs, **options))
