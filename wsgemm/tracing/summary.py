"""The numbers a trace answers: where each role's time goes, how much epilogue is exposed, how
the tiles spread over the SMs, the tail, and what tracing cost.

``summarize(decoded)`` returns a JSON-able dict (``summary.json``; fields in docs/trace.md);
``tables(summary)`` renders it as rich tables. Times are microseconds, shares are fractions
(0..1) in the dict and percentages in the tables.

* ``roles``: per role, the share of its recorders' time in each activity (``activity.py``:
  the innermost span counts; "loading"/"MMA" are the roles' own work, the rest waits).
* ``epilogue``: per SM, the time some consumer is in its epilogue (``time_us``, summed over the
  ``sms`` SMs whose consumers ran an epilogue) and the part of it when no consumer of the SM is
  in a tile's mainloop (``exposed_us``, summed the same way): from its first wait on full, MMA
  issue or stage release to its last (``mainloop_intervals``).
  Ping-pong hides one warpgroup's epilogue under the other's mainloop; the cooperative schedule,
  whose two warpgroups finish a tile together, exposes all of it.
* ``idle``: the GPU's SMs that ran no CTA of the call (when every CTA recorded) and consumer
  recorders that fetched no tile.
* ``tiles_per_sm``: distinct output tiles (split-K, stream-K: work units) the consumers of each
  recording SM fetched.
* ``fixup`` (split-K and stream-K recordings; None otherwise): the fix-up time of each shared
  tile (one of more than one part, inside the problem), summed over its parts (each part's
  fix-up span on its CTA), and the finishing part's own (waiting for the others' partials,
  then summing them); its mean, median and max over the shared tiles.
* ``finish``: each SM's last recorder end; ``tail_us`` = latest - earliest, also as a share of
  the call (first recorder begin .. last recorder end).
* ``overflow``: recorders that lost events and how many.
* ``overhead``: the same call's time traced and untraced (``meta["traced_us"]``,
  ``meta["untraced_us"]``, when the recording measured them) and ``traced / untraced - 1``.
"""

from __future__ import annotations

import numpy as np

from wsgemm.trace_format import Event, Role

from .activity import ACTIVITIES, exclusive_time, mainloop_intervals, sweep
from .decoding import CONSUMER_ROLES, SPAN_NAMES, Decoded, unit_tile

__all__ = ["summarize", "tables", "title"]


def summarize(d: Decoded, problems: list[str] | None = None) -> dict:
    """The summary of one decoded recording; ``problems``: ``check``'s list, kept with it."""
    meta = d.meta
    return {
        "call": {
            key: meta.get(key)
            for key in (
                "backend",
                "shape",
                "dtype",
                "out_dtype",
                "accumulate",
                "layout",
                "tile",
                "config",
                "device",
                "arch",
                "num_sms",
            )  # fmt: skip
        },
        "duration_us": _us(d.duration_ns),
        "recorders": len(d.recorders),
        "events": len(d.events),
        "sms": len(np.unique(d.recorders["smid"])),
        "idle": _idle(d),
        "roles": _roles(d),
        "epilogue": _epilogue(d),
        "tiles_per_sm": _tiles_per_sm(d),
        "fixup": _fixup(d),
        "finish": _finish(d),
        "overflow": {
            "recorders": int((d.recorders["overflow"] > 0).sum()),
            "events_lost": int(d.recorders["overflow"].sum()),
            "capacity": d.capacity,
        },
        "overhead": _overhead(meta),
        "problems": list(problems or []),
    }


def _us(ns) -> float:
    return round(float(ns) / 1000.0, 4)


def _roles(d: Decoded) -> dict:
    spent = exclusive_time(d)
    out = {}
    for role in Role:
        mine = d.recorders["role"] == role
        if not mine.any():
            continue
        total = spent[mine].sum(axis=0)
        time = float((d.recorders["end"] - d.recorders["begin"])[mine].sum())
        out[role.name.lower()] = {
            "recorders": int(mine.sum()),
            "time_us": _us(time),
            "fractions": {
                name: round(float(total[i]) / time, 4) if time > 0 else 0.0
                for i, name in enumerate(ACTIVITIES)
                if total[i] > 0
            },
        }
    return out


def _epilogue(d: Decoded) -> dict:
    consumers = np.flatnonzero(np.isin(d.recorders["role"], CONSUMER_ROLES))
    spans = d.spans
    epi = spans[(spans["span"] == SPAN_NAMES.index("epilogue")) & np.isin(spans["rec"], consumers)]
    m_rec, m_begin, m_end = mainloop_intervals(d, consumers)
    if not len(epi):
        return {"time_us": 0.0, "exposed_us": 0.0, "exposed_fraction": None, "sms": 0}
    smid = d.recorders["smid"].astype(np.int64)
    _, start, stop, covered = sweep(
        np.concatenate([smid[epi["rec"]], smid[m_rec]]),
        np.concatenate([epi["begin"], m_begin]),
        np.concatenate([epi["end"], m_end]),
        np.concatenate([np.zeros(len(epi), np.int64), np.ones(len(m_rec), np.int64)]),
        2,
    )
    length = stop - start
    time = float(length[covered[:, 0]].sum())
    exposed = float(length[covered[:, 0] & ~covered[:, 1]].sum())
    return {
        "time_us": _us(time),
        "exposed_us": _us(exposed),
        "exposed_fraction": round(exposed / time, 4) if time > 0 else None,
        "sms": len(np.unique(smid[epi["rec"]])),
    }


