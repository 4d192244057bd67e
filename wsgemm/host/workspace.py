"""Split-K's buffers: the fp32 workspace of partial sums and the per-tile semaphores a split
kernel (``Sm90Config.split_k != 1``) takes as launch arguments, and ``split_launcher``, which
binds them to a compiled split kernel so it is called like any other kernel.

* The workspace (``config.split_workspace_elements`` fp32 words) is ``torch.empty`` on the
  current device for every launch: torch's caching allocator, ordered on the current stream,
  no ``cudaMalloc`` of ours and no host synchronization. Its contents never matter: every
  word the kernel reads it wrote first in the same launch.
* The semaphores (one int32 per output tile) must be zero when a launch starts; the kernel
  leaves them zero again (the unit that finishes a tile resets its semaphore). So one zeroed
  buffer per (device, stream) is made once and reused by every later launch on that stream,
  which runs after the previous one has finished with it; two streams never share one (their
  launches may overlap). A launch needing more semaphores than the stream's buffer holds
  replaces it with a larger zeroed one (the old one is freed in stream order).
* Under CUDA-graph capture nothing is cached: each captured call gets its own zeroed buffer
  (``torch.zeros`` is a captured memset, and the graph's private pool keeps the memory), so a
  replay starts from zeros whatever ran on the stream before, and the cache never holds memory
  of a graph's pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .compiling.calls import KernelCall

__all__ = ["NO_EPILOGUE_LAUNCH", "UNSPLIT_LAUNCH", "SemaphoreCache", "bias_launcher",
           "split_launcher"]  # fmt: skip


class SemaphoreCache:
    """Zeroed int32 semaphore buffers, one per (device, stream) outside capture."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device, count: int) -> torch.Tensor:
        """At least ``count`` int32 zeros on ``device`` for a launch on its current stream."""
        count = max(count, 1)
        if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            # (a stand-in dispatcher's CPU kernels run on no stream: fresh zeros too)
            return torch.zeros(count, dtype=torch.int32, device=device)
        key = (device.index, torch.cuda.current_stream(device).cuda_stream)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < count:
            buffer = torch.zeros(count, dtype=torch.int32, device=device)
            with self._lock:
                self._buffers[key] = buffer
        return buffer

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()


