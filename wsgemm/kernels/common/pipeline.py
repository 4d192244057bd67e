"""An mbarrier ring for a cp.async producer warp and mma.sync consumer warps (sm_80 and later).

The wheel's ``cutlass.pipeline.PipelineCpAsync`` has the right protocol but its mbarrier calls
refuse to trace for targets below sm_90 (``check_arch``), although ``mbarrier.init``,
``mbarrier.arrive``, ``mbarrier.test_wait.parity`` and ``cp.async.mbarrier.arrive.noinc`` all
exist since sm_80 (PTX ISA 7.0/7.1). This module emits those four instructions itself, so one
kernel body traces for sm_80, sm_86, sm_89 and sm_90a alike (on sm_90a a waiting thread uses
``mbarrier.try_wait``, which the hardware suspends). The consumers' stage/phase bookkeeping reuses
the wheel's arch-neutral ``PipelineState``; the producer computes both from the k-tile index.

Protocol, per stage ``s`` (``full[s]`` and ``empty[s]`` are mbarriers):

* producer, k-tile t into stage s = t % stages: ``acquire`` waits until ``empty[s]`` finished
  phase parity 1 ^ (t // stages) & 1 (the phase the consumers last released; every stage
  starts free),
  issues its cp.async copies, then ``commit``: ``cp.async.mbarrier.arrive.noinc`` makes each
  producer thread arrive on ``full[s]`` once its own copies have landed in shared memory;
* consumer: ``wait`` blocks on ``full[s]``, reads the stage, then ``release`` arrives on
  ``empty[s]`` (every consumer thread; see ``consumer_release``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import PipelineState, PipelineUserType, make_pipeline_state


def _smem_address(ptr: cute.Pointer, *, loc=None, ip=None):
    """The 32-bit shared-window address that PTX ``.shared`` operands expect."""
    return ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)


def _shared_asm(operands: list, text: str, constraints: str, *, loc=None, ip=None) -> None:
    """One inline-PTX statement on shared memory, with side effects and a memory clobber (so
    the compiler neither drops nor reorders it across other memory accesses)."""
    llvm.inline_asm(
        None,
        operands,
        text,
        constraints + ",~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_init(mbar: cute.Pointer, count: int, *, loc=None, ip=None) -> None:
    """``mbarrier.init``: expect ``count`` arrivals per phase. One thread only."""
    cute.arch.mbarrier_init(mbar, count, loc=loc, ip=ip)


@dsl_user_op
def mbarrier_arrive(mbar: cute.Pointer, *, loc=None, ip=None) -> None:
    """One arrival (release semantics for this thread's earlier shared-memory accesses)."""
    _shared_asm(
        [_smem_address(mbar, loc=loc, ip=ip)],
        "{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared.b64 state, [$0];\n\t}",
        "r",
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_mbarrier_arrive_noinc(mbar: cute.Pointer, *, loc=None, ip=None) -> None:
    """Arrive on ``mbar`` when all of this thread's earlier cp.async copies have completed.

    ``.noinc``: the arrival counts against the barrier's expected count (it does not raise the
    pending count first), so the barrier is initialised with one arrival per producer thread.
    """
    _shared_asm(
        [_smem_address(mbar, loc=loc, ip=ip)],
        "cp.async.mbarrier.arrive.noinc.shared.b64 [$0];",
        "r",
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_wait(
    mbar: cute.Pointer, phase: cutlass.Int32, try_wait: bool, *, loc=None, ip=None
) -> None:
    """Wait until the phase of parity ``phase`` has completed (acquire semantics).

    ``try_wait`` (sm_90 and later: ``support.has_mbarrier_try_wait``): ``mbarrier.try_wait``,
    which suspends the thread in hardware until the phase completes or a time limit passes, in
    a loop; else ``mbarrier.test_wait`` in a loop. (On the H200 the two measured the same:
    docs/perf.md.) Labels inside the braces are local to this asm block, so it can be inlined
    many times.
    """
    if try_wait:
        poll = "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;"
    else:
        poll = "mbarrier.test_wait.parity.shared.b64 done, [$0], $1;"
    _shared_asm(
        [
            _smem_address(mbar, loc=loc, ip=ip),
            cutlass.Int32(phase).ir_value(loc=loc, ip=ip),
        ],
        "{\n\t.reg .pred done;\n\tWAIT_AGAIN:\n\t" + poll + "\n\t@!done bra WAIT_AGAIN;\n\t}",
        "r,r",
        loc=loc,
        ip=ip,
    )


@dataclass(frozen=True)
class CpAsyncPipeline:
    """``stages`` full/empty mbarrier pairs in shared memory; see the module docstring.

    ``barriers`` points at ``2 * stages`` 8-byte words: ``full[0..stages)`` then
    ``empty[0..stages)``. One thread calls :meth:`init`; the caller then makes the
    initialisation visible with a block-wide barrier before any role starts.
    """

    barriers: cute.Pointer
    stages: int
    #: Wait with ``mbarrier.try_wait`` (the target has it: ``support.has_mbarrier_try_wait``).
    try_wait: bool

    def init(self, producer_arrivals: int, consumer_arrivals: int) -> None:
        """Initialise every barrier. Exactly one thread calls this."""
        for s in range(self.stages):
            mbarrier_init(self.full(s), producer_arrivals)
            mbarrier_init(self.empty(s), consumer_arrivals)

    def full(self, index) -> cute.Pointer:
        return self.barriers + index

    def empty(self, index) -> cute.Pointer:
        return self.barriers + self.stages + index

    def consumer_state(self) -> PipelineState:
        return make_pipeline_state(PipelineUserType.Consumer, self.stages)

    def producer_acquire(self, index, phase) -> None:
        """Wait until stage ``index`` is free: ``empty[index]`` completed phase parity
        ``phase`` (``index`` may be a constant: its mbarrier address then is one too)."""
        mbarrier_wait(self.empty(index), phase, self.try_wait)

    def producer_commit(self, index) -> None:
        """Arrive on ``full[index]`` once this thread's copies so far have landed."""
        cp_async_mbarrier_arrive_noinc(self.full(index))

    def consumer_wait(self, state: PipelineState) -> None:
        mbarrier_wait(self.full(state.index), state.phase, self.try_wait)

    def consumer_release(self, state: PipelineState) -> None:
        """Hand stage ``state.index`` back: every consumer thread arrives, its own reads of the
        stage released by its own arrive (``empty`` counts consumer threads). One elected lane
        after ``__syncwarp`` would be enough under the PTX memory model, but compute-sanitizer's
        racecheck cannot follow that ordering (docs/perf.md, entry 10)."""
        mbarrier_arrive(self.empty(state.index))
