"""Which menu entry and which split-K count run a problem (``choose``), and every pair that may
(``candidates``, what the tuners time).

``choose`` decides in this order:

1. Rules no measurement overturns (``fits``, ``split_candidates``, ``_allowed``): a cluster of
   two CTAs along M (N) needs at least two m-tiles (n-tiles), or one of them computes nothing;
   split-K only on entries with a split variant, with an fp32 accumulator, outside
   batch-invariant mode, with a k-tile per split and at most two waves of split units. And
   decode is swap-AB's: up to ``SWAP_ONLY_TOKENS`` (16) tokens only swap-AB entries are
   candidates (they were the fastest at every 1- and 16-token ``llm`` shape but one whose best
   differs from one process to the next: docs/policy.md); from 17 tokens the 32-wide swap-AB
   tile competes with the rest.
2. The measured table (``table``), as a correction only: where this very problem (the same
   ``M_QUANTUM`` block of M, N and K) was measured, the best candidate measured there that rule
   1 allows here.
3. Otherwise the cost model (``cost``): every allowed candidate's predicted time, and the
   fastest wins (ties: menu order, then the smaller split). The model reasons from the grid
   (waves, k-tiles per unit) and the bytes (DRAM, L2) with a few constants per entry fitted
   from measurements; it, not the table, is what chooses on a problem nobody measured.

Step 3 does not price every candidate for every new M: from a layer shape's second new M on,
``_Plan`` prices only those that could win, with the same arithmetic, so it picks the same
(``_choose``; ``with_epilogue`` likewise, ``_epilogue_quick``; docs/perf.md entries 116, 118).

Split-K runs inside the kernel (``Sm90Config.split_k``; docs/architecture.md): no extra
kernels, a fixed cost per unit of one partial tile stored and, on the unit that finishes a
tile, the partials read back, rows inside C only. Only the entries marked ``splits`` (the
decode and 128-token ones) have a split variant, so ``warm`` compiles a bounded set: their
fp32-accumulator variants once more.

Batch invariance (``batch_invariant=True``, ``wsgemm.config.batch_invariant(True)`` or
``WSGEMM_BATCH_INVARIANT=1``): the summation order of every output element must not depend on
M. Split-K changes it (partial sums over K ranges, then their sum), so this mode never splits.
Every entry accumulates in one order: the consumer walks k-tiles in ascending order and each
k-tile's 16-deep WGMMA k-steps in ascending order, from zeroed accumulators, so every entry
issues the same sequence of k16 steps whatever its tile_k (a ragged tail only adds zero-filled
steps); the entries differ in which CTA computes an element, never in the order of its sum.
``tests/host/test_policy.py::test_gpu_every_menu_entry_gives_the_same_bits`` checks it on the GPU.

Pure Python, as the rest of the room: no torch, no DSL.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
from collections.abc import Callable

from ...support import ELEMENT_BYTES, dtype_error
from .. import registry
from ..settings import current
from . import cost
from . import table as table_module
from .menu import MENU, SPLITS, SWAP_DECODE_MAX_N, MenuEntry, entry, m_block
from .table import nearest, table_for, tables

__all__ = [
    "ENV_BATCH_INVARIANT",
    "ENV_TABLE",
    "Choice",
    "batch_invariant_requested",
    "candidates",
    "choose",
    "dgated_entry",
    "ranked_candidates",
    "fits",
    "split_candidates",
    "split_in_cluster",
]

# Splits are candidates (tuned, and chosen from the table) while tiles x split units fit in
# this many waves: a problem with more tiles than that already fills the machine.
SPLIT_MAX_WAVES = 2
# A split must be predicted this much faster than it is to be taken: the model prices the
# split's fix-up within its error (docs/policy.md), so an unsplit candidate wins a near tie.
SPLIT_MARGIN = 0.06
# The same for a cluster split: no workspace chain to misprice, only the receive wait, fitted
# on its own (cost.CostModel.per_cluster_split).
CLUSTER_SPLIT_MARGIN = 0.02
# Rule 1: up to this many tokens (M, in whole M_QUANTUM blocks) only swap-AB entries run.
SWAP_ONLY_TOKENS = 16
# How many of the fastest predicted candidates a choice keeps, for ``explain``.
SHOWN_PREDICTIONS = 4
#: A fused activation moves a choice to another candidate only where the cost model predicts
#: that one this much faster, its activation priced in (``with_epilogue``).
EPILOGUE_MARGIN = 0.02
#: What joins a choice's reason and the move ``with_epilogue`` made of it (``explain`` reads it).
EPILOGUE_MOVE = "; with the fused activation ("
ENV_BATCH_INVARIANT = "WSGEMM_BATCH_INVARIANT"
ENV_TABLE = "WSGEMM_POLICY_TABLE"


class Choice:
    """What runs a problem: a menu entry, a split-K count (1: none) and why.

    ``source``: "model", "table", "tuned" (WSGEMM_AUTOTUNE, choosing.autotune), "empty", or
    "default" (a GPU the cost model was never fitted for: the menu's first allowed entry).
    ``predictions``: the fastest few candidates as the cost model predicts them (entry name,
    split, prediction). A choice made on ``choose``'s quick path (``_Plan``) words its
    ``reason`` and ``predictions`` only when they are read (``explained``: the full pricing,
    which picks the same): ``matmul`` reads neither, ``explain`` and the debug log both.
    Not to be changed once made (it is memoized); equal when entry, split, source, reason and
    predictions are.
    """

    __slots__ = ("menu_entry", "split", "source", "_reason", "_predictions", "_explained",
                 "__weakref__")  # fmt: skip

    def __init__(
        self,
        menu_entry: MenuEntry,
        split: int,
        reason: str = "",
        source: str = "",
        predictions: tuple[tuple[str, int, cost.Prediction], ...] = (),
        *,
        explained: Callable[[], Choice] | None = None,
    ) -> None:
        # (plain stores: a Choice is made for every new call signature; not changed after)
        self.menu_entry = menu_entry
        self.split = split
        self.source = source
        self._reason = reason
        self._predictions = predictions
        self._explained = explained

    def _words(self) -> None:
        """Word a quick-path choice: the full pricing's reason and predictions."""
        explained = self._explained
        if explained is not None:
            full = explained()
            self._reason, self._predictions, self._explained = full.reason, full.predictions, None

    @property
    def reason(self) -> str:
        self._words()
        return self._reason

    @property
    def predictions(self) -> tuple[tuple[str, int, cost.Prediction], ...]:
        self._words()
        return self._predictions

    def _fields(self) -> tuple:
        return self.menu_entry, self.split, self.reason, self.source, self.predictions

    def __eq__(self, other) -> bool:
        if type(other) is not Choice:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.menu_entry, self.split, self.source))

    def __repr__(self) -> str:
        return (f"Choice(menu_entry={self.menu_entry.name!r}, split={self.split}, "
                f"source={self.source!r}, reason={self.reason!r})")  # fmt: skip

    def __reduce__(self):
        return Choice, self._fields()


