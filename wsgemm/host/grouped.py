"""Grouped GEMM on the host: which grouped kernel a call runs (the compiled kernel comes from
the dispatcher, ``Dispatcher.kernel(..., grouping="m")``).

A ragged-M grouped GEMM (``wsgemm.grouped_mm``'s 2D x 3D form) runs the family's grouped
kernel (``Backend.grouped_cls``; ``Variant.grouping`` "m"). The host knows the total rows and
the group count, not the groups' sizes (they are on the GPU), so the tile is chosen from the
mean rows per group: a group's last tile is partly empty, and a tile much taller than its
group wastes the tensor cores' work and B's reads on rows that are not there.
"""

from __future__ import annotations

from typing import Any

from ..support import int_ranges
from .registry import BACKENDS, Variant, cluster_size

__all__ = [
    "GROUPED_BACKENDS",
    "RAGGED_K_FAMILIES",
    "grouped_config",
    "grouped_variants",
    "ragged_k_beats_torch",
    "ragged_k_config",
    "ragged_k_variants",
    "ragged_k_workspace_words",
    "routes_ragged_k",
    "supports_grouped",
    "tile_map",
]

#: The backends with a grouped kernel, in the order ``auto`` prefers them.
GROUPED_BACKENDS = tuple(name for name, b in BACKENDS.items() if b.grouped_cls)

#: Mean rows per group up to which a 64-row ping-pong tile runs (a decode step's few tokens
#: per expert), and up to which the 128x128 ping-pong tile with its cluster along N does; above,
#: the cooperative 128x256 tile. Measured (docs/perf.md entry 46, ``scripts/tune_grouped.py``
#: on an H100, fitted on two MoE models and judged on two others): the 64-row tile at 8 rows a
#: group, the 128x128 c1x2 at 64, the cooperative 128x256 c2x1 at 512; the bounds between
#: those points are not measured. Re-tuned after a group's last tile became 16-byte vector
#: copies (entry 122, H100; at 4096 without DeepSeek-V3, which did not fit beside the
#: candidates): the same picks at 8, 64, 512 and 4096 tokens per expert.
SMALL_GROUP_ROWS = 32
MEDIUM_GROUP_ROWS = 256


#: The families whose ragged-K grouped kernel (``grouped_mm``'s 2D x 2D form, a mixture of
#: experts' weight gradient; ``Variant.grouping`` "k") ``backend="auto"`` runs. The sm90 one ran
#: on an H100 on 2026-12-05 (docs/perf.md entry 54): 35 of 35 GPU tests
#: (``tests/gpu/test_gpu_grouped.py -k ragged_k``) and memcheck clean. ``auto`` takes it where
#: torch has no fused grouped kernel (``api.grouped.route``: float16, or a float32 result,
#: where torch loops over the groups with a sync); bfloat16 in and out stays on
#: ``torch._grouped_mm`` until the kernel is timed against it.
RAGGED_K_FAMILIES: frozenset[str] = frozenset({"sm90"})


def routes_ragged_k(backend: str) -> bool:
    """Whether a 2D x 2D call on ``backend`` ("auto" or a name) may take the ragged-K kernel."""
    if backend == "auto":
        return any(BACKENDS[name].family in RAGGED_K_FAMILIES for name in GROUPED_BACKENDS)
    b = BACKENDS.get(backend)
    return b is not None and bool(b.k_grouped_cls)


#: The smallest group gradient (elements of one group's M x N result) for which ``auto`` runs
#: a bfloat16 2D x 2D call on the ragged-K kernel rather than ``torch._grouped_mm``: on the H200
#: (2026-12-06, docs/perf.md entries 61-62; the moe suite's weight gradients, 3 rounds) the kernel
#: ran 1.02-1.11x torch on qwen3-235b-a22b (6.3M and 12.6M elements a group) and 1.06-1.20x on
#: mixtral-8x7b (59M, 117M), and 0.89-1.02x on qwen3-30b-a3b (1.6M, 3.1M): its fixed cost per
#: tile against torch's shows where each group's product is small. Fitted on those three
#: models; deepseek-v3 (15M, 29M) is the held-out check.
RAGGED_K_BF16_MIN_GROUP_ELEMENTS = 4 * 2**20