def split_buffer_sizes(
    config: Any, split: int, m: int, n: int, k: int, batch: int, clusters: int | None = None
):
    """(the split count the kernel runs, workspace words, semaphores) for one split launch of
    ``config`` on (M, N, K, batch): the count clamped as the kernel clamps it
    (``scheduler.effective_splits``), one workspace word when that leaves no split (the kernel
    never touches it, but takes a tensor). A stream-K config (``config.stream_k``) sizes its
    workspace from the clusters it may launch (``clusters``, the launch's bound) and reports
    split 1 (each tile's parts are the schedule's)."""
    from ..kernels.common.scheduler import effective_splits

    if getattr(config, "stream_k", False):
        if clusters is None:
            raise ValueError("a stream-K launch's workspace depends on its clusters")
        check_stream_k_size(config, m, n, k, batch, clusters)
        words = config.stream_k_workspace_elements(m, n, k, batch, clusters)
        return 1, max(words, 1), config.split_semaphores(m, n, batch)
    splits = effective_splits(split, -(-k // config.tile_k))
    words = config.split_workspace_elements(m, n, batch, splits) if splits > 1 else 1
    return splits, words, config.split_semaphores(m, n, batch)


def check_stream_k_size(config: Any, m: int, n: int, k: int, batch: int, clusters: int) -> None:
    """The stream-K schedule's index arithmetic is int32 (``scheduler._stream_k_tile``): its
    largest product, (the shared k-tiles + one tile's) x the ranges sharing them, and (k-tiles
    x clusters^2) must stay below 2^31 (K below ~7.9 M at 132 clusters and 64-deep k-tiles; a
    layout in teams that shares every tile, far fewer tiles' worth)."""
    from ..kernels.common.scheduler import stream_k_layout

    work, k_tiles, team = config.stream_k_problem(m, n, k, batch, clusters)
    _, _, ranges, shared = stream_k_layout(work, k_tiles, clusters, team)
    if k_tiles * clusters * clusters >= 2**31 or (shared + k_tiles) * ranges >= 2**31:
        raise ValueError(
            f"stream-K with K={k} on {clusters} clusters overflows its int32 schedule; "
            "use split-K (config.split_k) or no split for this K"
        )


def split_launcher(fn: Callable, config: Any, split: int, semaphores: SemaphoreCache) -> Callable:
    """``launch(a_mkl, b_nkl, c_mnl, clusters)``: the compiled split kernel ``fn`` (a variant of
    ``config``, an ``Sm90Config`` with ``split_k != 1`` or ``stream_k``) run with K split
    ``split`` ways (a stream-K kernel: its own schedule; the
    kernel clamps the count, ``scheduler.effective_splits``; the buffers are sized with the
    same rule), a fresh workspace and the current stream's semaphores. Called like an unsplit
    kernel, so the API's launchers take either; ``launch.bind`` is ``KernelCall.bind``'s (None
    where ``fn`` has none). The buffer sizes are worked out once per problem shape (a
    launcher's calls share one)."""
    sizes: dict[tuple[int, int, int, int, int], tuple[int, int]] = {}

    def buffer_sizes(a_mkl: torch.Tensor, b_nkl: torch.Tensor, clusters: int) -> tuple[int, int]:
        m, k, batch = a_mkl.shape
        key = (m, b_nkl.shape[0], k, batch, clusters)
        got = sizes.get(key)
        if got is None:
            got = sizes[key] = split_buffer_sizes(config, split, *key)[1:]
        return got

    def buffers(words: int, count: int, device: torch.device) -> tuple:
        """The launch arguments after ``clusters``: raster group, split, a fresh workspace and
        the current stream's semaphores (``UNSPLIT_LAUNCH``'s places)."""
        workspace = torch.empty(words, dtype=torch.float32, device=device)
        return 0, split, workspace, semaphores.get(device, count)

    def launch(a_mkl, b_nkl, c_mnl, clusters: int, *late):
        sized = buffer_sizes(a_mkl, b_nkl, clusters)
        fn(a_mkl, b_nkl, c_mnl, clusters, *buffers(*sized, c_mnl.device), *late)

    def bind(a_mkl, b_nkl, c_mnl, clusters: int, late: int = 0):
        if not isinstance(fn, KernelCall):
            return None
        sized = (*buffer_sizes(a_mkl, b_nkl, clusters), c_mnl.device)
        return fn.bind(a_mkl, b_nkl, c_mnl, clusters, per_call=lambda: buffers(*sized),
                       per_call_count=len(UNSPLIT_LAUNCH), late=late)  # fmt: skip

    launch.bind = bind
    return launch


#: An unsplit sm90 launch's arguments between the clusters and a fused epilogue's bias
#: (``Sm90Gemm.LAUNCH_EXTRAS``): the kernel's own raster order, split 1, no split buffers.
UNSPLIT_LAUNCH = (0, 1, None, None)
#: The fused epilogue's launch arguments when it has none (bias, alpha, beta, C): what comes
#: between ``UNSPLIT_LAUNCH`` and a grouped kernel's row scale and offsets.
NO_EPILOGUE_LAUNCH = (None, None, None, None)


def bias_launcher(fn: Callable) -> Callable:
    """``launch(a_mkl, b_nkl, c_mnl, clusters, bias, alpha, beta, c)``: an unsplit kernel with
    a fused epilogue's launch arguments, called like a split launcher (those last);
    ``launch.bind(..., late=4)`` binds it as ``KernelCall.bind`` does, the four given per
    launch."""

    def launch(a_mkl, b_nkl, c_mnl, clusters: int, *late):
        fn(a_mkl, b_nkl, c_mnl, clusters, *UNSPLIT_LAUNCH, *late)

    def bind(a_mkl, b_nkl, c_mnl, clusters: int, late: int = 0):
        if not isinstance(fn, KernelCall):
            return None
        return fn.bind(a_mkl, b_nkl, c_mnl, clusters, *UNSPLIT_LAUNCH, late=late)

    launch.bind = bind
    return launch
