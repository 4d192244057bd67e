"""scripts/bench_fixup.py's problems, on the CPU (the timing needs an sm_90 GPU)."""

from script_modules import load

bench_fixup = load("bench_fixup")


def test_every_fixup_problem_is_one_wave_of_shared_tiles_beside_its_unsplit_part():
    problems = bench_fixup._problems(132)
    fixups = [(c, calls) for kind, c, calls in problems if kind == "fixup"]
    assert {c.entry for c, _ in fixups} == {"cooperative-128x128-c1x2", "pingpong-64x128-c2x1"}
    for c, calls in fixups:
        e = bench_fixup.tune_menu.entry(c.entry)
        assert e.splits and c.parts in (2, 4)
        assert c.tiles * c.parts <= 132  # every unit on its own SM
        assert c.k % (c.parts * e.tile_k) == 0 and c.k // c.parts >= 8 * e.tile_k
        (split, m, n, k, sc), (part, pm, pn, pk, pc) = calls
        assert (split, part) == ("split", "part")
        assert (m, n, k, sc.split) == (c.m, c.n, c.k, c.parts)
        assert (pm, pn, pk, pc.split) == (c.m, c.n, c.k // c.parts, 1)
        assert sc.entry == pc.entry == e


def test_the_stream_k_rows_are_entry_28s_against_the_same_tile_unsplit():
    rows = [(key, calls) for kind, key, calls in bench_fixup._problems(132) if kind == "streamk"]
    assert [key for key, _ in rows] == list(bench_fixup.ENTRY_28)
    for _, ((_, *_, sk), (_, *_, un)) in rows:
        assert sk.entry.config["stream_k"] and not un.entry.config.get("stream_k")
        assert (sk.entry.tile_m, sk.entry.tile_n) == (un.entry.tile_m, un.entry.tile_n)
    variants = bench_fixup._variants(bench_fixup._problems(132))
    assert len(variants) == 6  # two split, two unsplit, stream-K and sm90
