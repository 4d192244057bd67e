"""Compile shipped kernel variants for an arch, without a GPU, and report what the compiler made:
registers, shared memory, spills and the key SASS opcodes. Serves ``python -m wsgemm inspect``
and the CPU tests."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from . import host, sass

ARCHES = ("sm_90a", "sm_80", "sm_86", "sm_89")


@dataclass
class Report:
    kernel: str
    arch: str
    config: dict
    variant: dict
    registers: int
    smem_bytes: int
    spill_bytes: int
    sass: dict
    #: The whole disassembly (tests read it); not part of the JSON report.
    sass_text: str = dataclasses.field(default="", repr=False)

    def as_json(self) -> dict:
        out = dataclasses.asdict(self)
        del out["sass_text"]
        return out


def backends_for(arch: str) -> list[str]:
    """sm90 kernels need sm_90a; sm80 kernels build for every arch from sm_80 on."""
    family_ok = {"sm90": arch == "sm_90a", "sm80": True}
    return [n for n in host.shipped_backends() if family_ok[host.BACKENDS[n].family]]


def variants(arch: str, backend: str, everything: bool = False) -> list[host.Variant]:
    """The representative variant (fp16 in and out, fp32 accumulate, K-major A and B), or with
    ``everything`` every dtype, accumulator and major combination the backend supports."""
    if not everything:
        return [host.Variant(backend, arch)]
    out = []
    for ab, c, acc, am, bm in itertools.product(
        host.AB_DTYPES, host.C_DTYPES, host.ACC_DTYPES, ("k", "m"), ("k", "n")
    ):
        if acc == "float16" and ab != "float16":
            continue
        out.append(host.Variant(backend, arch, ab, c, acc, am, bm))
    return out


def inspect_variant(variant: host.Variant, compiled=None) -> Report:
    """``compiled``: the variant already compiled with ``host.compile_variant(keep=True)``."""
    if compiled is None:
        compiled = host.compile_variant(variant, keep=True)
    art = compiled.artifacts
    text = sass.disassemble(art.CUBIN)
    kernels = sass.kernel_resources(art.CUBIN, text)
    if len(kernels) != 1:
        raise RuntimeError(f"{variant.key()}: expected one kernel in the cubin, got {len(kernels)}")
    (k,) = kernels
    kernel_obj = host.make_kernel(variant)
    dynamic = getattr(kernel_obj, "shared_memory_bytes", None)
    smem = k.static_smem_bytes + (int(dynamic()) if callable(dynamic) else 0)
    config = variant.kernel_config()
    return Report(
        kernel=variant.backend,
        arch=variant.arch,
        config=dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {},
        variant={
            f: getattr(variant, f)
            for f in ("ab_dtype", "c_dtype", "acc_dtype", "a_major", "b_major")
        },
        registers=k.registers,
        smem_bytes=smem,
        spill_bytes=k.spill_bytes,
        sass={**sass.summarize(k.sass), "total": int(sum(k.sass.values()))},
        sass_text=text,
    )
