"""The measured table: what each menu candidate ran at on measured problems of one GPU, and the
lookup that lets a measured problem correct the cost model on that very problem.

A table (``data/sm90_*.json``, one per measured GPU, written by ``scripts/tune_menu.py``;
``WSGEMM_POLICY_TABLE=path`` replaces them, and a table with no points turns the correction off)
holds points: a problem and, for each candidate (entry, split), cuBLAS's time over its own. A
problem's features are ``(log2 ceil(M / M_QUANTUM), log2(N x L x table SMs / this GPU's SMs),
log2 K)``. M counts blocks of ``M_QUANTUM`` rows because that, not M itself, sets the work: 1 and
8 tokens run the same tiles. A point speaks only for its own cell (distance at most
``MAX_TABLE_DISTANCE``: the same M block, N and K on a GPU with the table's SM count): the best
candidate measured there that the rules allow here. Elsewhere the cost model chooses
(``cost``): the table used to let its nearest point within 1.5 log2 units decide, which on real
layers of other models picked kernels at half the speed of the best (docs/perf.md entry 33).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .menu import M_QUANTUM, MENU, SPLITS, MenuEntry, entry

__all__ = ["TABLE_SCHEMA", "Table", "TablePoint", "load_table", "nearest", "table_for", "tables"]

TABLE_SCHEMA = 1
# Feature weights (M blocks, N x L per SM, K) and the largest distance (log2 units) at which a
# measured problem still speaks for this one: its own cell only.
FEATURE_WEIGHTS = (1.0, 1.0, 0.5)
MAX_TABLE_DISTANCE = 0.0


@dataclass(frozen=True)
class TablePoint:
    """One measured problem and what each candidate ran at: (entry, split, cuBLAS time / its
    time), menu entries only."""

    label: str
    m: int
    n: int
    k: int
    batch: int
    ratios: tuple[tuple[str, int, float], ...]


@dataclass(frozen=True)
class Table:
    name: str
    device: str
    sm_count: int
    cc: tuple[int, int]
    source: str
    points: tuple[TablePoint, ...]
    # the points by cell (their features), for the exact-cell lookup: built once, here
    cells: dict = field(init=False, compare=False, hash=False, repr=False)
    # the cells' M blocks by their (N x L, K) features (a cell's M feature is log2 of its
    # blocks of M_QUANTUM rows): ``measured_blocks``
    cell_blocks: dict = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        cells: dict[tuple[float, ...], list[TablePoint]] = {}
        for p in self.points:
            cells.setdefault(_key(features(p.m, p.n, p.k, p.batch, 1.0)), []).append(p)
        blocks: dict[tuple[float, ...], set[int]] = {}
        for m, *where in cells:
            blocks.setdefault(tuple(where), set()).add(round(2**m) * M_QUANTUM)
        object.__setattr__(self, "cells", cells)
        object.__setattr__(self, "cell_blocks", {w: frozenset(b) for w, b in blocks.items()})

    def measured_blocks(self, n: int, k: int, batch: int, sm_count: int) -> frozenset[int]:
        """The M blocks (``m_block``'s) whose cell at this N, K and batch on a GPU of
        ``sm_count`` SMs the table measured: where ``nearest`` finds a cell (its reach being
        the cell itself, ``MAX_TABLE_DISTANCE`` 0)."""
        where = _key(features(1, n, k, batch, self.sm_count / sm_count))[1:]
        return self.cell_blocks.get(where, frozenset())


def _key(features: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(round(v, 9) for v in features)


def load_table(path: str | Path) -> Table:
    """Read and check a table written by ``scripts/tune_menu.py``. Candidates naming an entry
    not on the menu (a table older than the menu) are left out."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"policy table {path}: cannot read it as JSON ({exc})") from None
    try:
        if raw["schema"] != TABLE_SCHEMA:
            raise ValueError(f"schema {raw['schema']!r}, this wsgemm reads {TABLE_SCHEMA}")
        on_menu = {e.name for e in MENU}
        points = tuple(
            TablePoint(
                label=str(p["label"]),
                m=int(p["m"]),
                n=int(p["n"]),
                k=int(p["k"]),
                batch=int(p.get("batch", 1)),
                ratios=tuple(
                    (str(r["entry"]), int(r["split"]), float(r["ratio"]))
                    for r in p["ratios"]
                    if r["entry"] in on_menu and int(r["split"]) in SPLITS
                ),
            )
            for p in raw["points"]
        )
        cc = tuple(int(v) for v in raw["cc"])
        return Table(path.name, str(raw["device"]), int(raw["sm_count"]), cc, raw["source"], points)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"policy table {path}: malformed ({exc!r})") from None


