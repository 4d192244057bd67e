"""Every kernel ``auto`` can pick compiles without a GPU to the instructions recorded for it.

Each check below runs on one variant (fp16 in and out, fp32 accumulate, K-major A and B) of a
menu entry or of its split-K variant, through the session's ``compiled`` fixture: the WGMMAs its
warpgroups issue, TMA loads and stores, mbarriers, no spills, and its instruction digest
(``sass.instruction_digest``) against ``tests/data/menu_sass_digests.json``
(``scripts/sass_digests.py`` records it). A refactor that moves kernel code must leave every
digest alone; a deliberate kernel change records the file again.

The default run checks one representative of each kind of menu kernel (``REPRESENTATIVES``:
the cooperative and ping-pong schedules, each unsplit and split, and the swap-AB tiles), all
of them variants other tests compile anyway, so this file adds no compile to the default run.
``-m sweep`` checks every other entry and split variant the same way (one compile each), the
``inspect --menu`` rows of the whole menu, and every menu variant (all dtypes and majors) in
worker processes.
"""

import concurrent.futures
import json
import multiprocessing
import os
from pathlib import Path

import pytest
from sass_checks import assert_clean

from wsgemm import inspection as insp
from wsgemm import sass
from wsgemm.host import choosing

DIGESTS = json.loads((Path(__file__).parents[1] / "data" / "menu_sass_digests.json").read_text())
MENU = insp.menu_variants()
# WGMMA's depth for 16-bit inputs: the k-steps of a k-tile are tile_k // WGMMA_K
WGMMA_K = 16


def _label(m: insp.MenuVariant) -> str:
    return f"{m.entry}-split" if m.split else m.entry


#: The default run's menu variants, one of each kind, each also compiled by another test (the
#: ``compiled`` fixture compiles it once): the shipped cooperative and ping-pong kernels
#: (test_compile_sass.py's representatives), the decode entries' split variants (its
#: ``SPLIT``) and the two swap-AB tiles (test_swap_ab.py).
REPRESENTATIVES = {
    "sm90",
    "sm90-pingpong",
    "pingpong-64x128-c1x2-split",
    "cooperative-128x128-c1x2-split",
    "swap-pingpong-64x16x128-c1x1",
    "swap-pingpong-64x8x128-c1x1",
}
MENU_DEFAULT = [m for m in MENU if _label(m) in REPRESENTATIVES]


def test_the_menu_variants_are_one_per_entry_and_split_variant():
    """As ``scripts/sass_digests.py --one-per-entry`` takes them: the first of each (backend,
    config) in ``choosing.menu_variants()``, which is the fp16, K-major one."""
    first: dict = {}
    for v in choosing.menu_variants():
        first.setdefault((v.backend, v.config), v)
    assert sorted(m.variant.key() for m in MENU) == sorted(v.key() for v in first.values())
    assert len(MENU) == len(choosing.MENU) + sum(e.splits for e in choosing.MENU)
    for m in MENU:
        v = m.variant
        assert (v.ab_dtype, v.c_dtype, v.acc_dtype) == ("float16", "float16", "float32")
        assert (v.a_major, v.b_major) == ("k", "k")
        assert (getattr(v.config, "split_k", 1) == 0) == m.split


