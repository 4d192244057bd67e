"""Arrive counts, derived from kernel facts and checked when a kernel is traced.

A pipeline barrier that expects the wrong number of arrivals does not fail: it hangs the GPU (too
many expected) or lets a stage be overwritten while still in use (too few). So every kernel states
where its count comes from, as named terms, and compares it with the count its pipeline is built
with before anything runs. A mismatch raises ``ArriveCountError`` with the arithmetic spelled out.
"""

from __future__ import annotations

from collections.abc import Mapping


class ArriveCountError(ValueError):
    """A pipeline barrier would expect a different number of arrivals than the kernel makes."""


def derive_arrive_count(terms: Mapping[str, int]) -> int:
    """The product of named factors, e.g. ``{"consumer warps": 4, "arrivals per warp": 1}``."""
    if not terms:
        raise ValueError("an arrive count needs at least one named factor")
    count = 1
    for name, value in terms.items():
        if not isinstance(value, int) or value < 1:
            raise ArriveCountError(
                f"arrive-count factor {name!r} must be a positive int, got {value!r}"
            )
        count *= value
    return count


def check_arrive_count(barrier: str, actual: int, terms: Mapping[str, int]) -> int:
    """Raise ``ArriveCountError`` unless ``actual`` equals the product of ``terms``.

    ``barrier`` names the barrier ("sm90 mainloop empty", ...); the error shows each factor.
    Returns ``actual`` so the call can sit inside the expression that builds the pipeline.
    """
    expected = derive_arrive_count(terms)
    if actual != expected:
        arithmetic = " x ".join(f"{v} ({k})" for k, v in terms.items())
        raise ArriveCountError(
            f"{barrier}: the barrier is built to expect {actual} arrivals per phase, but the "
            f"kernel makes {arithmetic} = {expected}"
        )
    return actual
