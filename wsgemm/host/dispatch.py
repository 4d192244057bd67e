"""The dispatcher: every piece of host state behind ``wsgemm.matmul`` in one object.

A ``Dispatcher`` owns what a call needs besides its tensors:

* the device facts (capability, SM count, name) of each CUDA device, asked once per device;
* the backend choice for a problem on a device (``choose_backend``): which kernel ``auto`` runs,
  and whether a named backend runs on that GPU at all;
* the kernel memo: (backend, device, dtypes, majors, config) -> (compiled kernel, clusters to
  launch), over the compile cache (``COMPILE_CACHE`` unless given another);
* the launcher memo that ``wsgemm.api`` fills: one prebuilt launcher per call signature.

The process has one (``DISPATCHER``); a test or a benchmark builds its own with stand-in devices
and a stand-in compile cache instead of patching module globals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .cache import COMPILE_CACHE
from .registry import BACKENDS, Variant, arch_for_capability, cluster_size, shipped_backends

# Cooperative tiles fewer than SMs / this leave most of the machine idle (see auto_sm90).
IDLE_SM_FRACTION = 2


def auto_sm90(m: int, n: int, batch: int | None, sm_count: int) -> str:
    """Cooperative 128x256 tiles unless they would leave most SMs idle: then ping-pong, whose
    128x128 tiles are twice as many. Measured on the H200 (docs/perf.md, entry 5): at 128 tokens
    ping-pong wins the QKV, O and down projections (24 or 16 cooperative tiles, 0.33-0.53x ->
    0.58-0.70x of cuBLAS) and loses gate/up (112 tiles, 0.75x -> 0.60x)."""
    config = BACKENDS["sm90"].config()
    tiles = -(-m // config.tile_m) * -(-n // config.tile_n) * (batch or 1)
    return "sm90-pingpong" if tiles < sm_count // IDLE_SM_FRACTION else "sm90"


class CudaDevices:
    """Facts about this machine's CUDA devices, each asked of the driver once."""

    type = "cuda"  # the torch device type the kernels run on

    def __init__(self) -> None:
        self._facts: dict[int, tuple[tuple[int, int], int, str]] = {}
        self._count: int | None = None

    def available(self) -> bool:
        return torch.cuda.is_available()

    def count(self) -> int:
        if self._count is None:
            self._count = torch.cuda.device_count()
        return self._count

    def _props(self, index: int) -> tuple[tuple[int, int], int, str]:
        facts = self._facts.get(index)
        if facts is None:
            p = torch.cuda.get_device_properties(index)
            facts = self._facts[index] = ((p.major, p.minor), p.multi_processor_count, p.name)
        return facts

    def capability(self, index: int) -> tuple[int, int]:
        return self._props(index)[0]

    def sm_count(self, index: int) -> int:
        return self._props(index)[1]

    def name(self, index: int) -> str:
        return self._props(index)[2]

    def current(self) -> int:
        return torch.cuda.current_device()

    def guard(self, index: int):
        """A context that makes ``index`` the current device (kernels launch on the current one)."""
        return torch.cuda.device(index)


class StandInDevices:
    """The CPU posing as one GPU of a given capability, for a dispatcher whose compile cache
    hands out stand-in kernels (CPU code taking the same arguments): the CPU tests drive the
    whole call path with it, and the host-overhead benchmark times that path without a GPU."""

    type = "cpu"

    def __init__(self, capability: tuple[int, int] = (9, 0), sm_count: int = 132) -> None:
        self._capability, self._sm_count = capability, sm_count

    def available(self) -> bool:
        return True

    def count(self) -> int:
        return 1

    def capability(self, index) -> tuple[int, int]:
        return self._capability

    def sm_count(self, index) -> int:
        return self._sm_count

    def name(self, index) -> str:
        return "a stand-in GPU"

    def current(self) -> None:
        return None  # a CPU tensor's device index

    def guard(self, index):
        raise AssertionError("one stand-in device: nothing to switch to")