def hgmma_count(config) -> int:
    """The WGMMA instructions in a kernel's SASS: each warpgroup issues one per 64-row band of
    its rows and k-step, for the first k-tile and once more in the loop over the others
    (``Sm90Gemm.mma``). A ping-pong warpgroup owns the whole tile, a cooperative one half."""
    rows = config.tile_m if config.pingpong else config.tile_m // 2
    return 2 * (rows // 64) * (config.tile_k // WGMMA_K)


def check_variant(r: insp.Report, config, name: str, acc_dtype: str = "float32") -> None:
    assert r.sass["HGMMA"] == hgmma_count(config), f"{name}: {r.sass['HGMMA']} HGMMA"
    assert f"HGMMA.64x{config.tile_n}x16" in r.sass_text, f"{name}: no 64x{config.tile_n} WGMMA"
    for op, why in (
        ("UTMALDG", "the producer loads tiles with TMA"),
        ("UTMASTG", "the epilogue stores with TMA"),
        ("SYNCS", "roles meet on mbarriers"),
    ):
        assert r.sass[op] > 0, f"{name}: no {op} in SASS ({why})"
    assert_clean(r, serialized=known_serialized(config, acc_dtype))


def known_serialized(config, acc_dtype: str) -> bool:
    """The menu variants whose WGMMAs ptxas serializes (C7520, ``sass.waited_wgmmas``): fp16
    accumulators (``accumulate=torch.float16``) on four of the 160- to 224-wide tiles
    (docs/perf.md entry 100). Every fp32-accumulator variant, which is what ``auto`` runs
    unless asked otherwise, is pipelined."""
    tile = (config.schedule, config.tile_m, config.tile_n)
    return acc_dtype == "float16" and tile in SERIALIZED_WITH_FP16_ACC


SERIALIZED_WITH_FP16_ACC = {
    ("cooperative", 128, 160),
    ("cooperative", 128, 192),
    ("cooperative", 128, 224),
    ("pingpong", 64, 160),
}


def test_the_representatives_are_menu_variants_of_every_kind():
    assert {_label(m) for m in MENU_DEFAULT} == REPRESENTATIVES
    kinds = {(m.variant.backend, m.split, m.entry.startswith("swap")) for m in MENU_DEFAULT}
    assert kinds >= {("sm90", False, False), ("sm90", True, False),
                     ("sm90-pingpong", False, False), ("sm90-pingpong", True, False),
                     ("sm90-pingpong", False, True)}  # fmt: skip


@pytest.mark.parametrize(
    "m",
    [m if m in MENU_DEFAULT else pytest.param(m, marks=pytest.mark.sweep) for m in MENU],
    ids=_label,
)
def test_every_menu_kernel_compiles_to_its_recorded_instructions(compiled, m):
    r = compiled(m.variant).report
    check_variant(r, m.variant.kernel_config(), _label(m))
    key = m.variant.key()
    assert key in DIGESTS, f"{key}: no digest recorded (scripts/sass_digests.py --write)"
    assert sass.instruction_digest(r.sass_text) == DIGESTS[key], (
        f"{_label(m)} issues other instructions than recorded: a refactor changed its code "
        "(or a deliberate change needs scripts/sass_digests.py --write)"
    )


@pytest.mark.parametrize(
    "menu",
    [
        pytest.param(MENU_DEFAULT, id="representatives"),
        pytest.param(MENU, id="every-entry", marks=pytest.mark.sweep),
    ],
)
def test_inspect_menu_json_reports_each_entry(compiled, monkeypatch, capsys, menu):
    """``python -m wsgemm inspect --menu --json`` (in process, reading the session's
    compiles): one row per entry and split variant, named, with its resources. The default
    run gives the command the representatives as its menu (no compile of its own), the sweep
    the whole menu."""
    from wsgemm import cli

    monkeypatch.setattr(insp, "inspect_variant", lambda v, compiled_fn=None: compiled(v).report)
    if menu is not MENU:
        real = insp.menu_variants
        assert real("sm_90a", False) == MENU
        monkeypatch.setattr(insp, "menu_variants", lambda arch, everything=False: menu)
    assert cli.main(["inspect", "--menu", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["entry"], r["split"]) for r in rows] == [(m.entry, m.split) for m in menu]
    for r, m in zip(rows, menu, strict=True):
        assert set(r) == {"entry", "split", "kernel", "arch", "config", "variant", "registers",
                          "smem_bytes", "spill_bytes", "sass"}  # fmt: skip
        assert r["kernel"] == m.variant.backend and r["arch"] == "sm_90a"
        assert r["config"]["split_k"] == (0 if m.split else 1)
        assert r["spill_bytes"] == 0 and 0 < r["registers"] <= 255 and r["smem_bytes"] > 0
        assert r["sass"]["HGMMA"] == hgmma_count(m.variant.kernel_config())


def test_inspect_menu_refuses_what_has_no_menu(capsys):
    from wsgemm import cli

    assert cli.main(["inspect", "--menu", "--arch", "sm_80"]) == cli.EXIT_USAGE
    assert "--menu" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: --menu and --backend exclude each other
        cli.main(["inspect", "--menu", "--backend", "sm90"])


# ---------------------------------------------------------------------------------------------
# The sweep: every menu variant (python -m pytest -m sweep)


def _digest(m: insp.MenuVariant) -> tuple[str, str, str | None]:
    """(label, key, what is wrong or None) of one variant (runs in a worker process)."""
    label = f"{_label(m)} {m.variant.key()}"
    r = insp.inspect_variant(m.variant)
    try:
        check_variant(r, m.variant.kernel_config(), label, m.variant.acc_dtype)
    except AssertionError as exc:
        return label, m.variant.key(), str(exc)
    return label, m.variant.key(), sass.instruction_digest(r.sass_text)


@pytest.mark.sweep
def test_every_menu_variant_compiles_to_its_recorded_instructions():
    variants = insp.menu_variants(everything=True)
    assert len(variants) == len(choosing.menu_variants())
    workers = max(1, min(8, os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        rows = list(pool.map(_digest, variants))
    wrong = [f"{label}: {got}" for label, key, got in rows if got != DIGESTS.get(key)]
    assert not wrong, "\n".join(wrong)
