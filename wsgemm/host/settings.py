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

The words: lower-cased and stripped before the comparison (``WSGEMM_AUTOTUNE``,
``WSGEMM_DISK_CACHE``, ``WSGEMM_CACHE_SHARED``; ``WSGEMM_BATCH_INVARIANT`` takes ``0`` or ``1``
alone, ``choosing.rules``).

A block (``block``) is an object that may be entered again, nested in itself, shared by threads
and tasks (each keeps its own exits: a ``ContextVar`` too), or decorate a function, a coroutine
function included (the block holds while its body runs); never a generator function (its body
would run outside the block, or leak it to the caller between ``yield``s): TypeError.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from contextvars import ContextVar, Token
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
# the open blocks' tokens in this thread or task, innermost last (``_Block.__exit__`` resets the
# last): per context, so one block object may be entered in several at once
_tokens: ContextVar[tuple[Token[Settings], ...]] = ContextVar("wsgemm_settings_tokens", default=())


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
    included. The values are checked here, before any ``with``. The object may be entered
    again, and decorate a function (the module docstring)."""
    for name, value in values.items():
        check(name, value)
    return _Block(values)


class _Block(contextlib.AbstractContextManager):
    """``block``'s object: each ``with`` sets the settings on entry and restores them on exit
    (an exception included); the tokens live in this context (``_tokens``), not on the object."""

    def __init__(self, values: dict[str, bool | None]) -> None:
        self._values = dict(values)

    def __repr__(self) -> str:
        named = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"wsgemm.config block({named})"

    def __enter__(self) -> Settings:
        settings = current()._replace(**self._values)
        token = _block.set(settings)
        _tokens.set(_tokens.get() + (token,))
        return settings

    def __exit__(self, *exc: object) -> None:
        tokens = _tokens.get()
        if not tokens:
            raise RuntimeError(f"{self!r} exited in a thread or task where no block is open")
        _tokens.set(tokens[:-1])
        _block.reset(tokens[-1])

    def __call__(self, func: Callable) -> Callable:
        """Decorate ``func``: each call runs inside the block (a coroutine function's body
        too); TypeError for a generator function."""
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"{self!r} cannot decorate the generator function {func.__qualname__}: its "
                "body runs outside the call; enter the block inside it (with ...:)"
            )
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args, **kwargs):
                with self:
                    return await func(*args, **kwargs)

            return run_async
        if not callable(func):
            raise TypeError(f"{self!r} decorates a function, got {type(func).__name__}")

        @functools.wraps(func)
        def run(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return run
