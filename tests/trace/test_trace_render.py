"""``wsgemm.tracing`` and ``python -m wsgemm trace`` on the CPU: decoding a raw trace, the
consistency checks, the Chrome trace, the PNG, the summary and the command line, on synthetic
recordings (tests/trace_fixture.py) and on the real ones in tests/data/trace_*.npz."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from background import fresh_interpreter
from trace_fixture import (
    BASE_NS,
    FIXUP,
    Rec,
    Unit,
    hand_meta,
    hand_run,
    pack,
    pingpong_meta,
    pingpong_run,
    stream_k_meta,
    stream_k_run,
    units_run,
)

from wsgemm import cli
from wsgemm.trace_format import Event, RawTrace, Role, Timer
from wsgemm.tracing import Timeline, check, decode
from wsgemm.tracing import cli as trace_cli
from wsgemm.tracing import summary as summary_module
from wsgemm.tracing.checks import SKEW_NS
from wsgemm.tracing.chrome import INSTANTS
from wsgemm.tracing.decoding import SPAN_NAMES

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = sorted((REPO / "tests" / "data").glob("trace_*.npz"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _events(rec: Rec, kind: Event) -> list[int]:
    """Indices of ``rec``'s events of ``kind``."""
    return [i for i, e in enumerate(rec.events) if e[0] == kind]


def _retime(rec: Rec, i: int, t: int) -> None:
    kind, _, *coords = rec.events[i]
    rec.events[i] = (kind, t, *coords)


# ----------------------------------------------------------------------------- decode


def test_decode_reads_every_recorder_and_event_on_one_clock():
    recs = pingpong_run()
    d = decode(pack(recs))
    # the packed buffer has an extra row that never recorded: it is skipped
    assert len(d.recorders) == len(recs) == 6
    for got, want in zip(d.recorders, recs, strict=True):
        assert (got["smid"], got["cta"], got["role"], got["warp"]) == (
            want.smid, want.cta, int(want.role), want.warp,
        )  # fmt: skip
        assert got["count"] == got["stored"] == len(want.events) and got["overflow"] == 0
    assert len(d.events) == sum(len(r.events) for r in recs)
    # t = 0 is the earliest recorder start (CTA 0 starts at 1000 ns after BASE_NS)
    assert d.origin_ns == BASE_NS + 1000
    first = d.events[d.events["rec"] == 0]
    assert first["t"][0] == 0.0
    want = [e[1] - 1000 for e in recs[0].events]
    np.testing.assert_array_equal(first["t"], want)
    assert list(first["kind"]) == [e[0] for e in recs[0].events]
    # CTA 1 starts 1000 ns later
    assert d.recorders["begin"][3] == 1000.0


def test_clock64_rows_map_to_ns_through_their_anchors():
    recs = pingpong_run()
    plain = decode(pack(recs))
    recs[1].timer = Timer.CLOCK64
    mapped = decode(pack(recs))
    assert mapped.recorders["timer"][1] == Timer.CLOCK64
    np.testing.assert_allclose(mapped.events["t"], plain.events["t"], atol=1.0)


def test_spans_pair_begin_and_end_per_recorder_in_order():
    d = decode(pack(hand_run(), meta=hand_meta()))
    w0 = d.spans[d.spans["rec"] == 1]
    got = [(SPAN_NAMES[s["span"]], s["begin"], s["end"]) for s in w0]
    assert got == [
        ("recorder", 0.0, 1000.0),
        ("wait full", 0.0, 100.0),
        ("epilogue", 600.0, 900.0),
        ("store wait", 700.0, 800.0),
    ]
    wait_full = w0[w0["span"] == SPAN_NAMES.index("wait full")][0]
    assert (wait_full["tile_m"], wait_full["k_tile"], wait_full["stage"]) == (0, 0, 0)
    assert not len(d.unmatched)


def test_an_unmatched_begin_or_end_is_reported_not_raised():
    recs = hand_run()
    w0 = recs[1]
    del w0.events[_events(w0, Event.WAIT_FULL_END)[0]]  # a begin without its end
    del w0.events[_events(w0, Event.STORE_WAIT_BEGIN)[0]]  # an end without its begin
    d = decode(pack(recs, meta=hand_meta()))
    assert sorted(Event(k).name for k in d.unmatched["kind"]) == [
        "STORE_WAIT_END",
        "WAIT_FULL_BEGIN",
    ]
    assert SPAN_NAMES.index("epilogue") in d.spans["span"][d.spans["rec"] == 1]
    problems = check(d)
    assert any("WAIT_FULL_BEGIN at 0.000 us has no WAIT_FULL_END after it" in p for p in problems)
    assert any(
        "STORE_WAIT_END at 0.800 us has no STORE_WAIT_BEGIN before it" in p for p in problems
    )


def test_overflow_is_counted_per_recorder_and_reported():
    recs = pingpong_run()
    d = decode(pack(recs, capacity=30))
    want = [max(0, len(r.events) - 30) for r in recs]
    assert list(d.recorders["overflow"]) == want and list(d.recorders["stored"]) == [
        min(30, len(r.events)) for r in recs
    ]
    assert len(d.events) == sum(min(30, len(r.events)) for r in recs)
    problems = check(d)
    assert problems[0].startswith(f"6 recorder(s) overflowed: {sum(want)} events lost")
    assert "larger capacity" in problems[0]
    # the spans the overflow cut short are not reported on their own
    assert not any("has no" in p for p in problems)
    summary = Timeline(pack(recs, capacity=30)).summary()
    assert summary["overflow"] == {"recorders": 6, "events_lost": sum(want), "capacity": 30}


