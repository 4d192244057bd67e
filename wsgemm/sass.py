"""Reading what the compiler made of a kernel, without a GPU: registers, shared memory, local
memory (spills) from the cubin's ELF sections, and opcode counts from the SASS text.

The cubin is a CUDA ELF file. Per kernel it has a ``.text.<kernel>`` section (its ``sh_info`` is
the function's symbol index) and an optional ``.nv.shared.<kernel>`` section sized by the static
shared memory; the module-wide ``.nv.info`` section holds, per function symbol, the register
count and the per-thread stack frame (local memory: where spilled registers go).
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field

# The opcodes worth counting: what tells a reader which hardware path a GEMM takes.
KEY_OPCODES = (
    "HGMMA",  # warpgroup MMA (sm_90a)
    "HMMA",  # warp MMA, mma.sync
    "UTMALDG",  # TMA load
    "UTMASTG",  # TMA store
    "UBLKCP",  # bulk copy
    "LDGSTS",  # cp.async
    "LDSM",  # ldmatrix
    "STSM",  # stmatrix
    "SYNCS",  # mbarrier operations (sm_90)
    "ARRIVES",  # cp.async completion arriving on an mbarrier (sm_80)
    "DEPBAR",  # cp.async.wait_group
    "USETMAXREG",  # setmaxnreg
    "BAR",  # named / block barriers
    "LDG",
    "STG",
    "LDS",
    "STS",
    "LDL",  # local-memory load: a spill (or a runtime-indexed register array)
    "STL",  # local-memory store
)

_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_SVAL = 0x04
_EIFMT_HVAL = 0x03


@dataclass
class KernelResources:
    name: str
    registers: int
    static_smem_bytes: int
    frame_bytes: int
    sass: Counter = field(default_factory=Counter)

    @property
    def spill_bytes(self) -> int:
        """Local memory per thread. Zero for every shipped kernel (the CPU tests assert it)."""
        return self.frame_bytes


def _elf_sections(blob: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (offset, size, sh_info) for a 64-bit little-endian ELF."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = []
    for i in range(shnum):
        name, _type, _flags, _addr, off, size, _link, info = struct.unpack_from(
            "<IIQQQQII", blob, shoff + i * shentsize
        )
        headers.append((name, off, size, info))
    str_off = headers[shstrndx][1]

    def name_at(idx: int) -> str:
        end = blob.index(b"\0", str_off + idx)
        return blob[str_off + idx : end].decode()

    return {name_at(n): (off, size, info) for n, off, size, info in headers}


def _per_function_attrs(info: bytes) -> dict[int, dict[int, int]]:
    """attr -> {function symbol index: value} from the module-wide ``.nv.info`` section, whose
    per-function entries are (u32 symbol index, u32 value)."""
    attrs: dict[int, dict[int, int]] = {}
    pos = 0
    while pos + 4 <= len(info):
        fmt, attr = info[pos], info[pos + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", info, pos + 2)
            if size == 8:
                sym, value = struct.unpack_from("<II", info, pos + 4)
                attrs.setdefault(attr, {})[sym] = value
            pos += 4 + size
        elif fmt == _EIFMT_HVAL:
            pos += 4
        else:
            pos += 2
    return attrs


_SASS_FUNC = re.compile(r"^\s*\.text\.(\S+):\s*$")
_SASS_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_SASS_FULL = re.compile(r"/\*[0-9a-f]{4,}\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]*[^;]*;)")


def instructions(sass: str) -> list[str]:
    """Every instruction of the SASS text, guard, opcode with its modifiers and operands:
    ``"@!P0 LDGSTS.E.BYPASS.LTC128B.128 [R139+0x400], [R144.64], !P2 ;"``."""
    return [m.group(1) for m in map(_SASS_FULL.search, sass.splitlines()) if m]


def waited_wgmmas(sass: str) -> tuple[int, int]:
    """(HGMMAs that wait for their own completion before the next WGMMA issues, all HGMMAs).

    A pipelined mainloop issues a k-tile's HGMMAs back to back and waits once a k-tile
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``). Where ptxas cannot place a ``warpgroup.arrive`` it
    needs (warning C7520: "wgmma.mma_async instructions are serialized due to program
    dependence on compiler-inserted WG.AR in divergent path"), it serializes every WGMMA of
    the kernel instead: each HGMMA is followed by ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` and a
    fresh ``WARPGROUP.ARRIVE`` before the next one, which leaves the tensor cores idle between
    them. Counted in the order the instructions are laid out."""
    stream = [i for i in instructions(sass) if "HGMMA" in i or "WARPGROUP" in i]
    waited = sum(
        "HGMMA" in a and "DEPBAR.LE gsb0, 0x0" in b and ("HGMMA" in c or "ARRIVE" in c)
        for a, b, c in zip(stream, stream[1:], stream[2:], strict=False)
    )
    return waited, sum("HGMMA" in i for i in stream)


def instruction_digest(sass: str) -> str:
    """sha256 of a kernel's instruction stream (``instructions``), its function names replaced
    by placeholders: two builds with the same digest issue the same instructions, whatever
    their kernels are called (a refactor that moves a kernel's code renames its symbols)."""
    import hashlib

    names = sorted({m.group(1) for m in map(_SASS_FUNC.match, sass.splitlines()) if m}, key=len)
    text = "\n".join(instructions(sass))
    for i, name in enumerate(reversed(names)):  # longest first: no name inside another's
        text = text.replace(name, f"<fn{i}>")
    return hashlib.sha256(text.encode()).hexdigest()


def opcodes(sass: str) -> list[str]:
    """The full opcode (modifiers included, e.g. ``HMMA.16816.F32``) of every instruction."""
    return [re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].rstrip(";") for i in instructions(sass)]


def count_opcodes(sass: str) -> dict[str, Counter]:
    """kernel -> Counter of base opcodes (``HGMMA.64x256x16.F32`` counts as ``HGMMA``)."""
    counts: dict[str, Counter] = {}
    current: Counter | None = None
    for line in sass.splitlines():
        m = _SASS_FUNC.match(line)
        if m:
            current = counts.setdefault(m.group(1), Counter())
            continue
        m = _SASS_INSN.search(line)
        if m and current is not None:
            current[m.group(1).split(".")[0]] += 1
    return counts


def kernel_resources(cubin: bytes, sass: str) -> list[KernelResources]:
    sections = _elf_sections(cubin)
    opcodes = count_opcodes(sass)
    out = []
    off, size, _ = sections[".nv.info"]
    attrs = _per_function_attrs(cubin[off : off + size])
    for sec, (_off, _size, info) in sections.items():
        if not sec.startswith(".text."):
            continue
        # sh_info: function symbol index in the low 24 bits; some toolchains put the register
        # count in the top byte as well
        sym = info & 0xFFFFFF
        name = sec[len(".text.") :]
        shared = sections.get(f".nv.shared.{name}")
        out.append(
            KernelResources(
                name=name,
                registers=attrs.get(_EIATTR_REGCOUNT, {}).get(sym, info >> 24),
                static_smem_bytes=shared[1] if shared else 0,
                frame_bytes=attrs.get(_EIATTR_FRAME_SIZE, {}).get(sym, 0),
                sass=opcodes.get(name, Counter()),
            )
        )
    return out


# What to install when nvdisasm is missing: the DSL's own extra that pins the nvdisasm its cubins
# need (the DSL's hint names ``nvidia-cutlass-dsl[sass]``, an extra that does not exist).
NVDISASM_PACKAGE = "nvidia-cutlass-dsl-libs-base[sass]"


class NvdisasmMissing(RuntimeError):
    """No usable nvdisasm: reading SASS needs CUDA's disassembler."""


def nvdisasm() -> str:
    """The nvdisasm the DSL would use (the ``nvidia-cuda-nvdisasm`` wheel, or a CUDA toolkit's
    on CUDA_HOME), or NvdisasmMissing saying what to install."""
    from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

    try:
        return _find_nvdisasm_binary()
    except Exception as exc:  # the DSL's DSLUserCodeError, with advice that does not work
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NvdisasmMissing(
            f"reading SASS needs CUDA's nvdisasm ({first}); install it with "
            f"pip install '{NVDISASM_PACKAGE}' (a wsgemm dependency), or point CUDA_HOME at a "
            "CUDA toolkit at least as new as the DSL's"
        ) from None


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin."""
    tool = nvdisasm()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True)
    return proc.stdout


_EM_CUDA = 190


def embedded_cubin(obj: bytes) -> bytes | None:
    """The cubin a kernel object file carries (the DSL embeds it verbatim in the host object's
    read-only data), or None if there is not exactly one."""
    found = []
    start = obj.find(b"\x7fELF", 1)
    while start >= 0:
        end = _elf_end(obj, start)
        if end is not None:
            found.append(obj[start:end])
        start = obj.find(b"\x7fELF", start + 1)
    return found[0] if len(found) == 1 else None


def _elf_end(blob: bytes, at: int) -> int | None:
    """End offset of a 64-bit little-endian CUDA ELF starting at ``at``: its last section or
    header table, whichever ends later."""
    try:
        if blob[at + 4] != 2 or blob[at + 5] != 1:
            return None
        if struct.unpack_from("<H", blob, at + 0x12)[0] != _EM_CUDA:
            return None
        phoff, shoff = struct.unpack_from("<QQ", blob, at + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
        end = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
        for i in range(shnum):
            sh_type = struct.unpack_from("<I", blob, at + shoff + i * shentsize + 4)[0]
            off, size = struct.unpack_from("<QQ", blob, at + shoff + i * shentsize + 0x18)
            if sh_type != 8:  # SHT_NOBITS occupies no file space
                end = max(end, off + size)
    except (struct.error, IndexError):
        return None
    return at + end if at + end <= len(blob) else None


def summarize(sass_counts: Counter) -> dict[str, int]:
    """The key opcodes, zeros included, so reports line up across kernels."""
    return {op: int(sass_counts.get(op, 0)) for op in KEY_OPCODES}
