"""Effective bandwidth of a result, and which shapes the memory roofline bounds.

A GEMM reads A and B and writes C at least once, so it moves at least
``(M*K + N*K) * input bytes + M*N * output bytes``; that over the measured time is its effective
bandwidth. Its arithmetic intensity is FLOP over those bytes. Below the device's ridge point
(``hardware.ridge_flop_per_byte``: peak FLOP/s over peak bytes/s) the HBM, not the tensor
cores, sets the speed limit: such a shape is *memory-bound*, and its bandwidth as a share of
the HBM peak says how close a kernel came to that limit (decode GEMMs, M of a few tokens).

A grouped GEMM (the moe suite: ``m`` rows split among G experts, each with its own N x K
weight) reads the weight of every expert that has rows, so B counts once per non-empty group;
its weight gradient (``grouped.pass`` "wgrad") reads the output gradient and the input once
and writes every group's N x K gradient.

The fields are derived from the header and the row alone, so a record from before they
existed (schema version 1) gets them when it is read.
"""

from __future__ import annotations

from ..support import element_bytes
from . import hardware


def bytes_moved(m: int, n: int, k: int, in_bytes: int, out_bytes: int, weights: int = 1,
                wgrad: bool = False) -> int:  # fmt: skip
    """A and B read once, C written once: the least any GEMM kernel moves (``weights``: how
    many N x K matrices B is, the non-empty groups of a grouped GEMM). ``wgrad``: a grouped
    weight gradient instead, which reads the M x N output gradient and the M x K input and
    writes ``weights`` N x K gradients (every group's)."""
    if wgrad:
        return (m * n + m * k) * in_bytes + weights * n * k * out_bytes
    return (m * k + weights * n * k) * in_bytes + m * n * out_bytes


def intensity(m: int, n: int, k: int, in_bytes: int, out_bytes: int, weights: int = 1,
              wgrad: bool = False) -> float:  # fmt: skip
    """FLOP per byte moved: 2*M*N*K over ``bytes_moved``."""
    return 2 * m * n * k / bytes_moved(m, n, k, in_bytes, out_bytes, weights, wgrad)


def header_fields(
    gpu: str | None, sm_count: int | None, flop_per_clock: int | None, sm_max_mhz: float | None
) -> dict:
    """``hbm_tbps`` and ``ridge_flop_per_byte`` for a record's header. The ridge takes the
    tensor peak at the board's maximum SM clock: the clock a GEMM runs at when power allows."""
    tbps = hardware.hbm_tbps(gpu)
    return {
        "hbm_tbps": tbps,
        "ridge_flop_per_byte": hardware.ridge_flop_per_byte(
            sm_count, flop_per_clock, sm_max_mhz, tbps
        ),
    }


def annotate(header: dict, results: list[dict]) -> None:
    """Fill each row's ``memory_bound``, ``tbps`` and ``pct_of_hbm`` from the header's peaks.

    ``memory_bound`` is null when the ridge is unknown; ``tbps`` is set on every ok row;
    ``pct_of_hbm`` where the device's HBM peak is known."""
    ridge, peak = header["ridge_flop_per_byte"], header["hbm_tbps"]
    for row in results:
        size = element_bytes(row["dtype"])  # the benchmark's output has the inputs' dtype
        grouped = row.get("grouped")
        wgrad = bool(grouped) and grouped.get("pass") == "wgrad"
        weights = 1
        if grouped:  # a weight gradient writes every group's; a forward reads the non-empty ones
            sizes = grouped["sizes"]
            weights = len(sizes) if wgrad else sum(s > 0 for s in sizes)
        dims = (row["m"], row["n"], row["k"], size, size, weights, wgrad)
        moved = bytes_moved(*dims)
        row["memory_bound"] = None
        if ridge is not None:
            row["memory_bound"] = intensity(*dims) < ridge
        row["tbps"] = row["pct_of_hbm"] = None
        if row["status"] == "ok":
            row["tbps"] = moved / (row["median_ms"] * 1e9)
            row["pct_of_hbm"] = 100.0 * row["tbps"] / peak if peak else None