def ragged_k_beats_torch(m: int, n: int) -> bool:
    """Whether ``auto`` runs a bfloat16 2D x 2D call whose groups' results are ``m x n`` on the
    ragged-K kernel rather than torch's fused grouped kernel
    (``RAGGED_K_BF16_MIN_GROUP_ELEMENTS``)."""
    return m * n >= RAGGED_K_BF16_MIN_GROUP_ELEMENTS


def ragged_k_config(backend: str) -> tuple[str, Any]:
    """(backend, config) of a ragged-K grouped GEMM: the output's tiles are the dense ones of
    ``groups`` M x N products, so the backend's shipped config ("auto": the cooperative one)."""
    return ("sm90" if backend == "auto" else backend), None


def ragged_k_workspace_words(backend: str, config: Any, clusters: int) -> int:
    """fp32 words of a ragged-K launch's workspace: each CTA's copies of A's and B's TMA
    descriptors (``kernels/sm90/ragged_k.py``), for ``clusters`` clusters of ``config``
    (None: ``backend``'s shipped one)."""
    from ..kernels.sm90.config import RAGGED_K_WORDS_PER_CTA

    return clusters * cluster_size(config or BACKENDS[backend].config()) * RAGGED_K_WORDS_PER_CTA


def ragged_k_variants(arch: str = "sm_90a") -> list[Variant]:
    """The ragged-K variants a call may run: each grouped backend's shipped config x input
    dtype x result dtype (the inputs' or fp32); A M-major, B N-major (the kernel's only
    majors: the host copies others)."""
    from ..support import AB_DTYPES

    return [
        Variant(backend, arch, ab, c, "float32", "m", "n", grouping="k")
        for backend in GROUPED_BACKENDS
        for ab in AB_DTYPES
        for c in (ab, "float32")
    ]


def supports_grouped(backend: str, cc: tuple[int, int]) -> bool:
    """Whether ``backend`` has a grouped kernel that runs on a GPU of capability ``cc``."""
    b = BACKENDS.get(backend)
    return b is not None and bool(b.grouped_cls) and b.supports(cc)


def grouped_config(backend: str, rows: int, groups: int) -> tuple[str, Any]:
    """(backend, config) of a ragged-M grouped GEMM of ``rows`` rows in ``groups`` groups:
    ``backend`` "auto" picks by the mean group (module docstring); a named backend keeps its
    schedule and takes the tile height the mean group fits."""
    from ..kernels.sm90.config import Sm90Config

    mean = rows / max(groups, 1)
    if backend == "auto":
        backend = "sm90-pingpong" if mean <= MEDIUM_GROUP_ROWS else "sm90"
    if backend == "sm90-pingpong" and mean <= SMALL_GROUP_ROWS:
        # one 64-row tile per group, 128 columns: many CTAs, each reads its B tile once
        return backend, Sm90Config(tile_m=64, tile_n=128, schedule="pingpong")
    if backend == "sm90-pingpong" and mean <= MEDIUM_GROUP_ROWS:
        # 128x128, its cluster along N: a group's last tile pads it to 128 rows, not the 256
        # of the shipped cluster along M (two m-tiles of one group)
        return backend, Sm90Config(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2,
                                   schedule="pingpong")  # fmt: skip
    return backend, None  # the backend's shipped config


