"""On-line tuning for ``backend="auto"`` on Hopper: ``wsgemm.config.autotune(True)`` or
``WSGEMM_AUTOTUNE=1``, and its store.

The shape policy (``choosing.choose``) answers from a cost model fitted on the H200; on another
sm_90 part (an H100 PCIe with 114 SMs, an H20) the model counts that part's waves, but its constants
are the H200's. With autotuning on, the first call of a problem times every candidate the policy
may pick (``choosing.candidates``: each menu entry that fits, with each split it allows) on
the call's own operands (``tuning.tune``), keeps the fastest for this GPU on disk, and every later
call and process of the same *bucket* (the policy's: M in ``M_QUANTUM``-row blocks, N, K, batch,
dtypes) runs it.

Never while a CUDA graph is being captured, under torch.compile's tracing or on fake tensors:
those calls take the policy's choice. A tuned choice naming an entry or split that the current
menu no longer offers is ignored (re-tuned). docs/policy.md.

The store: ``<cache root>/autotune/<GPU name>-<SMs>sm.json`` (the compile cache's root,
``compiling.disk.location``, so ``cache clear`` clears both; in memory only where there is no
cache root), written atomically; a file that does not parse is set aside with a warning and
tuning starts over.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import tempfile
import threading
import warnings
from pathlib import Path

from ..compiling.disk import location
from ..settings import FALSE_WORDS, TRUE_WORDS
from .menu import MENU, m_block
from .rules import Choice, batch_invariant_requested, candidates

ENV_AUTOTUNE = "WSGEMM_AUTOTUNE"
SCHEMA = 1


class AutotuneWarning(UserWarning):
    """The tuned-choice store could not be read or written (tuning goes on in memory)."""


@functools.cache
def environment() -> bool | None:
    """What ``WSGEMM_AUTOTUNE`` says (``host.settings``' words; read once, at the first call):
    True or False, or None where it is unset (or not one of the words: a warning, then None).
    The default where ``wsgemm.config`` sets nothing (the dispatcher asks the setting first);
    None leaves the default to the reader: off for the sm90 menu's tuning, on for the race
    against torch.matmul where no table measured ``auto``'s kernel (``route_choice``)."""
    word = os.environ.get(ENV_AUTOTUNE, "").strip().lower()
    if word and word not in TRUE_WORDS | FALSE_WORDS:
        warnings.warn(
            f"{ENV_AUTOTUNE}={os.environ[ENV_AUTOTUNE]!r} is not one of "
            f"{', '.join(sorted(TRUE_WORDS | FALSE_WORDS))}; it is ignored",
            AutotuneWarning,
            stacklevel=2,
        )
    if word in TRUE_WORDS:
        return True
    return False if word in FALSE_WORDS else None


def asked(setting: bool | None) -> bool | None:
    """The autotune switch as set: ``setting`` (a dispatcher's argument, else
    ``wsgemm.config``'s) where it says, else ``WSGEMM_AUTOTUNE`` (``environment``); None where
    neither says. Its two readings: the sm90 menu's tuning is ``asked(...) is True`` (off
    unless asked), the race against torch.matmul ``asked(...) is not False`` (on unless set
    off)."""
    return environment() if setting is None else setting


def bucket(
    m: int, n: int, k: int, batch: int, dtypes: tuple[str, str, str], invariant: bool = False,
    mufu: int = 0,
) -> str:  # fmt: skip
    """The store's key for a problem: what ``choose`` distinguishes, batch-invariant
    mode included (its candidates differ: no split), and a fused activation's MUFU work per
    element (``cost.EPILOGUE_MUFU``: its candidates were timed with it; 0, none, for a plain
    call or a bias)."""
    key = f"m{m_block(m)}-n{n}-k{k}-b{batch}-" + "-".join(dtypes)
    return key + ("-invariant" if invariant else "") + (f"-mufu{mufu}" if mufu else "")


class TunedStore:
    """Tuned choices per GPU model: bucket -> (menu entry name, split, timings). ``root``: the
    folder holding ``autotune/`` (None: ``location()``'s root; in memory where none)."""

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        # per (GPU model, SMs, file): the file follows the disk-cache setting (None: off, the
        # choices in memory), so a choice read under one setting is not served under another
        self._files: dict[tuple[str, int, Path | None], dict] = {}
        self._lock = threading.Lock()

    def _path(self, device: str, sm_count: int) -> Path | None:
        root = self._root if self._root is not None else location().root
        if root is None:
            return None
        slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-") or "gpu"
        return Path(root) / "autotune" / f"{slug}-{sm_count}sm.json"

    def _file_mode(self) -> int:
        """As the compile cache's entries: private, or readable by all with
        ``WSGEMM_CACHE_SHARED`` (the umask applied)."""
        if self._root is None and location().shared:
            umask = os.umask(0o22)
            os.umask(umask)
            return 0o666 & ~umask
        return 0o600

    def _load(self, device: str, sm_count: int) -> dict:
        path = self._path(device, sm_count)
        key = (device, sm_count, path)
        if key not in self._files:
            self._files[key] = self._read(path)
        return self._files[key]

    @staticmethod
    def _read(path: Path | None) -> dict:
        if path is None or not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            if (
                not isinstance(data, dict)
                or data.get("schema") != SCHEMA
                or not isinstance(data.get("choices"), dict)
            ):
                raise ValueError(f"not a schema-{SCHEMA} tuned-choice file")
            return data["choices"]
        except (OSError, ValueError) as exc:
            bad = path.with_suffix(".bad")
            try:
                os.replace(path, bad)
            except OSError:
                pass
            warnings.warn(
                f"wsgemm autotune: {path} could not be read ({exc}); set aside as {bad.name}, "
                "tuning starts over",
                AutotuneWarning,
                stacklevel=4,
            )
            return {}

    def get(self, device: str, sm_count: int, key: str) -> tuple[str, int] | None:
        """The tuned (entry name, split) of ``key`` on this GPU model, or None."""
        found = self.record(device, sm_count, key)
        if found is None:
            return None
        name, split = found.get("entry"), found.get("split")
        if not isinstance(name, str) or not isinstance(split, int):
            return None
        return name, split

    def record(self, device: str, sm_count: int, key: str) -> dict | None:
        """Everything ``put`` kept for ``key`` on this GPU model (winner, split, every
        candidate's ms), or None."""
        with self._lock:
            found = self._load(device, sm_count).get(key)
        return found if isinstance(found, dict) else None

    def put(
        self, device: str, sm_count: int, key: str, name: str, split: int, times: dict[str, float]
    ) -> None:
        """Keep ``key``'s winner (and every candidate's ms, for the record) in memory and on
        disk, merged with what other processes stored meanwhile."""
        record = {"entry": name, "split": split, "ms": times}
        with self._lock:
            choices = self._load(device, sm_count)
            choices[key] = record
            path = self._path(device, sm_count)
            if path is None:
                return
            tmp = None
            try:
                # what other processes stored meanwhile, plus this key (never this process's
                # older memory of other keys over theirs)
                on_disk = self._read(path) if path.exists() else {}
                on_disk[key] = record
                choices.update(on_disk)
                path.parent.mkdir(parents=True, exist_ok=True)
                body = {"schema": SCHEMA, "device": device, "sm_count": sm_count,
                        "choices": on_disk}  # fmt: skip
                with tempfile.NamedTemporaryFile(
                    "w", dir=path.parent, prefix=".tmp-", delete=False
                ) as f:
                    tmp = f.name
                    json.dump(body, f, indent=1, sort_keys=True)
                os.chmod(tmp, self._file_mode())
                os.replace(tmp, path)
                tmp = None
            except OSError as exc:
                warnings.warn(
                    f"wsgemm autotune: cannot write {path} ({exc}); the choice is kept in memory",
                    AutotuneWarning,
                    stacklevel=3,
                )
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)


