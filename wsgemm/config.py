"""wsgemm's behaviour switches from Python, in the manner of ``torch.backends``: batch
invariance, on-line tuning and the on-disk compile cache.

>>> import wsgemm
>>> with wsgemm.config.batch_invariant(True):   # this thread or async task only, until the end
...     y = model(x)                             # every output row as it would be alone
>>> wsgemm.config.set_autotune(False)           # the process default
>>> wsgemm.config.batch_invariant_enabled(), wsgemm.config.autotune_enabled()
(False, False)

Each switch has three functions: ``<name>_enabled()`` reads it, ``set_<name>(flag)`` sets the
process default, and ``<name>(flag)`` is a ``with`` block. A setting is, in order: the innermost
block's in this thread or async task, else the process default, else the environment variable
(``WSGEMM_BATCH_INVARIANT``, ``WSGEMM_AUTOTUNE``, ``WSGEMM_DISK_CACHE``: the first two read
once, at the first call, as before). ``set_<name>(None)`` goes back to the environment's.
One switch reads two ways: ``autotune_enabled()`` (the Hopper menu's tuning: off unless set)
and ``race_enabled()`` (off Hopper, the race against torch.matmul: on unless set off).

The switches are context variables (``contextvars``): a block holds in the thread or task that
entered it, so serving threads and async tasks each keep their own; a new thread starts with
the process default (where Python gives threads their creator's context, as 3.14's
free-threaded build does, the creator's settings), a new async task with its creator's
settings. A block fixes every switch at its start (the ones it does not name as they are
then), as ``decimal.localcontext`` does. A block object may be kept and entered again (by
several threads or tasks at once), and decorate a function or a coroutine function (not a
generator function: TypeError).

Every call reads them: ``matmul``, ``linear`` and ``nn.Linear`` choose their kernel for a call
signature under the settings in effect, and a kernel chosen outside a block is never reused
inside it (nor the other way round). Code compiled by ``torch.compile`` calls wsgemm's op at
run time, so it follows the settings of each call without recompiling. A captured CUDA graph
(``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) replays the kernels of its
capture: it keeps the settings in effect when it was captured.

What each switch does: batch invariance keeps every output element's summation order
independent of the number of rows M (no split-K; docs/policy.md); autotuning times the
candidates of a problem's first call on a Hopper GPU and keeps the fastest (off unless asked;
``autotune_enabled()`` says), and off Hopper, where no table measured ``auto``'s kernel, races
that kernel against torch.matmul at a bucket's first call (on unless autotuning is set False
or ``WSGEMM_AUTOTUNE=0``: docs/policy.md, "Off Hopper");
the disk cache keeps compiled kernels across processes (README, "The compile cache"): off,
each process compiles in memory (and on-line tuning's choices, stored in the same folder,
are kept in memory too).
"""

from __future__ import annotations

import contextlib

from .host import settings as _settings
from .host.choosing import autotune_asked as _autotune_asked
from .host.choosing import batch_invariant_requested as _batch_invariant_requested
from .host.compiling import disk as _disk
from .host.settings import Settings

__all__ = [
    "Settings",
    "autotune",
    "autotune_enabled",
    "race_enabled",
    "batch_invariant",
    "batch_invariant_enabled",
    "current",
    "disk_cache",
    "disk_cache_enabled",
    "set_autotune",
    "set_batch_invariant",
    "set_disk_cache",
]


def current() -> Settings:
    """The settings in effect here as set: True, False, or None where the environment
    variable decides."""
    return _settings.current()


# ----------------------------------------------------------------------------- batch invariance


def batch_invariant_enabled() -> bool:
    """Whether calls here run batch-invariant: the same bits for a row whatever the batch."""
    return _batch_invariant_requested(None)


def set_batch_invariant(enabled: bool | None) -> None:
    """The process default (None: ``WSGEMM_BATCH_INVARIANT``'s)."""
    _settings.set_default("batch_invariant", enabled)


def batch_invariant(enabled: bool | None = True) -> contextlib.AbstractContextManager[Settings]:
    """``with`` block: batch invariance on (or off) in this thread or async task."""
    return _settings.block(batch_invariant=enabled)


# ----------------------------------------------------------------------------- autotune


def autotune_enabled() -> bool:
    """Whether ``backend="auto"`` times the sm90 menu's candidates of a problem's first call
    here (off unless set). Off Hopper the race against torch.matmul runs unless this is set
    False (a block, ``set_autotune`` or ``WSGEMM_AUTOTUNE``): nothing set is on there."""
    return _autotune_asked(_settings.current().autotune) is True


def race_enabled() -> bool:
    """Whether ``backend="auto"``, where no table measured its kernel (off Hopper), races it
    against torch.matmul at a bucket's first call: on unless autotuning is set False here (a
    block, ``set_autotune``) or by ``WSGEMM_AUTOTUNE``."""
    return _autotune_asked(_settings.current().autotune) is not False


def set_autotune(enabled: bool | None) -> None:
    """The process default (None: ``WSGEMM_AUTOTUNE``'s)."""
    _settings.set_default("autotune", enabled)


def autotune(enabled: bool | None = True) -> contextlib.AbstractContextManager[Settings]:
    """``with`` block: on-line tuning on (or off) in this thread or async task."""
    return _settings.block(autotune=enabled)


# ----------------------------------------------------------------------------- disk cache


def disk_cache_enabled() -> bool:
    """Whether a compile here reads and writes the on-disk cache (when it can: ``python -m
    wsgemm cache info`` says whether the folder is usable)."""
    return _disk.enabled()


def set_disk_cache(enabled: bool | None) -> None:
    """The process default (None: ``WSGEMM_DISK_CACHE``'s)."""
    _settings.set_default("disk_cache", enabled)


def disk_cache(enabled: bool | None = True) -> contextlib.AbstractContextManager[Settings]:
    """``with`` block: the on-disk compile cache on (or off) for compiles in this thread or
    async task (a kernel already compiled in this process is reused either way)."""
    return _settings.block(disk_cache=enabled)