class Dispatcher:
    """Device facts, backend choice, compiled kernels and prebuilt launchers (see the module
    docstring). Thread-safe: the memos only grow under a lock; a failed compile or a rejected call
    stores nothing.

    ``max_batch_per_launch``: non-persistent kernels put the batch on the grid's z, which holds
    65535, so larger batches take several launches. ``max_broadcast_copy_bytes``: a broadcast
    operand that cannot be folded is copied once per batch (TMA cannot address a stride-0 batch);
    past this many bytes of copies, one launch per batch is cheaper.
    """

    # Launchers kept; the oldest goes first (a workload with ever-new shapes must not grow memory).
    MAX_LAUNCHERS = 4096

    def __init__(
        self,
        cache: Any = None,
        devices: Any = None,
        *,
        max_batch_per_launch: int = 65535,
        max_broadcast_copy_bytes: int = 64 << 20,
    ) -> None:
        self.cache = COMPILE_CACHE if cache is None else cache
        self.devices = CudaDevices() if devices is None else devices
        self.max_batch_per_launch = max_batch_per_launch
        self.max_broadcast_copy_bytes = max_broadcast_copy_bytes
        self.launchers: dict[Hashable, Any] = {}  # call signature -> launcher (wsgemm.api)
        self._kernels: dict[tuple, tuple[Callable, int]] = {}
        self._lock = threading.Lock()

    # --------------------------------------------------------------------------- backends

    def available_backends(self, device=None) -> list[str]:
        """The backends that run on ``device`` (default: the current device), best first. A kernel
        module that does not import raises here rather than vanishing from the list."""
        if not self.devices.available():
            return []
        index = self._index(device)
        cc = self.devices.capability(index)
        return [n for n in shipped_backends() if BACKENDS[n].supports(cc)]

    def choose_backend(self, backend: str, device: int, m: int, n: int, batch: int | None) -> str:
        """The backend a validated call runs on: ``auto``'s pick for the problem, or the named one
        if it runs on this GPU (ValueError otherwise)."""
        cc = self.devices.capability(device)
        if cc < (8, 0):
            raise ValueError(
                f"{self.devices.name(device)} is sm_{cc[0]}{cc[1]}; wsgemm needs an "
                "sm_80 or newer GPU (cp.async and bf16 tensor cores)"
            )
        if backend == "auto":
            if BACKENDS["sm90"].supports(cc):
                return auto_sm90(m, n, batch, self.devices.sm_count(device))
            return "sm80"
        if not BACKENDS[backend].supports(cc):
            raise ValueError(
                f"backend={backend!r} needs "
                + ("an sm_90 (Hopper) GPU" if BACKENDS[backend].family == "sm90" else "sm_80+")
                + f"; {self.devices.name(device)} is sm_{cc[0]}{cc[1]}"
            )
        return backend

    # --------------------------------------------------------------------------- kernels

    def kernel(
        self,
        backend: str,
        device: int,
        dtypes: tuple[str, str, str],
        a_major: str,
        b_major: str,
        config: Any = None,
    ) -> tuple[Callable, int]:
        """(compiled kernel, clusters to launch) for ``backend`` on ``device``; ``dtypes`` are the
        host names of (A/B, C, accumulator). ``config`` replaces the shipped config (tuning)."""
        key = (backend, device, dtypes, a_major, b_major, config)
        hit = self._kernels.get(key)
        if hit is not None:
            return hit
        if config is not None and config == BACKENDS[backend].config(dtypes[2]):
            # the shipped config under its own name: one compile, not two
            hit = self.kernel(backend, device, dtypes, a_major, b_major, None)
        else:
            arch = arch_for_capability(self.devices.capability(device))
            variant = Variant(backend, arch, *dtypes, a_major, b_major, config)
            clusters = self.devices.sm_count(device) // cluster_size(variant.kernel_config())
            hit = (self.cache.get(variant), clusters)
        with self._lock:
            return self._kernels.setdefault(key, hit)

    def remember(self, signature: Hashable, launcher: Any) -> None:
        """Keep ``launcher`` for ``signature`` (``wsgemm.api`` builds both)."""
        with self._lock:
            if len(self.launchers) >= self.MAX_LAUNCHERS:
                del self.launchers[next(iter(self.launchers))]
            self.launchers[signature] = launcher

    def _index(self, device) -> int:
        if device is None:
            return self.devices.current()
        if isinstance(device, int):
            return device
        index = torch.device(device).index
        return self.devices.current() if index is None else index


DISPATCHER = Dispatcher()
