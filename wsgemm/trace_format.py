"""The raw trace buffer a traced kernel writes (issue #13): its layout, event kinds and roles.

Pure Python (no DSL, no torch): the kernels write this layout, the host (``wsgemm.trace``) reads
it, and a recording saved to disk can be re-rendered on a machine without a GPU.

A **recorder** is one lane that records the events of one role in one CTA: the producer warp's
elected lane, lane 0 of each consumer warpgroup's first warp (sm90), lane 0 of each warp of the
sm80 kernels. Each recorder owns one row of the buffer and nobody else writes it.

The buffer is one ``int32`` tensor of shape ``(recorders, HEADER_WORDS + capacity * EVENT_WORDS)``
in device memory, zeroed by the host before the launch. A recorder's row:

* header (``HEADER_WORDS`` words, fields ``HEADER_FIELDS``):

  - ``count``: events the recorder tried to write, including those past ``capacity``: the host
    reports ``max(0, count - capacity)`` as overflow. A recorder never writes past its row.
  - ``smid``, ``cta`` (the CTA's linear index in its grid), ``role`` (``Role``), ``warp`` (the
    warp index in the CTA; for a warpgroup recorder, its first warp);
  - ``timer`` (``Timer``): what the events' times count.
  - ``t0_lo``/``t0_hi``, ``t1_lo``/``t1_hi``: ``%globaltimer`` (ns) when the recorder started
    and finished, and ``c0_lo``/``c0_hi``, ``c1_lo``/``c1_hi``: ``clock64`` at the same two
    instants, so that ``Timer.CLOCK64`` events map to ns by a line through the two anchors.

* then ``capacity`` events of ``EVENT_WORDS`` words each (fields ``EVENT_FIELDS``): ``kind``
  (``Event``), ``t_lo``/``t_hi`` (the 64-bit time), ``tile_m``, ``tile_n``, ``tile_l`` (the
  output tile's coordinates in tiles; -1 where no tile applies), ``k_tile`` (the k-tile index
  within the tile's K range; -1 where none), ``stage`` (the ring stage or epilogue buffer; -1
  where none).

Rows of recorders that never ran (a CTA outside the traced sample) keep ``count == 0`` and
are skipped. Which CTAs record is the kernel's and host's choice (every CTA of a persistent
grid; a bounded sample of a non-persistent one), as is ``capacity`` (from the problem: k-tiles
per tile times tiles per CTA times events per k-tile, capped): both are in the ``RawTrace``
metadata the host keeps next to the buffer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

__all__ = [
    "EVENT_FIELDS",
    "EVENT_WORDS",
    "HEADER_FIELDS",
    "HEADER_WORDS",
    "SPANS",
    "Event",
    "RawTrace",
    "Role",
    "Timer",
]

HEADER_FIELDS = (
    "count",
    "smid",
    "cta",
    "role",
    "warp",
    "timer",
    "t0_lo",
    "t0_hi",
    "t1_lo",
    "t1_hi",
    "c0_lo",
    "c0_hi",
    "c1_lo",
    "c1_hi",
    "reserved0",
    "reserved1",
)
HEADER_WORDS = len(HEADER_FIELDS)  # 16 words = 64 bytes

EVENT_FIELDS = ("kind", "t_lo", "t_hi", "tile_m", "tile_n", "tile_l", "k_tile", "stage")
EVENT_WORDS = len(EVENT_FIELDS)  # 8 words = 32 bytes: two 16-byte stores


class Role(IntEnum):
    """Who recorded a row."""

    PRODUCER = 0  # the warp that issues loads (TMA on sm90, cp.async on the sm80 study kernel)
    CONSUMER = 1  # a warp or warpgroup that issues MMAs and runs the epilogue
    WORKER = 2  # a warp that both loads and computes (the sm80 multistage baseline)


class Timer(IntEnum):
    """What an event's time counts."""

    GLOBALTIMER = 0  # %globaltimer, ns (32 ns steps on Hopper; 1 us on older parts)
    CLOCK64 = 1  # the SM's clock64 cycles; map to ns through the header's anchors


