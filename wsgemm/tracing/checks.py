"""Is a recording consistent with how the kernels work? ``check(raw)`` lists what is not.

The checks (each problem is one sentence naming the CTA, SM, role and time):

* **decode**: what the decoder could not read as the format says (a clock anchor missing).
* **overflow**: a recorder that tried to write more than ``capacity`` events (the rest are lost:
  the other checks then skip what the lost events would have said).
* **pairing**: a begin without its end, or an end without its begin.
* **order**: a recorder's times going backwards.
* **stages**: every ``STAGE_RELEASE`` is matched, by identity, to a producer fill
  (``LOAD_ISSUE``) of the same (CTA, tile, k-tile, stage): a consumer recorder releases such a
  key at most as often as its CTA's producer filled it (a fill serves every consumer recorder),
  and the fill that served a release is stamped at most one tick after it. Release stamps lag
  their arrives (hundreds of ns seen on H100), so a stage's next fill may carry an earlier
  stamp than the release that freed it: that is not a problem.
* **tiles**: every output tile of the problem (``meta["tiles"]``) is fetched by the consumers of
  exactly one CTA, and by each consumer recorder at most once (on ping-pong: by one recorder).
  Under split-K (``meta["split"]`` > 1) the same holds for every (tile, split) work unit, the
  split read from its ``TILE_FETCH``; a tile coordinate in a message then shows l x splits +
  split as its third value. Under stream-K (``meta["stream_k"]``) for every (tile, part) unit,
  the part read from its ``TILE_FETCH``, and every tile of the problem by some unit.
  A grouped call's tile set (``meta["group_tiles"]``: each group's m-tiles, the column tiles)
  is each group's own grid, a tile's coordinates (tile in its group, n, group).
  Tiles past the problem's edge, which a cluster that overhangs a ragged edge runs (its loads
  zero-filled, its stores dropped), are not required; they still must not be run twice, and no
  tile may lie past the edge rounded up to whole clusters. When only a sample of the grid
  recorded (fewer CTAs traced than launched: ``max_ctas``, or sm80's default waves) or a consumer
  overflowed, missing tiles are not reported.
* **parts** (split-K and stream-K recordings): each tile's units (``Decoded.units``: a
  stream-K unit's k-range end and part count from the ``UNIT_RANGE`` after its fetch) name
  one part count, and its parts, in part order, run its k-tiles [0, k_tiles) exactly once,
  one after another; every unit of a shared tile (more than one part) records a fix-up
  (``FIXUP_BEGIN/END``); every tile inside the problem runs its epilogue on exactly one part,
  and not before the last of its parts began its fix-up (the finisher is the last to arrive;
  ``SKEW_NS`` allowed, the parts' stamps being other SMs').
* **full after load**: a consumer's wait on ``full`` for (tile, k-tile) ends at or after its
  CTA's producer issued that k-tile's loads. In a cluster (``meta["config"]`` cluster_m x
  cluster_n > 1) the stage is full only when every CTA of the cluster issued its share of the
  multicast loads, so the bound is the latest ``LOAD_ISSUE`` of that k-tile among the CTAs that
  run the same cluster tile. One timer tick (32 ns) of slack: two stamps of one instant may
  straddle a tick; ``SKEW_NS`` where the bound is a peer CTA's load, stamped on another SM.
"""

from __future__ import annotations

import numpy as np

from wsgemm.trace_format import Event, RawTrace, Role

from .decoding import CONSUMER_ROLES, Decoded, decode, recorder_label, unit_tile

__all__ = ["SKEW_NS", "TICK_NS", "check"]

#: %globaltimer's step on Hopper: the slack between two events' order and their stamps.
TICK_NS = 32
#: The slack between two SMs' stamps: each SM reads %globaltimer a few ticks apart from the
#: others. On an H100 a stream-K finisher's epilogue was stamped 64 ns before another SM's
#: stamp of a fix-up that causally came first (docs/perf.md entry 110); four ticks allowed.
SKEW_NS = 4 * TICK_NS
#: Problems listed per check; the rest are counted.
MAX_LISTED = 5


