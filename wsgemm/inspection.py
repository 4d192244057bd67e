"""Compile shipped kernel variants for an arch, without a GPU, and report what the compiler made:
registers, shared memory, spills and the key SASS opcodes. Serves ``python -m wsgemm inspect``
and the CPU tests.

The cubin comes from the on-disk compile cache when the variant is there (the cached object
carries it; ``warm`` fills the cache for ``inspect`` too), else the variant is compiled and
stored, so a second ``inspect`` compiles nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import host, sass, support

#: The targets of ``support.TARGETS``, sm_90a (the default, where every family builds) first.
ARCHES = tuple(sorted(support.SMEM_PER_BLOCK, key=lambda arch: arch != "sm_90a"))

# The opcode columns of the table, per kernel family: what shows which hardware path it takes.
# sm80 kernels meet on mbarriers: cp.async arrives are ARRIVES before Hopper and SYNCS on it;
# the baseline has neither (DEPBAR and BAR instead).
#: (``HGMMA_WAITED`` is no opcode: the HGMMAs that wait for their own completion before the
#: next issues, ``sass.waited_wgmmas``; near 0 in a pipelined kernel, all of them where ptxas
#: serialized its WGMMAs)
OPCODE_COLUMNS = {
    "sm90": ("HGMMA", "HGMMA_WAITED", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG", "BAR"),
    "sm80": ("HMMA", "LDGSTS", "LDSM", "ARRIVES", "SYNCS", "DEPBAR", "BAR"),
}


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
    """The backends that build for ``arch`` (``support.TARGETS``: sm90 kernels need sm_90a;
    sm80 kernels build for every target)."""
    return [n for n in host.shipped_backends() if arch_allows(arch, host.BACKENDS[n].family)]


def arch_allows(arch: str, family: str) -> bool:
    return any(t.arch == arch and family in t.families for t in support.TARGETS)


def mismatch(arch: str, backends: list[str]) -> str:
    """Why none of ``backends`` builds for ``arch`` (empty if one does)."""
    wrong = [b for b in backends if not arch_allows(arch, host.BACKENDS[b].family)]
    if not wrong or len(wrong) < len(backends):
        return ""
    fits = ", ".join(backends_for(arch))
    return (
        f"{', '.join(wrong)} {'needs' if len(wrong) == 1 else 'need'} --arch sm_90a (WGMMA, "
        f"TMA and setmaxnreg are Hopper-only); for {arch} choose from: {fits}"
    )


def opcode_columns(arch: str, families) -> tuple[str, ...]:
    """The opcode columns for a table of kernels of ``families`` compiled for ``arch``."""
    columns: list[str] = []
    for family in ("sm90", "sm80"):
        if family in families:
            columns += [op for op in OPCODE_COLUMNS[family] if op not in columns]
    if support.arch_major(arch) < 9:
        columns = [op for op in columns if op != "SYNCS"]  # no such instruction before Hopper
    return tuple(columns)


def variants(arch: str, backend: str, everything: bool = False) -> list[host.Variant]:
    """The representative variant (fp16 in and out, fp32 accumulate, K-major A and B), or with
    ``everything`` every dtype, accumulator and major combination the backend supports."""
    if not everything:
        return [host.Variant(backend, arch)]
    return host.every_variant(backend, arch)


def menu_entries(arch: str, backends) -> list:
    """The sm90 menu entries (``choosing.MENU``) that run on ``backends``, for ``arch``."""
    from .host import choosing

    return [e for e in choosing.MENU if e.backend in backends and arch_allows(arch, "sm90")]


def warm_variants(arch: str, backends) -> list[host.Variant]:
    """What ``warm`` compiles for ``backends``: every variant of each sm80-family backend, and
    for the sm90 family every variant of the menu entries that run on those backends (the
    shipped two are the sm90 backends' own variants), so ``auto`` never compiles at run time
    a kernel ``warm`` left out. Bounded: 36 per backend or menu entry."""
    from .host import choosing

    out = [
        v
        for name in backends
        if host.BACKENDS[name].family != "sm90"
        for v in variants(arch, name, everything=True)
    ]
    return out + choosing.menu_variants(arch, tuple(menu_entries(arch, backends)))


@dataclass(frozen=True)
class MenuVariant:
    """A variant of an sm90 menu entry (``choosing.MENU``): the entry's name, and whether it
    is the entry's split-K variant."""

    entry: str
    split: bool
    variant: host.Variant


def menu_variants(arch: str = "sm_90a", everything: bool = False) -> list[MenuVariant]:
    """The variants of every menu entry ``auto`` can pick, in menu order: one for each entry
    and for its split-K variant where it has one (the first of each: fp16 in and out, fp32
    accumulate, K-major A and B), or with ``everything`` all that ``warm`` compiles
    (``choosing.menu_variants``). None for an arch the sm90 kernels do not build for."""
    from .host import choosing

    if not arch_allows(arch, "sm90"):
        return []
    out = []
    for e in choosing.MENU:
        split_config = e.variant_config(split=True) if e.splits else None
        seen = set()
        for v in choosing.menu_variants(arch, (e,)):
            split = split_config is not None and v.config == split_config
            if everything or split not in seen:
                seen.add(split)
                out.append(MenuVariant(e.name, split, v))
    return out


def cubin(variant: host.Variant) -> bytes:
    """The variant's cubin: from its cached object (compiled and stored on a miss)."""
    from .host.compiling.cache import object_bytes

    found = sass.embedded_cubin(object_bytes(variant))
    if found is not None:
        return found
    # An object that does not carry one plain cubin (a DSL that packs it differently): compile
    # again, keeping the cubin.
    return host.compile_variant(variant, keep=True).artifacts.CUBIN


def inspect_variant(variant: host.Variant, compiled=None) -> Report:
    """``compiled``: the variant already compiled with ``host.compile_variant(keep=True)``;
    without it the cubin comes from the variant's cached object."""
    blob = compiled.artifacts.CUBIN if compiled is not None else cubin(variant)
    text = sass.disassemble(blob)
    kernels = sass.kernel_resources(blob, text)
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
        sass={
            **sass.summarize(k.sass),
            "total": int(sum(k.sass.values())),
            "HGMMA_WAITED": sass.waited_wgmmas(text)[0],
        },
        sass_text=text,
    )
