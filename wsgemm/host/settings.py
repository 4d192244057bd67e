"""wsgemm's behaviour switches: the settings in effect here (``current``), and the words their
environment variables accept.

Three switches: batch invariance, on-line tuning and the on-disk compile cache. Each is, in
order: what a ``wsgemm.config`` block says in this thread or async task, else the process
default ``wsgemm.config.set_*`` gave, else None, which the room that reads the switch resolves
from its environment variable (``WSGEMM_BATCH_INVARIANT`` and ``WSGEMM_AUTOTUNE`` read once,
``WSGEMM_DISK_CACHE`` at each compile: ``choosing.rules``, ``choosing.autotune``,
``compiling.disk``).

One ``ContextVar`` holds all three as one tuple, so a call reads its settings with one lookup
(``current``) and its launcher memo keys on them (``wsgemm.api.dispatch``): a launcher chosen
outside a block is never reused inside it. A thread starts with no block (the process
default); an async task starts with its creator's.

The words: lower-cased and stripped before the comparison.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import NamedTuple

FALSE_WORDS = frozenset({"0", "false", "no", "off"})
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


class Settings(NamedTuple):
    """The switches as set: True or False, or None for the environment variable's default."""

    batch_invariant: bool | None = None
    autotune: bool | None = None
    disk_cache: bool | None = None


NAMES = Settings._fields

_process = Settings()
_process_lock = threading.Lock()
_block: ContextVar[Settings] = ContextVar("wsgemm_settings")


def current() -> Settings:
    """The settings in effect in this thread or async task: its innermost block's, else the
    process default. On every call's path: one lookup."""
    return _block.get(_process)


def check(name: str, value: object) -> bool | None:
    """``value`` if it may be the setting ``name``: a bool, or None (the environment's
    default); else TypeError."""
    if name not in NAMES:
        raise TypeError(f"no setting {name!r}; the settings: {', '.join(NAMES)}")
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True, False or None (the environment's default), "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def set_default(name: str, value: bool | None) -> None:
    """Make ``value`` the process default of setting ``name``: every thread and task outside a
    block sees it from its next call on."""
    global _process
    check(name, value)
    with _process_lock:
        _process = _process._replace(**{name: value})


def block(**values: bool | None) -> contextlib.AbstractContextManager[Settings]:
    """Settings for the ``with`` body in this thread or async task only: the named ones as
    given, the others as they are at the block's start; restored on exit, nested blocks
    included. The values are checked here, before any ``with``."""
    for name, value in values.items():
        check(name, value)
    return _entered(values)


@contextlib.contextmanager
def _entered(values: dict[str, bool | None]) -> Iterator[Settings]:
    token = _block.set(current()._replace(**values))
    try:
        yield _block.get()
    finally:
        _block.reset(token)