# ----------------------------------------------------------------------------- rules


#: The tokens a wide swap-AB tile (tile_n above ``SWAP_DECODE_MAX_N``) runs: more than
#: ``SWAP_WIDE_MIN_M``, at most ``SWAP_WIDE_MAX_M``. They were measured, and their cost
#: constants fitted, at 129-1024 tokens only (docs/perf.md entry 51), unbatched, with fp32
#: accumulators and the inputs' dtype out (``_measured``): elsewhere the model would speak past
#: its data (below, the 64-row tiles and the 32-wide swap tile serve; above, 128-row tiles fill).
SWAP_WIDE_MIN_M = 128
SWAP_WIDE_MAX_M = 1024


def fits(e: MenuEntry, m: int, n: int) -> bool:
    """A cluster of two CTAs along M (N) needs two m-tiles (n-tiles): with one, the second CTA
    of every cluster computes a tile wholly outside the problem (the shipped 2x1 cluster at
    decode). A decode swap-AB tile (``SWAP_DECODE_MAX_N``) fits only all the tokens at once,
    a wide one ``SWAP_WIDE_MIN_M`` < M <= ``SWAP_WIDE_MAX_M`` tokens."""
    cm, cn = e.cluster
    km, kn = e.kernel_mn(m, n)
    if e.swap_ab and e.tile_n <= SWAP_DECODE_MAX_N and m > e.tile_n:
        return False  # the decode swap-AB tiles are for a few tokens: all of them in one tile
    if e.swap_ab and e.tile_n > SWAP_DECODE_MAX_N and not SWAP_WIDE_MIN_M < m <= SWAP_WIDE_MAX_M:
        return False
    return -(-km // e.tile_m) >= cm and -(-kn // e.tile_n) >= cn


def split_candidates(
    e: MenuEntry,
    m: int,
    n: int,
    k: int,
    batch: int,
    sm_count: int,
    acc_dtype: str = "float32",
    batch_invariant: bool = False,
) -> tuple[int, ...]:
    """The split-K counts the tuner times and the policy may choose for entry ``e``.

    Only entries with a split variant (``splits``). Never with an fp16 accumulator:
    ``accumulate=torch.float16`` means one fp16 running sum per element over all of K; split
    partials would each round in fp16 and then add in fp32, a result that changes with the split
    (so with M) and matches neither promise. Never in batch-invariant mode (the split changes the
    summation order). Otherwise s in 2, 4, 8 while every split keeps a k-tile (no empty units)
    and the split units fit ``SPLIT_MAX_WAVES`` waves.
    """
    if not e.splits or acc_dtype != "float32" or batch_invariant:
        return (1,)
    tiles = e.tiles(m, n, batch)
    k_tiles = -(-k // e.tile_k)
    return (1,) + tuple(
        s for s in SPLITS[1:] if s <= k_tiles and tiles * s <= SPLIT_MAX_WAVES * sm_count
    )


def batch_invariant_requested(flag: bool | None = None) -> bool:
    """``flag`` when given, else ``wsgemm.config``'s setting in this thread or task
    (``settings.current``), else ``WSGEMM_BATCH_INVARIANT=1`` in the environment (read once, at
    the first call: set it before the process multiplies)."""
    if flag is None:
        flag = current().batch_invariant
        return _invariant_by_default() if flag is None else flag
    if not isinstance(flag, bool):
        raise TypeError(f"batch_invariant must be a bool or None, got {type(flag).__name__}")
    return flag


@functools.cache
def _environment() -> tuple[str, str | None]:
    """(``WSGEMM_BATCH_INVARIANT``'s word, table path override), read once per process:
    ``choose`` runs for every new call signature, and reading the environment costs a
    microsecond a variable. The word is checked only where it decides
    (``_invariant_by_default``): a setting made in Python needs no environment."""
    return os.environ.get(ENV_BATCH_INVARIANT, "0"), os.environ.get(ENV_TABLE) or None


def _invariant_by_default() -> bool:
    """``WSGEMM_BATCH_INVARIANT``: "1" on, "0" (or unset, or empty) off; another word a
    ValueError."""
    value = _environment()[0]
    if value not in ("0", "1", ""):
        raise ValueError(f"{ENV_BATCH_INVARIANT}={value!r}; allowed: 0 or 1")
    return value == "1"


def _measured(e: MenuEntry, batch: int, dtypes: tuple[str, str, str]) -> bool:
    """A wide swap-AB tile only where it was measured (``SWAP_WIDE_MIN_M``): unbatched, fp32
    accumulators, the inputs' dtype out. Every other entry: anywhere."""
    return e.runs_dtypes(*dtypes) and (not e.wide_swap or batch <= 1)


def _allowed(m, n, k, batch, dtypes, sm_count, invariant) -> dict[str, tuple[int, ...]]:
    """Menu entry name -> the splits rule 1 allows, the entries in menu order; ``dtypes`` is
    (A/B, C, accumulator)."""
    acc_dtype = dtypes[2]
    # Batch invariance needs no filter here: every entry sums in one order (the module's
    # docstring; the GPU test of the bits), so only the split is ruled out (split_candidates).
    entries = [e for e in MENU if fits(e, m, n) and _measured(e, batch, dtypes)]
    if m <= SWAP_ONLY_TOKENS and any(e.swap_ab for e in entries):
        entries = [e for e in entries if e.swap_ab]  # decode is swap-AB's (rule 1)
    return {
        e.name: split_candidates(e, m, n, k, batch, sm_count, acc_dtype, invariant) for e in entries
    }


def _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc) -> None:
    for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch), ("sm_count", sm_count)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < (1 if name == "sm_count" else 0):
            raise ValueError(f"{name}={value}; it must be >= {1 if name == 'sm_count' else 0}")
    dtypes = (ab_dtype, c_dtype, acc_dtype)
    error = dtype_error(*dtypes)
    if error is None and not set(dtypes) <= ELEMENT_BYTES.keys():
        # the split rule compares acc_dtype with "float32": no aliases ("fp32", torch.float32)
        error = f"dtypes by the host's names only: {', '.join(ELEMENT_BYTES)}"
    if error:
        raise ValueError(f"(ab_dtype, c_dtype, acc_dtype)={dtypes}: {error}")
    if cc != (9, 0):
        raise ValueError(
            f"the sm90 menu runs on sm_90 (Hopper) only, got compute capability {cc}; "
            "other GPUs take an sm80 backend"
        )