def _tiles_per_sm(d: Decoded) -> dict:
    ev = d.events
    role = d.recorders["role"][ev["rec"]]
    fetch = (ev["kind"] == Event.TILE_FETCH) & np.isin(role, CONSUMER_ROLES) & (ev["tile_m"] >= 0)
    if not fetch.any():
        return {"min": None, "median": None, "max": None}
    r = d.recorders[ev["rec"][fetch]]
    split = d.fetch_split(fetch)  # under split-K a unit is (tile, split)
    runs = np.unique(
        np.column_stack(
            [r["smid"], r["cta"], *(ev[f][fetch] for f in ("tile_m", "tile_n", "tile_l")), split]
        ),
        axis=0,
    )
    per_sm = np.unique(runs[:, 0], return_counts=True)[1]
    return {
        "min": int(per_sm.min()),
        "median": float(np.median(per_sm)),
        "max": int(per_sm.max()),
    }


def _fixup(d: Decoded) -> dict | None:
    """Where a split recording's fix-up time goes (module docstring); None when unsplit."""
    if not d.is_split:
        return None
    units = d.units()
    fix, epi = d.unit_spans("fixup"), d.unit_spans("epilogue")
    # (tile, part) -> its fix-up (a cooperative CTA's two warpgroups record the same one: the
    # longer), and the tiles of more than one part
    per_unit: dict[tuple, float] = {}
    shared: set = set()
    for f in fix:
        u = units[f["unit"]]
        tile = unit_tile(u)
        if not d.inside(tile):
            continue  # past the problem's edge: no fix-up to time
        key = (tile, int(u["part"]))
        per_unit[key] = max(per_unit.get(key, 0.0), float(f["end"] - f["begin"]))
        if u["parts"] > 1:
            shared.add(tile)
    per_tile: dict[tuple, float] = {}
    for (tile, _), ns in per_unit.items():
        if tile in shared:
            per_tile[tile] = per_tile.get(tile, 0.0) + ns
    finished = {(unit_tile(units[e["unit"]]), int(units[e["unit"]]["part"])) for e in epi}
    finisher = [per_unit[k] for k in finished if k[0] in shared and k in per_unit]
    return {
        "shared_tiles": len(shared),
        "parts": sum(1 for tile, _ in per_unit if tile in shared),
        "time_us": _us(sum(per_tile.values())),
        "per_tile_us": _stats(list(per_tile.values())),
        "finisher_us": _stats(finisher),
    }


def _stats(ns: list[float]) -> dict:
    """``mean``, ``median``, ``max`` of ``ns`` in us (None for none)."""
    if not ns:
        return {"mean": None, "median": None, "max": None}
    return {"mean": _us(np.mean(ns)), "median": _us(np.median(ns)), "max": _us(max(ns))}


def _idle(d: Decoded) -> dict:
    """What of the machine the call left unused: ``sms``, the GPU's SMs that ran no CTA of it
    (None when only a sample of the grid recorded, or the SM count is unknown), and
    ``consumers``, consumer recorders that fetched no tile (a ping-pong CTA with one tile leaves
    its second warpgroup idle), of ``consumer_recorders``."""
    num_sms = d.meta.get("num_sms")
    sms = None
    if num_sms and not d.sampled:
        sms = max(0, int(num_sms) - len(np.unique(d.recorders["smid"])))
    consumers = np.flatnonzero(np.isin(d.recorders["role"], CONSUMER_ROLES))
    ev = d.events
    fetched = np.unique(ev["rec"][(ev["kind"] == Event.TILE_FETCH) & (ev["tile_m"] >= 0)])
    return {
        "sms": sms,
        "consumers": int(len(np.setdiff1d(consumers, fetched))),
        "consumer_recorders": int(len(consumers)),
    }


def _finish(d: Decoded) -> dict:
    smid = d.recorders["smid"]
    sms = np.unique(smid)
    last = np.array([d.recorders["end"][smid == s].max() for s in sms])
    tail = float(last.max() - last.min())
    return {
        "first_us": _us(last.min()),
        "last_us": _us(last.max()),
        "tail_us": _us(tail),
        "tail_fraction": round(tail / d.duration_ns, 4) if d.duration_ns > 0 else None,
    }


