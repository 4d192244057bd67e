"""The record's header: which GPU, driver, library versions and clocks a run measured."""

from __future__ import annotations

import datetime
import platform
import shlex
import sys
from importlib import metadata

from .hardware import flop_per_clock_per_sm
from .nvml import Nvml
from .roofline import header_fields

# Distribution names of the versions the header reports.
DISTRIBUTIONS = {
    "cutlass_dsl": "nvidia-cutlass-dsl",
    "triton": "triton",
    "quack": "quack-kernels",
    "wsgemm": "wsgemm",
}


def version_of(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


#: The wheels that ship cuBLAS with torch (CUDA 12's, CUDA 13's), in the order they are asked
CUBLAS_DISTRIBUTIONS = ("nvidia-cublas-cu12", "nvidia-cublas", "nvidia-cublas-cu13")


def cublas_version() -> str | None:
    """The cuBLAS the baseline runs: its wheel's version, else what the loaded library says
    (``cublasLtGetVersion``: 120903 is 12.9.3), else None."""
    for dist in CUBLAS_DISTRIBUTIONS:
        found = version_of(dist)
        if found is not None:
            return found
    import ctypes
    import os

    lt = None
    for name in ("libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"):
        try:  # only one torch has loaded already (RTLD_NOLOAD)
            lt = ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
            break
        except OSError:
            continue
    if lt is None:
        return None
    try:
        v = int(lt.cublasLtGetVersion())
    except (AttributeError, OSError):
        return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def command_line(argv: list[str] | None = None) -> str:
    """How this run was started, as a shell would take it back."""
    argv = sys.argv if argv is None else argv
    if argv and argv[0].endswith("__main__.py"):
        # ``python -m wsgemm bench`` puts the package's __main__.py path in argv[0].
        argv = ["python", "-m", _module_of(argv[0]), *argv[1:]]
    return shlex.join(argv)


def _module_of(main_path: str) -> str:
    parts = main_path.replace("\\", "/").split("/")
    if "wsgemm" not in parts:
        return "wsgemm"
    # The last "wsgemm" is the package (a checkout may itself be called wsgemm).
    start = len(parts) - 1 - parts[::-1].index("wsgemm")
    return ".".join(parts[start:-1])


def collect(device, nvml: Nvml | None, *, options: dict, method: dict, notes: list[str]) -> dict:
    """The header for a run on ``device`` (a CUDA torch.device)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    info = nvml.info() if nvml is not None else {}
    fpc = flop_per_clock_per_sm(capability)
    versions = {key: version_of(dist) for key, dist in DISTRIBUTIONS.items()}
    if versions["wsgemm"] is None:
        versions["wsgemm"] = _wsgemm_version()
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "flop_per_clock_per_sm": fpc,
        **header_fields(props.name, props.multi_processor_count, fpc, info.get("sm_max_mhz")),
        "driver": info.get("driver"),
        "cuda": torch.version.cuda,
        "cublas": cublas_version(),
        "torch": torch.__version__,
        **versions,
        "python": platform.python_version(),
        "clocks": {
            "sm_max_mhz": info.get("sm_max_mhz"),
            "mem_max_mhz": info.get("mem_max_mhz"),
            "sm_at_start_mhz": info.get("sm_at_start_mhz"),
            "power_limit_w": info.get("power_limit_w"),
            "sm_observed_mhz": None,
        },
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_digest": source_digest(),
        "settings": settings(),
        "command": command_line(),
        "options": options,
        "method": method,
        "notes": notes,
    }


def settings() -> dict:
    """wsgemm's switches in effect now (``wsgemm.config``): a batch-invariant or autotuned run
    says so in its record, whichever way (environment, process default) it was set."""
    import wsgemm

    return {
        "batch_invariant": wsgemm.config.batch_invariant_enabled(),
        "autotune": wsgemm.config.autotune_enabled(),
        # off Hopper: whether auto raced its kernel against torch.matmul (nothing set: on)
        "race_torch": wsgemm.config.race_enabled(),
    }


def source_digest(root=None) -> str:
    """sha256 of the package's Python sources (each ``wsgemm/**/*.py`` file's path relative to
    the package and its bytes, in path order): which code a record ran, whatever the git
    metadata beside it says (a GPU host's copy of a working tree can carry an older ``.git``:
    docs/perf.md entry 81). For a commit: ``git worktree add /tmp/c COMMIT``, then
    ``source_digest("/tmp/c/wsgemm")``."""
    import hashlib
    from pathlib import Path

    package = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _wsgemm_version() -> str | None:
    try:
        import wsgemm

        return getattr(wsgemm, "__version__", None)
    except Exception:
        return None


def write_script_record(path: str, args, records: list, **fields) -> None:
    """A bench script's JSON record at ``path``: the git commit, its arguments, torch's version,
    the GPU's name, ``fields`` and every record (``scripts/bench_epilogue.py``,
    ``bench_mlp_train.py``, ``bench_gated_tiles.py``)."""
    import json
    import subprocess

    import torch

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    with open(path, "w") as f:
        json.dump(dict(commit=commit.stdout.strip() or None, source_digest=source_digest(),
                       args=vars(args),
                       torch=torch.__version__, gpu=torch.cuda.get_device_name(), **fields,
                       records=records), f, indent=1)  # fmt: skip