def check(source: RawTrace | Decoded) -> list[str]:
    """Every inconsistency found in a recording (an empty list: none)."""
    d = source if isinstance(source, Decoded) else decode(source)
    problems = list(d.notes)
    if not len(d.recorders):
        return [*problems, "no recorder wrote any event"]
    for part in (_overflow, _unmatched, _order, _stages, _tiles, _parts, _full_after_load):
        problems += part(d)
    return problems


# ----------------------------------------------------------------------------- helpers


def _who(d: Decoded, rec: int) -> str:
    r = d.recorders[rec]
    return f"CTA {int(r['cta'])} {recorder_label(r)} (SM {int(r['smid'])})"


def _us(t: float) -> str:
    return f"{t / 1000:.3f} us"


def _listed(lines: list[str], what: str) -> list[str]:
    if len(lines) <= MAX_LISTED:
        return lines
    return [*lines[:MAX_LISTED], f"... and {len(lines) - MAX_LISTED} more {what}"]


def _event_columns(d: Decoded):
    """Per event: its recorder's role and CTA, and the tile it belongs to: its own coordinates,
    or where it has none the last ones its recorder recorded (an event index, -1 for none)."""
    ev = d.events
    role = d.recorders["role"][ev["rec"]].astype(np.int64)
    cta = d.recorders["cta"][ev["rec"]].astype(np.int64)
    return role, cta, _last_where(ev["rec"], ev["tile_m"] >= 0)


