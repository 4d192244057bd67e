"""What the SASS of a compiled variant must show (shared by the compile tests)."""

import re

from wsgemm import inspection as insp
from wsgemm import sass


def assert_clean(r: insp.Report, serialized: bool = False):
    """No spills, a sane register count, and a WGMMA kernel's HGMMAs pipelined
    (``assert_wgmma_pipelined``); ``serialized``: a kernel known to be serialized (C7520),
    asserted to still be, so that the day it is not its exemption goes."""
    assert r.spill_bytes == 0, f"{r.kernel} {r.arch}: {r.spill_bytes} bytes of local memory"
    assert r.sass["LDL"] == 0 and r.sass["STL"] == 0, f"{r.kernel} {r.arch}: spills in SASS"
    assert 0 < r.registers <= 255
    if serialized:
        waited, total = sass.waited_wgmmas(r.sass_text)
        assert 2 * waited >= total, f"{r.kernel}: pipelined now ({waited} of {total} wait)"
    else:
        assert_wgmma_pipelined(r)


def assert_wgmma_pipelined(r: insp.Report):
    """A WGMMA kernel's HGMMAs issue back to back within a k-tile: fewer than half of them
    wait for their own completion (``sass.waited_wgmmas``; a serialized kernel waits on every
    one: ptxas's C7520)."""
    waited, total = sass.waited_wgmmas(r.sass_text)
    assert 2 * waited < max(total, 1), (
        f"{r.kernel} {r.arch}: {waited} of {total} HGMMAs wait for their own completion "
        "(ptxas serialized the WGMMAs: C7520)"
    )


def assert_sm80_path(r: insp.Report, acc: str, mma_threads: int, specialized: bool):
    """The sm80 hardware path, from the full opcodes: mma.sync of the accumulator dtype,
    16-byte cp.async and stores, ldmatrix.x4; the epilogue's named barrier counts the MMA
    threads only; the specialized kernel meets on mbarriers (one block-wide barrier, at the
    start) and has both loading loops, the baseline waits on cp.async groups."""
    ops = set(sass.opcodes(r.sass_text))
    hmma = "HMMA.16816.F32" if acc == "float32" else "HMMA.16816.F16"
    for op in (hmma, "LDGSTS.E.BYPASS.LTC128B.128", "LDSM.16.M88.4", "STG.E.128"):
        assert any(o.startswith(op) for o in ops), f"no {op}"
    assert f"BAR.SYNC.DEFER_BLOCKING 0x1, {mma_threads:#x}" in r.sass_text
    if specialized:
        assert r.sass["ARRIVES"] + r.sass["SYNCS"] > 0, "the ring lives on mbarriers"
        assert r.sass_text.count("BAR.SYNC.DEFER_BLOCKING 0x0 ") == 1
        # Row-predicated copies (a trailing "P<n>" zero-fill operand) for edge tiles,
        # unpredicated ones for interior tiles (fast_interior).
        copies = [i for i in sass.instructions(r.sass_text) if "LDGSTS" in i]
        predicated = [c for c in copies if re.search(r",\s*!?P\d\s*;", c)]
        assert predicated and len(predicated) < len(copies)
    else:
        assert r.sass["ARRIVES"] == 0 and r.sass["SYNCS"] == 0
        assert r.sass["DEPBAR"] > 0, "the baseline waits on cp.async groups"
