"""Record one traced call (issue #13): ``record(a, b, backend=...) -> RawTrace``.

The call is validated as ``matmul`` validates it and planned the same way (kernel views of the
operands); then the chosen kernel's traced variant (``plan.compile_traced``, compiled once per
process) runs once into a zeroed buffer sized by ``plan.plan_trace``, and the buffer comes back
to the host with the facts needed to read it (``RawTrace.meta``). With ``measure=True`` the same
call is also timed traced and untraced (``measure.median_us``) so the tracing overhead can be
reported.

The decoder, the consistency checks and the renderers are this package's other modules.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import host
from ..api import DISPATCHER, batched, validate
from ..api.dispatch import kernel_views
from ..host.workspace import split_buffer_sizes, split_launcher
from ..kernels.common.trace import timer_for
from ..trace_format import HEADER_FIELDS, RawTrace
from . import plan
from .measure import median_us

__all__ = ["NoGpuError", "consumers_per_tile", "record", "record_gated_grad", "record_grouped"]


class NoGpuError(RuntimeError):
    """Recording a trace needs a CUDA GPU, and there is none."""


def record(
    a,
    b,
    *,
    backend: str = "auto",
    config=None,
    out_dtype=None,
    accumulate=None,
    capacity: int | None = None,
    max_ctas: int | None = None,
    measure: bool = True,
    out=None,
    split_k: bool = False,
) -> RawTrace:
    """Run ``a @ b`` once on ``backend``'s traced kernel and return what it recorded.

    Args:
        a, b, out_dtype, config: as ``wsgemm.api.matmul``; ``accumulate`` None means
            torch.float32.
        backend: ``"auto"`` (the kernel and config ``matmul`` would pick) or a backend name.
        split_k: trace the split ``matmul`` runs: its split-K count (its units' ``FIXUP_*``
            events, each unit's split in its ``TILE_FETCH``), or a stream-K config's schedule
            (each unit's part in its ``TILE_FETCH``, its k-range's end and its tile's part
            count in the ``UNIT_RANGE`` after it); False (the default) traces a split choice
            unsplit. ``meta["split"]`` is the split-K count traced, ``meta["stream_k"]``
            whether the stream-K schedule was, ``meta["policy_split"]`` the count ``matmul``
            runs. Both ran on an H100 (docs/trace.md; docs/perf.md entry 104).
        capacity: events per recorder row (None: planned from the problem,
            ``plan.plan_trace``); a recorder past it counts its overflow.
        max_ctas: trace only the first this many CTAs (None: every CTA of a persistent sm90
            grid, ``plan.DEFAULT_SM80_WAVES`` waves of the sm80 grid).
        measure: also time the call traced and untraced (``meta["traced_us"]``,
            ``meta["untraced_us"]``).
        out: where the product goes (a tensor ``matmul`` would accept as ``out``); None
            allocates one and drops it.

    Returns:
        a ``RawTrace``: the buffer (numpy int32) and ``meta`` (``trace_format.RawTrace``
        lists the keys; also ``recorders_per_cta``, ``ctas_launched``, ``ctas_traced``,
        ``consumers_per_tile``, ``cluster``, ``schedule``, ``timer``, ``overflow``,
        ``policy_split``, ``stream_k``).

    Raises:
        NoGpuError: no CUDA GPU. TypeError / ValueError: bad arguments (as ``matmul``), a bad
        ``capacity`` or ``max_ctas``, a backend that does not run on this GPU, or a call the
        traced kernels do not cover (an empty product, more than one launch).
    """
    if not torch.cuda.is_available():
        raise NoGpuError(
            "recording a trace runs the kernel on a CUDA GPU and none is available; "
            "a recorded trace (RawTrace.save) can be re-rendered without one"
        )
    if not isinstance(split_k, bool):
        raise TypeError(f"split_k must be a bool, got {type(split_k).__name__}")
    if accumulate is None:
        accumulate = torch.float32
    p = validate(a, b, out, out_dtype, accumulate, backend, config)
    _check_sampling(capacity, max_ctas)
    if min(p.m, p.n, p.k, 1 if p.batch is None else p.batch) == 0:
        raise ValueError(
            f"nothing to trace: M={p.m}, N={p.n}, K={p.k}, batch={p.batch} (every one must be "
            ">= 1 for a kernel to run)"
        )
    d = DISPATCHER
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    route = d.route(backend, device, (p.m, p.n, p.k, p.batch), p.dtype_names, config)
    # a cluster split is not traced (its kernel refuses the recorders): its ways through the
    # workspace, which the trace draws as a split (docs/trace.md)
    route = route.in_workspace()
    # a stream-K config runs split 1 (each tile's parts are its schedule's)
    stream_k = split_k and getattr(route.config, "stream_k", False)
    traced_split = route.split if split_k else 1
    if getattr(route.config, "splits_in_kernel", False) and traced_split == 1 and not stream_k:
        # traced unsplit
        unsplit = dataclasses.replace(route.config, split_k=1, stream_k=False)
        route = dataclasses.replace(route, config=unsplit)

    if out is None:
        out = torch.empty(p.out_shape, dtype=p.c_dtype, device=a.device)
    launch, _ = kernel_views(*batched(a, b, out), route)  # as matmul plans it (swap-AB too)
    m, k, L = launch.a.shape
    n = launch.c.shape[1]
    if L > d.max_batch_per_launch:
        raise ValueError(f"a batch of {L} takes several launches; a trace records one (<= "
                         f"{d.max_batch_per_launch})")  # fmt: skip
    variant = host.Variant(
        route.backend, host.arch_for_capability(d.devices.capability(device)), *p.dtype_names,
        launch.a_major, launch.b_major, route.config,
    )  # fmt: skip
    kernel_config = variant.kernel_config()
    if host.BACKENDS[route.backend].family == "sm80":
        from ..kernels.sm80.kernel import launch_columns

        if n > launch_columns(kernel_config):
            raise ValueError(f"N={n} takes several sm80 launches; a trace records one")

    num_sms = d.devices.sm_count(device)
    # the traced entry takes every launch argument after the buffer: the family's defaults
    # (``LAUNCH_EXTRAS``: split count, workspace, semaphores, then the epilogue's), the split's
    # three when the call splits
    extras = host.BACKENDS[route.backend].kernel_class().LAUNCH_EXTRAS
    split_args: tuple = tuple(default for _, default in extras)
    if traced_split > 1 or stream_k:
        # (stream-K's workspace is sized by the clusters it may launch: ``_launched``'s)
        clusters = num_sms // host.cluster_size(kernel_config)
        traced_split, words, count = split_buffer_sizes(kernel_config, traced_split, m, n, k, L,
                                                        clusters)  # fmt: skip
        workspace = torch.empty(words, dtype=torch.float32, device=a.device)
        split_args = (traced_split, workspace, d.semaphores.get(a.device, count), *split_args[3:])
    tplan = plan.plan_trace(
        route.backend, kernel_config, (m, n, k, L), num_sms, capacity=capacity,
        max_ctas=max_ctas, split=traced_split,
    )  # fmt: skip
    untraced = None
    if measure:
        untraced, _ = d.kernel(
            route.backend, device, p.dtype_names, launch.a_major, launch.b_major, route.config
        )
        if traced_split > 1 or stream_k:
            untraced = split_launcher(untraced, route.config, traced_split, d.semaphores)
    views = (launch.a, launch.b, launch.c)
    raw, timing = _launched(variant, kernel_config, device, num_sms, tplan, views, split_args,
                            untraced and (lambda clusters: untraced(*views, clusters)),
                            launch.finish)  # fmt: skip
    meta = _meta(raw, tplan, variant, kernel_config, d, device, timing,
                 shape=[p.m, p.n, p.k, 1 if p.batch is None else p.batch],
                 tiles=[-(-m // kernel_config.tile_m), -(-n // kernel_config.tile_n), L],
                 split=traced_split, policy_split=route.split, stream_k=stream_k)  # fmt: skip
    return RawTrace(buffer=raw, meta=meta)


def _check_sampling(capacity, max_ctas) -> None:
    """``capacity`` and ``max_ctas`` are None or ints >= 1 (TypeError / ValueError)."""
    for name, value in (("capacity", capacity), ("max_ctas", max_ctas)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _launched(variant, config, device, num_sms, tplan, views, extras, untraced=None,
              finish=None) -> tuple:  # fmt: skip
    """``variant``'s traced build launched once on ``views`` (A, B, C) with the launch
    arguments after the buffer ``extras``, on the grid the dispatcher launches, into a zeroed
    buffer of ``tplan``'s size: (the buffer on the host, the timing: {} or, with ``untraced``
    (the same launch untraced, a call of the clusters), both calls' median us). ``finish``:
    run after each launch (a result copied out of a scratch C)."""
    with torch.cuda.device(device):
        traced = plan.cached_traced(variant)
        clusters = num_sms // host.cluster_size(config)  # as the dispatcher launches
        buffer = torch.zeros((tplan.recorders, tplan.words), dtype=torch.int32,
                             device=views[0].device)  # fmt: skip
        traced(*views, clusters, 0, buffer, *extras)
        if finish is not None:
            finish()
        raw = buffer.cpu().numpy()
        timing = {}
        if untraced is not None:
            timing = {
                "traced_us": median_us(lambda: traced(*views, clusters, 0, buffer, *extras)),
                "untraced_us": median_us(lambda: untraced(clusters)),
            }
            if finish is not None:
                finish()
    return raw, timing


def _meta(raw, tplan, variant, config, d, device, timing, **fields) -> dict:
    """A recording's ``meta`` (``RawTrace``): the launch's facts every recording has, then
    ``fields`` (its shape, tile grid, splits, ...)."""
    counts = raw[:, HEADER_FIELDS.index("count")]
    return {
        "capacity": tplan.capacity,
        "backend": variant.backend,
        "config": dataclasses.asdict(config),
        "dtype": variant.ab_dtype,
        "out_dtype": variant.c_dtype,
        "accumulate": variant.acc_dtype,
        "layout": ("T" if variant.a_major == "k" else "N")
        + ("N" if variant.b_major == "k" else "T"),
        "tile": [config.tile_m, config.tile_n, config.tile_k],
        "k_tiles": tplan.k_tiles,
        "device": d.devices.name(device),
        "num_sms": d.devices.sm_count(device),
        "arch": variant.arch,
        **timing,
        "recorders_per_cta": tplan.recorders_per_cta,
        "ctas_launched": tplan.ctas_launched,
        "ctas_traced": tplan.ctas_traced,
        "consumers_per_tile": consumers_per_tile(variant.backend, config),
        "cluster": [getattr(config, "cluster_m", 1), getattr(config, "cluster_n", 1)],
        "schedule": getattr(config, "schedule", None),
        "timer": int(timer_for(variant.arch)),
        "overflow": int(sum(max(0, int(c) - tplan.capacity) for c in counts)),
        **fields,
    }


def record_grouped(
    a,
    b,
    offs,
    *,
    backend: str = "auto",
    out_dtype=None,
    capacity: int | None = None,
    max_ctas: int | None = None,
    measure: bool = True,
    out=None,
) -> RawTrace:
    """Run ``wsgemm.grouped_mm(a, b, offs)`` (the 2D x 3D form: ``a`` (M, K) rows sorted by
    group, ``b`` (G, K, N), ``offs`` the groups' int32 end rows) once on the traced variant of
    its grouped kernel and return what it recorded, as ``record`` does. Each ``TILE_FETCH``
    carries the tile's index inside its group (``tile_m``), its column tile and its group
    (``tile_l``); ``meta["groups"]`` holds the groups' end rows and ``meta["group_tiles"]``
    each group's m-tiles (the consistency checks' tile set). Reads ``offs`` on the host (a
    sync: a trace is a diagnostic). ``out``: where the product goes (a tensor ``grouped_mm``
    would accept as ``out``; its rows past ``offs[-1]`` left as they were); None allocates one
    and drops it. GPU-run on an H100 (docs/trace.md; docs/perf.md entry 86).

    Raises NoGpuError without a CUDA GPU; what ``grouped_mm`` raises for bad arguments; a
    ValueError where the call runs no grouped kernel (``api.grouped.kernel_launch``)."""
    from ..api import grouped as grouped_api

    if not torch.cuda.is_available():
        raise NoGpuError("recording a trace runs the kernel on a CUDA GPU and none is available")
    _check_sampling(capacity, max_ctas)
    d = grouped_api.host_dispatcher()
    launch = grouped_api.kernel_launch(d, a, b, offs, backend, out_dtype, out)
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    arch = host.arch_for_capability(d.devices.capability(device))
    variant = host.Variant(launch.backend, arch, launch.dtypes[0], launch.dtypes[1],
                           launch.dtypes[2], launch.a_major, launch.b_major, launch.config,
                           grouping="m")  # fmt: skip
    config = variant.kernel_config()
    (m, k), n = a.shape, b.shape[2]
    ends = [int(e) for e in offs.tolist()]  # the host's copy: the tile set to check against
    group_tiles, tiles_n, work, bound = grouped_units(ends, m, n, config)
    num_sms = d.devices.sm_count(device)
    tplan = plan.plan_trace(launch.backend, config, (m, n, k, 1), num_sms, capacity=capacity,
                            max_ctas=max_ctas, units=(max(work, 1), bound))  # fmt: skip
    kernel_class = host.BACKENDS[launch.backend].kernel_class("m")
    extras = [default for _, default in kernel_class.LAUNCH_EXTRAS]
    extras[-1] = offs.contiguous()  # the last launch argument: the groups' ends
    views = (launch.a, launch.b, launch.c)
    untraced = _untraced(d, variant, device, views, extras) if measure else None
    raw, timing = _launched(variant, config, device, num_sms, tplan, views, extras, untraced)
    meta = _meta(raw, tplan, variant, config, d, device, timing, shape=[m, n, k, 1],
                 groups=ends, group_tiles=[group_tiles, tiles_n], split=1,
                 policy_split=1)  # fmt: skip
    return RawTrace(buffer=raw, meta=meta)


def record_gated_grad(
    dy,
    w_down,
    preact,
    activation: str = "silu",
    *,
    capacity: int | None = None,
    max_ctas: int | None = None,
    measure: bool = True,
    out=None,
) -> RawTrace:
    """Run ``api.gated.gated_grad(dy, w_down, preact, activation)`` (a ``GatedMLP`` backward's
    dh GEMM with the gated unit's gradient in its epilogue, ``Epilogue.dgated``) once on the
    traced variant of its kernel and return what it recorded, as ``record`` does: where its
    time goes against the plain dh GEMM's (docs/perf.md entry 81: 1.27-1.37x). Its epilogue
    records its span, not its store waits. ``out``: where ``d[gate | up]`` goes (a contiguous
    (M, 2I) tensor of dy's dtype); None allocates one and drops it. GPU-run on an H100
    (docs/trace.md; docs/perf.md entries 86, 115).

    Raises NoGpuError without a CUDA GPU; what ``gated_grad`` raises for bad arguments; a
    ValueError where the call runs no dgated kernel (``api.gated.grad_launch`` says why)."""
    from ..api import gated as gated_api

    if not torch.cuda.is_available():
        raise NoGpuError("recording a trace runs the kernel on a CUDA GPU and none is available")
    _check_sampling(capacity, max_ctas)
    d = DISPATCHER
    launch = gated_api.grad_launch(d, dy, w_down, preact, activation, out)
    device = launch.index
    arch = host.arch_for_capability(d.devices.capability(device))
    variant = host.Variant(launch.backend, arch, *launch.dtypes, launch.a_major, launch.b_major,
                           launch.config, launch.epilogue)  # fmt: skip
    config = variant.kernel_config()
    (m, k), half = dy.shape, w_down.shape[1]
    num_sms = d.devices.sm_count(device)
    tplan = plan.plan_trace(launch.backend, config, (m, half, k, 1), num_sms, capacity=capacity,
                            max_ctas=max_ctas)  # fmt: skip
    kernel_class = host.BACKENDS[launch.backend].kernel_class()
    extras = [default for _, default in kernel_class.LAUNCH_EXTRAS]
    extras[-1] = launch.c_in  # the pre-activation's gate half: the epilogue's C
    views = (launch.a, launch.b, launch.c)
    untraced = _untraced(d, variant, device, views, extras) if measure else None
    raw, timing = _launched(variant, config, device, num_sms, tplan, views, extras, untraced)
    meta = _meta(raw, tplan, variant, config, d, device, timing, shape=[m, half, k, 1],
                 epilogue=launch.epilogue,
                 tiles=[-(-m // config.tile_m), -(-half // config.tile_n), 1], split=1,
                 policy_split=1)  # fmt: skip
    return RawTrace(buffer=raw, meta=meta)


def _untraced(d, variant, device, views, extras):
    """The untraced launch of ``variant`` on ``views`` with the launch arguments ``extras``
    (raster group 0), as a call of the clusters (``_launched``'s ``untraced``)."""
    fn, _ = d.kernel(variant.backend, device, (variant.ab_dtype, variant.c_dtype,
                     variant.acc_dtype), variant.a_major, variant.b_major, variant.config,
                     variant.epilogue, variant.grouping)  # fmt: skip
    return lambda clusters: fn(*views, clusters, 0, *extras)


def grouped_units(ends: list[int], rows: int, n: int, config) -> tuple[list[int], int, int, int]:
    """A ragged-M grouped launch of ``rows`` rows and ``n`` columns with group ends ``ends``
    (``offs``) on ``config``: (each group's m-tiles, the n-tiles, the work units its groups
    hold, the unit bound its grid is sized by), the arithmetic of the kernel's schedule
    (``kernels.common.grouped_scheduler``: ends clamped to [the previous end, rows], each
    group's m-tiles in whole clusters along M times the cluster columns)."""
    from ..kernels.common.grouped_scheduler import unit_bound

    cm, cn = config.cluster_m, config.cluster_n
    tiles_n = -(-n // config.tile_n)
    clusters_n = -(-tiles_n // cn)
    group_tiles, start = [], 0
    for e in ends:
        end = min(max(e, start), rows)
        group_tiles.append(-(-(end - start) // config.tile_m))
        start = end
    work = sum(-(-t // cm) for t in group_tiles) * clusters_n
    return group_tiles, tiles_n, work, unit_bound(rows, len(ends), config.tile_m, cm, clusters_n)


def consumers_per_tile(backend: str, config) -> int:
    """How many consumer (or worker) recorders fetch each output tile: both warpgroups of a
    cooperative sm90 CTA, one ping-pong warpgroup, every MMA warp of an sm80 CTA."""
    if host.BACKENDS[backend].family == "sm90":
        return 1 if config.pingpong else 2
    return config.mma_warps