def test_a_buffer_of_the_wrong_shape_is_a_value_error():
    raw = pack(pingpong_run())
    with pytest.raises(ValueError, match="whole 8-word events"):
        decode(RawTrace(buffer=raw.buffer[:, :-3], meta=raw.meta))
    with pytest.raises(ValueError, match="int32"):
        decode(RawTrace(buffer=raw.buffer.astype(np.int64), meta=raw.meta))


# ----------------------------------------------------------------------------- checks


def test_consistent_recordings_pass_every_check():
    assert check(pack(pingpong_run())) == []
    assert check(pack(hand_run(), meta=hand_meta())) == []
    # a 2x1 cluster whose CTAs issue each k-tile together
    meta = pingpong_meta()
    meta["config"]["cluster_m"] = 2
    assert check(pack(pingpong_run(stagger=0), meta=meta)) == []


def test_a_stage_released_twice_without_a_fill_fails():
    recs = pingpong_run()
    w0 = recs[1]
    i = _events(w0, Event.STAGE_RELEASE)[1]
    w0.events.insert(i + 1, w0.events[i])
    problems = check(pack(recs))
    assert len(problems) == 1
    assert "CTA 0 stage 1: CTA 0 consumer w0 (SM 3) released it twice without a fill" in problems[0]


def test_a_release_before_any_fill_fails():
    recs = pingpong_run()
    w0 = recs[1]
    w0.events.insert(1, (int(Event.STAGE_RELEASE), w0.events[0][1], 0, 0, 0, 0, 3))
    problems = check(pack(recs))
    assert any("stage 3" in p and "before any fill of it" in p for p in problems)


def _stage_problems(recs: list[Rec], **meta) -> list[str]:
    """``check``'s stage problems (lines of the form ``CTA c stage s: ...``)."""
    problems = check(pack(recs, meta=pingpong_meta(**meta) if meta else None))
    return [p for p in problems if " stage " in p.split(":")[0]]


def _shift_from(rec: Rec, i: int, by: int) -> None:
    """Move ``rec``'s events from ``i`` on ``by`` ns later (its times stay in order)."""
    for j in range(i, len(rec.events)):
        _retime(rec, j, rec.events[j][1] + by)


def test_a_release_stamped_after_the_next_fill_of_its_stage_passes():
    """A release's stamp is read after its arrive and can lag it by hundreds of ns (an H100
    stream-K trace: w0's stamp 128 ns after the producer's next fill of the stage, which
    could only follow the arrive). One CTA, one warpgroup, 2 stages: w0's release of k-tile 0
    (stage 0) stamped 500 ns after the producer's fill of k-tile 2 into stage 0 passes; the
    fill is matched to k-tile 2's release by identity, not by the time window."""
    meta = dict(tiles=(1, 1, 1))
    recs = pingpong_run(tiles=(1, 1, 1), ctas=1, stages=2)
    producer, w0 = recs[0], recs[1]
    fill = next(e for e in producer.events if e[0] == Event.LOAD_ISSUE and e[5] == 2)
    first = _events(w0, Event.STAGE_RELEASE)[0]
    assert w0.events[first][5:] == (0, 0) and fill[6] == 0
    _shift_from(w0, first, fill[1] + 500 - w0.events[first][1])
    assert check(pack(recs, meta=pingpong_meta(**meta))) == []


def test_a_missing_fill_fails():
    """One fill dropped (k-tile 1 of CTA 0's third tile, stage 1): its release is reported
    (w0 released stage 1 before, for its first tile), and only it."""
    recs = pingpong_run()
    producer = recs[0]
    loads = _events(producer, Event.LOAD_ISSUE)
    dropped = producer.events.pop(loads[9])
    assert dropped[5:] == (1, 1)
    problems = _stage_problems(recs)
    assert len(problems) == 1, problems
    assert problems[0].startswith("CTA 0 stage 1: CTA 0 consumer w0 (SM 3) released it twice")
    assert f"tile {tuple(dropped[2:5])} k-tile 1: 1 release(s) by it, 0 fill(s)" in problems[0]
    # the first fill of a stage dropped: the release comes before any fill of it
    recs = pingpong_run()
    del recs[0].events[_events(recs[0], Event.LOAD_ISSUE)[2]]
    (problem,) = _stage_problems(recs)
    assert problem.startswith("CTA 0 stage 2: CTA 0 consumer w0 (SM 3) released it at")
    assert problem.endswith("before any fill of it (tile (0, 0, 0) k-tile 2)")


def test_a_fill_stamped_after_the_release_it_serves_fails():
    """CTA 0's last fill (k-tile 3 of its last tile) stamped 1 us after w0 released it: a
    fill cannot follow the release it served. One tick after the release is still one
    instant."""
    recs = pingpong_run()
    producer, w0 = recs[0], recs[1]
    last = _events(producer, Event.LOAD_ISSUE)[-1]
    key = list(producer.events[last][2:])  # (m, n, l, k, stage)
    release = next(e for e in w0.events if e[0] == Event.STAGE_RELEASE and list(e[2:]) == key)
    _retime(producer, last, release[1] + 32)
    _retime(producer, last + 1, release[1] + 2000)  # RECORDER_END
    assert _stage_problems(recs) == []
    _retime(producer, last, release[1] + 1000)
    (problem,) = _stage_problems(recs)
    assert problem == (
        f"CTA 0 stage 3: CTA 0 consumer w0 (SM 3) released tile {tuple(key[:3])} k-tile 3 at "
        f"{(release[1] - 1000) / 1000:.3f} us, before its fill was issued at "
        f"{release[1] / 1000:.3f} us"
    )