def _last_where(rec: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """For each event, the index of the latest event at or before it on the same recorder where
    ``valid`` holds, else -1 (events are recorder-major in recording order)."""
    idx = np.where(valid, np.arange(len(valid)), -1)
    np.maximum.accumulate(idx, out=idx)
    seen = idx >= 0
    seen[seen] = rec[idx[seen]] == rec[seen]
    return np.where(seen, idx, -1)


def _tile_of(d: Decoded, source: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """(events, 3) tile coordinates of the events ``pick`` through ``source`` (-1 for none)."""
    at = source[pick]
    out = np.full((len(at), 3), -1, dtype=np.int64)
    known = at >= 0
    for j, name in enumerate(("tile_m", "tile_n", "tile_l")):
        out[known, j] = d.events[name][at[known]]
    return out


def _ids(*columns: np.ndarray) -> np.ndarray:
    """One dense id per distinct row of ``columns`` (int arrays of one length)."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    _, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    return inverse.reshape(-1)


def _overflowed(d: Decoded, roles) -> bool:
    r = d.recorders
    return bool((r["overflow"][np.isin(r["role"], roles)] > 0).any())


# ----------------------------------------------------------------------------- the checks


def _overflow(d: Decoded) -> list[str]:
    over = np.flatnonzero(d.recorders["overflow"] > 0)
    if not len(over):
        return []
    lost = int(d.recorders["overflow"][over].sum())
    worst = int(d.recorders["count"][over].max())
    head = (
        f"{len(over)} recorder(s) overflowed: {lost} events lost (capacity {d.capacity} per "
        f"recorder, the fullest tried {worst}): record again with a larger capacity"
    )
    each = [f"{_who(d, i)} lost {int(d.recorders['overflow'][i])} events" for i in over]
    return [head, *_listed(each, "overflowed recorders")]


def _unmatched(d: Decoded) -> list[str]:
    """Unpaired begins and ends, except on recorders that overflowed (their last spans were
    cut by it, which ``_overflow`` reports)."""
    lines = []
    complete = d.recorders["overflow"] == 0
    for e in d.unmatched[complete[d.unmatched["rec"]]]:
        try:
            kind = Event(int(e["kind"])).name
        except ValueError:
            kind = f"event {int(e['kind'])}"
        if kind.endswith("_END"):
            partner, where = kind.removesuffix("_END") + "_BEGIN", "before it"
        else:
            partner, where = kind.removesuffix("_BEGIN") + "_END", "after it"
        lines.append(f"{_who(d, int(e['rec']))}: {kind} at {_us(e['t'])} has no {partner} {where}")
    return _listed(lines, "unpaired events")


def _order(d: Decoded) -> list[str]:
    ev = d.events
    back = np.flatnonzero((ev["rec"][1:] == ev["rec"][:-1]) & (ev["t"][1:] < ev["t"][:-1])) + 1
    lines = [
        f"{_who(d, int(ev['rec'][i]))}: time goes back at its event "
        f"{i - int(np.searchsorted(ev['rec'], ev['rec'][i]))} ({_us(ev['t'][i])} after "
        f"{_us(ev['t'][i - 1])})"
        for i in back
    ]
    return _listed(lines, "backward steps")


def _stages(d: Decoded) -> list[str]:
    """Every stage release is matched, by identity, to a fill of the same (CTA, tile, k-tile,
    stage): a consumer recorder's n-th release of such a key (in recording order) is served by
    the key's n-th fill (in time order; one fill serves every consumer recorder of the CTA),
    and that fill must be stamped at most one tick after the release. Stamps are not compared
    otherwise: a release's stamp, read after its arrive, can lag it by hundreds of ns, so the
    next fill of the stage may carry an earlier stamp than the release that freed it.

    A release with no fill left for it reads "released it twice without a fill in between"
    when the recorder released that stage before (the previous release's time and this one's),
    else "released it at ... before any fill of it"; a release whose fill is stamped after it
    (beyond the tick) reads "released tile T k-tile K at ..., before its fill was issued at
    ...". A CTA without a producer recorder is not judged; where its producer overflowed (it
    stopped recording fills), no release after the producer's last event is."""
    ev = d.events
    role, cta, source = _event_columns(d)
    producers = np.unique(d.recorders["cta"][d.recorders["role"] == Role.PRODUCER])
    fill = (ev["kind"] == Event.LOAD_ISSUE) & (role == Role.PRODUCER) & (ev["stage"] >= 0)
    release = (ev["kind"] == Event.STAGE_RELEASE) & (ev["stage"] >= 0) & np.isin(cta, producers)
    # a producer that overflowed stopped recording fills: judge no release after its last one
    cutoff = np.full(len(d.recorders), np.inf)
    over = (d.recorders["role"] == Role.PRODUCER) & (d.recorders["overflow"] > 0)
    for i in np.flatnonzero(over):
        last = ev["t"][ev["rec"] == i].max()
        cutoff[d.recorders["cta"] == d.recorders["cta"][i]] = last
    release &= ev["t"] <= cutoff[ev["rec"]]
    if not release.any():
        return []
    both = fill | release
    tiles = np.full((len(ev), 3), -1, dtype=np.int64)
    tiles[both] = _tile_of(d, source, both)
    k, stage = ev["k_tile"].astype(np.int64), ev["stage"].astype(np.int64)
    key = np.full(len(ev), -1, dtype=np.int64)
    key[both] = _ids(cta[both], *tiles[both].T, k[both], stage[both])
    t, rec = ev["t"], ev["rec"].astype(np.int64)
    # each key's fills in time order, from first[key] on
    f = np.flatnonzero(fill)
    f = f[np.lexsort((f, t[f], key[f]))]
    n_keys = int(key[both].max()) + 1
    filled = np.bincount(key[f], minlength=n_keys)
    first = np.searchsorted(key[f], np.arange(n_keys))
    # each recorder's releases of a key in recording order: the n-th is served by the n-th fill
    r = np.flatnonzero(release)
    r = r[np.lexsort((r, key[r], rec[r]))]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (rec[r][1:] != rec[r][:-1]) | (key[r][1:] != key[r][:-1])
    starts = np.flatnonzero(new)
    rank = np.arange(len(r)) - np.repeat(starts, np.diff(np.append(starts, len(r))))
    missing = rank >= filled[key[r]]
    served = np.full(len(r), -1, dtype=np.int64)
    served[~missing] = f[first[key[r][~missing]] + rank[~missing]]
    late = ~missing
    late[late] = t[served[late]] > t[r[late]] + TICK_NS
    # the recorder's previous release of the same stage (recording order), for the wording
    previous = np.full(len(ev), -1, dtype=np.int64)
    s = np.flatnonzero(release)
    s = s[np.lexsort((s, stage[s], rec[s]))]
    same = (rec[s][1:] == rec[s][:-1]) & (stage[s][1:] == stage[s][:-1])
    previous[s[1:][same]] = s[:-1][same]
    lines = []
    bad = np.flatnonzero(missing | late)
    for j in bad[np.argsort(r[bad])]:  # in recording order
        i = r[j]
        at = f"CTA {int(cta[i])} stage {int(stage[i])}: {_who(d, int(rec[i]))}"
        what = f"tile {tuple(tiles[i].tolist())} k-tile {int(k[i])}"
        if late[j]:
            lines.append(
                f"{at} released {what} at {_us(t[i])}, before its fill was issued at "
                f"{_us(t[served[j]])}"
            )
        elif previous[i] < 0:
            lines.append(f"{at} released it at {_us(t[i])} before any fill of it ({what})")
        else:
            lines.append(
                f"{at} released it twice without a fill in between ({_us(t[previous[i]])} and "
                f"{_us(t[i])}; {what}: {int(rank[j]) + 1} release(s) by it, "
                f"{int(filled[key[i]])} fill(s))"
            )
    return _listed(lines, "stage releases without a fill before them")


def _tiles(d: Decoded) -> list[str]:
    ev = d.events
    role, cta, source = _event_columns(d)
    fetch = (ev["kind"] == Event.TILE_FETCH) & np.isin(role, CONSUMER_ROLES) & (ev["tile_m"] >= 0)
    if not fetch.any():
        return ["no consumer recorded a TILE_FETCH: cannot check that every tile ran once"]
    tiles = _tile_of(d, source, fetch)
    rec, cta = ev["rec"][fetch].astype(np.int64), cta[fetch]
    lines = []
    counts = d.meta.get("tiles")

    def unit(key) -> str:
        return f"tile {tuple(key)}"

    if d.splits > 1:
        # split-K: the unit is (tile, split); the checks below run on units, each split a
        # slice of the batch coordinate
        tiles = tiles.copy()
        tiles[:, 2] = tiles[:, 2] * d.splits + d.fetch_split(fetch)
        if counts is not None:
            counts = [counts[0], counts[1], counts[2] * d.splits]
    elif d.stream_k:
        # stream-K: the unit is (tile, part), a tile's part count its own; the part is a
        # fourth column (every tile is required below, its parts by ``_parts``)
        tiles = np.column_stack([tiles, d.fetch_split(fetch)])

        def unit(key) -> str:
            return f"tile {tuple(key[:3])} part {key[3]}"

    width = tiles.shape[1]
    config = d.meta.get("config") or {}
    grouped = d.meta.get("group_tiles")  # a grouped call's: each group's m-tiles, tiles_n
    if grouped is not None:
        outside, grid = _outside_groups(tiles, grouped, config)
        lines += [
            f"{_who(d, int(rc))} fetched tile {tuple(t)}, past its group's grid of {tuple(g)} tiles"
            for rc, t, g in zip(
                rec[outside], tiles[outside].tolist(), grid[outside].tolist(), strict=True
            )  # fmt: skip
        ]
        tiles, rec, cta = tiles[~outside], rec[~outside], cta[~outside]
    elif counts is not None:
        cluster = np.array([config.get("cluster_m", 1), config.get("cluster_n", 1), 1])
        grid = -(-np.asarray(counts, dtype=np.int64) // cluster) * cluster
        outside = ((tiles[:, :3] < 0) | (tiles[:, :3] >= grid)).any(axis=1)
        lines += [
            f"{_who(d, int(rc))} fetched {unit(t)}, past the grid of {tuple(grid.tolist())} tiles"
            for rc, t in zip(rec[outside], tiles[outside].tolist(), strict=True)
        ]
        tiles, rec, cta = tiles[~outside], rec[~outside], cta[~outside]
    # each recorder at most once
    key = np.column_stack([rec, tiles])
    uniq, n = np.unique(key, axis=0, return_counts=True)
    lines += [
        f"{_who(d, int(k[0]))} fetched {unit(k[1:].tolist())} {c} times"
        for k, c in zip(uniq[n > 1], n[n > 1], strict=True)
    ]
    # one CTA per unit (and on ping-pong one recorder of it)
    per_cta = np.unique(np.column_stack([tiles, cta]), axis=0)
    tile_keys, n_ctas = np.unique(per_cta[:, :width], axis=0, return_counts=True)
    for t in tile_keys[n_ctas > 1]:
        which = per_cta[(per_cta[:, :width] == t).all(axis=1), width].tolist()
        lines.append(f"{unit(t.tolist())} was run by {len(which)} CTAs: {which}")
    # each unit by as many consumer recorders of its CTA as the kernel gives it (record's
    # ``consumers_per_tile``: 1 ping-pong, 2 cooperative, every MMA warp on sm80)
    want = d.meta.get("consumers_per_tile", 1 if config.get("schedule") == "pingpong" else None)
    if want and not _overflowed(d, CONSUMER_ROLES):
        per_rec = np.unique(np.column_stack([tiles, cta, rec]), axis=0)
        keys, n_recs = np.unique(per_rec[:, : width + 1], axis=0, return_counts=True)
        lines += [
            f"{unit(k[:width].tolist())} was fetched by {c} consumer recorder(s) of CTA "
            f"{k[width]}, expected {want}"
            for k, c in zip(keys[n_recs != want], n_recs[n_recs != want], strict=True)
        ]
    checkable = grouped is not None or counts is not None
    if checkable and not d.sampled and not _overflowed(d, CONSUMER_ROLES):
        if grouped is not None:  # every group's own m-tiles by every column tile
            per_group, tiles_n = grouped
            want = np.array([(m, n, g) for g, t in enumerate(per_group) for m in range(t)
                             for n in range(tiles_n)], dtype=np.int64).reshape(-1, 3)  # fmt: skip
        else:
            want = np.stack(np.meshgrid(*(np.arange(c) for c in counts), indexing="ij"), -1)
            want = want.reshape(-1, 3)
        seen = {tuple(t[:3]) for t in tile_keys.tolist()}
        missing = [tuple(t) for t in want.tolist() if tuple(t) not in seen]
        if missing:
            lines.append(
                f"{len(missing)} of {len(want)} tiles were run by no CTA: "
                f"{', '.join(map(str, missing[:MAX_LISTED]))}"
                + (" ..." if len(missing) > MAX_LISTED else "")
            )
    return _listed(lines, "tile problems")


def _parts(d: Decoded) -> list[str]:
    """A split recording's tiles, each from the units its consumers fetched (``Decoded.units``):
    every unit of a tile names the same part count, and its parts, in part order, run its
    k-tiles [0, k_tiles) once, one after another; a shared tile's units (more than one part)
    each record a fix-up; and a tile inside the problem runs its epilogue on exactly one of
    its parts (the one that finished it), after every part of it began its fix-up (it cannot
    finish before the others arrived). A sample of the grid, or a consumer overflow, is not
    asked for the parts and epilogues it cannot show."""
    if not d.is_split:
        return []
    units = d.units()
    consumer = np.isin(d.recorders["role"], CONSUMER_ROLES)
    mine = consumer[units["rec"]] if len(units) else np.zeros(0, dtype=bool)
    if not mine.any():
        return []
    complete = not d.sampled and not _overflowed(d, CONSUMER_ROLES)
    k_tiles = int(d.meta.get("k_tiles") or 1)
    lines = []
    lost = np.flatnonzero(mine & (units["k_end"] < 0))
    over = d.recorders["overflow"] > 0
    lines += [
        f"{_who(d, int(units['rec'][i]))}: its fetch of tile {unit_tile(units[i])} part "
        f"{int(units['part'][i])} has no UNIT_RANGE after it"
        for i in lost
        if not over[units["rec"][i]]
    ]
    # one row per distinct unit (a cooperative tile's two recorders name it twice)
    cols = ("tile_m", "tile_n", "tile_l", "part", "k_begin", "k_end", "parts")
    known = mine & (units["k_end"] >= 0)
    distinct = np.unique(np.column_stack([units[c][known] for c in cols]), axis=0)
    tile_ids = _ids(*(distinct[:, j] for j in range(3)))
    for t in range(int(tile_ids.max()) + 1 if len(tile_ids) else 0):
        pieces = distinct[tile_ids == t]
        problem = _pieces_problem(pieces[:, 3:], k_tiles, complete)
        if problem:
            lines.append(f"tile {tuple(pieces[0, :3].tolist())}: {problem}")
    lines += _fixups_and_epilogues(d, units, mine, complete)
    return _listed(lines, "split tile problems")


def _pieces_problem(pieces: np.ndarray, k_tiles: int, complete: bool) -> str | None:
    """What is wrong with one tile's units (rows of part, k_begin, k_end, parts), or None:
    one part count, each part once with one k-range, the parts in part order running
    [0, k_tiles) one after another (``complete`` False: only no overlap, order kept)."""
    parts = sorted(set(pieces[:, 3].tolist()))
    ranges = ", ".join(f"{p} [{b}, {e})" for p, b, e, _ in pieces.tolist())
    said = f"its parts (part [k-tiles)) are {ranges}"
    if len(parts) > 1:
        named = ", ".join(f"part {p} of {n}" for p, _, _, n in pieces.tolist())
        return f"its units name different part counts: {named}"
    if len(set(pieces[:, 0].tolist())) < len(pieces):
        return f"a part was recorded with two k-ranges; {said}"
    pieces = pieces[np.argsort(pieces[:, 0])]
    part, begin, end = pieces[:, 0], pieces[:, 1], pieces[:, 2]
    ordered = (end > begin).all() and (begin[1:] >= end[:-1]).all()
    ordered &= (part >= 0).all() and (part < parts[0]).all() and begin[0] >= 0
    ordered &= end[-1] <= k_tiles
    whole = (
        len(pieces) == parts[0]
        and (part == np.arange(len(part))).all()
        and begin[0] == 0
        and (begin[1:] == end[:-1]).all()
        and end[-1] == k_tiles
    )
    if not ordered or (complete and not whole):
        return f"{said}, not each of its {k_tiles} k-tiles once in {parts[0]} parts in K order"
    return None


def _fixups_and_epilogues(d: Decoded, units, mine, complete: bool) -> list[str]:
    """``_parts``' fix-up and epilogue checks, from the spans and the unit each belongs to."""
    fix, epi = d.unit_spans("fixup"), d.unit_spans("epilogue")
    lines = []
    over = d.recorders["overflow"] > 0
    shared = np.flatnonzero(mine & (units["parts"] > 1))
    fixed = np.zeros(len(units), dtype=bool)
    fixed[fix["unit"]] = True
    lines += [
        f"{_who(d, int(units['rec'][i]))}: tile {unit_tile(units[i])} part "
        f"{int(units['part'][i])} of {int(units['parts'][i])} recorded no fix-up"
        for i in shared
        if not fixed[i] and not over[units["rec"][i]]
    ]
    if d.meta.get("tiles") is None:
        return lines
    # per tile inside the problem (a tile past its edge skips the fix-up: every part of it
    # runs an epilogue that stores nothing)
    tiles = {}
    for i in np.flatnonzero(mine):
        key = unit_tile(units[i])
        if d.inside(key):
            tiles.setdefault(key, []).append(i)
    fix_begin = {}
    for f in fix:
        key = unit_tile(units[f["unit"]])
        fix_begin[key] = max(fix_begin.get(key, -np.inf), f["begin"])
    ran = {}
    for e in epi:
        key = unit_tile(units[e["unit"]])
        if key in tiles:
            ran.setdefault(key, []).append(e)
    for key in tiles:
        runs = ran.get(key, [])
        parts = sorted({int(units["part"][e["unit"]]) for e in runs})
        if len(parts) > 1:
            lines.append(f"tile {key}: its epilogue was run by parts {parts}, not by one")
        elif not parts and complete:
            lines.append(f"tile {key}: no part of it ran its epilogue")
        for e in runs:
            if e["begin"] < fix_begin.get(key, -np.inf) - SKEW_NS:  # (parts on other SMs)
                lines.append(
                    f"{_who(d, int(e['rec']))}: tile {key} part {int(units['part'][e['unit']])} "
                    f"began its epilogue at {_us(e['begin'])}, before the last of its parts "
                    f"began its fix-up ({_us(fix_begin[key])})"
                )
    return lines


def _outside_groups(tiles: np.ndarray, grouped, config: dict) -> tuple[np.ndarray, np.ndarray]:
    """A grouped call's tiles (tile in its group, n, group) past their group's grid (its
    m-tiles and the column tiles, each rounded up to whole clusters: a cluster never
    straddles two groups, and one that overhangs a group's end runs tiles that store nothing),
    and each tile's grid (m-tiles, n-tiles, groups)."""
    per_group, tiles_n = grouped
    cm, cn = config.get("cluster_m", 1), config.get("cluster_n", 1)
    limits = np.array([-(-t // cm) * cm for t in per_group] + [0], dtype=np.int64)
    groups = len(per_group)
    g = tiles[:, 2]
    known = (g >= 0) & (g < groups)
    m_limit = limits[np.where(known, g, groups)]
    n_limit = -(-tiles_n // cn) * cn
    outside = ~known | (tiles[:, 0] < 0) | (tiles[:, 0] >= m_limit) | (tiles[:, 1] < 0)
    outside |= tiles[:, 1] >= n_limit
    grid = np.column_stack([m_limit, np.full_like(m_limit, n_limit), np.full_like(m_limit, groups)])
    return outside, grid


def _full_after_load(d: Decoded) -> list[str]:
    ev = d.events
    role, cta, source = _event_columns(d)
    load = (ev["kind"] == Event.LOAD_ISSUE) & (role == Role.PRODUCER)
    wait = (ev["kind"] == Event.WAIT_FULL_END) & (role == Role.CONSUMER)
    # a wait's k-tile: its own, or its WAIT_FULL_BEGIN's just before it
    k = ev["k_tile"].astype(np.int64)
    k_at = _last_where(ev["rec"], k >= 0)
    k_of = np.where(k_at >= 0, k[np.maximum(k_at, 0)], -1)
    load &= k_of >= 0
    wait &= k_of >= 0
    if not wait.any():
        return []
    load_tiles, wait_tiles = _tile_of(d, source, load), _tile_of(d, source, wait)
    config = d.meta.get("config") or {}
    cm, cn = int(config.get("cluster_m", 1)), int(config.get("cluster_n", 1))
    n_load = int(load.sum())

    def latest(*columns):
        """Per wait, the latest load with the same key (-inf where there is none)."""
        ids = _ids(*(np.concatenate(pair) for pair in columns))
        when = np.full(ids.max() + 1 if len(ids) else 0, -np.inf)
        np.maximum.at(when, ids[:n_load], ev["t"][load])
        return when[ids[n_load:]]

    own = latest(
        (cta[load], cta[wait]),
        *((load_tiles[:, j], wait_tiles[:, j]) for j in range(3)),
        (k_of[load], k_of[wait]),
    )
    bound = own
    if cm * cn > 1:
        bound = np.maximum(
            own,
            latest(
                (load_tiles[:, 0] // cm, wait_tiles[:, 0] // cm),
                (load_tiles[:, 1] // cn, wait_tiles[:, 1] // cn),
                (load_tiles[:, 2], wait_tiles[:, 2]),
                (k_of[load], k_of[wait]),
            ),
        )
    # a CTA whose producer recorded nothing or overflowed cannot show its loads
    has_producer = np.zeros(int(d.recorders["cta"].max()) + 1, dtype=bool)
    complete = (d.recorders["role"] == Role.PRODUCER) & (d.recorders["overflow"] == 0)
    has_producer[d.recorders["cta"][complete]] = True
    judged = has_producer[cta[wait]]
    t = ev["t"][wait]
    idx = np.flatnonzero(wait)
    lines = []
    # (one tick against its own CTA's load; ``SKEW_NS`` against a peer's, stamped on its SM)
    slack = np.where(bound > own, SKEW_NS, TICK_NS)
    for j in np.flatnonzero(judged & ((own == -np.inf) | (t < bound - slack))):
        i = idx[j]
        what = (
            f"{_who(d, int(ev['rec'][i]))}: tile {tuple(wait_tiles[j].tolist())} k-tile {k_of[i]}"
        )
        if own[j] == -np.inf:
            lines.append(f"{what}: waited on full (ended {_us(t[j])}) but its CTA issued no load")
        else:
            whose = "its load was" if bound[j] == own[j] else "the last of its cluster's loads was"
            lines.append(
                f"{what}: the wait on full ended at {_us(t[j])}, before {whose} issued at "
                f"{_us(bound[j])}"
            )
    return _listed(lines, "waits on full before their loads")