# ----------------------------------------------------------------------------- choosing


def _asks_of_a_problem(answer: Callable) -> Callable:
    """The signature ``choose`` and ``candidates`` share, written once: the returned function
    takes ``(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, *, batch_invariant)``,
    checks M and the mode, and hands ``answer`` M in whole ``M_QUANTUM`` blocks (all of M that
    any rule sees), ``cc`` as a tuple and the mode resolved; ``answer`` checks the rest
    (``_check_args``, inside ``choose``'s memo)."""

    def asked(
        m: int,
        n: int,
        k: int,
        batch: int,
        ab_dtype: str,
        c_dtype: str,
        acc_dtype: str,
        sm_count: int,
        cc: tuple[int, int],
        *,
        batch_invariant: bool | None = None,
    ):
        if not isinstance(m, int) or isinstance(m, bool):
            raise TypeError(f"m must be an int, got {type(m).__name__}")
        if m < 0:
            raise ValueError(f"m={m}; it must be >= 0")
        invariant = batch_invariant_requested(batch_invariant)
        return answer(
            m_block(m), n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, tuple(cc), invariant
        )

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(asked, name, getattr(answer, name))
    return asked


@_asks_of_a_problem
def choose(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant) -> Choice:
    """The menu entry and split for ``C (M, N, L) = A (M, K, L) B (K, N, L)`` on an sm_90 GPU
    with ``sm_count`` SMs: ``choose(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
    *, batch_invariant=None)``. Dtypes are the host's names ("float16", ...).
    ``batch_invariant`` None reads ``wsgemm.config``'s setting, else ``WSGEMM_BATCH_INVARIANT``
    (``batch_invariant_requested``). Memoized: a repeated problem (M
    counted in blocks of ``M_QUANTUM`` rows) costs a dict lookup; a new one a table search."""
    table = _environment()[1]
    # (the cluster split's switch keys the memo: a split is priced in the form it runs)
    clusters = registry.CLUSTER_SPLIT_FAMILIES
    return _choose(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table,
                   clusters)  # fmt: skip


def dgated_entry(
    rows: int, half: int, k: int, ab_dtype: str, sm_count: int, cc: tuple[int, int]
) -> str:
    """The menu entry whose tile the dgated GEMM (``api.gated.gated_grad``: ``dh`` (rows,
    half) = dy (rows, k) @ W_down (k, half)) runs: ``cost.dgated_kernel_entry``'s row tile,
    unless ``choose``'s unsplit cooperative row tile for the plain product fills its waves more
    than ``cost.DGATED_PLAIN_TILE_MARGIN`` times as well (docs/perf.md entry 110: the
    dgated epilogue costs about the same share on every cooperative tile, so where the plain
    product's tile makes whole waves and the two fixed tiles leave a partial one, the dgated
    GEMM follows it). Cached per (rows, ...): a call of ``gated_grad`` asks once."""
    # (what it reads keys the cache too: a test or a fit that sets a constant or a switch is
    # answered anew, as ``choose``'s memo keys the table and the cluster split's switch)
    constants = (cost.DGATED_PINGPONG_WAVE_MARGIN, cost.DGATED_PLAIN_TILE_MARGIN,
                 cost.GATED_PINGPONG_MAX_ROWS, registry.CLUSTER_SPLIT_FAMILIES,
                 _environment()[1])  # fmt: skip
    return _dgated_entry(rows, half, k, ab_dtype, sm_count, tuple(cc), constants)


