"""The dispatcher: every piece of host state behind ``wsgemm.matmul`` in one object.

A ``Dispatcher`` owns what a call needs besides its tensors:

* the device facts (capability, SM count, name) of each CUDA device, asked once per device;
* the route of a problem on a device (``route``): which kernel ``auto`` runs (torch.matmul where
  wsgemm has no kernel for the GPU or dtypes, or none that competes: ``support.TARGETS``; on
  sm_90 the shape policy's menu entry and split-K count, ``host.choosing``; with
  ``WSGEMM_AUTOTUNE``, the fastest candidate, timed through the caller's ``run``; where no
  table measured the kernel, the sm80 family's off Hopper, that kernel or torch.matmul, raced
  through ``run`` unless autotuning is set off: ``choosing.route_choice``), and whether a
  named backend runs on that GPU at all; ``explain`` says the same in words;
* the kernel memo: (backend, device, dtypes, majors, config) -> (compiled kernel, clusters to
  launch), over the compile cache (``COMPILE_CACHE`` unless given another);
* the launcher memo that ``wsgemm.api`` fills: one prebuilt launcher per call signature;
* split-K's semaphores, one zeroed buffer per (device, stream) (``host.workspace``).

The process has one (``DISPATCHER``); a test or a benchmark builds its own with stand-in devices
and a stand-in compile cache instead of patching module globals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from .. import support
from ..support import MAX_GRID_DIM
from . import choosing
from .compiling.cache import COMPILE_CACHE
from .registry import (
    BACKENDS,
    Variant,
    arch_for_capability,
    cluster_size,
    cluster_split_config,
    fuses_epilogues,
    runs_over_cluster,
    shipped_backends,
)
from .settings import block as settings_block
from .settings import current as current_settings
from .workspace import SemaphoreCache

log = logging.getLogger("wsgemm")

# run(route) -> what to time: launches ``route`` once on the caller's operands (into a scratch
# output) and returns a callable that launches its kernel alone (``wsgemm.api``'s; ``route``).
Runner = Callable[["Route"], Callable[[], object]]
# The policy's own answers, which WSGEMM_AUTOTUNE replaces by a measurement ("tuned" is one).
_TUNABLE = ("table", "model", "default")
_NO_SWITCH = contextlib.nullcontext()
#: The route's backend where ``auto`` runs torch.matmul (``wsgemm.api.fallback``): no wsgemm
#: kernel for this GPU or these dtypes, none that can compete (``support.TARGETS``), or one no
#: table measured here that did not win a race against it (``choosing.route_choice``).
TORCH = choosing.route_choice.TORCH
_RACE = choosing.route_choice


@dataclass(frozen=True)
class Route:
    """How a validated problem runs: a backend, its config (None: the shipped one) and a split-K
    count (1: none; more: the config is a split kernel's, ``split_k=0``, and the count its
    launch argument, ``host.workspace.split_launcher``). ``choice`` is the policy's answer when
    ``auto`` picked from the sm90 menu; ``reason`` why ``auto`` runs torch.matmul when
    ``backend`` is :data:`TORCH`, or its kernel where it chose between the two
    (``choosing.route_choice``). ``keep`` False: a default taken where a race could not run
    yet: a captured or traced call's signature keeps no launcher for it (the next call races);
    an eager call that cannot race (alpha, a residual) keeps one until a race stores a
    decision (``Dispatcher.remember``'s ``provisional``)."""

    backend: str
    config: Any = None
    split: int = 1
    choice: choosing.Choice | None = None
    reason: str = ""
    keep: bool = True

    def in_workspace(self) -> Route:
        """This route with a cluster split's parts through the workspace instead (the same
        ways, ``split_k``'s kernel): for what a cluster split kernel does not run (a traced
        call, an epilogue that reads C or stores a second output:
        ``Epilogue.rides_cluster_split``). Any other route is returned as it is."""
        ways = getattr(self.config, "cluster_split", 1)
        if ways == 1:
            return self
        config = dataclasses.replace(self.config, cluster_split=1, split_k=0)
        return dataclasses.replace(self, config=config, split=ways)

    def for_epilogue(self, epilogue) -> Route:
        """The route a launch whose kernel runs ``epilogue`` (an ``Epilogue``) takes: this one,
        or where its cluster split kernel does not run that epilogue
        (``registry.runs_over_cluster``), the same ways through the workspace."""
        if getattr(self.config, "cluster_split", 1) == 1:
            return self
        return self if runs_over_cluster(self.backend, epilogue) else self.in_workspace()

    @property
    def k_parts(self) -> int:
        """How many parts K is split into, in either form: the workspace split's count, or a
        cluster split's ways (``config.cluster_split``: the policy's split run over a cluster,
        ``choice_route``); 1 unsplit."""
        return self.split if self.split > 1 else getattr(self.config, "cluster_split", 1)


class CudaDevices:
    """Facts about this machine's CUDA devices, each asked of the driver once."""

    type = "cuda"  # the torch device type the kernels run on

    def __init__(self) -> None:
        self._facts: dict[int, tuple[tuple[int, int], int, str]] = {}
        self._count: int | None = None
        self._clusters: dict[tuple[int, int], int] = {}

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

    def clusters(self, index: int, size: int) -> int:
        """Clusters of ``size`` CTAs (one per SM) the device holds at once: ``sm_count //
        size`` for 1 and 2, the driver's occupancy answer above (a cluster lies in one GPC, and
        a GPC's SMs need not come in fours), asked once. The persistent grid launches no more
        than this, or the rest would run as a second wave."""
        whole = self.sm_count(index) // size
        if size <= 2:
            return whole
        key = (index, size)
        if key not in self._clusters:
            try:
                from cutlass.utils import HardwareInfo

                with torch.cuda.device(index):
                    torch.cuda.init()
                    fit = HardwareInfo(index).get_max_active_clusters(size)
                self._clusters[key] = max(1, min(whole, int(fit)))
            except Exception as e:  # noqa: BLE001  (a driver without the query: the SM count's)
                log.warning("clusters of %d CTAs: the occupancy query failed (%s); launching "
                            "%d", size, e, whole)  # fmt: skip
                self._clusters[key] = whole
        return self._clusters[key]

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
    whole call path with it, and the host-overhead benchmark times that path without a GPU.
    ``device_type`` "meta": tensors without memory, for ``python -m wsgemm explain`` (which
    launches nothing); ``name``: the GPU it stands for."""

    def __init__(
        self,
        capability: tuple[int, int] = (9, 0),
        sm_count: int = 132,
        *,
        device_type: str = "cpu",
        name: str = "a stand-in GPU",
    ) -> None:
        self._capability, self._sm_count = capability, sm_count
        self.type, self._name = device_type, name

    def available(self) -> bool:
        return True

    def count(self) -> int:
        return 1

    def capability(self, index) -> tuple[int, int]:
        return self._capability

    def sm_count(self, index) -> int:
        return self._sm_count

    def clusters(self, index, size: int) -> int:
        return self._sm_count // size

    def name(self, index) -> str:
        return self._name

    def current(self) -> None:
        return None  # a CPU tensor's device index

    def guard(self, index):
        raise AssertionError("one stand-in device: nothing to switch to")


class Dispatcher:
    """Device facts, backend choice, compiled kernels and prebuilt launchers (see the module
    docstring). Thread-safe: the memos only grow under a lock; a failed compile or a rejected call
    stores nothing.

    ``batch_invariant``: passed to ``choosing.choose``; None (the default) reads
    ``wsgemm.config``'s setting, else ``WSGEMM_BATCH_INVARIANT``, True keeps every output
    element's summation order independent of M (no split-K). ``max_batch_per_launch``:
    non-persistent kernels put the batch on the grid's z, which holds
    ``support.MAX_GRID_DIM[2]`` blocks, so larger batches take several launches.
    ``max_broadcast_copy_bytes``: a broadcast operand that cannot be folded is copied once per
    batch (TMA cannot address a stride-0 batch); past this many bytes of copies, one launch per
    batch is cheaper.
    ``autotune``: time the policy's candidates at a problem's first call and keep the fastest
    (``choosing.autotune``); None (the default) reads ``wsgemm.config``'s setting, else
    ``WSGEMM_AUTOTUNE``; where none of them says, the menu is not tuned (``autotune``) and
    ``auto``'s unmeasured kernel is raced against torch.matmul (``races``). ``tuned``: where
    tuned choices (and route decisions) are kept (default the process's ``choosing.STORE``);
    ``time_call``: how a candidate is timed (ms per call of a function; default
    ``choosing.time_cuda``; a race calls it ``ROUNDS`` times per side).
    ``against_torch``: whether ``auto`` chooses between its kernel and torch.matmul
    (``choosing.route_choice``): None (the default) where no shipped table measured the
    kernel's family on the GPU (the sm80 family, everywhere it is ``auto``'s), True on every
    GPU with a wsgemm kernel (a study: the H200's sm90 choice against torch), False never (the
    kernel, unmeasured).
    """

    # Launchers kept; the oldest goes first (a workload with ever-new shapes must not grow memory).
    MAX_LAUNCHERS = 4096

    def __init__(
        self,
        cache: Any = None,
        devices: Any = None,
        *,
        batch_invariant: bool | None = None,
        max_batch_per_launch: int = MAX_GRID_DIM[2],
        max_broadcast_copy_bytes: int = 64 << 20,
        autotune: bool | None = None,
        tuned: choosing.TunedStore | None = None,
        time_call: Callable[[Callable[[], object]], float] | None = None,
        against_torch: bool | None = None,
    ) -> None:
        self.cache = COMPILE_CACHE if cache is None else cache
        self.devices = CudaDevices() if devices is None else devices
        if batch_invariant is not None:
            choosing.batch_invariant_requested(batch_invariant)  # TypeError unless a bool
        self.batch_invariant = batch_invariant
        self.max_batch_per_launch = max_batch_per_launch
        self.max_broadcast_copy_bytes = max_broadcast_copy_bytes
        if autotune is not None and not isinstance(autotune, bool):
            raise TypeError(f"autotune must be a bool or None, got {type(autotune).__name__}")
        self._autotune = autotune
        self.tuned = choosing.STORE if tuned is None else tuned
        self.time_call = choosing.time_cuda if time_call is None else time_call
        if against_torch is not None and not isinstance(against_torch, bool):
            raise TypeError(
                f"against_torch must be a bool or None, got {type(against_torch).__name__}"
            )
        self.against_torch = against_torch
        self.launchers: dict[Hashable, Any] = {}  # call signature -> launcher (wsgemm.api)
        # the launchers kept on a default a race may overturn (``remember``'s ``provisional``)
        self._provisional: set[Hashable] = set()
        self.semaphores = SemaphoreCache()  # split-K's, per (device, stream)
        self._kernels: dict[tuple, tuple[Callable, int]] = {}
        self._gated_roads: dict[tuple, tuple] = {}  # gated_unfused's answers
        self._said: set[Hashable] = set()  # say_once's
        self._lock = threading.Lock()

    def _asked_autotune(self) -> bool | None:
        """The autotune switch as set: the argument, else ``wsgemm.config``'s setting in this
        thread or task, else ``WSGEMM_AUTOTUNE``; None where none of them says."""
        setting = self._autotune
        return choosing.autotune_asked(current_settings().autotune if setting is None else setting)

    @property
    def autotune(self) -> bool:
        """Whether ``auto`` tunes the sm90 menu's choice on this dispatcher: the switch as set
        (``_asked_autotune``), off where nothing says."""
        return self._asked_autotune() is True

    @property
    def races(self) -> bool:
        """Whether ``auto`` races a kernel no table measured against torch.matmul
        (``choosing.route_choice``): the same switch, but **on** where nothing says (issue
        #27: where wsgemm has no measurement the first call of a bucket measures)."""
        return self._asked_autotune() is not False

    def tuned_choice(self, device, problem, dtypes, mufu: int = 0) -> choosing.Choice | None:
        """The tuned choice stored for this problem (with a fused activation of ``mufu``) on
        this GPU model, or None (also when autotuning is off)."""
        if not self.autotune:
            return None
        m, n, k, batch, *_, sm_count, cc = self._policy_args(device, problem, dtypes)
        return choosing.tuned_choice(
            self.tuned, self.devices.name(device), sm_count, cc, m, n, k, batch, dtypes,
            self.batch_invariant, mufu,
        )  # fmt: skip

    def model_choice(self, device, problem, dtypes) -> choosing.Choice:
        """What the policy alone picks for this problem on sm_90 (the table and the cost
        model; no tuned pick): ``wsgemm.tune``'s baseline."""
        return choosing.choose(
            *self._policy_args(device, problem, dtypes), batch_invariant=self.batch_invariant
        )

    def stored_or_model_choice(self, device, problem, dtypes, mufu: int = 0) -> choosing.Choice:
        """``auto``'s sm90 choice before any tuning this call may do: the tuned pick (with a
        fused activation of ``mufu``), else the policy's (``model_choice``)."""
        return self.tuned_choice(device, problem, dtypes, mufu) or self.model_choice(
            device, problem, dtypes
        )

    def tuned_record(self, device, problem, dtypes, mufu: int = 0) -> dict | None:
        """What the tuned store keeps for this problem's bucket (with a fused activation of
        ``mufu``) on this GPU model (the winner, its split, every candidate's ms), read whether
        or not autotuning is on; None if nothing."""
        m, n, k, batch, *_, sm_count, _ = self._policy_args(device, problem, dtypes)
        invariant = choosing.batch_invariant_requested(self.batch_invariant)
        key = choosing.bucket(m, n, k, batch, dtypes, invariant, mufu)
        return self.tuned.record(self.devices.name(device), sm_count, key)

    def candidates(self, device, problem, dtypes, top: int | None = None) -> list[choosing.Choice]:
        """Every choice ``auto`` may make for this problem on sm_90 (``choosing.candidates``),
        as ``Choice`` objects whose ``source`` is "candidate"; with ``top``, the cost model's
        ``top`` fastest (``choosing.ranked_candidates``)."""
        args = self._policy_args(device, problem, dtypes)
        if top is None:
            found = choosing.candidates(*args, batch_invariant=self.batch_invariant)
        else:
            found = choosing.ranked_candidates(*args, batch_invariant=self.batch_invariant)[:top]
        return [choosing.Choice(e, split, "a candidate being timed", "candidate")
                for e, split in found]  # fmt: skip

    def tune_problem(
        self, device, problem, dtypes, run: Runner, top: int | None = None, mufu: int = 0
    ) -> choosing.Choice | None:
        """The on-line tuner (``WSGEMM_AUTOTUNE``'s first call of a bucket, and
        ``wsgemm.tune``): time every candidate (``top``: the cost model's fastest ``top``)
        through ``run`` (``choosing.tune``) on ``device``, keep the fastest for this problem's
        bucket (``mufu``: the fused activation ``run`` times them with) and return it as the
        choice later calls read (``tuned_choice``); None when fewer than two candidates or none
        ran."""
        candidates = self.candidates(device, problem, dtypes, top)
        if len(candidates) < 2:
            return None
        with self.on_device(device):  # the timing events record on the operands' device
            times = choosing.tune(
                candidates,
                lambda choice: run(self.choice_route(choice, problem[2], dtypes[1])),
                self.time_call,
            )
        if not times:
            return None
        m, n, k, batch, *_, sm_count, _ = self._policy_args(device, problem, dtypes)
        choosing.remember(
            self.tuned, self.devices.name(device), sm_count, m, n, k, batch, dtypes,
            choosing.batch_invariant_requested(self.batch_invariant), times, mufu,
        )  # fmt: skip
        return self.tuned_choice(device, problem, dtypes, mufu)

    def on_device(self, index):
        """Kernels launch on the current device: a context that makes it ``index`` for a call
        if it is not."""
        if self.devices.count() == 1 or self.devices.current() == index:
            return _NO_SWITCH
        return self.devices.guard(index)

    # --------------------------------------------------------------------------- backends

    def available_backends(self, device=None) -> list[str]:
        """The backends that run on ``device`` (default: the current device), best first. Listing
        imports no kernel module: one that does not import stays listed and raises at first use
        (``Backend.kernel_class``), never vanishing silently."""
        if not self.devices.available():
            return []
        index = self.device_index(device)
        cc = self.devices.capability(index)
        return [n for n in shipped_backends() if BACKENDS[n].supports(cc)]

    def route(
        self,
        backend: str,
        device: int,
        problem: tuple[int, int, int, int | None],
        dtypes: tuple[str, str, str],
        config: Any = None,
        *,
        quiet: bool = False,
        run: Runner | None = None,
        mufu: int = 0,
    ) -> Route:
        """How a validated call runs. ``problem`` is (M, N, K, batch or None), ``dtypes`` the
        names of (A/B, C, accumulator). ``auto`` runs torch.matmul (a :data:`TORCH` route, with
        its reason: ``torch_reason``) where wsgemm has no kernel for the GPU or the dtypes, or
        none that competes; on sm_90 it takes the policy's menu entry and split; elsewhere the
        sm80 kernel, or torch.matmul in its place (``_or_torch``). A named backend runs
        ``config`` (None: its shipped one), split only when the config says so (an
        ``Sm90Config`` with ``split_k`` >= 2, checked by ``api.validate``, or with
        ``stream_k``); ValueError, naming the GPUs it runs on, if it does not run on this one.
        Called once per call signature (its launcher keeps the route), so a repeated call never
        asks the policy. ``quiet``: no DEBUG line (``explain`` asks, nothing runs).

        ``run``: how the caller launches a route on its operands, given when the call may be
        timed (``Runner``). With autotuning on, an ``auto`` choice the policy made (not one
        tuned before) is replaced by the fastest candidate timed through it (``_tuned``); where
        no table measured the kernel, the route decision's race runs through it too (unless
        autotuning is set off: ``races``; nothing set races).

        ``mufu``: the MUFU instructions per element of a fused activation the call runs
        (``choosing.cost.EPILOGUE_MUFU``), which the policy prices where the chosen entry's
        family fuses it (``choosing.with_epilogue``)."""
        cc = self.devices.capability(device)
        if backend == "auto":
            why = self.torch_reason(device, dtypes)
            if why is not None:
                chosen = Route(TORCH, reason=why)
            elif BACKENDS["sm90"].supports(cc):
                # (a fused activation's candidates are tuned and kept apart: ``run`` times
                # them with it, and the policy prices it, ``with_epilogue``)
                choice = self.stored_or_model_choice(device, problem, dtypes, mufu)
                if run is not None and choice.source in _TUNABLE and self.autotune:
                    choice = self.tune_problem(device, problem, dtypes, run, mufu=mufu) or choice
                if mufu and fuses_epilogues(choice.menu_entry.backend):
                    choice = choosing.with_epilogue(
                        choice, mufu, *self._policy_args(device, problem, dtypes),
                        batch_invariant=self.batch_invariant,
                    )  # fmt: skip
                chosen = self._or_torch(self.choice_route(choice, problem[2], dtypes[1]), device,
                                        problem, dtypes, run,
                                        mufu)  # fmt: skip
            else:
                chosen = self._or_torch(Route("sm80"), device, problem, dtypes, run, mufu)
        elif not BACKENDS[backend].supports(cc):
            raise ValueError(
                f"backend={backend!r} runs on {support.family_gpus(BACKENDS[backend].family)}; "
                f"{self.devices.name(device)} is {support.cc_name(cc)} (backend='auto' runs "
                "torch.matmul where wsgemm has no kernel)"
            )
        elif getattr(config, "cluster_split", 1) > 1 and not config.k_tiles_for_every_rank(
            problem[2]
        ):
            raise ValueError(
                f"config.cluster_split={config.cluster_split} gives each CTA of a cluster at "
                f"least one k-tile of {config.tile_k}: K={problem[2]} has "
                f"{-(-problem[2] // config.tile_k)} (take fewer ways, a smaller tile_k, or none)"
            )
        elif getattr(config, "splits_in_kernel", False):
            # the split kernel; a stream-K schedule picks each tile's parts itself (split 1)
            chosen = Route(backend, config.compiled(), max(config.split_k, 1))
        else:
            chosen = Route(backend, config)
        if not quiet and log.isEnabledFor(logging.DEBUG):
            m, n, k, batch = problem
            what = chosen.choice.menu_entry.name if chosen.choice else chosen.backend
            why = f" ({chosen.choice.source}: {chosen.choice.reason})" if chosen.choice else ""
            why = f" ({chosen.reason})" if chosen.reason else why
            log.debug(
                "backend=%s runs %s with split %d for M=%d N=%d K=%d batch=%s, %s%s",
                backend, what, chosen.split, m, n, k, batch, "/".join(dtypes), why,
            )  # fmt: skip
        return chosen

    def gated_unfused(self, device, rows: int, n: int, k: int, dtype: str, activation: str,
                      swap_tile_n: int | None = None, small: bool = False):  # fmt: skip
        """Why a ``gated_linear`` call on a (rows, n = 2I, k) product of ``dtype`` inputs runs
        that product on ``auto``'s choice (in fp32) and then the gating, rather than the gated
        kernel: the cost model predicts that road faster (``choosing.gated_roads``, the product
        priced on the policy's pick: a tuned pick only measured faster than that, so tuning
        never makes this road the slower one and the answer holds from the first call). None
        (the gated kernel) where it does not, off the sm90 family, where no cost model knows
        this GPU, and in batch-invariant mode (a row's bits must not depend on how many rows
        the call has). Memoized per problem, activation and settings (a memo of its own, so
        that many row counts do not crowd out the launchers). ``swap_tile_n``: the gated kernel
        is the swap-AB decode tile of that width (``choosing.gated_swap_tile_n``); ``small``: its
        row tile is the small one (``choosing.gated_kernel_entry``; the caller says which tile
        runs, so the road is priced on it)."""
        return self._gated_answer(device, rows, n, k, dtype, activation, swap_tile_n, small)[0]

    def gated_verdict(self, device, rows: int, n: int, k: int, dtype: str, activation: str,
                      swap_tile_n: int | None = None, small: bool = False):  # fmt: skip
        """``gated_unfused``'s two predictions in words, whichever road won (``explain``);
        None where it asked no model."""
        return self._gated_answer(device, rows, n, k, dtype, activation, swap_tile_n, small)[1]

    def _gated_answer(self, device, rows, n, k, dtype, activation, swap_tile_n=None,
                      small=False) -> tuple:  # fmt: skip
        if choosing.batch_invariant_requested(self.batch_invariant):
            return None, "batch-invariant mode: the gated kernel whatever the rows"
        key = (device, rows, n, k, dtype, activation, swap_tile_n, small, current_settings())
        known = self._gated_roads.get(key)
        if known is not None:
            return known
        cc, sm_count = self.devices.capability(device), self.devices.sm_count(device)
        model = choosing.cost_model_for(sm_count, cc)
        why = verdict = None
        if BACKENDS["sm90"].supports(cc) and model is not None:
            problem, dtypes = (rows, n, k, None), (dtype, "float32", "float32")
            choice = self.model_choice(device, problem, dtypes)
            in_cluster = choosing.split_in_cluster(choice.menu_entry, choice.split, k, "float32")
            roads = choosing.gated_roads(model, choice.menu_entry, choice.split, rows, n, k,
                                         sm_count, activation, swap_tile_n=swap_tile_n,
                                         small=small, cluster_split=in_cluster)  # fmt: skip
            if roads is not None:
                split = f" split {choice.split}" if choice.split > 1 else ""
                times = f"{roads.product_us:.1f} + {roads.gating_us:.1f} us"
                product = (f"the product on {choice.menu_entry.name}{split} then the gating "
                           f"({times})")  # fmt: skip
                tile = "row tile" if swap_tile_n is None else f"swap-AB {swap_tile_n}-token tile"
                if swap_tile_n is None and choosing.gated_kernel_entry(rows, small) == (
                    choosing.GATED_SMALL_TILE
                ):
                    tile = "small row tile"
                fused = f"the gated kernel's {tile} ({roads.fused_us:.1f} us)"
                if roads.unfused_wins:
                    why = verdict = f"the cost model predicts {product} faster than {fused}"
                else:
                    verdict = f"the cost model predicts {fused} faster than {product}"
        known = (why, verdict)
        self._keep(self._gated_roads, key, known)
        return known

    def races_torch(self, device, family: str) -> bool:
        """Whether ``auto``'s kernel of ``family`` on ``device`` is chosen against torch.matmul
        (``against_torch``; by default where no shipped table measured the family there)."""
        if self.against_torch is not None:
            return self.against_torch
        cc = self.devices.capability(device)
        return not _RACE.measured(family, self.devices.sm_count(device), cc)

    def route_decision(
        self, device, problem, dtypes, family: str, mufu: int = 0
    ) -> choosing.RouteDecision:
        """What runs in place of ``family``'s kernel without a race: the stored decision, the
        default, or "not measured yet" (``choosing.route_choice.decide``)."""
        m, n, k, batch, *_, sm_count, _ = self._policy_args(device, problem, dtypes)
        return _RACE.decide(
            self.tuned, self.devices.name(device), sm_count, (m, n, k, batch), dtypes, family,
            race=self.races,
            invariant=choosing.batch_invariant_requested(self.batch_invariant),
            mufu=mufu,
        )  # fmt: skip

    def _or_torch(
        self, chosen: Route, device, problem, dtypes, run: Runner | None, mufu: int = 0
    ) -> Route:
        """``chosen`` (``auto``'s kernel route), or torch.matmul where it may not run unmeasured
        (``races_torch``): the route decision, raced through ``run`` when there is none yet and
        the call may be timed. A default taken because the call could not race says so
        (``Route.keep`` False: the caller keeps no launcher, or a provisional one)."""
        family = BACKENDS[chosen.backend].family
        if not self.races_torch(device, family):
            return chosen
        decision = self.route_decision(device, problem, dtypes, family, mufu)
        if decision.source == _RACE.NOT_YET and run is not None:
            decision = self._race(chosen, family, device, problem, dtypes, run, mufu) or decision
        if decision.runs == TORCH:
            return Route(TORCH, reason=decision.reason, keep=decision.source != _RACE.NOT_YET)
        return dataclasses.replace(chosen, reason=decision.reason)

    def _race(self, chosen: Route, family, device, problem, dtypes, run: Runner, mufu: int = 0):
        """Time ``chosen`` against torch.matmul through ``run`` on ``device``
        (``route_choice.race``), keep the winner for the bucket and say so in one INFO line;
        None when neither ran."""
        with self.on_device(device):  # the timing events record on the operands' device
            times = _RACE.race(
                {family: lambda: run(chosen), TORCH: lambda: run(Route(TORCH))}, self.time_call
            )
        if not times:
            return None
        m, n, k, batch, *_, sm_count, _ = self._policy_args(device, problem, dtypes)
        name = self.devices.name(device)
        decision = _RACE.remember(
            self.tuned, name, sm_count, (m, n, k, batch), dtypes, family, times, mufu
        )
        self._drop_provisional()
        if decision.runs == TORCH:  # this line says it: not the torch route's line too
            self.say_once(("torch", device, decision.reason))
        log.info(
            "%s: backend='auto' measured %s against torch.matmul for M=%d N=%d K=%d batch=%d "
            "%s: %s; runs %s from now on for this bucket on this GPU model",
            name, chosen.backend, m, n, k, batch, "/".join(dtypes), decision.detail,
            "torch.matmul" if decision.runs == TORCH else f"the {family} kernel",
        )  # fmt: skip
        return decision

    def torch_reason(self, device, dtypes: tuple[str, str, str]) -> str | None:
        """Why ``auto`` runs torch.matmul for operands of ``dtypes`` on ``device``, or None when
        a wsgemm kernel runs them: inputs of a dtype the kernels do not multiply, a GPU with no
        row in ``support.TARGETS`` (before sm_80, or one wsgemm does not know yet), or a row
        that sends ``auto`` to torch (the tcgen05 GPUs)."""
        if dtypes[0] not in support.AB_DTYPES:
            return (
                f"{dtypes[0]} inputs; wsgemm's kernels multiply {' and '.join(support.AB_DTYPES)}"
            )
        cc = self.devices.capability(device)
        row = support.target(cc)
        gpu = f"{self.devices.name(device)} is {support.cc_name(cc)}"
        if row is None and cc < (8, 0):
            return f"{gpu}; wsgemm's kernels need sm_80 or newer (cp.async, bf16 mma.sync)"
        if row is None:
            known = ", ".join(support.cc_name(t.cc) for t in support.TARGETS)
            return f"{gpu}, which wsgemm does not build for yet (it knows {known})"
        if row.auto_torch:
            return f"{gpu}, {row.auto_torch}"
        return None

    def say_once(self, what: Hashable) -> bool:
        """True the first time this dispatcher is asked about ``what``: what says a fact once
        (the torch fallback's log line, once per device and reason) asks here."""
        with self._lock:
            if what in self._said:
                return False
            self._said.add(what)
            return True

    @staticmethod
    def choice_route(choice: choosing.Choice, k: int, c_dtype: str) -> Route:
        """The route that runs a policy (or tuned) choice on a problem of depth ``k`` and C of
        dtype ``c_dtype``: its split as a cluster split where one runs
        (``cluster_split_config``), else through the workspace."""
        e = choice.menu_entry
        config = cluster_split_config(e, choice.split, k, c_dtype)
        if config is not None:
            return Route(e.backend, config, 1, choice)
        return Route(e.backend, e.variant_config(split=choice.split > 1), choice.split, choice)

    def explain(
        self,
        backend: str,
        device: int,
        problem: tuple[int, int, int, int | None],
        dtypes: tuple[str, str, str],
        mufu: int = 0,
    ) -> str:
        """``route``'s answer in words: which kernel, tile, cluster and split, and why; where
        ``auto`` chooses between its kernel and torch.matmul, a ``route:`` line with the
        decision and where it came from (a stored measurement, the default, not measured yet,
        or no choice). ``mufu``: the call's fused activation (``route``'s): its own tuned
        bucket and race, and a ``with its activation:`` line where the policy moved the choice
        for it. Compiles, launches and measures nothing."""
        cc = self.devices.capability(device)
        torch_reason = self.torch_reason(device, dtypes) if backend == "auto" else None
        if torch_reason is not None:
            lines = [
                self._problem_line(device, problem, dtypes),
                f"kernel: torch.matmul (fallback): {torch_reason}",
            ]
            if choosing.batch_invariant_requested(self.batch_invariant):
                lines.append(
                    "batch invariance: asked for, but torch.matmul (cuBLAS) does not promise "
                    "it; no wsgemm kernel runs here to give it"
                )
            return "\n".join(lines)
        decided = ""
        if backend == "auto":
            family = "sm90" if BACKENDS["sm90"].supports(cc) else "sm80"
            if self.races_torch(device, family):
                decision = self.route_decision(device, problem, dtypes, family, mufu)
                decided = f"\nroute: {decision.source}: {decision.reason}; {decision.detail}"
                if decision.runs == TORCH:
                    return (
                        f"{self._problem_line(device, problem, dtypes)}\n"
                        f"kernel: torch.matmul (not the {family} kernel): {decision.reason}"
                        f"{decided}"
                    )
        if backend == "auto" and BACKENDS["sm90"].supports(cc):
            args = self._policy_args(device, problem, dtypes)
            tuned = self.tuned_choice(device, problem, dtypes, mufu)
            if tuned is not None:
                text = choosing.describe(tuned, *args, batch_invariant=self.batch_invariant)
                model = self.model_choice(device, problem, dtypes)
                if (model.menu_entry, model.split) == (tuned.menu_entry, tuned.split):
                    text += "\ntuned: the cost model picks the same"
                else:
                    text += (f"\ntuned: overrides the cost model's pick, {model.menu_entry.name} "
                             f"split {model.split}")  # fmt: skip
                return text + decided
            text = choosing.explain(*args, batch_invariant=self.batch_invariant)
            chosen = self.route(backend, device, problem, dtypes, quiet=True, mufu=mufu)
            said = chosen.choice.reason if chosen.choice is not None else ""
            if choosing.EPILOGUE_MOVE in said:  # the policy moved its choice for the activation
                text += (f"\nwith its activation: {chosen.choice.menu_entry.name} split "
                         f"{chosen.choice.split} runs instead:"
                         f"{said.split(choosing.EPILOGUE_MOVE, 1)[1]}")  # fmt: skip
            count = len(self.candidates(device, problem, dtypes)) if self.autotune else 0
            if count > 1:
                text += (
                    "\nautotune: on (wsgemm.config.autotune, else WSGEMM_AUTOTUNE); the first "
                    f"call times these {count} candidates and runs the fastest instead"
                )
            elif not self.autotune and (stored := self.tuned_record(device, problem, dtypes, mufu)):
                text += (
                    f"\ntuned: {stored['entry']} split {stored['split']} is stored for this "
                    "problem on this GPU (`wsgemm tune` or an autotuned call), not used: "
                    "autotuning is off (WSGEMM_AUTOTUNE=1 or wsgemm.config.autotune(True) reads it)"
                )
            return text + decided
        chosen = self.route(backend, device, problem, dtypes, quiet=True)
        config = BACKENDS[chosen.backend].config(dtypes[2])
        tile = "x".join(str(getattr(config, f, "?")) for f in ("tile_m", "tile_n", "tile_k"))
        cluster = f"{getattr(config, 'cluster_m', 1)}x{getattr(config, 'cluster_n', 1)}"
        why = (
            f"backend={backend!r} named: its shipped config, never split"
            if backend != "auto"
            else f"auto on sm_{cc[0]}{cc[1]}: the sm80 kernel (the sm90 menu needs sm_90)"
        )
        return (
            "\n".join(
                [
                    self._problem_line(device, problem, dtypes),
                    f"kernel: {chosen.backend} ({tile} tile, cluster {cluster})",
                    "split-K: 1 (none)",
                    f"why: {why}",
                ]
            )
            + decided
        )

    def _problem_line(self, device, problem, dtypes) -> str:
        """``explain``'s first line, where the policy's does not speak."""
        m, n, k, batch = problem
        cc = self.devices.capability(device)
        return (
            f"problem: M={m} N={n} K={k} batch={1 if batch is None else batch}, "
            f"{dtypes[0]} inputs, {dtypes[1]} output, {dtypes[2]} accumulate; "
            f"{support.cc_name(cc)} with {self.devices.sm_count(device)} SMs"
        )

    def _policy_args(self, device, problem, dtypes) -> tuple:
        """``choosing.choose``'s (and ``choosing.explain``'s) positional arguments for a problem."""
        m, n, k, batch = problem
        return (
            m, n, k, 1 if batch is None else batch, *dtypes,
            self.devices.sm_count(device), self.devices.capability(device),
        )  # fmt: skip

    # --------------------------------------------------------------------------- kernels

    def kernel(
        self,
        backend: str,
        device: int,
        dtypes: tuple[str, str, str],
        a_major: str,
        b_major: str,
        config: Any = None,
        epilogue: str = "none",
        grouping: str = "none",
    ) -> tuple[Callable, int]:
        """(compiled kernel, clusters to launch) for ``backend`` on ``device``; ``dtypes`` are the
        host names of (A/B, C, accumulator). ``config`` replaces the shipped config (tuning);
        ``epilogue`` names a fused epilogue, ``grouping`` a grouped GEMM
        (``host.Variant.epilogue``, ``.grouping``)."""
        key = (backend, device, dtypes, a_major, b_major, config, epilogue, grouping)
        hit = self._kernels.get(key)
        if hit is not None:
            return hit
        if config is not None and config == BACKENDS[backend].config(dtypes[2]):
            # the shipped config under its own name: one compile, not two
            hit = self.kernel(backend, device, dtypes, a_major, b_major, None, epilogue, grouping)
        else:
            arch = arch_for_capability(self.devices.capability(device))
            variant = Variant(backend, arch, *dtypes, a_major, b_major, config, epilogue, grouping)
            clusters = self.devices.clusters(device, cluster_size(variant.kernel_config()))
            hit = (self.cache.get(variant), clusters)
        with self._lock:
            return self._kernels.setdefault(key, hit)

    def remember(self, signature: Hashable, launcher: Any, provisional: bool = False) -> None:
        """Keep ``launcher`` for ``signature`` (``wsgemm.api`` builds both). ``provisional``:
        built on a route decision's default (``Route.keep`` False) for a call that cannot race
        (alpha, a residual): kept until a race stores a decision (``_race``), then dropped, so
        the signature's next call asks again."""
        self._keep(self.launchers, signature, launcher)
        if provisional:
            with self._lock:
                self._provisional.add(signature)

    def _drop_provisional(self) -> None:
        """Drop the launchers kept on a default (``remember``): a race just stored a decision
        that may overturn it (rare: once per bucket and GPU model)."""
        with self._lock:
            for signature in self._provisional:
                self.launchers.pop(signature, None)
            self._provisional.clear()

    def _keep(self, memo: dict, key: Hashable, value: Any) -> None:
        """``memo[key] = value`` under the lock, the oldest entry dropped past
        ``MAX_LAUNCHERS`` (the launchers' FIFO, and the gated roads')."""
        with self._lock:
            if len(memo) >= self.MAX_LAUNCHERS:
                del memo[next(iter(memo))]
            memo[key] = value

    def forget(self) -> None:
        """Drop every launcher and kernel this dispatcher holds (its compile cache keeps its own
        memo: clear that too for a process with nothing in memory, as the cache tests do)."""
        with self._lock:
            self.launchers.clear()
            self._provisional.clear()
            self._kernels.clear()
            self._gated_roads.clear()
        self.semaphores.clear()

    def device_index(self, device) -> int:
        """The index of ``device`` (a torch.device, its string, an int, or None: the current
        one) among this dispatcher's devices; a device without an index is the current one."""
        if device is None:
            return self.devices.current()
        if isinstance(device, int):
            return device
        index = torch.device(device).index
        return self.devices.current() if index is None else index


def autotuning(enabled: bool = True):
    """``with`` block: on-line tuning on (or off) in this thread or task, whatever the
    process's setting (``wsgemm.config.autotune``'s block, for the API's own use)."""
    return settings_block(autotune=enabled)


DISPATCHER = Dispatcher()