class Event(IntEnum):
    """Event kinds. ``*_BEGIN``/``*_END`` pairs bound a span (``SPANS``); the rest are instants."""

    RECORDER_BEGIN = 1
    RECORDER_END = 2
    TILE_FETCH = 3  # the scheduler handed this recorder's role a tile (tile_m/n/l set)
    # stream-K: right after a unit's TILE_FETCH (whose k_tile is the unit's first k-tile and
    # stage its part), the end of its k-range (k_tile, exclusive) and its tile's part count
    # (stage)
    UNIT_RANGE = 4
    # producer
    WAIT_EMPTY_BEGIN = 10  # waiting for a stage to be released (stage set)
    WAIT_EMPTY_END = 11
    LOAD_ISSUE = 12  # the loads of one k-tile issued into a stage (k_tile, stage set)
    # consumer
    WAIT_FULL_BEGIN = 20  # waiting for a stage's data (k_tile, stage set)
    WAIT_FULL_END = 21
    MMA_ISSUE = 22  # one k-tile's MMAs issued (k_tile, stage set)
    MMA_WAIT_BEGIN = 23  # waiting for issued MMAs to retire
    MMA_WAIT_END = 24
    STAGE_RELEASE = 25  # a stage handed back to the producer (k_tile, stage set)
    ORDER_WAIT_BEGIN = (
        26  # ping-pong: waiting for this warpgroup's turn (stage = 0 MMA, 1 epilogue)
    )
    ORDER_WAIT_END = 27
    EPILOGUE_BEGIN = 30
    STORE_WAIT_BEGIN = 31  # waiting for an epilogue buffer's previous store (stage = buffer)
    STORE_WAIT_END = 32
    EPILOGUE_END = 33
    FIXUP_BEGIN = 40  # split-K / stream-K: combining partial accumulators
    FIXUP_END = 41
    # sm80 multistage baseline: the phases of a warp that loads and computes
    LOAD_BEGIN = 50
    LOAD_END = 51
    COMPUTE_BEGIN = 52
    COMPUTE_END = 53


# A span's name -> (its begin kind, its end kind). The host pairs them per recorder in order.
SPANS: dict[str, tuple[Event, Event]] = {
    "recorder": (Event.RECORDER_BEGIN, Event.RECORDER_END),
    "wait empty": (Event.WAIT_EMPTY_BEGIN, Event.WAIT_EMPTY_END),
    "wait full": (Event.WAIT_FULL_BEGIN, Event.WAIT_FULL_END),
    "mma wait": (Event.MMA_WAIT_BEGIN, Event.MMA_WAIT_END),
    "order wait": (Event.ORDER_WAIT_BEGIN, Event.ORDER_WAIT_END),
    "epilogue": (Event.EPILOGUE_BEGIN, Event.EPILOGUE_END),
    "store wait": (Event.STORE_WAIT_BEGIN, Event.STORE_WAIT_END),
    "fixup": (Event.FIXUP_BEGIN, Event.FIXUP_END),
    "load": (Event.LOAD_BEGIN, Event.LOAD_END),
    "compute": (Event.COMPUTE_BEGIN, Event.COMPUTE_END),
}


#: The layout's version, saved with every recording and required by ``RawTrace.load``. It
#: changes when a recording of an existing kind would read differently (a header or event word
#: moved, a field's meaning changed). An addition that only a new kind of recording uses (a new
#: event kind, a new ``meta`` key: split-K's ``split``, stream-K's ``stream_k`` and
#: ``UNIT_RANGE``) keeps it: every recording saved before reads as it did, and the decoder keeps
#: an event kind it does not know without pairing or drawing it.
RAW_FORMAT_VERSION = 1


@dataclass
class RawTrace:
    """One recorded call: the buffer as the kernel left it, and what is needed to read it.

    ``buffer``: a numpy ``int32`` array ``(recorders, HEADER_WORDS + capacity * EVENT_WORDS)``.
    ``meta``: JSON-able facts, at least ``capacity``, ``backend``, ``config`` (the kernel
    config as a dict), ``shape`` ([M, N, K, L]), ``dtype``, ``out_dtype``, ``accumulate``,
    ``layout``, ``tile`` ([tile_m, tile_n, tile_k]), ``k_tiles``, ``tiles`` ([m, n, l] tile
    counts; a grouped call's ``group_tiles`` instead: [each group's m-tiles, n-tiles], with
    ``groups``, its end rows), ``device``, ``num_sms``, ``arch``, and when measured
    ``traced_us`` / ``untraced_us`` (the same call's time with and without tracing). A split
    recording adds ``split`` (the split-K count traced; 1 or absent: none) or ``stream_k``
    (True: the stream-K schedule, each unit's ``TILE_FETCH`` followed by its ``UNIT_RANGE``).
    """

    buffer: Any
    meta: dict = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.npz``): the buffer and the metadata as JSON."""
        import numpy as np

        path = Path(path)
        meta = dict(self.meta, format_version=RAW_FORMAT_VERSION)
        np.savez_compressed(
            path, buffer=np.asarray(self.buffer, dtype=np.int32), meta=json.dumps(meta)
        )
        return path

    @classmethod
    def load(cls, path: str | Path) -> RawTrace:
        """Read a file written by ``save``; a file that is not one raises ``ValueError``."""
        import numpy as np

        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                buffer = data["buffer"]
                meta = json.loads(str(data["meta"]))
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(
                f"{path} is not a wsgemm raw trace (.npz from `wsgemm trace`): {exc}"
            ) from exc
        version = meta.get("format_version")
        if version != RAW_FORMAT_VERSION:
            raise ValueError(
                f"{path} has raw trace format {version!r}; this wsgemm reads {RAW_FORMAT_VERSION}"
            )
        if buffer.ndim != 2 or buffer.dtype != np.int32 or buffer.shape[1] < HEADER_WORDS:
            raise ValueError(
                f"{path}: the buffer must be int32 (recorders, words), "
                f"got {buffer.dtype} {buffer.shape}"
            )
        return cls(buffer=buffer, meta=meta)