@functools.lru_cache(maxsize=256)
def _dgated_entry(rows, half, k, ab_dtype, sm_count, cc, constants) -> str:
    tile = cost.dgated_kernel_entry(rows, half, sm_count)
    if (rows <= cost.GATED_PINGPONG_MAX_ROWS or not half or not k
            or cost.cost_model_for(sm_count, cc) is None):  # fmt: skip
        # (the gated kernel's tile; an empty product; a GPU the cost model does not describe)
        return tile
    plain = choose(rows, half, k, 1, ab_dtype, ab_dtype, "float32", sm_count, cc,
                   batch_invariant=False)  # fmt: skip
    e = plain.menu_entry
    if plain.split != 1 or e.swap_ab or e.config["schedule"] != "cooperative":
        return tile
    fill = cost.wave_fill(e, rows, half, sm_count)
    if fill > cost.DGATED_PLAIN_TILE_MARGIN * cost.wave_fill(entry(tile), rows, half, sm_count):
        return e.name
    return tile


@_asks_of_a_problem
def candidates(
    m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant
) -> tuple[tuple[MenuEntry, int], ...]:
    """Every (menu entry, split) ``choose`` may pick for this problem, in menu order: what the
    tuners time (``scripts/tune_menu.py``, ``WSGEMM_AUTOTUNE``), with ``choose``'s arguments.
    Empty for an empty problem."""
    return _flat(_allowed_of(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
                             invariant))  # fmt: skip


@_asks_of_a_problem
def ranked_candidates(
    m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant
) -> tuple[tuple[MenuEntry, int], ...]:
    """``candidates``, the cost model's fastest first (as ``choose`` ranks them); in menu order
    where no cost model describes the GPU. ``wsgemm.tune`` times the first few."""
    allowed = _allowed_of(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant)
    if not allowed:
        return ()
    ranked = [(e, s) for _, _, e, s in _ranked(m, n, k, batch, ab_dtype, c_dtype, sm_count, cc,
                                                 allowed)]  # fmt: skip
    return tuple(ranked) + tuple(c for c in _flat(allowed) if c not in ranked)


def _allowed_of(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant) -> dict:
    """``_allowed`` of a checked problem; empty for an empty one."""
    _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc)
    if m == 0 or n == 0 or k == 0 or batch == 0:
        return {}
    return _allowed(m, n, k, batch, (ab_dtype, c_dtype, acc_dtype), sm_count, invariant)


def _flat(allowed: dict) -> tuple[tuple[MenuEntry, int], ...]:
    return tuple((entry(name), s) for name, splits in allowed.items() for s in splits)


@functools.lru_cache(maxsize=4096)
def _choose(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table_path,
            clusters=None):  # fmt: skip
    args = (m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table_path,
            clusters)  # fmt: skip
    # (the plans know the table's cells only while a cell answers for its own M block alone)
    quick = SWAP_ONLY_TOKENS < m <= QUICK_MAX_M and table_module.MAX_TABLE_DISTANCE == 0.0
    if quick and n and k and batch:
        plan = _plan_asked(args[1:])
        picked = None if plan is None else plan.pick(m)
        if picked is not None:
            e, split = picked
            return Choice(e, split, source="model", explained=functools.partial(_full, *args))
    return _full(*args)


def _full(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table_path,
          clusters=None) -> Choice:  # fmt: skip
    """``choose`` by the full pricing: every allowed candidate priced, the table consulted, the
    choice worded."""
    _check_args(m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc)
    if m == 0 or n == 0 or k == 0 or batch == 0:
        return Choice(MENU[0], 1, "empty problem: no kernel runs", "empty")
    allowed = _allowed(m, n, k, batch, (ab_dtype, c_dtype, acc_dtype), sm_count, invariant)
    notes = _notes(acc_dtype, invariant)
    if allowed and all(entry(name).swap_ab for name in allowed):  # rule 1
        notes = f"; up to {SWAP_ONLY_TOKENS} tokens only the swap-AB entries are candidates{notes}"
    ranked = _ranked(m, n, k, batch, ab_dtype, c_dtype, sm_count, cc, allowed, 0, clusters)
    shown = tuple((e.name, s, p) for p, _, e, s in ranked[:SHOWN_PREDICTIONS])
    table = table_for(tables(table_path), sm_count, cc)
    found = None if table is None else nearest(table, m, n, k, batch, sm_count, allowed)
    # The table corrects the model where it measured the model's pick against the others;
    # a cell measured before the model's pick joined the menu cannot overrule it, nor can one
    # measured before a split ran over a cluster (its cells timed the workspace form alone).
    if found is not None and (not ranked or _table_timed(ranked[0], found)):
        e, split, why, _ = found
        if ranked and (e, split) != (ranked[0][2], ranked[0][3]):
            p = ranked[0][0]
            why += f" (the cost model's pick, {ranked[0][2].name} split {ranked[0][3]} at "
            why += f"{p.us:.1f} us predicted, measured slower there)"
        return Choice(e, split, why + notes, "table", shown)
    if not ranked:
        e = entry(next(iter(allowed)))
        why = f"no cost model for sm_{cc[0]}{cc[1]} with {sm_count} SMs: the menu's first fit"
        return Choice(e, 1, why + notes, "default")
    best, _, e, split = ranked[0]
    why = _why(best, ranked[1:], e, split, len(ranked))
    return Choice(e, split, why + notes, "model", shown)


def forget() -> None:
    """Drop ``choose``'s memo and plans (and the answers built on them): a test or a fit that
    changes what the policy reads without it being in their keys (a constant, the cost
    models, the menu) calls this before asking again."""
    for cached in (_choose, _plan, _with_epilogue, _dgated_entry):
        cached.cache_clear()
    _ASKED.clear()


