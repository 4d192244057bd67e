"""Host layer: the backend registry, compiling kernel variants, the compile caches, launching.

A *variant* is everything a kernel is specialized on: backend (kernel class and config), target
arch, dtypes and the operands' major modes. Problem sizes (M, N, K, L) and the non-unit strides
are run-time values: a new shape never recompiles. Each variant is compiled once per process
(an in-memory dict) and, across processes, once per machine (an on-disk object-file cache keyed
by the variant and a fingerprint of the kernel sources and toolchain versions).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Dtype names used throughout the host and API layers (torch-free on purpose: `inspect` and the
# CPU tests compile without torch tensors).
AB_DTYPES = ("float16", "bfloat16")
C_DTYPES = ("float16", "bfloat16", "float32")
ACC_DTYPES = ("float32", "float16")
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# TMA and cp.async move 16-byte vectors: base pointers and non-unit strides must be 16-byte
# multiples, i.e. this many elements.
VECTOR_BYTES = 16


@dataclass(frozen=True)
class Backend:
    """One selectable kernel: where its class lives and which config it ships with."""

    name: str
    module: str
    cls: str
    family: str  # "sm90" kernels need sm_90a exactly; "sm80" kernels run on sm_80 and later

    def kernel_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)

    def config(self, acc_dtype: str = "float32") -> Any:
        """The shipped config; a kernel module may pick it per accumulator dtype (fp16
        accumulators take half the registers, so sm80 affords the study kernel's larger tile).
        Memoized: ``matmul``'s dispatch asks on every call, and configs are frozen."""
        return _shipped_config(self.module, self.name, acc_dtype)

    def supports(self, cc: tuple[int, int]) -> bool:
        if self.family == "sm90":
            return cc == (9, 0)
        return cc >= (8, 0)


@functools.cache
def _shipped_config(module_name: str, name: str, acc_dtype: str) -> Any:
    module = importlib.import_module(module_name)
    pick = getattr(module, "shipped_config", None)
    if pick is not None:
        return pick(name, _cutlass_dtype(acc_dtype))
    return module.SHIPPED_CONFIGS[name]


# What each one is: README's backend table and the kernel classes' docstrings.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("sm90", "wsgemm.kernels.sm90", "Sm90Gemm", "sm90"),
        Backend("sm90-pingpong", "wsgemm.kernels.sm90", "Sm90Gemm", "sm90"),
        Backend("sm80", "wsgemm.kernels.sm80_ws", "Sm80WsGemm", "sm80"),
        Backend("sm80-multistage", "wsgemm.kernels.sm80_multistage", "Sm80MultistageGemm", "sm80"),
    )
}


def arch_for_capability(cc: tuple[int, int]) -> str:
    """The DSL target for a device: sm_90a-only instructions (WGMMA, setmaxnreg) need the 'a'."""
    major, minor = cc
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


@functools.cache
def shipped_backends(family: str | None = None) -> tuple[str, ...]:
    """Backends whose kernel module imports (all of them in a complete install). Cached: the
    answer cannot change within a process, and ``matmul``'s dispatch asks on every call."""
    names = []
    for name, backend in BACKENDS.items():
        if family is not None and backend.family != family:
            continue
        try:
            backend.config()
        except (ImportError, AttributeError, KeyError):
            continue
        names.append(name)
    return tuple(names)


@functools.cache
def needs_vector_extent(backend: str) -> bool:
    """cp.async kernels need each unit-stride extent to be a whole number of 16-byte vectors."""
    return bool(BACKENDS[backend].kernel_class().needs_vector_extent)


def cluster_size(config: Any) -> int:
    """CTAs per cluster: the persistent grid has (SMs // this) clusters."""
    return getattr(config, "cluster_m", 1) * getattr(config, "cluster_n", 1)


@dataclass(frozen=True)
class Variant:
    """Everything one compiled kernel is specialized on."""

    backend: str
    arch: str
    ab_dtype: str = "float16"
    c_dtype: str = "float16"
    acc_dtype: str = "float32"
    a_major: str = "k"  # A is (M, K, L): "k" (row-major a) or "m"
    b_major: str = "k"  # B is (N, K, L): "k" (column-major b) or "n" (row-major b)
    config: Any = None  # None: the backend's shipped config; else a config to try (tuning)

    def __post_init__(self) -> None:
        checks = (
            ("backend", self.backend, tuple(BACKENDS)),
            ("ab_dtype", self.ab_dtype, AB_DTYPES),
            ("c_dtype", self.c_dtype, C_DTYPES),
            ("acc_dtype", self.acc_dtype, ACC_DTYPES),
            ("a_major", self.a_major, ("k", "m")),
            ("b_major", self.b_major, ("k", "n")),
        )
        for field, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"Variant.{field}={value!r}; allowed: {', '.join(allowed)}")
        if self.acc_dtype == "float16" and self.ab_dtype != "float16":
            raise ValueError(
                "fp16 accumulation needs fp16 inputs: the tensor cores accumulate bf16 products "
                "in fp32 only"
            )

    def key(self) -> str:
        names = [f.name for f in dataclasses.fields(self) if f.name != "config"]
        fields = [str(getattr(self, name)) for name in names]
        if self.config is not None:
            fields.append(repr(self.config))
        return "-".join(fields)

    def kernel_config(self) -> Any:
        if self.config is not None:
            return self.config
        return BACKENDS[self.backend].config(self.acc_dtype)


def _cutlass_dtype(name: str):
    import cutlass

    return {
        "float16": cutlass.Float16,
        "bfloat16": cutlass.BFloat16,
        "float32": cutlass.Float32,
    }[name]


