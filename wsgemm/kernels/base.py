"""The host entries every GEMM kernel class shares (the contract of ``wsgemm.kernels``): the
tensor entry ``__call__``, the address entry ``by_address`` the host compiles, and the traced
entry ``traced``, all three ending in the family's ``_call``.

A family declares the launch arguments its kernels take after ``raster_group`` in
``LAUNCH_EXTRAS`` (name and default: sm90's split-K count and buffers, none for sm80); the
entries take them as a ``*launch`` tail, in that order, and ``_call`` receives them as a tuple.
The host reads their names and defaults from there (``compiling.compile.launch_signature``)
and compiles every entry with a stand-in for each (``fake_launch_extras``), so a compiled
function takes every launch argument as a run-time value: the compiled signature the families'
own entries with Python defaults had.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from wsgemm.kernels.common import address


class GemmKernel:
    """Base of the kernel classes: the three host entries and the launch-argument contract.
    A subclass sets ``name``, ``arch``, ``needs_vector_extent`` and ``LAUNCH_EXTRAS``, and
    writes ``_call(mA, mB, mC, max_active_clusters, stream, raster_group, launch,
    trace_buffer)`` (``launch``: the ``LAUNCH_EXTRAS`` values, all of them) and
    ``fake_launch_extras`` (a stand-in for each)."""

    name = "gemm"
    arch = "sm_80"
    needs_vector_extent = False
    #: (name, default) of each launch argument after ``raster_group``, in order.
    LAUNCH_EXTRAS: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def launch_defaults(cls) -> tuple:
        """What a call that leaves them out passes for ``raster_group`` (0: the kernel's own
        tile order) and each of ``LAUNCH_EXTRAS``. (The entries have no Python defaults: the
        DSL turns a ``*launch`` tail into parameters without defaults, which no defaulted
        parameter may precede; the host wraps every compiled function with these instead.)"""
        return (0, *(default for _, default in cls.LAUNCH_EXTRAS))

    def fake_launch_extras(self) -> tuple:
        """Compile-time stand-ins for ``LAUNCH_EXTRAS``, one each (the compiled function takes
        them as run-time values)."""
        return ()

    def check_traced(self) -> None:
        """What a family checks before it builds its traced entry (nothing by default)."""

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        max_active_clusters: Int32,
        stream,
        raster_group: Int32,
        *launch,
    ):
        """C[m, n, l] = sum_k A[m, k, l] * B[n, k, l]: the package docstring's contract, then
        the family's ``LAUNCH_EXTRAS`` (omitted ones take their defaults, in a traced call of
        this entry)."""
        self._call(
            mA, mB, mC, max_active_clusters, stream, raster_group, self._launch_values(launch), None
        )

    @cute.jit
    def by_address(
        self,
        majors: cutlass.Constexpr,
        token: cute.Tensor,
        a: cute.Pointer,
        b: cute.Pointer,
        c: cute.Pointer,
        m: Int64,
        n: Int64,
        k: Int64,
        l: Int64,  # noqa: E741
        a_ld: Int64,
        a_batch: Int64,
        b_ld: Int64,
        b_batch: Int64,
        c_ld: Int64,
        c_batch: Int64,
        max_active_clusters: Int32,
        stream,
        raster_group: Int32,
        *launch,
    ):
        """``__call__`` with the operands at addresses ``a``, ``b``, ``c`` (the entry the host
        compiles: ``common.address``); ``majors`` (compile time) is (A's, B's, C's) major mode,
        ``token`` any tensor on the device (it names the device and so the stream)."""
        mA, mB, mC = address.operands(
            majors, a, b, c, m, n, k, l, a_ld, a_batch, b_ld, b_batch, c_ld, c_batch
        )
        self._call(
            mA, mB, mC, max_active_clusters, stream, raster_group, self._launch_values(launch), None
        )

    @cute.jit
    def traced(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        max_active_clusters: Int32,
        stream,
        raster_group: Int32,
        trace_buffer: cute.Tensor,
        *launch,
    ):
        """``__call__`` of a kernel built with ``trace=True``, recording into ``trace_buffer``
        (int32, (recorders, words), ``trace_format``; which recorder writes which row: sm90's
        ``RECORDERS_PER_CTA``, sm80's ``check_traced``)."""
        self.check_traced()
        self._call(
            mA, mB, mC, max_active_clusters, stream, raster_group, self._launch_values(launch),
            trace_buffer,
        )  # fmt: skip

    def _launch_values(self, launch: tuple) -> tuple:
        """``launch`` with the defaults of the ``LAUNCH_EXTRAS`` it leaves out."""
        if len(launch) > len(self.LAUNCH_EXTRAS):
            names = [name for name, _ in self.LAUNCH_EXTRAS] or "none"
            raise TypeError(
                f"{self.name} takes {len(self.LAUNCH_EXTRAS)} launch arguments after "
                f"raster_group ({names}), got {len(launch)}"
            )
        return (*launch, *(default for _, default in self.LAUNCH_EXTRAS[len(launch) :]))
