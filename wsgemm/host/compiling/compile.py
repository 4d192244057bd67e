"""Compiling one variant with the DSL (no GPU needed): fake arguments, kernel object, compile."""

from __future__ import annotations

import inspect
import os
import tempfile
import threading
from pathlib import Path

from ...support import VECTOR_BYTES, cutlass_dtype, vector_elems
from ..registry import Variant


def operand_majors(variant: Variant) -> tuple[str, str, str]:
    """(A's, B's, C's) major mode: the variant's two, and C's from its config (a swap-AB config
    computes C^T = B^T A^T: its C is the caller's C transposed, M-major)."""
    c_m_major = bool(getattr(variant.kernel_config(), "swap_ab", False))
    return variant.a_major, variant.b_major, "m" if c_m_major else "n"


def fake_arguments(variant: Variant) -> tuple:
    """Compile-time stand-ins for the tensor entry's (mA, mB, mC, max_active_clusters, stream,
    raster_group): the operands and the launch arguments (``wsgemm.kernels``), all run-time
    values. (The traced entry takes these; ``fake_address_arguments`` are the untraced one's.)

    M, N, K, L and every non-unit stride are symbolic; the unit stride is static, so the major
    mode is part of the variant. Non-unit strides are declared 16-byte divisible (the host only
    passes such tensors) so the kernels can vectorize and build TMA descriptors.
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    m, n, k, l_ = (cute.sym_int64(symbol=s) for s in "MNKL")

    def operand(dtype: str, rows, cols, major_is_rows: bool):
        div = vector_elems(dtype)
        ld = cute.sym_int64(divisibility=div)
        batch = cute.sym_int64(divisibility=div)
        stride = (1, ld, batch) if major_is_rows else (ld, 1, batch)
        return make_fake_tensor(
            cutlass_dtype(dtype), (rows, cols, l_), stride, assumed_align=VECTOR_BYTES
        )

    a_major, b_major, c_major = operand_majors(variant)
    a = operand(variant.ab_dtype, m, k, a_major == "m")
    b = operand(variant.ab_dtype, n, k, b_major == "n")
    c = operand(variant.c_dtype, m, n, c_major == "m")
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    return a, b, c, cutlass.Int32(1), stream, cutlass.Int32(0)


def fake_address_arguments(variant: Variant) -> tuple:
    """Compile-time stand-ins for ``by_address``'s (majors, token, a, b, c, M, N, K, L, six
    strides, max_active_clusters, stream, raster_group) (``kernels.common.address``): the
    majors are compile-time, everything after them a run-time value."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr

    from ...kernels.common.address import SIZE_AND_STRIDE_NAMES

    def pointer(dtype: str):
        return make_ptr(cutlass_dtype(dtype), 0, cute.AddressSpace.gmem, assumed_align=VECTOR_BYTES)

    token = make_fake_tensor(cutlass.Int32, (cute.sym_int64(),), (1,))
    pointers = (pointer(variant.ab_dtype), pointer(variant.ab_dtype), pointer(variant.c_dtype))
    ints = tuple(cutlass.Int64(0) for _ in SIZE_AND_STRIDE_NAMES)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    return (operand_majors(variant), token, *pointers, *ints, cutlass.Int32(1), stream,
            cutlass.Int32(0))  # fmt: skip


def make_kernel(variant: Variant, **options):
    """The kernel object of ``variant``; ``options`` go to its class (``trace=True``)."""
    if variant.epilogue != "none":
        options = {**options, "epilogue": variant.epilogue}
    return variant.kernel_class()(
        variant.kernel_config(),
        cutlass_dtype(variant.ab_dtype),
        cutlass_dtype(variant.c_dtype),
        cutlass_dtype(variant.acc_dtype),
        gpu_arch=variant.arch,
        **options,
    )


# cute.compile keeps MLIR state per thread and is not re-entrant: one compile at a time.
_COMPILE_LOCK = threading.Lock()


def compile_variant(variant: Variant, *, keep: bool = False):
    """Trace and compile one variant's address entry (``by_address``; no GPU needed). ``keep``
    retains the PTX and the cubin in ``compiled.artifacts`` for inspection."""
    kernel = make_kernel(variant)
    args = fake_address_arguments(variant) + kernel.fake_launch_extras()
    return compile_entry(kernel.by_address, args, variant.arch, keep=keep)


def compile_entry(entry, args: tuple, arch: str, *, keep: bool = False):
    """``cute.compile(entry, *args)`` for ``arch`` under the compile lock (a kernel object's
    ``__call__`` or another ``@cute.jit`` entry of it, e.g. ``traced``); ``keep`` reads the
    PTX and the cubin back into ``compiled.artifacts``."""
    import cutlass.cute as cute

    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    with _COMPILE_LOCK:
        if not keep:
            return cute.compile(entry, *args, options=options)
        # The DSL writes kept files into a dump folder; read the cubin back into the artifacts.
        with tempfile.TemporaryDirectory(prefix="wsgemm-keep-") as dump:
            compiled = cute.compile(
                entry, *args, options=f"{options} --keep-ptx --keep-cubin --dump-dir {dump}"
            )
            art = compiled.artifacts
            for attr, read in (("CUBIN", Path.read_bytes), ("PTX", Path.read_text)):
                value = getattr(art, attr, None)
                if isinstance(value, str) and os.path.isfile(value):
                    setattr(art, attr, read(Path(value)))
            return compiled


def launch_signature(variant: Variant) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The names of the compiled function's arguments (the kernel's ``by_address`` less
    ``stream``, which the compiled function takes from the environment, and the compile-time
    ``majors``; then the family's ``LAUNCH_EXTRAS``) and the defaults of the trailing ones.
    Imports the kernel class (and so the DSL): asked when an entry is stored, which keeps it
    (``disk.Entry.launch``), and when a function compiled here is wrapped."""
    cls = variant.kernel_class()
    skip = ("self", "stream", "majors")
    params = [
        p
        for p in inspect.signature(cls.by_address).parameters.values()
        if p.name not in skip and p.kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    names = (*(p.name for p in params), *(name for name, _ in cls.LAUNCH_EXTRAS))
    # ints (raster group, split count) and None (split-K's buffers of an unsplit kernel)
    defaults = tuple(None if d is None else int(d) for d in cls.launch_defaults())
    return names, defaults


def wrap_launch(fn, launch: tuple[tuple[str, ...], tuple[int, ...]]):
    """``fn`` (a compiled kernel exported to disk and loaded back) taking the defaults of its
    launch arguments. The DSL keeps Python defaults only on the function it compiled in this
    process; a loaded one takes every run-time argument positionally. Wrapped, both answer
    ``fn(a, b, c, max_active_clusters)`` and ``fn(..., raster_group=...)`` alike, at no cost
    over passing the defaults by hand (0.16 us a call either way on the development machine).
    The raw function stays reachable as ``__wrapped__``, the defaults as ``launch_defaults``
    (``calls.KernelCall.bind`` calls it with every argument)."""
    from tvm_ffi.utils.kwargs_wrapper import make_kwargs_wrapper

    names, defaults = launch
    wrapper = make_kwargs_wrapper(fn, list(names), defaults)
    wrapper.__wrapped__ = fn
    wrapper.launch_defaults = defaults  # what a caller passing every argument passes
    return wrapper


def with_launch_defaults(fn, variant: Variant):
    """``wrap_launch`` with the launch arguments read from ``variant``'s kernel class."""
    return wrap_launch(fn, launch_signature(variant))