def test_a_tile_no_cta_ran_fails():
    recs = pingpong_run()
    w4 = recs[2]  # CTA 0's second warpgroup ran one tile: (0, 1, 0)
    w4.events = [e for e in w4.events if e[0] != Event.TILE_FETCH]
    assert check(pack(recs)) == ["1 of 6 tiles were run by no CTA: (0, 1, 0)"]


def test_a_tile_two_ctas_ran_fails():
    recs = pingpong_run()
    w4 = recs[5]  # CTA 1's second warpgroup: make its tile CTA 0's first
    i = _events(w4, Event.TILE_FETCH)[0]
    w4.events[i] = (int(Event.TILE_FETCH), w4.events[i][1], 0, 0, 0, -1, -1)
    problems = check(pack(recs))
    assert "tile (0, 0, 0) was run by 2 CTAs: [0, 1]" in problems
    assert "1 of 6 tiles were run by no CTA: (1, 1, 0)" in problems


def test_missing_tiles_are_not_required_of_a_sampled_recording():
    recs = pingpong_run()
    recs = recs[:3]  # only CTA 0 recorded
    sampled = pingpong_meta(ctas_launched=2, ctas_traced=1)
    assert check(pack(recs, meta=sampled)) == []
    assert "3 of 6 tiles were run by no CTA" in check(pack(recs))[0]


def split_run(k_tiles=4):
    """``pingpong_run``'s two CTAs on split-K units: 3 tiles (0, n, 0) of two splits each,
    CTA s running split s of each (k-tiles [s * k_tiles, (s + 1) * k_tiles)); each unit's
    fetch carries its first k-tile and split as the kernel writes them, each records its
    fix-up, and split 1 (CTA 1 starts later: it arrives last) runs the epilogue."""
    work = [[Unit((0, n, 0), s, s * k_tiles, (s + 1) * k_tiles, 2) for n in range(3)]
            for s in range(2)]  # fmt: skip
    recs = units_run(work, smids=(3, 7))
    return recs, pingpong_meta(tiles=(1, 3, 1), k_tiles=2 * k_tiles, split=2)


def test_split_k_units_are_checked_as_units():
    recs, meta = split_run()
    assert check(pack(recs, meta=meta)) == []
    # read unsplit, three tiles look run twice
    unsplit = {**meta, "split": 1}
    assert any("was run by 2 CTAs" in p for p in check(pack(recs, meta=unsplit)))
    # a unit nobody fetched
    w = recs[1]  # CTA 0's first warpgroup ran split 0 of tiles (0, 0, 0) and (0, 2, 0)
    w.events = [e for e in w.events if not (e[0] == Event.TILE_FETCH and e[3] == 2)]
    problems = check(pack(recs, meta=meta))
    assert "1 of 6 tiles were run by no CTA: (0, 2, 0)" in problems, problems
    recs2, _ = split_run()
    w = recs2[4]  # CTA 1's first warpgroup ran split 1 of (0, 0, 0) and (0, 2, 0)
    w.events = [e for e in w.events if not (e[0] == Event.TILE_FETCH and e[3] == 2)]
    assert "1 of 6 tiles were run by no CTA: (0, 2, 1)" in check(pack(recs2, meta=meta))


def test_a_split_units_fetch_names_its_split_in_the_chrome_trace(tmp_path):
    recs, meta = split_run()
    t = Timeline(pack(recs, meta=meta))
    text = t.to_chrome(tmp_path / "t.json").read_text()
    assert '"first_k_tile": 4' in text and '"split": 1' in text


def test_a_split_k_tile_runs_its_epilogue_on_one_split():
    recs, meta = split_run()
    tile = (0, 0, 0)
    # CTA 0's first warpgroup (split 0) runs the epilogue too, in its idle slot after its fix-up
    _copy_epilogue(recs, tile, src=recs[4], dst=recs[1])
    problems = check(pack(recs, meta=meta))
    assert f"tile {tile}: its epilogue was run by parts [0, 1], not by one" in problems


# ----------------------------------------------------------------------------- stream-K


def _unit_events(rec: Rec, tile, kinds) -> list[int]:
    """Indices of ``rec``'s events of ``kinds`` while its unit is one of ``tile``'s."""
    out, inside = [], False
    for i, (kind, _, *coords) in enumerate(rec.events):
        if kind == Event.TILE_FETCH:
            inside = tuple(coords[:3]) == tile
        if inside and kind in kinds:
            out.append(i)
    return out


_EPILOGUE = (Event.EPILOGUE_BEGIN, Event.STORE_WAIT_BEGIN, Event.STORE_WAIT_END,
             Event.EPILOGUE_END)  # fmt: skip


def _copy_epilogue(recs, tile, src: Rec, dst: Rec, move: bool = False, at=None) -> None:
    """``src``'s epilogue of ``tile`` also (``move``: only) on ``dst``, right after ``dst``'s
    fix-up of its unit of the tile (in the idle slot the fixture leaves there), or beginning
    ``at`` ns."""
    events = [src.events[i] for i in _unit_events(src, tile, _EPILOGUE)]
    if move:
        src.events = [e for e in src.events if e not in events]
    end = dst.events[_unit_events(dst, tile, (Event.FIXUP_END,))[0]][1]
    shift = (end + 32 if at is None else at) - events[0][1]
    dst.events += [(kind, t + shift, *coords) for kind, t, *coords in events]
    dst.events.sort(key=lambda e: e[1])


