"""Shared test set-up: GPU tests skip without a GPU; kernel variants compile once per session."""

import builtins
from dataclasses import dataclass

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass(frozen=True)
class Compiled:
    """One variant compiled (no GPU needed): the function the DSL built and what
    ``inspection`` reads from its cubin (registers, spills, SASS counts and text)."""

    fn: object
    report: object


@pytest.fixture(scope="session")
def compiled():
    """``compiled(variant) -> Compiled``, through the one harness (``host.compile_variant`` +
    ``inspection.inspect_variant``); each variant is compiled once per test session, however
    many tests read it."""
    from wsgemm import host
    from wsgemm import inspection as insp

    done: dict = {}
    # bound now: a test that patches ``inspection.inspect_variant`` to read this fixture (the
    # ``inspect`` CLI's tests) must not make a compile here call back into itself
    compile_variant, inspect_variant = host.compile_variant, insp.inspect_variant

    def get(variant: host.Variant) -> Compiled:
        if variant not in done:
            fn = compile_variant(variant, keep=True)
            done[variant] = Compiled(fn, inspect_variant(variant, fn))
        return done[variant]

    return get


@pytest.fixture
def python_min_max(monkeypatch):
    """``cutlass.min``/``max`` answering Python ints with Python's ``min``/``max``, other values
    with the DSL's. On Python ints the DSL's are Python's (``test_scheduler`` checks) but cost
    ~40 us a call in the DSL's op wrapper: the host replays of the schedules call them many
    thousand times."""
    import cutlass

    def int_fast_path(dsl, python):
        def minmax(*args):
            if all(type(a) is int for a in args):
                return python(*args)
            return dsl(*args)

        return minmax

    monkeypatch.setattr(cutlass, "min", int_fast_path(cutlass.min, builtins.min))
    monkeypatch.setattr(cutlass, "max", int_fast_path(cutlass.max, builtins.max))
