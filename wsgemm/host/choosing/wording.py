"""The policy's answer in words: ``explain`` (what ``choose`` picks, and why) and ``describe`` (any
choice, a tuned one included), the lines ``wsgemm.explain`` and ``python -m wsgemm explain``
print for ``auto`` on Hopper."""

from __future__ import annotations

from typing import Any

from . import cost
from .rules import Choice, batch_invariant_requested, choose, split_in_cluster

__all__ = ["describe", "explain", "grid", "predicted"]


def explain(*args: Any, batch_invariant: bool | None = None) -> str:
    """``choose``'s answer for the same arguments, as a few lines a person reads."""
    choice = choose(*args, batch_invariant=batch_invariant)  # checks the arguments first
    return describe(choice, *args, batch_invariant=batch_invariant)


def describe(choice: Choice, *args: Any, batch_invariant: bool | None = None) -> str:
    """``choice`` for ``choose``'s arguments ``args``, as ``explain`` words it."""
    m, n, k, batch, ab_dtype, c_dtype, acc_dtype, sm_count, cc = args
    e = choice.menu_entry
    mode = ", batch-invariant" if batch_invariant_requested(batch_invariant) else ""
    split = f"{choice.split} (in the kernel, fp32 partials)" if choice.split > 1 else "1 (none)"
    in_cluster = split_in_cluster(e, choice.split, k, c_dtype)
    if in_cluster:
        split = (f"{choice.split} over a cluster of {choice.split} CTAs (fp32 partials met in "
                 "shared memory)")  # fmt: skip
    return "\n".join(
        [
            f"problem: M={m} N={n} K={k} batch={batch}, {ab_dtype} inputs, {c_dtype} output, "
            f"{acc_dtype} accumulate; sm_{cc[0]}{cc[1]} with {sm_count} SMs{mode}",
            f"kernel: {e.name} (backend {e.backend}: {e.describe()})",
            f"split-K: {split}",
            f"grid: {grid(choice, m, n, batch, sm_count, in_cluster)}",
            f"why ({choice.source}): {choice.reason}",
            *predicted(choice),
        ]
    )


def predicted(choice: Choice) -> list[str]:
    """The cost model's fastest few candidates, one line each (none without a model)."""
    if not choice.predictions:
        return []
    lines = ["predicted (cost model, fastest first):"]
    for name, split, p in choice.predictions:
        f = p.features
        lines.append(
            f"  {p.us:8.1f} us  {name} split {split}: {f.units} units in {f.waves} "
            f"wave{'s' if f.waves > 1 else ''}; compute {p.compute_us:.1f}, DRAM "
            f"{p.dram_us:.1f}, L2 {p.l2_us:.1f} us"
        )
    return lines


def grid(choice: Choice, m: int, n: int, batch: int, sm_count: int, in_cluster=False) -> str:
    """The work units against the SMs (one CTA each): how whole the waves are, which is what
    decides a mid-size problem's speed (docs/perf.md entry 28). ``in_cluster``: the split
    runs over clusters of its ways, of which fewer may run at once than the SMs hold
    (``cost.clusters_at_once``)."""
    tiles = choice.menu_entry.tiles(m, n, batch)
    if choice.source == "empty" or tiles == 0:
        return "none (an empty problem)"
    if choice.menu_entry.config.get("stream_k"):
        return f"{tiles} tiles for {sm_count} SMs, the last waves' k-tiles shared by all (stream-K)"
    units = tiles * choice.split
    what = f"{tiles} tiles" if choice.split == 1 else f"{tiles} tiles x {choice.split} splits"
    slots, where = sm_count, f"{sm_count} SMs"
    if in_cluster:
        size = choice.split * choice.menu_entry.cluster[0] * choice.menu_entry.cluster[1]
        slots = cost.clusters_at_once(sm_count, size) * size
        if slots < sm_count:
            where += f" ({slots} CTAs at once in clusters of {size})"
    full, rest = divmod(units, slots)
    if units <= slots:
        fill = f"one wave, {units / sm_count:.0%} of the SMs busy"
    elif rest:
        fill = f"{units / slots:.2f} waves, the last {rest / slots:.0%} full"
    else:
        fill = f"{full} whole waves"
    return f"{what} for {where}: {fill}"