def test_a_stream_k_recording_passes_every_check_and_decodes_to_the_kernels_units():
    from wsgemm.kernels.common.scheduler import unit_order

    raw = pack(stream_k_run(), meta=stream_k_meta())
    assert check(raw) == []
    d = decode(raw)
    units = d.units()
    consumers = units[d.recorders["role"][units["rec"]] == Role.CONSUMER]
    got = {(int(u["tile_m"]), int(u["tile_n"]), int(u["tile_l"]), *(int(u[f]) for f in
            ("part", "k_begin", "k_end", "parts"))) for u in consumers}  # fmt: skip
    schedule = unit_order(3, 3, 1, 1, 4, split_k=(8, 1), stream_k=True)
    want = {(*u.coord_mnl, u.split, u.k_begin, u.k_end, u.parts) for cta in schedule for u in cta}
    assert got == want and len(consumers) == len(want) == 12
    # read as unsplit, the shared tiles look run by two CTAs
    problems = check(pack(stream_k_run(), meta={**stream_k_meta(), "stream_k": False}))
    assert any("was run by 2 CTAs" in p for p in problems)


# A stream-K recording (stream_k_run) with one thing wrong, and what the checks say of it.
# Tile (1, 2, 0) is CTA 0's part 0, k-tiles [0, 2) (its first warpgroup, recs[1]; it arrives
# last and finishes the tile), and CTA 1's part 1, [2, 8) (its second warpgroup, recs[5]).
SHARED = (1, 2, 0)


def _retag(recs, i, kind, k=None, stage=None):
    """Set the k-tile or stage of recs[i]'s ``kind`` event of the shared tile's unit."""
    at = _unit_events(recs[i], SHARED, (kind,))[0]
    e = list(recs[i].events[at])
    e[5] = e[5] if k is None else k
    e[6] = e[6] if stage is None else stage
    recs[i].events[at] = tuple(e)


def _drop(recs, i, *kinds):
    drop = set(_unit_events(recs[i], SHARED, kinds))
    recs[i].events = [e for j, e in enumerate(recs[i].events) if j not in drop]