def tuned_choice(store: TunedStore, device: str, sm_count: int, cc, m, n, k, batch, dtypes,
                 batch_invariant: bool | None = None, mufu: int = 0) -> Choice | None:  # fmt: skip
    """The stored choice for this problem (with a fused activation of ``mufu``: ``bucket``)
    as a ``Choice`` (source "tuned"), or None when none is stored or it names a candidate the
    policy no longer allows."""
    invariant = batch_invariant_requested(batch_invariant)
    key = bucket(m, n, k, batch, dtypes, invariant, mufu)
    found = store.get(device, sm_count, key)
    if found is None:
        return None
    allowed = candidates(m, n, k, batch, *dtypes, sm_count, cc, batch_invariant=batch_invariant)
    for e, split in allowed:
        if (e.name, split) == found:
            why = (f"tuned on this GPU (autotune on): the fastest of {len(allowed)} "
                   f"candidates for {key}")  # fmt: skip
            return Choice(e, split, why, "tuned")
    return None


def remember(store: TunedStore, device: str, sm_count: int, m, n, k, batch, dtypes,
             invariant: bool, times: dict[tuple[str, int], float], mufu: int = 0
             ) -> None:  # fmt: skip
    """Keep the fastest of ``times`` ((entry name, split) -> ms per call) for the problem's
    bucket (its fused activation's ``mufu`` included), with every candidate's time."""
    name, split = fastest(times)
    record = {f"{c[0]}/{c[1]}": round(t, 5) for c, t in times.items()}
    key = bucket(m, n, k, batch, dtypes, invariant, mufu)
    store.put(device, sm_count, key, name, split, record)


def fastest(times: dict[tuple[str, int], float]) -> tuple[str, int]:
    """The (entry name, split) with the least time; ties go to the earlier in menu order."""
    order = {e.name: i for i, e in enumerate(MENU)}
    return min(times, key=lambda c: (times[c], order.get(c[0], len(order)), c[1]))


def store_info(root: Path) -> tuple[int, int]:
    """(GPU models, tuned choices) kept under cache root ``root``."""
    models = choices = 0
    for path in sorted((Path(root) / "autotune").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            choices += len(data.get("choices") or {})
            models += 1
        except (OSError, ValueError, AttributeError):
            continue
    return models, choices


def store_listing(root: Path) -> list[tuple[str, int, str, str, int, str]]:
    """Every stored pick under cache root ``root``: (GPU model, SMs, bucket key, the winner: an
    entry name or, for a route decision (``route_choice``), the family or "torch", its split,
    and its time against the others' as text), sorted by GPU model and key."""
    rows = []
    for path in sorted((Path(root) / "autotune").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            device, sm_count = str(data["device"]), int(data["sm_count"])
            for key, record in sorted(data["choices"].items()):
                ms = record.get("ms") or {}
                mine = f"{record['entry']}/{record['split']}"
                best = ms.get(mine, ms.get(record["entry"]))
                others = [t for name, t in ms.items() if name not in (mine, record["entry"])]
                said = f"{len(ms)} timed" if ms else "no times kept"
                if best and others:
                    said += f", {min(others) / best:.2f}x the next"
                rows.append((device, sm_count, key, str(record["entry"]),
                             int(record["split"]), said))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return rows


def clear(root: Path) -> int:
    """Remove every tuned choice under cache root ``root``; returns the files removed."""
    folder = Path(root) / "autotune"
    removed = 0
    for path in folder.glob("*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass
    STORE._files.clear()  # this process's memory of them, too
    return removed


STORE = TunedStore()
