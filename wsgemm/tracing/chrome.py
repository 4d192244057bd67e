"""A recording as a Chrome trace (the Trace Event Format), which https://ui.perfetto.dev and
chrome://tracing open.

One process per SM (``pid`` = SM id, named "SM 12"), one thread per recorder (``tid`` = its
index in ``Decoded.recorders``, named "consumer w4 (CTA 3)"). Spans are complete events
(``"ph": "X"``, the span kinds of ``SPANS``), the role events instants (``"ph": "i"``: load
issue, MMA issue, stage release, tile fetch, a stream-K unit's range); both carry the tile,
k-tile and stage they name as ``args``. ``ts`` and ``dur`` are microseconds (floats, ns
resolution) from the earliest recorder start. The recording's metadata rides along in
``otherData``.

Written line by line rather than through one big ``json.dumps``: a 4096^3 call has ~10^6 events.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wsgemm.trace_format import Event

from .decoding import SPAN_NAMES, Decoded, recorder_label, role_name

__all__ = ["INSTANTS", "write_chrome"]

#: Instant events and their names in the trace.
INSTANTS = {
    Event.LOAD_ISSUE: "load issue",
    Event.MMA_ISSUE: "MMA issue",
    Event.STAGE_RELEASE: "stage release",
    Event.TILE_FETCH: "tile fetch",
    Event.UNIT_RANGE: "unit range",
}


def write_chrome(d: Decoded, path: str | Path, problems: list[str] | None = None) -> Path:
    """Write ``path`` (JSON); returns it."""
    path = Path(path)
    rec = d.recorders
    pid = rec["smid"].tolist()
    role = [role_name(r) for r in rec["role"].tolist()]
    with open(path, "w") as f:
        other = {"meta": d.meta, "origin_globaltimer_ns": d.origin_ns, "problems": problems or []}
        f.write('{"displayTimeUnit": "ns", "otherData": ')
        f.write(json.dumps(other, default=str))
        f.write(', "traceEvents": [\n')
        lines = []
        for sm in sorted(set(pid)):
            lines.append(_meta("process_name", sm, None, {"name": f"SM {sm}"}))
            lines.append(_meta("process_sort_index", sm, None, {"sort_index": sm}))
        for i, r in enumerate(rec):
            name = f"{recorder_label(r)} (CTA {int(r['cta'])})"
            order = int(r["cta"]) * 10_000 + int(r["role"]) * 1000 + int(r["warp"])
            lines.append(_meta("thread_name", pid[i], i, {"name": name}))
            lines.append(_meta("thread_sort_index", pid[i], i, {"sort_index": order}))
        f.write(",\n".join(lines))
        s = d.spans
        args = _args(s, d.stream_k)
        for i, k, b, e, a in zip(s["rec"].tolist(), s["span"].tolist(), s["begin"].tolist(),
                                 s["end"].tolist(), args, strict=True):  # fmt: skip
            f.write(
                f',\n{{"name": "{SPAN_NAMES[k]}", "cat": "{role[i]}", "ph": "X", "pid": {pid[i]}, '
                f'"tid": {i}, "ts": {b / 1000:.3f}, "dur": {max(e - b, 0.0) / 1000:.3f}{a}}}'
            )
        ev = d.events[np.isin(d.events["kind"], [int(k) for k in INSTANTS])]
        args = _args(ev, d.stream_k)
        for i, k, t, a in zip(ev["rec"].tolist(), ev["kind"].tolist(), ev["t"].tolist(), args,
                              strict=True):  # fmt: skip
            f.write(
                f',\n{{"name": "{INSTANTS[k]}", "cat": "{role[i]}", "ph": "i", "s": "t", '
                f'"pid": {pid[i]}, "tid": {i}, "ts": {t / 1000:.3f}{a}}}'
            )
        f.write("\n]}\n")
    return path


def _meta(name: str, pid: int, tid: int | None, args: dict) -> str:
    event = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return json.dumps(event)


def _args(table: np.ndarray, stream_k: bool = False) -> list[str]:
    """``, "args": {...}`` for each row: the tile, k-tile and stage it names (none: empty); a
    split unit's tile fetch names its first k-tile and its split (``stream_k``: its part)
    instead, a stream-K unit's range its end and its tile's part count."""
    m, n, l = (table[f].tolist() for f in ("tile_m", "tile_n", "tile_l"))  # noqa: E741
    k, stage = table["k_tile"].tolist(), table["stage"].tolist()
    kinds = table["kind"].tolist() if "kind" in (table.dtype.names or ()) else [None] * len(k)
    names = {
        Event.TILE_FETCH: ("first_k_tile", "part" if stream_k else "split"),
        Event.UNIT_RANGE: ("end_k_tile", "parts"),
    }
    out = []
    for row in zip(m, n, l, k, stage, kinds, strict=True):
        k_name, stage_name = names.get(row[5], ("k_tile", "stage"))
        parts = []
        if row[0] >= 0:
            parts.append(f'"tile": [{row[0]}, {row[1]}, {row[2]}]')
        if row[3] >= 0:
            parts.append(f'"{k_name}": {row[3]}')
        if row[4] >= 0:
            parts.append(f'"{stage_name}": {row[4]}')
        out.append(f', "args": {{{", ".join(parts)}}}' if parts else "")
    return out