PLANTED = {
    "a part's k-range overlaps the next": (
        lambda r: (_retag(r, 5, Event.TILE_FETCH, k=1), _retag(r, 3, Event.TILE_FETCH, k=1)),
        "tile (1, 2, 0): its parts (part [k-tiles)) are 0 [0, 2), 1 [1, 8), not each of its 8 "
        "k-tiles once in 2 parts in K order",
    ),
    "a part runs no unit": (
        lambda r: _drop(r, 5, Event.TILE_FETCH, Event.UNIT_RANGE),
        "tile (1, 2, 0): its parts (part [k-tiles)) are 0 [0, 2), not each of its 8 k-tiles "
        "once in 2 parts in K order",
    ),
    "the parts are numbered out of K order": (
        lambda r: (
            _retag(r, 1, Event.TILE_FETCH, stage=1),
            _retag(r, 5, Event.TILE_FETCH, stage=0),
        ),
        "tile (1, 2, 0): its parts (part [k-tiles)) are 0 [2, 8), 1 [0, 2), not each of its "
        "8 k-tiles once in 2 parts in K order",
    ),  # fmt: skip
    "its units disagree on the part count": (
        lambda r: _retag(r, 5, Event.UNIT_RANGE, stage=3),
        "tile (1, 2, 0): its units name different part counts: part 0 of 2, part 1 of 3",
    ),
    "a unit's range is not recorded": (
        lambda r: _drop(r, 5, Event.UNIT_RANGE),
        "CTA 1 consumer w4 (SM 5): its fetch of tile (1, 2, 0) part 1 has no UNIT_RANGE after it",
    ),
    "a part of a shared tile records no fix-up": (
        lambda r: _drop(r, 5, Event.FIXUP_BEGIN, Event.FIXUP_END),
        "CTA 1 consumer w4 (SM 5): tile (1, 2, 0) part 1 of 2 recorded no fix-up",
    ),
    "two parts run the epilogue": (
        lambda r: _copy_epilogue(r, SHARED, src=r[1], dst=r[5]),
        "tile (1, 2, 0): its epilogue was run by parts [0, 1], not by one",
    ),
    "a part finishes before the last part arrived": (
        lambda r: _copy_epilogue(r, SHARED, src=r[1], dst=r[5], move=True),
        "CTA 1 consumer w4 (SM 5): tile (1, 2, 0) part 1 began its epilogue at 7.568 us, before "
        "the last of its parts began its fix-up (7.704 us)",
    ),
    "no part runs the epilogue": (
        lambda r: _drop(r, 1, *_EPILOGUE),
        "tile (1, 2, 0): no part of it ran its epilogue",
    ),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_stream_k_bug_is_rejected(bug):
    plant, problem = PLANTED[bug]
    recs = stream_k_run()
    assert (recs[1].cta, recs[1].warp, recs[5].cta, recs[5].warp) == (0, 0, 1, 4)
    plant(recs)
    problems = check(pack(recs, meta=stream_k_meta()))
    assert problem in problems, problems


@pytest.mark.parametrize("early_ns, reported", [(64, False), (SKEW_NS + 32, True)])
def test_an_epilogue_stamped_within_the_skew_before_another_part_s_fix_up_passes(
    early_ns, reported
):
    """Two SMs read ``%globaltimer`` a few ticks apart (64 ns seen on an H100): a finisher's
    epilogue stamped 64 ns before another part's fix-up (on another SM) passes, one stamped
    more than ``SKEW_NS`` before it is reported."""
    recs = stream_k_run()
    fix_begin = recs[1].events[_unit_events(recs[1], SHARED, (Event.FIXUP_BEGIN,))[0]][1]
    _copy_epilogue(recs, SHARED, src=recs[1], dst=recs[5], move=True, at=fix_begin - early_ns)
    problems = check(pack(recs, meta=stream_k_meta()))
    assert any("before the last of its parts began its fix-up" in p for p in problems) is reported
    assert reported or problems == []


def test_a_sampled_stream_k_recording_is_not_asked_for_the_parts_it_cannot_show():
    recs = stream_k_run()[:6]  # CTAs 0 and 1 of 4
    meta = stream_k_meta(ctas_launched=4, ctas_traced=2)
    assert check(pack(recs, meta=meta)) == []
    # read as the whole grid, tile (2, 0, 0) lacks its part 1 (CTA 2's)
    problems = check(pack(recs, meta=stream_k_meta()))
    assert (
        "tile (2, 0, 0): its parts (part [k-tiles)) are 0 [0, 4), not each of its 8 k-tiles "
        "once in 2 parts in K order" in problems
    ), problems


def test_the_summary_states_the_fix_up_time_per_shared_tile():
    s = Timeline(pack(stream_k_run(), meta=stream_k_meta())).summary()
    # three shared tiles of two parts, each part's fix-up FIXUP ns; the finisher's one of them
    tile, part = 2 * FIXUP / 1000, FIXUP / 1000
    assert s["fixup"] == {
        "shared_tiles": 3,
        "parts": 6,
        "time_us": 3 * 2 * FIXUP / 1000,
        "per_tile_us": {"mean": tile, "median": tile, "max": tile},
        "finisher_us": {"mean": part, "median": part, "max": part},
    }
    line = dict(summary_module._facts(s))["fix-up"]
    assert line.startswith("0.80 us a shared tile (median 0.80, max 0.80) over 3 tiles of 6 "
                           "parts, 2.40 us in all; the finishing part's share 0.40 us")  # fmt: skip
    # split-K: every tile is shared; unsplit: no fix-up
    recs, meta = split_run()
    assert Timeline(pack(recs, meta=meta)).summary()["fixup"]["shared_tiles"] == 3
    assert Timeline(pack(pingpong_run())).summary()["fixup"] is None


def test_a_stream_k_units_fetch_and_range_are_named_in_the_chrome_trace(tmp_path):
    t = Timeline(pack(stream_k_run(), meta=stream_k_meta()))
    doc = json.loads(t.to_chrome(tmp_path / "t.json").read_text())
    ranges = [e for e in doc["traceEvents"] if e["name"] == "unit range"]
    assert {"tile": [1, 2, 0], "end_k_tile": 8, "parts": 2} in [e["args"] for e in ranges]
    fetches = [e["args"] for e in doc["traceEvents"] if e["name"] == "tile fetch"]
    assert {"tile": [1, 2, 0], "first_k_tile": 2, "part": 1} in fetches


def test_tiles_past_the_problem_edge_are_allowed_within_the_cluster_grid():
    # 2 x 3 tiles of which the problem covers 1 x 3: a 2x1 cluster overhangs the ragged edge
    meta = pingpong_meta(tiles=(1, 3, 1))
    meta["config"]["cluster_m"] = 2
    assert check(pack(pingpong_run(stagger=0), meta=meta)) == []
    meta["config"]["cluster_m"] = 1
    problems = check(pack(pingpong_run(stagger=0), meta=meta))
    assert any("past the grid of (1, 3, 1) tiles" in p for p in problems)


def test_a_wait_on_full_ending_before_its_load_fails():
    recs = pingpong_run()
    producer, w0 = recs[0], recs[1]
    load = next(e for e in producer.events if e[0] == Event.LOAD_ISSUE and e[5] == 1)
    begin, end = (_events(w0, k)[1] for k in (Event.WAIT_FULL_BEGIN, Event.WAIT_FULL_END))
    _retime(w0, begin, load[1] - 200)
    _retime(w0, end, load[1] - 100)
    problems = check(pack(recs))
    assert any(
        "CTA 0 consumer w0 (SM 3): tile (0, 0, 0) k-tile 1: the wait on full ended at" in p
        and "before its load was issued" in p
        for p in problems
    )


def test_one_tick_of_clock_slack_is_allowed():
    recs = pingpong_run()
    producer, w0 = recs[0], recs[1]
    load = next(e for e in producer.events if e[0] == Event.LOAD_ISSUE and e[5] == 0)
    _retime(w0, _events(w0, Event.WAIT_FULL_END)[0], load[1] - 32)
    assert check(pack(recs)) == []


def test_in_a_cluster_the_wait_on_full_waits_for_the_peers_loads():
    meta = pingpong_meta()
    meta["config"]["cluster_m"] = 2
    # CTA 1 (the peer holding the same cluster tile) issues every k-tile 1 us after CTA 0
    problems = check(pack(pingpong_run(stagger=1000), meta=meta))
    assert any("before the last of its cluster's loads was issued" in p for p in problems)


@pytest.mark.parametrize("early_ns, reported", [(64, False), (SKEW_NS + 64, True)])
def test_a_wait_is_allowed_the_skew_against_a_peer_s_load(early_ns, reported):
    """A peer CTA's load is stamped on another SM: a wait on full that ended 64 ns before it
    passes, one that ended more than ``SKEW_NS`` before it is reported. (In the fixture CTA
    0's first wait ends 600 ns after CTA 0 starts, so a peer started 600 + x ns later issues
    its k-tile 0 x ns after that wait ended.)"""
    meta = pingpong_meta()
    meta["config"]["cluster_m"] = 2
    problems = check(pack(pingpong_run(stagger=600 + early_ns), meta=meta))
    said = [p for p in problems if "before the last of its cluster's loads was issued" in p]
    assert bool(said) is reported, problems
    assert reported or problems == []


# ----------------------------------------------------------------------------- outputs


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    recs = pingpong_run()
    timeline = Timeline(pack(recs))
    doc = json.loads(timeline.to_chrome(tmp_path / "trace.json").read_text())
    events = doc["traceEvents"]
    assert doc["otherData"]["meta"]["backend"] == "sm90-pingpong"
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {3: "SM 3", 7: "SM 7"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads[(3, 0)] == "producer w8 (CTA 0)" and threads[(7, 5)] == "consumer w4 (CTA 1)"
    spans = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(spans) == len(timeline.spans)
    assert len(instants) == int(np.isin(timeline.events["kind"], list(INSTANTS)).sum())
    for e in spans + instants:
        assert {"name", "ph", "pid", "tid", "ts", "cat"} <= set(e)
        assert (e["pid"], e["tid"]) in threads
        assert isinstance(e["ts"], float) and e["ts"] >= 0
    assert all(e["dur"] >= 0 for e in spans)
    load = next(e for e in instants if e["name"] == "load issue")
    assert load["s"] == "t" and set(load["args"]) == {"tile", "k_tile", "stage"}
    # microseconds: the first wait on empty of CTA 0 spans 64..96 ns
    first_wait = next(e for e in spans if e["name"] == "wait empty" and e["tid"] == 0)
    assert (first_wait["ts"], first_wait["dur"]) == (0.064, 0.032)


def test_png_timeline_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    timeline = Timeline(pack(pingpong_run()))
    path = timeline.plot(tmp_path / "timeline.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    one = timeline.plot(tmp_path / "one.png", sms=[7, 99])
    assert one.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="none of SMs 50-51 recorded; the trace has SMs 3, 7"):
        timeline.plot(tmp_path / "none.png", sms=[50, 51])


def test_summary_numbers_on_a_hand_computed_recording():
    s = Timeline(pack(hand_run(), meta=hand_meta())).summary()
    assert s["roles"]["producer"] == {
        "recorders": 1,
        "time_us": 1.0,
        "fractions": {"loading": 0.07, "wait empty": 0.2, "other": 0.73},
    }
    # two consumers, 2000 ns: MMA 450 + 400, wait full 100 + 50, order wait 400, epilogue 200
    # (its store wait 100 apart), other 150 + 150
    assert s["roles"]["consumer"]["fractions"] == {
        "MMA": 0.425,
        "wait full": 0.075,
        "order wait": 0.2,
        "epilogue": 0.1,
        "store wait": 0.05,
        "other": 0.15,
    }
    assert s["epilogue"] == {
        "time_us": 0.3,
        "exposed_us": 0.05,
        "exposed_fraction": 0.1667,
        "sms": 1,
    }
    assert s["tiles_per_sm"] == {"min": 2, "median": 2.0, "max": 2}
    assert s["finish"] == {"first_us": 1.0, "last_us": 1.0, "tail_us": 0.0, "tail_fraction": 0.0}
    assert s["overhead"] == {"traced_us": 1.05, "untraced_us": 1.0, "overhead_fraction": 0.05}
    assert s["problems"] == [] and s["duration_us"] == 1.0 and s["sms"] == 1


def test_summary_tail_and_tiles_across_sms():
    s = Timeline(pack(pingpong_run(stagger=1000))).summary()
    # both CTAs run the same schedule, the second 1 us later
    assert s["finish"]["tail_us"] == 1.0
    assert s["finish"]["tail_fraction"] == round(1.0 / s["duration_us"], 4)
    assert s["tiles_per_sm"] == {"min": 3, "median": 3.0, "max": 3}
    assert s["overhead"]["overhead_fraction"] == 0.04
    assert sum(s["roles"]["consumer"]["fractions"].values()) == pytest.approx(1.0, abs=1e-3)
    epi = s["epilogue"]
    assert epi["sms"] == 2
    line = dict(summary_module._facts(s))["exposed epilogue"]
    mean = f"({epi['exposed_us'] / 2:.2f} of {epi['time_us'] / 2:.2f} us per SM)"
    assert line.endswith(f", summed over 2 SMs {mean}"), line


def test_summary_tables_render():
    from rich.console import Console

    from wsgemm.tracing.summary import tables

    console = Console(record=True, width=200)
    for table in tables(Timeline(pack(hand_run(), meta=hand_meta())).summary()):
        console.print(table)
    text = console.export_text()
    assert "sm90-pingpong 256x128x64 float16 TN tile 128x128x64" in text
    assert "0.05 of 0.30 us (17%), summed over 1 SM (0.05 of 0.30 us per SM)" in text
    assert "+5.0%" in text


def test_a_saved_recording_reads_back_the_same(tmp_path):
    timeline = Timeline(pack(pingpong_run()))
    again = Timeline.from_raw(timeline.save(tmp_path / "raw.npz"))
    np.testing.assert_array_equal(again.events, timeline.events)
    assert again.summary() == timeline.summary()


# ----------------------------------------------------------------------------- command line


@pytest.fixture
def recording(tmp_path) -> Path:
    return pack(pingpong_run()).save(tmp_path / "recorded.npz")


def test_from_raw_writes_the_four_files_and_prints_the_summary(recording, tmp_path, capsys):
    out = tmp_path / "out" / "deeper"
    assert cli.main(["trace", "--from-raw", str(recording), "--out", str(out), "--sms", "7"]) == 0
    captured = capsys.readouterr()
    assert "wsgemm trace: sm90-pingpong 256x384x256" in captured.out
    assert "exposed epilogue" in captured.out
    for name in trace_cli.FILES.values():
        assert (out / name).stat().st_size > 0
        assert str(out / name) in captured.err
    assert (out / "timeline.png").read_bytes().startswith(PNG_MAGIC)
    json.loads((out / "trace.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary == Timeline.from_raw(recording).summary()
    assert Timeline.from_raw(out / "raw.npz").summary() == summary


def test_from_raw_warns_about_an_inconsistent_recording(tmp_path, capsys):
    recs = pingpong_run()
    recs[2].events = [e for e in recs[2].events if e[0] != Event.TILE_FETCH]
    path = pack(recs).save(tmp_path / "bad.npz")
    assert cli.main(["trace", "--from-raw", str(path), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning: the recording is not consistent (1 problem(s)" in err
    assert "1 of 6 tiles were run by no CTA: (0, 1, 0)" in err


def test_without_a_gpu_recording_says_so_and_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["trace", "--shape", "256,256,256", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == trace_cli.EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible: recording a trace needs a CUDA GPU" in err
    assert "--from-raw FILE re-renders a recording" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "1,2"], "expected three positive integers"),
        (["--shape", "0,8,8"], "expected three positive integers"),
        (["--shape", "8,8,8;8,8,8"], "expected one shape"),
        (["--shape", "8,8,8", "--backend", "sm100"], "invalid choice: 'sm100'"),
        (["--shape", "8,8,8", "--dtype", "float32"], "float16 (fp16, half), bfloat16 (bf16)"),
        (["--shape", "8,8,8", "--layout", "TX"], "expected one of TN, NN, NT, TT"),
        (["--shape", "8,8,8", "--batch", "0"], "expected an integer >= 1"),
        (["--shape", "8,8,8", "--capacity", "-5"], "expected an integer >= 1"),
        (["--shape", "8,8,8", "--sms", "0-x"], "expected SM ids such as 0-7"),
        (["--shape", "8,8,8", "--sms", "7-3"], "the range 7-3 runs backwards"),
        (["--from-raw", "missing.npz"], "no such file: missing.npz"),
        (["--from-raw", "NOT_RAW"], "is not a wsgemm raw trace"),
        (["--from-raw", "RAW", "--shape", "8,8,8"], "not allowed with argument"),
        ([], "one of the arguments --shape --from-raw is required"),
        (["--shape", "8,8,8", "--out", "FILE/sub"], "is not a directory"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(argv, message, recording, tmp_path, capsys):
    not_raw = tmp_path / "not_raw.npz"
    not_raw.write_bytes(b"PK\x03\x04 not a zip")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    swap = {"NOT_RAW": str(not_raw), "RAW": str(recording), "FILE/sub": str(a_file / "sub")}
    argv = [swap.get(a, a) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        cli.main(["trace", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--from-raw", "RAW", "--backend", "sm90", "--dtype", "bf16"],
         "--backend, --dtype: only for a new recording (--shape)"),
        (["--from-raw", "RAW", "--sms", "40-47"], "none of SMs 40-47 recorded"),
        (["--shape", "8,8,8", "--dtype", "bf16", "--accumulate", "fp16"], "fp16 inputs"),
        (["--shape", "512,256,128", "--groups", "400,200"],
         "the groups hold 600 rows, more than M=512"),
        (["--shape", "512,256,128", "--groups", "400", "--batch", "2", "--layout", "NN"],
         "--groups records the 2D x 3D grouped form: no --batch, --layout"),
        (["--from-raw", "RAW", "--groups", "1"], "--groups: only for a new recording"),
        (["--from-raw", "RAW", "--stream-k"], "--stream-k: only for a new recording"),
        (["--shape", "8,8,8", "--stream-k", "--split-k"],
         "--stream-k and --split-k trace two different splits: give one"),
        (["--shape", "8,8,8", "--stream-k", "--backend", "sm80"],
         "--stream-k runs the stream-K schedule of sm90 or sm90-pingpong's tile, not --backend "
         "sm80"),
        (["--shape", "8,8,8", "--stream-k", "--accumulate", "fp16"],
         "--stream-k adds each tile's partial sums in fp32: --accumulate float32"),
        (["--shape", "512,256,128", "--groups", "400", "--stream-k"],
         "--groups records the 2D x 3D grouped form: no --stream-k"),
    ],
)  # fmt: skip
def test_inconsistent_options_exit_2_before_any_gpu_work(argv, message, recording, tmp_path,
                                                         capsys):  # fmt: skip
    argv = [str(recording) if a == "RAW" else a for a in argv]
    assert cli.main(["trace", *argv, "--out", str(tmp_path / "out")]) == trace_cli.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend, tile", [(None, (128, 256)), ("sm90-pingpong", (128, 128))])
def test_stream_k_records_the_backends_tile_on_its_stream_k_schedule(backend, tile, monkeypatch,
                                                                     tmp_path, capsys):  # fmt: skip
    """``--stream-k`` (the recording itself needs a GPU: here a synthetic one stands in): the
    call goes to ``trace`` on the backend's shipped tile with ``stream_k`` set and its split
    traced, and the printed summary states the fix-up time per shared tile."""
    pytest.importorskip("matplotlib")
    from wsgemm.tracing import timeline as timeline_module

    asked = {}

    def fake_trace(a, b, **options):
        asked.update(options)
        return Timeline(pack(stream_k_run(), meta=stream_k_meta()))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(trace_cli, "make_operands", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(timeline_module, "trace", fake_trace)
    argv = ["trace", "--shape", "384,384,512", "--stream-k", "--out", str(tmp_path / "out")]
    argv += ["--backend", backend] if backend else []
    assert cli.main(argv) == 0
    config = asked["config"]
    assert asked["backend"] == (backend or "sm90") and asked["split_k"] is True
    assert config.stream_k and (config.tile_m, config.tile_n) == tile
    out = capsys.readouterr()
    assert f"recording {backend or 'sm90'} stream-K 384x384x512" in out.err
    assert "0.80 us a shared tile" in out.out and "warning" not in out.err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["fixup"]["shared_tiles"] == 3


@pytest.fixture(scope="module", autouse=True)
def re_render(tmp_path_factory):
    """The fresh interpreter of the test below (a second or two: it imports wsgemm and
    re-renders a recording), started with this module's first test so that it runs beside the
    in-process ones (on the other core) rather than after them."""
    folder = tmp_path_factory.mktemp("re_render")
    recording = pack(pingpong_run()).save(folder / "recorded.npz")
    code = (
        "import sys, wsgemm\n"
        "assert wsgemm.trace is wsgemm.tracing.trace\n"
        "from wsgemm import cli\n"
        f"code = cli.main(['trace', '--from-raw', {str(recording)!r}, '--out', "
        f"{str(folder / 'out')!r}])\n"
        "print(code, sorted(m for m in ('torch', 'cutlass') if m in sys.modules))\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    with fresh_interpreter(code, env) as child:
        yield child


def test_import_wsgemm_and_a_re_render_load_neither_torch_nor_the_dsl(re_render):
    out, err = re_render.communicate(timeout=120)
    assert re_render.returncode == 0, err
    assert out.strip().splitlines()[-1] == "0 []"


# ----------------------------------------------------------------------------- real recordings


@pytest.fixture(params=RECORDINGS or [None], ids=lambda p: p.name if p else "none")
def real(request) -> Timeline:
    """A recording made on a GPU (tests/data/trace_*.npz); skipped while there is none."""
    if request.param is None:
        pytest.skip("no real recording in tests/data/trace_*.npz")
    return Timeline.from_raw(request.param)


def test_a_decode_recording_says_what_it_left_idle():
    """The H200 decode recording (swap-AB 64x16, 16x4096x4096, traced unsplit): 64 CTAs of one
    tile each on 132 SMs, so 68 SMs idle and each CTA's second ping-pong warpgroup too."""
    t = Timeline.from_raw(REPO / "tests" / "data" / "trace_sm90-swap_16x4096x4096.npz")
    s = t.summary()
    assert s["sms"] == 64 and s["call"]["num_sms"] == 132
    assert s["idle"] == {"sms": 68, "consumers": 64, "consumer_recorders": 128}
    facts = dict(summary_module._facts(s))
    assert "64 of 132 SMs (68 idle)" in facts["call"]
    assert facts["idle consumers"] == "64 of 128 consumer recorders ran no tile"
    assert s["epilogue"]["sms"] == 64 and "summed over 64 SMs" in facts["exposed epilogue"]


def test_a_sampled_recording_claims_no_idle_sms():
    recs = pingpong_run()[:3]  # only CTA 0 recorded
    meta = pingpong_meta(ctas_launched=2, ctas_traced=1, num_sms=132)
    s = Timeline(pack(recs, meta=meta)).summary()
    assert s["idle"]["sms"] is None


def test_a_real_recording_renders(real, tmp_path):
    pytest.importorskip("matplotlib")
    doc = json.loads(real.to_chrome(tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])
    assert real.plot(tmp_path / "timeline.png").read_bytes().startswith(PNG_MAGIC)
    summary = real.summary()
    json.dumps(summary)
    assert summary["recorders"] == len(real.recorders) > 0
    for role in summary["roles"].values():
        assert sum(role["fractions"].values()) == pytest.approx(1.0, abs=1e-3)


def test_a_real_recording_is_consistent(real):
    assert real.check() == []


# ----------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend, shape",
    [("sm80-multistage", "1024,1024,1024"), ("sm80", "1000,520,264"), ("auto", "16,4096,4096")],
)
def test_trace_command_records_a_consistent_call(backend, shape, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["trace", "--shape", shape, "--backend", backend, "--out", str(out)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning" not in err, err
    for name in trace_cli.FILES.values():
        assert (out / name).stat().st_size > 0
    timeline = Timeline.from_raw(out / "raw.npz")
    assert timeline.check() == []
    summary = timeline.summary()
    assert summary["overhead"]["traced_us"] is not None
    assert summary["recorders"] > 0 and summary["overflow"]["recorders"] == 0