@functools.cache
def tables(override: str | None) -> tuple[Table, ...]:
    """The shipped tables, or only the one at ``override`` (``WSGEMM_POLICY_TABLE``)."""
    if override:
        return (load_table(override),)
    folder = resources.files(__package__) / "data"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    return tuple(load_table(Path(str(folder / name))) for name in names)


def table_for(tables: tuple[Table, ...], sm_count: int, cc: tuple[int, int]) -> Table | None:
    """The table measured on this compute capability with the nearest SM count."""
    same = [t for t in tables if t.cc == cc]
    if not same:
        return None
    return min(same, key=lambda t: abs(math.log2(t.sm_count / sm_count)))


def features(m: int, n: int, k: int, batch: int, sm_scale: float) -> tuple[float, float, float]:
    """Where a problem lies for the lookup (the module docstring); ``sm_scale``: the table's
    SMs over this GPU's."""
    blocks = -(-max(m, 1) // M_QUANTUM)
    return math.log2(blocks), math.log2(max(n, 1) * max(batch, 1) * sm_scale), math.log2(max(k, 1))


def distance(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    return math.sqrt(sum((w * (a - b)) ** 2 for w, a, b in zip(FEATURE_WEIGHTS, x, y, strict=True)))


def nearest(
    table: Table, m, n, k, batch, sm_count, allowed: dict[str, tuple[int, ...]]
) -> tuple[MenuEntry, int, str, frozenset[tuple[str, int]]] | None:
    """(entry, split, why, the candidates measured there) of the best allowed candidate of the
    measured cell within reach, or None. ``allowed``: entry name -> the splits the rules allow.

    A cell: the measured problems at one distance (1 and 8 tokens of one layer are both one
    ``M_QUANTUM`` block, so they are one cell); a candidate scores its mean ratio over the cell's
    problems that measured it.
    """
    here = features(m, n, k, batch, table.sm_count / sm_count)
    if MAX_TABLE_DISTANCE == 0.0:  # one cell at most: a dict lookup, not a scan
        cell = table.cells.get(_key(here), [])
        return _best_of(table, cell, 0.0, allowed) if cell else None
    dist = sorted(
        (distance(here, features(p.m, p.n, p.k, p.batch, 1.0)), i)
        for i, p in enumerate(table.points)
    )
    for d, group in itertools.groupby(dist, key=lambda x: round(x[0], 9)):
        if d > MAX_TABLE_DISTANCE:
            return None
        found = _best_of(table, [table.points[i] for _, i in group], d, allowed)
        if found is not None:
            return found
    return None


def _best_of(table: Table, cell: list[TablePoint], d: float, allowed):
    scores: dict[tuple[str, int], list[float]] = {}
    for p in cell:
        for name, s, r in p.ratios:
            if s in allowed.get(name, ()):
                scores.setdefault((name, s), []).append(r)
    if not scores:
        return None
    (name, split), ratios = max(scores.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]))
    mean = sum(ratios) / len(ratios)
    labels = ", ".join(p.label for p in cell)
    why = (
        f"{table.name} ({table.device}, {table.sm_count} SMs): measured problems of this cell: "
        f"{labels} (distance {d:.2f}); there {name} with split {split} ran at {mean:.2f}x "
        f"cuBLAS, the best of {len(scores)} allowed candidates"
    )
    return entry(name), split, why, frozenset(scores)