#: The layer shapes ``choose`` was asked about (``_plan``'s arguments) -> whether their plan
#: is built: a plan is built at a shape's second new M, so a shape asked at one M only (a
#: fixed batch) costs what the full pricing costs, not a plan's ~0.2 ms more. Emptied past
#: ``_ASKED_MAX`` shapes (a plan still in ``_plan``'s cache is then found again).
_ASKED: dict[tuple, bool] = {}
_ASKED_MAX = 4096


def _plan_asked(key: tuple) -> _Plan | None:
    """``_plan(*key)`` from the second time a new M of this shape is asked on; None the first
    time (the full pricing answers it)."""
    if key in _ASKED:
        _ASKED[key] = True
        return _plan(*key)  # (checks the arguments, once per plan)
    if len(_ASKED) >= _ASKED_MAX:
        _ASKED.clear()
    _ASKED[key] = False
    return None


# ----------------------------------------------------------------------------- the quick path

#: A candidate's lower bound (``_Plan``) times this stays below its price through rounding.
_BOUND_SLACK = 1 - 1e-9
#: The largest M the quick path answers (the table's cells tell M blocks apart to 2 ** 30
#: blocks and more; the full pricing answers beyond).
QUICK_MAX_M = 1 << 30
#: ``_Plan``'s windows of M: the top this many bits of M name its window (2 ** (bits - 1)
#: windows an octave of M).
WINDOW_BITS = 4


