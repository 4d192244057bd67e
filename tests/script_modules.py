"""The repository's ``scripts/`` as modules, for the tests that read what a script owns (the
tuner's dropped entries) or drive its plan: ``scripts/`` is no package, so each loads by path,
once per test session."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parents[1] / "scripts"


def load(name: str):
    """``scripts/<name>.py`` as module ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while defined
        spec.loader.exec_module(module)
    return sys.modules[name]