def _overhead(meta: dict) -> dict:
    traced, untraced = meta.get("traced_us"), meta.get("untraced_us")
    fraction = None
    if traced is not None and untraced:
        fraction = round(traced / untraced - 1.0, 4)
    return {"traced_us": traced, "untraced_us": untraced, "overhead_fraction": fraction}


def _fixup_text(fixup: dict) -> str:
    n = fixup["shared_tiles"]
    if not n:
        return "no shared tile (every tile ran in one part)"
    tile, last = fixup["per_tile_us"], fixup["finisher_us"]
    text = (
        f"{tile['mean']:.2f} us a shared tile (median {tile['median']:.2f}, max "
        f"{tile['max']:.2f}) over {n} tile{'s' if n > 1 else ''} of {fixup['parts']} parts, "
        f"{fixup['time_us']:.2f} us in all"
    )
    if last["mean"] is not None:
        text += f"; the finishing part's share {last['mean']:.2f} us (mean)"
    return text


# ----------------------------------------------------------------------------- rendering


def title(call: dict) -> str:
    """One line naming the call (a recording's ``meta`` or a summary's ``call``): backend,
    shape, dtype, layout, tile, device."""
    shape = call.get("shape") or []
    dims = "x".join(str(v) for v in shape[:3])
    if len(shape) > 3 and shape[3] != 1:
        dims += f" (batch {shape[3]})"
    tile = "x".join(str(v) for v in call.get("tile") or [])
    parts = [call.get("backend") or "?", dims, call.get("dtype"), call.get("layout")]
    parts += [f"tile {tile}" if tile else None, call.get("device")]
    return " ".join(str(p) for p in parts if p)


def tables(summary: dict) -> list:
    """The summary as rich tables: where each role's time goes, then the call's numbers."""
    from rich.table import Table

    roles = summary["roles"]
    shown = [a for a in ACTIVITIES if any(a in r["fractions"] for r in roles.values())]
    by_role = Table(title=f"wsgemm trace: {title(summary['call'])}", title_justify="left")
    by_role.add_column("role")
    by_role.add_column("recorders", justify="right")
    for name in shown:
        by_role.add_column(f"{name} %", justify="right")
    for role, r in roles.items():
        cells = [f"{100 * r['fractions'].get(a, 0.0):.1f}" for a in shown]
        by_role.add_row(role, str(r["recorders"]), *cells)

    facts = Table(show_header=False, box=None, padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for name, text in _facts(summary):
        facts.add_row(name, text)
    return [by_role, facts]


def _facts(summary: dict) -> list[tuple[str, str]]:
    epi, tiles, fin = summary["epilogue"], summary["tiles_per_sm"], summary["finish"]
    over, cost = summary["overflow"], summary["overhead"]
    idle = summary["idle"]
    on = f"{summary['sms']} SMs"
    if idle["sms"] is not None:
        on = f"{summary['sms']} of {summary['sms'] + idle['sms']} SMs ({idle['sms']} idle)"
    rows = [
        (
            "call",
            f"{summary['duration_us']:.2f} us on {on}, "
            f"{summary['recorders']} recorders, {summary['events']} events",
        )
    ]
    if idle["consumers"]:
        text = f"{idle['consumers']} of {idle['consumer_recorders']} consumer recorders ran no tile"
        rows.append(("idle consumers", text))
    text = f"{epi['exposed_us']:.2f} of {epi['time_us']:.2f} us"
    if epi["exposed_fraction"] is not None:
        text += f" ({100 * epi['exposed_fraction']:.0f}%)"
    if epi["sms"]:  # sums over SMs: say over how many, and the mean per SM
        n = epi["sms"]
        text += (
            f", summed over {n} SM{'s' if n > 1 else ''}"
            f" ({epi['exposed_us'] / n:.2f} of {epi['time_us'] / n:.2f} us per SM)"
        )
    rows.append(("exposed epilogue", text))
    if tiles["min"] is not None:
        text = f"min {tiles['min']}, median {tiles['median']:g}, max {tiles['max']}"
        rows.append(("tiles per SM", text))
    fixup = summary.get("fixup")
    if fixup is not None:
        rows.append(("fix-up", _fixup_text(fixup)))
    text = f"{fin['tail_us']:.2f} us between the first and last SM to finish"
    if fin["tail_fraction"] is not None:
        text += f" ({100 * fin['tail_fraction']:.1f}% of the call)"
    rows.append(("tail", text))
    lost = f"{over['recorders']} recorders lost {over['events_lost']} events"
    rows.append(("overflow", lost if over["recorders"] else "none"))
    if cost["overhead_fraction"] is not None:
        text = (
            f"{100 * cost['overhead_fraction']:+.1f}% ({cost['traced_us']:.2f} us traced, "
            f"{cost['untraced_us']:.2f} us untraced)"
        )
    else:
        text = "not measured"
    rows.append(("tracing overhead", text))
    if summary["problems"]:
        rows.append(("problems", f"{len(summary['problems'])} (listed above)"))
    return rows