class _Plan:
    """``choose``'s quick path for one (N, K, batch, dtypes, GPU, mode, table, switch): what of
    each candidate's price does not depend on M, worked out once, so that a new M prices only
    the candidates that could win (docs/perf.md entry 116).

    A candidate's price only grows with M (its waves, DRAM and L2 bytes do). So its price at
    the start of M's window (``_window``: the top ``WINDOW_BITS`` bits of M) bounds it over
    the window, and ``pick`` walks the window's candidates in the order of those prices,
    stopping where one passes the best price found. Before pricing a candidate it also skips
    it where ``launch_us + gamma x M`` (its compute and L2 terms with waves and tiles
    unrounded, ``_row``) or its exact compute term already passes the best. What it prices it
    prices with ``_ranked``'s arithmetic in the same order (the same floats), and it ranks as
    ``_ranked`` does (the split margins, then menu order and split), so it picks what the full
    pricing picks (``tests/host/test_policy.py`` checks it on random problems). It answers
    None, and the full pricing decides, where the table measured the problem's cell; M up to
    ``SWAP_ONLY_TOKENS`` tokens never asks it (rule 1)."""

    __slots__ = ("starts", "rows", "windows", "n", "k", "ab", "c", "batch", "launch", "q",
                 "l2_rate", "measured", "margin")  # fmt: skip

    def __init__(self, rows, n, k, ab, c, batch, model, measured) -> None:
        # the candidates that fit, per range of M between the rows' own ranges' ends: ``pick``
        # finds M's range by bisection
        ends = sorted({1} | {lo for _, lo, *_ in rows} | {hi + 1 for _, _, hi, *_ in rows})
        self.starts = [end for end in ends if end != math.inf]
        self.rows = [[(row[0], *row[3:]) for row in rows if row[1] <= start <= row[2]]
                     for start in self.starts]  # fmt: skip
        self.windows: dict[int, list] = {}  # a window's first M -> its candidates in order
        self.n, self.k, self.ab, self.c, self.batch = n, k, ab, c, batch
        self.launch, self.q, self.l2_rate = model.launch_us, model.q, model.l2_tb_s * 1e6
        self.measured = measured  # the M blocks whose cell the table measured
        # the largest of the rows' margins (a window's keys are prices times them)
        self.margin = max((row[-3] for row in rows), default=1.0)

    def _price(self, row, m: int) -> float | None:
        """``row``'s ranking key (its price times its margin) at ``m`` tokens, as ``pick``
        works it out; None where ``m`` makes more split units than the rule allows."""
        _, period, tiles_of, split, cap, slots, unit, k_tiles, l2_of, ws, rate, margin, *_ = row
        tiles = -(-m // period) * tiles_of
        if tiles > cap:
            return None
        units = tiles * split
        base = ((m + self.n) * self.k * self.ab + m * self.n * self.c) * self.batch
        compute = -(-units // slots) * unit + 0.0
        dram = (base + tiles * ws) / rate
        l2 = units * k_tiles * l2_of * self.ab / self.l2_rate
        q = self.q
        return (self.launch + (compute**q + dram**q + l2**q) ** (1 / q)) * margin

    def _window(self, m: int) -> list:
        """The candidates for ``m`` tokens in the order of their prices at the start of
        ``m``'s window (``WINDOW_BITS``; a window ends where a candidate's range does too):
        a candidate's price only grows with M, so that price bounds it over the window.
        Each window's are worked out once, when first asked."""
        shift = m.bit_length() - WINDOW_BITS
        segment = bisect.bisect_right(self.starts, m) - 1
        start = max((m >> shift) << shift, self.starts[segment])
        rows = self.windows.get(start)
        if rows is None:
            priced = ((self._price(row, start), row) for row in self.rows[segment])
            rows = [(key * _BOUND_SLACK, *row) for key, row in priced if key is not None]
            rows.sort(key=lambda row: (row[0], row[-2]))
            self.windows[start] = rows
        return rows

    def pick(self, m: int) -> tuple[MenuEntry, int] | None:
        """(entry, split) for ``m`` tokens (a whole ``M_QUANTUM`` block), or None: the table's
        cell, or no candidate priced (the full pricing words what happens then)."""
        if m in self.measured:
            return None
        n, ab, launch, q, l2_rate = self.n, self.ab, self.launch, self.q, self.l2_rate
        # ``cost.features``' DRAM bytes (the same for a swapped problem: M + N, M x N)
        base = ((m + n) * self.k * ab + m * n * self.c) * self.batch
        best_key, best = math.inf, None
        for floor, bound, period, tiles_of, split, cap, slots, unit, k_tiles, l2_of, ws, rate, \
                margin, rank, e in self._window(m):  # fmt: skip
            if floor > best_key:
                break  # this and every later candidate cost more than the best
            if launch + bound * m > best_key:
                continue
            tiles = -(-m // period) * tiles_of
            if tiles > cap:
                continue  # more split units than SPLIT_MAX_WAVES waves
            units = tiles * split
            # cost.predict's terms, in its order (``_price``'s, inline: this loop is the hot
            # part); its price is at least its compute term
            compute = -(-units // slots) * unit + 0.0
            if (launch + compute * _BOUND_SLACK) * margin > best_key:
                continue
            dram = (base + tiles * ws) / rate
            l2 = units * k_tiles * l2_of * ab / l2_rate
            key = (launch + (compute**q + dram**q + l2**q) ** (1 / q)) * margin
            if key < best_key or (key == best_key and rank < best[0]):
                best_key, best = key, (rank, e, split)
        return None if best is None else best[1:]


@functools.lru_cache(maxsize=256)
def _plan(n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, invariant, table_path,
          clusters=None) -> _Plan | None:  # fmt: skip
    """The quick path for these arguments (``_Plan``); None where the full pricing alone
    answers: no cost model for the GPU."""
    _check_args(1, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc)
    model = cost.cost_model_for(sm_count, cc)
    table = table_for(tables(table_path), sm_count, cc)
    if model is None:
        return None
    measured = frozenset() if table is None else table.measured_blocks(n, k, batch, sm_count)
    dtypes = (ab_dtype, c_dtype, acc_dtype)
    ab = ELEMENT_BYTES[ab_dtype]
    rows = []
    for rank, e in enumerate(MENU):
        costs = model.entries.get(e.name)
        if costs is None or not _measured(e, batch, dtypes):
            continue
        for split in split_candidates(e, 1, n, k, batch, sm_count, acc_dtype, invariant):
            row = _row(model, costs, e, split, n, k, batch, sm_count, ab, c_dtype, rank, clusters)
            if row is not None:
                rows.append(row)
    return _Plan(rows, n, k, ab, ELEMENT_BYTES[c_dtype], max(batch, 1), model, measured)


def _row(model, costs, e: MenuEntry, split, n, k, batch, sm_count, ab, c_dtype, rank, clusters):
    """One candidate of a ``_Plan``: (bound per token, the M range ``fits``, tiles per period
    of M, ..., rank, entry); None where it never fits N. Each term as ``cost.features`` and
    ``cost.predict`` work it out for any M."""
    cm, cn = e.cluster
    # along the kernel's M and N: the tokens go along its M, or along its N when swapped
    token_tile, token_cluster = (e.tile_n, cn) if e.swap_ab else (e.tile_m, cm)
    other_tile, other_cluster = (e.tile_m, cm) if e.swap_ab else (e.tile_n, cn)
    other = -(-n // other_tile)
    if other < other_cluster:
        return None  # ``fits``: a cluster along N needs that many tiles
    lo = (token_cluster - 1) * token_tile + 1  # ``fits``: as many token tiles as the cluster
    hi = math.inf
    if e.swap_ab and e.tile_n <= SWAP_DECODE_MAX_N:
        hi = e.tile_n  # a decode tile takes all the tokens
    elif e.swap_ab:
        lo, hi = max(lo, SWAP_WIDE_MIN_M + 1), SWAP_WIDE_MAX_M
    # ``MenuEntry.tiles``: ceil(ceil(M / t) / c) x c = ceil(M / (t c)) x c
    period = token_tile * token_cluster
    tiles_of = token_cluster * (-(-other // other_cluster) * other_cluster) * max(batch, 1)
    cap = math.inf if split == 1 else SPLIT_MAX_WAVES * sm_count // split
    in_cluster = split_in_cluster(e, split, k, c_dtype, clusters)
    size = cm * cn * (split if in_cluster else 1)
    slots = cost.clusters_at_once(sm_count, size) * size
    k_tiles = -(-math.ceil(k / e.tile_k) // split)
    volume = e.tile_m * e.tile_n * e.tile_k / cost.REFERENCE_TILE_VOLUME
    unit = k_tiles * costs.per_k_tile * volume + costs.per_unit + 0.0
    if in_cluster and model.per_cluster_split is not None:
        unit += model.per_cluster_split * (e.tile_m * e.tile_n * 4 / 1024) * (split - 1)
    elif split > 1:
        unit += costs.per_split_unit + model.per_extra_split * (split - 1)
    l2_of = e.tile_m * e.tile_k / cn + e.tile_n * e.tile_k / cm
    ws = e.tile_m * e.tile_n * 4 * 2 * split if split > 1 and not in_cluster else 0
    margin = 1 + (0.0 if split == 1 else CLUSTER_SPLIT_MARGIN if in_cluster else SPLIT_MARGIN)
    # per token, the waves and tiles unrounded: compute and L2 at least this, combined
    per_token_units = tiles_of * split / period
    compute = per_token_units / slots * unit
    l2 = per_token_units * k_tiles * l2_of * ab / (model.l2_tb_s * 1e6)
    bound = (compute**model.q + l2**model.q) ** (1 / model.q) * margin * _BOUND_SLACK
    return (bound, lo, hi, period, tiles_of, split, cap, slots, unit, k_tiles, l2_of, ws,
            costs.dram_tb_s * 1e6, margin, (rank, split), e)  # fmt: skip


def with_epilogue(
    choice: Choice, mufu: int, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
    *, batch_invariant: bool | None = None,
) -> Choice:  # fmt: skip
    """``choice`` (``choose``'s, or the table's) for the problem with a fused activation of
    ``mufu`` MUFU instructions per accumulator element (``cost.EPILOGUE_MUFU``): the cost model
    prices the activation where nothing hides it (``cost.epilogue_us``: a cooperative tile's
    whole epilogue, a ping-pong tile's only past the other warpgroup's mainloop) and takes the
    candidate whose activation costs ``EPILOGUE_MARGIN`` of the time less than on ``choice``'s
    entry and split, net of any plain time the model gives that candidate more (and never
    crediting plain time it gives it less: a table choice was measured against the model);
    the largest such saving wins. ``choice`` itself for a plain epilogue, a tuned choice (a
    measured pick is not second-guessed), in batch-invariant mode (one tile for every M), and
    without a cost model for the GPU."""
    if mufu <= 0 or choice.source not in ("model", "table"):
        return choice
    if batch_invariant_requested(batch_invariant):
        return choice
    # (the cluster split's switch keys the memo: candidates are priced in the form they run)
    return _with_epilogue(choice, int(mufu), m_block(m), n, k, batch, ab_dtype, c_dtype, acc_dtype,
                          sm_count, tuple(cc), registry.CLUSTER_SPLIT_FAMILIES)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _with_epilogue(choice, mufu, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
                   clusters=None):  # fmt: skip
    args = (choice, mufu, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, clusters)
    quick = _epilogue_quick(*args) if SWAP_ONLY_TOKENS < m <= QUICK_MAX_M and n and k else None
    return _epilogue_full(*args) if quick is None else quick


def _epilogue_quick(choice, mufu, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
                    clusters=None):  # fmt: skip
    """``_epilogue_full``'s answer from the few candidates that could take the choice's place
    (None: ask it; so before the shape's plan is built, ``_plan_asked``). A candidate is
    credited at most the choice's activation time less its own, less the plain time it has
    over the choice (both at least 0), and it moves the choice only if that passes
    ``EPILOGUE_MARGIN`` of the choice's time: so only a choice whose activation costs more
    than that can move, and only to a candidate whose plain price is below the choice's by
    less than the difference. ``_Plan``'s window bounds each candidate's plain price from
    below, so the walk stops where none is left; those it keeps are priced as ``_ranked``
    prices them and judged as ``_epilogue_full`` judges them (in its order, the largest
    credit first)."""
    model = cost.cost_model_for(sm_count, cc)
    e0, s0 = choice.menu_entry, choice.split
    dtypes = (ab_dtype, c_dtype, acc_dtype)
    if model is None or e0.name not in model.entries or dtype_error(*dtypes):
        return None
    allowed = s0 in split_candidates(e0, m, n, k, batch, sm_count, acc_dtype, False)
    if not (allowed and fits(e0, m, n) and _measured(e0, batch, dtypes)):
        return choice  # not a candidate here (past rule 1's tokens): the full answer too
    ab, c = ELEMENT_BYTES[ab_dtype], ELEMENT_BYTES[c_dtype]

    def prices(e, s):  # (plain, with the activation): ``_ranked``'s
        f = _features(e, s, m, n, k, batch, sm_count, ab, c, c_dtype, clusters)
        return cost.predict(model, e, f), cost.predict(model, e, f, mufu)

    plain0, priced0 = prices(e0, s0)
    mine_act = priced0.us - plain0.us
    slack = mine_act - EPILOGUE_MARGIN * priced0.us
    if slack < 0:
        return choice  # no candidate can be credited enough
    ceiling = plain0.us + slack  # a candidate's plain price must be below this
    key = (n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, False, _environment()[1],
           clusters)  # fmt: skip
    if not _ASKED.get(key):
        return None  # (no plan built for the shape yet: ``_plan_asked``)
    plan = _plan(*key)
    if plan is None:
        return None
    judged = []
    for floor, _, period, tiles_of, split, cap, *_, margin, rank, e in plan._window(m):
        if floor > ceiling * plan.margin:
            break  # its plain price, and every later one's, is above the ceiling
        if floor > ceiling * margin or (e, split) == (e0, s0):
            continue
        if -(-m // period) * tiles_of > cap:
            continue  # (more split units than the rule allows: not a candidate here)
        plain, priced = prices(e, split)
        if plain is None or priced is None:
            return None
        judged.append((priced.us * (1 + _margin(priced.features)), rank, plain, priced, e, split))
    best = None
    for _, _, plain, priced, e, split in sorted(judged, key=lambda x: x[:2]):
        act = priced.us - plain.us
        credited = (mine_act - act) - max(0.0, plain.us - plain0.us)
        if credited > EPILOGUE_MARGIN * priced0.us and (best is None or credited > best[0]):
            best = (credited, e, split)
    if best is None:
        return choice
    args = (choice, mufu, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc, clusters)
    return Choice(best[1], best[2], source="model",
                  explained=functools.partial(_epilogue_full, *args))  # fmt: skip


def _epilogue_full(choice, mufu, m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc,
                   clusters=None):  # fmt: skip
    """``with_epilogue`` by pricing every allowed candidate, plain and with the activation
    (``clusters``: the cluster split's switch to price for, by default the one now)."""
    allowed = _allowed(m, n, k, batch, (ab_dtype, c_dtype, acc_dtype), sm_count, False)
    plain = {(e, s): p.us for p, _, e, s in _ranked(m, n, k, batch, ab_dtype, c_dtype, sm_count,
                                                    cc, allowed, 0, clusters)}  # fmt: skip
    priced = _ranked(m, n, k, batch, ab_dtype, c_dtype, sm_count, cc, allowed, mufu, clusters)
    mine = (choice.menu_entry, choice.split)
    if mine not in plain:
        return choice
    mine_us = {(e, s): p.us for p, _, e, s in priced}[mine]
    mine_act = mine_us - plain[mine]
    best = None
    for p, _, e, s in priced:
        # what the activation costs here less what it costs on the choice, less any plain time
        # the model gives this candidate over the choice; never a plain time it gains (the
        # table may have measured the choice faster where the model said otherwise)
        act = p.us - plain[(e, s)]
        credited = (mine_act - act) - max(0.0, plain[(e, s)] - plain[mine])
        if (e, s) != mine and credited > EPILOGUE_MARGIN * mine_us:
            if best is None or credited > best[0]:
                best = (credited, p, e, s)
    if best is None:
        return choice
    _, p, e, split = best
    why = (
        f"{choice.reason}{EPILOGUE_MOVE}{mufu} MUFU an element) the cost model "
        f"adds {mine_act:.1f} us to {choice.menu_entry.name} split {choice.split} "
        f"({mine_us:.1f} us) and {p.us - plain[(e, split)]:.1f} us to {e.name} split {split} "
        f"({p.us:.1f} us), which runs instead"
    )
    shown = tuple((c.name, s, q) for q, _, c, s in priced[:SHOWN_PREDICTIONS])
    return Choice(e, split, why, "model", shown)


def _ranked(m, n, k, batch, ab_dtype, c_dtype, sm_count, cc, allowed, mufu: int = 0,
            families=None):  # fmt: skip
    """Every allowed candidate with its predicted time (a fused activation of ``mufu`` MUFU
    instructions an element priced in), fastest first: (prediction, tie-break, entry, split);
    empty without a cost model for this GPU. ``families``: ``split_in_cluster``'s."""
    model = cost.cost_model_for(sm_count, cc)
    if model is None:
        return []
    ab, c = ELEMENT_BYTES[ab_dtype], ELEMENT_BYTES[c_dtype]
    out = []
    for order, (name, splits) in enumerate(allowed.items()):
        e = entry(name)
        for s in splits:
            f = _features(e, s, m, n, k, batch, sm_count, ab, c, c_dtype, families)
            p = cost.predict(model, e, f, mufu)
            if p is not None:
                out.append((p, (order, s), e, s))
    return sorted(out, key=lambda x: (x[0].us * (1 + _margin(x[0].features)), x[1]))


def _features(e, split, m, n, k, batch, sm_count, ab, c, c_dtype, families) -> cost.Features:
    """``cost.features`` of a candidate, in the form it runs: where the family runs ``split``
    as a cluster split (``split_in_cluster``, for the switch setting ``families``), that
    form's."""
    in_cluster = split_in_cluster(e, split, k, c_dtype, families)
    return cost.features(e, split, m, n, k, batch, sm_count, ab, c, in_cluster)


def _table_timed(candidate, found) -> bool:
    """Whether the table's cell ``found`` timed the model's ``candidate`` in the form it runs
    (its cells predate the cluster split: they timed the workspace form alone)."""
    p, _, e, split = candidate
    return not p.features.cluster_split and (e.name, split) in found[3]


def split_in_cluster(e: MenuEntry, split: int, k: int, c_dtype: str, families=None) -> bool:
    """Whether ``split`` on ``e`` runs over a cluster (``registry.cluster_split_config``: the
    family's switch, the tile, K and C's dtype allow it), so that it is priced in that form.
    ``families``: the switch's setting (``registry.CLUSTER_SPLIT_FAMILIES``) to answer for,
    by default the one now."""
    if families is None:
        families = registry.CLUSTER_SPLIT_FAMILIES
    return split > 1 and _split_in_cluster(e, split, k, c_dtype, frozenset(families))


@functools.lru_cache(maxsize=4096)
def _split_in_cluster(e: MenuEntry, split: int, k: int, c_dtype: str, families) -> bool:
    """``split_in_cluster``, kept per switch setting (``families``, which it answers for): the
    config it builds costs more than the rest of a candidate's price (docs/perf.md entry 114)."""
    return registry.cluster_split_config(e, split, k, c_dtype, families) is not None


def _margin(f: cost.Features) -> float:
    """How much faster than it is a candidate must be predicted to be taken (``SPLIT_MARGIN``,
    ``CLUSTER_SPLIT_MARGIN``)."""
    if f.split == 1:
        return 0.0
    return CLUSTER_SPLIT_MARGIN if f.cluster_split else SPLIT_MARGIN


def _why(best, rest, e, split, count) -> str:
    """Why the model's winner won, against the runner-up."""
    f = best.features
    grid = f"{f.units} units in {f.waves} wave{'s' if f.waves > 1 else ''}"
    said = (
        f"cost model: {e.name} split {split} predicted {best.us:.1f} us, ranked first of "
        f"{count} candidates ({grid}, {f.k_tiles} k-tiles each; {best.bound}-bound)"
    )
    if rest:
        p, _, other, s = rest[0]
        said += f"; next {other.name} split {s} at {p.us:.1f} us"
        if p.us < best.us:  # a split within its margin of the winner: ranked behind it
            form = "split over a cluster" if p.features.cluster_split else "split"
            said += (f" (a {form} must be predicted {_margin(p.features):.0%} faster to be "
                     "taken: the model prices its fix-up within its error)")  # fmt: skip
        elif p.features.waves > f.waves:
            said += f" ({p.features.waves} waves)"
        elif p.bound != best.bound:
            said += f" ({p.bound}-bound)"
    return said


def _notes(acc_dtype: str, invariant: bool) -> str:
    if invariant:
        return "; batch-invariant: no split-K, one accumulation order for every M"
    if acc_dtype != "float32":
        return "; no split-K with an fp16 accumulator"
    return ""
