"""Shared test set-up: GPU tests skip without a GPU; kernel variants compile once per session."""

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

    def get(variant: host.Variant) -> Compiled:
        if variant not in done:
            fn = host.compile_variant(variant, keep=True)
            done[variant] = Compiled(fn, insp.inspect_variant(variant, fn))
        return done[variant]

    return get