def tile_map(backend: str, ends: list[int], rows: int, n: int, sm_count: int,
             shown: int = 8) -> list[str]:  # fmt: skip
    """``explain``'s lines on which tiles run which group of a ragged-M grouped call whose
    group ends (``offs``) the host holds: the grouped kernel's schedule replayed on the host
    (``kernels.common.grouped_scheduler.RaggedSchedule``: ``ragged_unit_order``'s answer, the
    same arithmetic the kernel runs, at a cost per group) over the CTAs a launch on
    ``sm_count`` SMs starts: per group its rows, its m-tiles x n-tiles, its last m-tile's fill
    and the CTAs that run its tiles (the first ``shown`` groups, then a count); the whole
    call's units, waves and padded rows."""
    from ..kernels.common.grouped_scheduler import RaggedSchedule
    from ..kernels.sm90.config import DEFAULT_RASTER_GROUP

    name, config = grouped_config(backend, rows, len(ends))
    cfg = config or BACKENDS[name].config()
    num_n = -(-n // cfg.tile_n)
    schedule = RaggedSchedule(list(ends), rows, num_n, cfg.tile_m,
                              DEFAULT_RASTER_GROUP[cfg.schedule], sm_count,
                              (cfg.cluster_m, cfg.cluster_n))  # fmt: skip
    # each CTA of a cluster runs the cluster's units: the counts per CTA are its cluster's
    counts = [len(schedule.works(c)) for c in range(schedule.launched)]
    launched_ctas = schedule.launched * cfg.cluster_m * cfg.cluster_n
    units, busiest = sum(counts) * cfg.cluster_m * cfg.cluster_n, max(counts, default=0)
    # the shown groups' tiles, one by one: the units before the first group not shown
    groups_shown = min(shown, len(ends))
    shown_end = schedule.cursors[groups_shown - 1][4] if groups_shown > 0 else 0
    ctas: dict[int, set[int]] = {}
    idle: dict[int, int] = {}  # a group's tiles past its rows or N: a cluster's surplus
    for w in range(min(shown_end, schedule.units) if schedule.launched else 0):
        for cta, cta_mn in schedule.cluster_ctas(w % schedule.launched):
            u = schedule.tile(w, cta_mn)
            g = int(u.l)
            ctas.setdefault(g, set()).add(cta)
            if u.rows_left(cfg.tile_m) <= 0 or int(u.n) >= num_n:
                idle[g] = idle.get(g, 0) + 1
    lines = []
    written = 0
    prev = 0
    for g, end in enumerate(ends):
        lo, hi = prev, min(max(end, prev), rows)
        prev = hi
        size = hi - lo
        written += size * n
        if g >= shown:
            continue
        if not size:
            lines.append(f"  group {g}: no rows, no tiles")
            continue
        m_tiles = -(-size // cfg.tile_m)
        last = size - (m_tiles - 1) * cfg.tile_m
        surplus = ""
        if g in idle:
            surplus = f" (+{idle[g]} computed and not stored: its clusters' surplus)"
        lines.append(
            f"  group {g}: rows {lo}-{hi - 1} ({size}): {m_tiles} x {num_n} tiles{surplus}, its "
            f"last m-tile {last}/{cfg.tile_m} rows; CTAs {int_ranges(sorted(ctas.get(g, ())))}"
        )
    if len(ends) > shown:
        lines.append(f"  ... {len(ends) - shown} more groups")
    computed = units * cfg.tile_m * cfg.tile_n
    padded = 1 - written / computed if computed else 0.0
    head = (
        f"tile map (offs read on the host, from a CPU tensor): {units} tiles of "
        f"{cfg.tile_m}x{cfg.tile_n} computed over {launched_ctas} CTAs, the busiest "
        f"running {busiest}; {padded:.0%} of the computed elements are padding (each group's "
        "last m-tile and n-tile, a cluster's surplus tiles)"
    )
    return [head, *lines]


def grouped_variants(arch: str = "sm_90a") -> list[Variant]:
    """Every grouped variant a call may run on ``arch``: each backend's tiles
    (``grouped_config``) x input dtype x result dtype (the inputs' or fp32) x operand majors,
    then the ragged-K ones (``ragged_k_variants``).
    What ``python -m wsgemm warm --grouped`` adds (plain ``warm`` compiles dense kernels only:
    a grouped kernel compiles at its first call otherwise)."""
    import itertools

    from ..support import AB_DTYPES

    means = (SMALL_GROUP_ROWS, MEDIUM_GROUP_ROWS, MEDIUM_GROUP_ROWS + 1)  # one of each tile
    configs = {grouped_config(backend, rows, 1) for backend in GROUPED_BACKENDS
               for rows in means}  # fmt: skip
    out = []
    for (backend, config), ab, am, bm in itertools.product(
        sorted(configs, key=repr), AB_DTYPES, ("k",), ("k", "n")
    ):
        for c in (ab, "float32"):
            out.append(Variant(backend, arch, ab, c, "float32", am, bm, config, grouping="m"))
    return out + ragged_k_variants(arch)