def fake_arguments(variant: Variant) -> tuple:
    """Compile-time stand-ins for (mA, mB, mC, max_active_clusters, stream).

    M, N, K, L and every non-unit stride are symbolic; the unit stride is static, so the major
    mode is part of the variant. Non-unit strides are declared 16-byte divisible (the host only
    passes such tensors) so the kernels can vectorize and build TMA descriptors.
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    m, n, k, l_ = (cute.sym_int64(symbol=s) for s in "MNKL")

    def operand(dtype: str, rows, cols, major_is_rows: bool):
        div = VECTOR_BYTES // ELEMENT_BYTES[dtype]
        ld = cute.sym_int64(divisibility=div)
        batch = cute.sym_int64(divisibility=div)
        stride = (1, ld, batch) if major_is_rows else (ld, 1, batch)
        return make_fake_tensor(
            _cutlass_dtype(dtype), (rows, cols, l_), stride, assumed_align=VECTOR_BYTES
        )

    a = operand(variant.ab_dtype, m, k, variant.a_major == "m")
    b = operand(variant.ab_dtype, n, k, variant.b_major == "n")
    c = operand(variant.c_dtype, m, n, False)
    return a, b, c, cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True)


def make_kernel(variant: Variant):
    backend = BACKENDS[variant.backend]
    return backend.kernel_class()(
        variant.kernel_config(),
        _cutlass_dtype(variant.ab_dtype),
        _cutlass_dtype(variant.c_dtype),
        _cutlass_dtype(variant.acc_dtype),
    )


# cute.compile keeps MLIR state per thread and is not re-entrant: one compile at a time.
_COMPILE_LOCK = threading.Lock()


def compile_variant(variant: Variant, *, keep: bool = False):
    """Trace and compile one variant (no GPU needed). ``keep`` retains the PTX and the cubin in
    ``compiled.artifacts`` for inspection."""
    import cutlass.cute as cute

    options = f"--enable-tvm-ffi --gpu-arch {variant.arch}"
    kernel = make_kernel(variant)
    args = fake_arguments(variant)
    with _COMPILE_LOCK:
        if not keep:
            return cute.compile(kernel, *args, options=options)
        # The DSL writes kept files into a dump folder; read the cubin back into the artifacts.
        with tempfile.TemporaryDirectory(prefix="wsgemm-keep-") as dump:
            compiled = cute.compile(
                kernel, *args, options=f"{options} --keep-ptx --keep-cubin --dump-dir {dump}"
            )
            art = compiled.artifacts
            for attr, read in (("CUBIN", Path.read_bytes), ("PTX", Path.read_text)):
                value = getattr(art, attr, None)
                if isinstance(value, str) and os.path.isfile(value):
                    setattr(art, attr, read(Path(value)))
            return compiled


@functools.cache
def _source_fingerprint() -> str:
    """Kernel sources plus toolchain versions: any change invalidates the on-disk cache."""
    import cutlass

    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for sub in ("kernels", "runtime"):
        for path in sorted((root / sub).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    h.update(Path(__file__).read_bytes())
    h.update(f"{sys.version_info[:2]} cutlass-dsl={getattr(cutlass, '__version__', '?')}".encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path | None:
    """``$WSGEMM_CACHE_DIR`` or ``~/.cache/wsgemm``; ``WSGEMM_DISK_CACHE=0`` turns it off."""
    if os.environ.get("WSGEMM_DISK_CACHE", "1") == "0":
        return None
    base = os.environ.get("WSGEMM_CACHE_DIR") or Path.home() / ".cache" / "wsgemm"
    return Path(base) / _source_fingerprint()


class CompileCache:
    """Variant -> callable, in memory and on disk. Thread-safe; a failed compile caches nothing."""

    def __init__(self) -> None:
        self._fns: dict[Variant, Callable] = {}
        self._lock = threading.Lock()

    def get(self, variant: Variant) -> Callable:
        fn = self._fns.get(variant)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._fns.get(variant)
            if fn is None:
                fn = self._load_or_compile(variant)
                self._fns[variant] = fn
        return fn

    def clear(self) -> None:
        with self._lock:
            self._fns.clear()

    def __len__(self) -> int:
        return len(self._fns)

    def _load_or_compile(self, variant: Variant) -> Callable:
        import cutlass.cute as cute

        folder = cache_dir()
        name = "wsgemm_" + hashlib.sha256(variant.key().encode()).hexdigest()[:24]
        path = folder / f"{name}.o" if folder else None
        if path is not None and path.exists():
            try:
                return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), name)
            except Exception:  # a truncated or stale object is a miss, not an error
                path.unlink(missing_ok=True)
        compiled = compile_variant(variant)
        if path is not None:
            tmp = None
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".o.tmp")
                os.close(fd)
                compiled.export_to_c(tmp, function_name=name)
                os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
                tmp = None
            except Exception:  # a failed export only costs a recompile in the next process
                pass
            finally:
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)
        return compiled


COMPILE_CACHE = CompileCache()


def _warm_one(variant: Variant) -> str:
    COMPILE_CACHE.get(variant)
    return variant.key()


def warm(variants: list[Variant], jobs: int = 1, progress: Callable[[str], None] | None = None):
    """Compile ``variants`` into the on-disk cache, ``jobs`` processes at a time (cute.compile is
    neither thread-safe nor re-entrant, so parallelism is by process)."""
    if cache_dir() is None:
        raise ValueError("the on-disk cache is off (WSGEMM_DISK_CACHE=0): nothing to warm")
    report = progress or (lambda _: None)
    if jobs <= 1:
        for v in variants:
            report(_warm_one(v))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(_warm_one, v) for v in variants]):
            report(fut.result())
