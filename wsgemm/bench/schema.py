"""The benchmark record: one JSON document per run, from which every table and plot is drawn.

Version 2::

    {
      "schema": "wsgemm.bench", "version": 2,
      "header": {
        "gpu": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": ...,
        "flop_per_clock_per_sm": 4096,            # null: unknown GPU, no % of peak
        "hbm_tbps": 4.8, "ridge_flop_per_byte": 222.6,  # null: unknown (roofline.py)
        "driver": ..., "cuda": ..., "cublas": ..., "torch": ..., "cutlass_dsl": ..., "triton": ...,
        "quack": ..., "wsgemm": ..., "python": ...,  # versions; null when not installed
        "clocks": {"sm_max_mhz", "mem_max_mhz", "sm_at_start_mhz", "power_limit_w",
                   "sm_observed_mhz": [min, max] or null},
        "date": "2026-11-30T12:00:00+00:00", "command": "python -m wsgemm bench --quick",
        "settings": {"batch_invariant": false, "autotune": false,    # wsgemm.config at start
                     "race_torch": true},   # off Hopper auto races its kernel (newer records)
        "options": {"suite", "dtype", "accumulate", "layout", "backends": [...], "rounds",
                    "target_ms", "min_reps", "max_reps", "seed"},
        "method": {"l2_flush_bytes", "hold_gpu", "order", "clock_source",
                   "cublas_reduced_precision_reduction"},
        "notes": ["quack: import failed: ModuleNotFoundError: ...", ...]
      },
      "results": [{
        "group": "8b", "label": "8b qkv t=4096", "m": 4096, "n": 6144, "k": 4096,
        "dtype": "fp16", "layout": "TN", "accumulate": "fp32",
        "backend": "wsgemm:sm90", "status": "ok" | "wrong" | "skipped" | "error", "note": "",
        "median_ms": 0.123, "tflops": 812.3,        # null unless ok
        "ratio_to_cublas": {"median": 1.02, "min": 0.99, "max": 1.04},  # cuBLAS ms / this ms
        "sm_clock_mhz": 1755.0, "power_w": 690.0, "pct_of_peak": 83.4,
        "memory_bound": false, "tbps": 0.41, "pct_of_hbm": 8.5,  # roofline.py
        "reps": 40, "round_ms": [0.124, 0.122, ...],
        "error": {"rel": 2.1e-4, "peak": 1.9e-3, "tol_rel": 4.9e-4, "tol_peak": 3.9e-3}
      }, ...]                                       # rel/peak null: the output had NaN/Inf
    }

``load`` validates a file against this and raises ``RecordError`` naming the first bad field.
A ratio above 1 means faster than cuBLAS.

Grouped problems (the moe suite, moe.py) add two keys, optional so that every other record
stays as it was: ``header.options.baseline``, the backend the ratios are to (absent:
``"cublas"``; ``ratio_to_cublas`` keeps its name), and on each row ``grouped``: {"groups": G,
"routing": "balanced" | "skewed", "tokens_per_expert": T, "sizes": [rows of each group]}, where
``m`` is the sum of the sizes and the weights are G matrices of N x K; a weight gradient's row
adds ``"pass": "wgrad"`` (its result is the G N x K gradients, its K the tokens: moe.py), a
routed forward's ``"pass": "routed"`` (each row times its router weight: moe.py).

Version 1 lacked ``hbm_tbps``, ``ridge_flop_per_byte``, ``memory_bound``, ``tbps`` and
``pct_of_hbm``; every one is derived from the rest of the record, so ``load`` reads a version 1
file as version 2 with them filled in (``upgrade``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from . import roofline

SCHEMA = "wsgemm.bench"
VERSION = 2
STATUSES = ("ok", "wrong", "skipped", "error")

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))

_CLOCKS = {
    "sm_max_mhz": OPT_NUM,
    "mem_max_mhz": OPT_NUM,
    "sm_at_start_mhz": OPT_NUM,
    "power_limit_w": OPT_NUM,
    "sm_observed_mhz": (list, type(None)),  # [min, max]: checked in _check_header
}
_OPTIONS = {
    "suite": str,
    "dtype": str,
    "accumulate": str,
    "layout": str,
    "backends": list,
    "rounds": int,
    "target_ms": NUM,
    "min_reps": int,
    "max_reps": int,
    "seed": int,
}
_METHOD = {
    "l2_flush_bytes": int,
    "hold_gpu": bool,
    "order": str,
    "clock_source": OPT_STR,
    "cublas_reduced_precision_reduction": bool,
}
_HEADER = {
    "gpu": str,
    "compute_capability": OPT_STR,
    "sm_count": OPT_INT,
    "l2_bytes": OPT_INT,
    "flop_per_clock_per_sm": OPT_INT,
    "hbm_tbps": OPT_NUM,
    "ridge_flop_per_byte": OPT_NUM,
    "driver": OPT_STR,
    "cuda": OPT_STR,
    "torch": OPT_STR,
    "cutlass_dsl": OPT_STR,
    "triton": OPT_STR,
    "quack": OPT_STR,
    "wsgemm": OPT_STR,
    "python": OPT_STR,
    "clocks": _CLOCKS,
    "date": str,
    "command": str,
    "options": _OPTIONS,
    "method": _METHOD,
    "notes": list,
}
_RATIO = {"median": NUM, "min": NUM, "max": NUM}
# rel/peak are null when the output held NaN or Inf (JSON has no infinity).
_ERROR = {"rel": OPT_NUM, "peak": OPT_NUM, "tol_rel": NUM, "tol_peak": NUM}
_RESULT = {
    "group": str,
    "label": str,
    "m": int,
    "n": int,
    "k": int,
    "dtype": str,
    "layout": str,
    "accumulate": str,
    "backend": str,
    "status": str,
    "note": str,
    "median_ms": OPT_NUM,
    "tflops": OPT_NUM,
    "ratio_to_cublas": (_RATIO, type(None)),
    "sm_clock_mhz": OPT_NUM,
    "power_w": OPT_NUM,
    "pct_of_peak": OPT_NUM,
    "memory_bound": (bool, type(None)),
    "tbps": OPT_NUM,
    "pct_of_hbm": OPT_NUM,
    "reps": OPT_INT,
    "round_ms": list,
    "error": (_ERROR, type(None)),
}
_GROUPED = {"groups": int, "routing": str, "tokens_per_expert": int, "sizes": list}
#: ``grouped.pass``, where present (moe.PASSES): absent means the forward product.
_GROUPED_PASSES = ("forward", "wgrad", "routed")
# Keys only some records have (the module docstring): checked where present.
_OPTIONAL_OPTIONS = {"baseline": str}
#: Header keys later records add (older ones lack them): the cuBLAS the baseline ran
#: and ``settings``, the wsgemm switches in effect (``wsgemm.config``) when the run began.
_SETTINGS = {"batch_invariant": bool, "autotune": bool}
#: Settings keys later records add: whether ``auto`` raced an unmeasured kernel (off Hopper)
#: against torch.matmul (``wsgemm.config.race_enabled``; true with nothing set).
_OPTIONAL_SETTINGS = {"race_torch": bool}
_OPTIONAL_HEADER = {"cublas": OPT_STR, "source_digest": OPT_STR, "settings": _SETTINGS}
_OPTIONAL_RESULT = {"grouped": _GROUPED}
# What version 2 added, all derived (roofline.py): a version 1 record is read without them.
_ADDED_IN_2 = {"header": ("hbm_tbps", "ridge_flop_per_byte"),
               "result": ("memory_bound", "tbps", "pct_of_hbm")}  # fmt: skip

CSV_COLUMNS = (
    "group", "label", "m", "n", "k", "dtype", "layout", "accumulate", "backend", "status",
    "median_ms", "tflops", "ratio_median", "ratio_min", "ratio_max", "pct_of_peak",
    "memory_bound", "tbps", "pct_of_hbm", "sm_clock_mhz", "power_w", "reps", "rel_err",
    "peak_err", "tol_rel", "tol_peak", "note", "groups", "routing", "tokens_per_expert",
    "empty_groups", "max_group",
)  # fmt: skip


class RecordError(ValueError):
    """A benchmark record that does not follow the schema."""


def result(
    shape,
    *,
    dtype: str,
    layout: str,
    accumulate: str,
    backend: str,
    status: str,
    note: str = "",
    **measured,
) -> dict:
    """One result row with every schema key; ``measured`` fills the numeric ones. A grouped
    shape (``moe.GroupedShape``) adds its ``grouped`` field."""
    row = {
        "group": shape.group,
        "label": shape.label,
        "m": shape.m,
        "n": shape.n,
        "k": shape.k,
        "dtype": dtype,
        "layout": layout,
        "accumulate": accumulate,
        "backend": backend,
        "status": status,
        "note": note,
        "median_ms": None,
        "tflops": None,
        "ratio_to_cublas": None,
        "sm_clock_mhz": None,
        "power_w": None,
        "pct_of_peak": None,
        "memory_bound": None,
        "tbps": None,
        "pct_of_hbm": None,
        "reps": None,
        "round_ms": [],
        "error": None,
    }
    unknown = set(measured) - set(row)
    if unknown:
        raise RecordError(f"result() got keys outside the schema: {sorted(unknown)}")
    row.update(measured)
    grouped = getattr(shape, "grouped", None)
    if grouped is not None:
        row["grouped"] = grouped
    return row


def record(header: dict, results: list[dict]) -> dict:
    """The record of a run; fills each row's bandwidth fields from the header's peaks."""
    _check_fields(header, _HEADER, "header")
    roofline.annotate(header, results)
    out = {"schema": SCHEMA, "version": VERSION, "header": header, "results": results}
    validate(out)
    return out


def upgrade(rec: dict) -> dict:
    """A version 1 record as version 2 (checked against version 1 first); others unchanged."""
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or rec.get("version") != 1:
        return rec
    header_v1 = {k: v for k, v in _HEADER.items() if k not in _ADDED_IN_2["header"]}
    result_v1 = {k: v for k, v in _RESULT.items() if k not in _ADDED_IN_2["result"]}
    _check_fields(rec.get("header"), header_v1, "header")
    if not isinstance(rec.get("results"), list):
        raise RecordError("results: expected a list")
    for i, row in enumerate(rec["results"]):
        _check_fields(row, result_v1, f"results[{i}]")
    h = rec["header"]
    header = {
        **h,
        **roofline.header_fields(
            h["gpu"], h["sm_count"], h["flop_per_clock_per_sm"], h["clocks"]["sm_max_mhz"]
        ),
    }
    results = [dict(row) for row in rec["results"]]
    roofline.annotate(header, results)
    return {**rec, "version": VERSION, "header": header, "results": results}


def validate(rec: dict) -> None:
    """Raise ``RecordError`` at the first field that breaks the schema or its invariants."""
    if not isinstance(rec, dict):
        raise RecordError("record: expected a JSON object")
    if rec.get("schema") != SCHEMA:
        raise RecordError(f"schema: expected {SCHEMA!r}, got {rec.get('schema')!r}")
    if rec.get("version") != VERSION:
        raise RecordError(
            f"version: this reader knows {VERSION} (1 through load), got {rec.get('version')!r}"
        )
    _check_fields(rec.get("header"), _HEADER, "header")
    _check_optional(rec["header"]["options"], _OPTIONAL_OPTIONS, "header.options")
    _check_optional(rec["header"], _OPTIONAL_HEADER, "header")
    if "settings" in rec["header"]:
        _check_optional(rec["header"]["settings"], _OPTIONAL_SETTINGS, "header.settings")
    _check_header(rec["header"])
    results = rec.get("results")
    if not isinstance(results, list):
        raise RecordError("results: expected a list")
    for i, row in enumerate(results):
        path = f"results[{i}]"
        _check_fields(row, _RESULT, path)
        _check_optional(row, _OPTIONAL_RESULT, path)
        _check_result(row, path)


def _check_header(header: dict) -> None:
    observed = header["clocks"]["sm_observed_mhz"]
    if observed is not None and not (
        len(observed) == 2
        and all(_is_instance(v, NUM) and math.isfinite(v) for v in observed)
        and observed[0] <= observed[1]
    ):
        raise RecordError("header.clocks.sm_observed_mhz: expected null or [min, max] in MHz")


def _check_optional(obj: dict, spec: dict, path: str) -> None:
    for key, expected in spec.items():
        if key in obj:
            _check_value(obj[key], expected, f"{path}.{key}")


def _check_grouped(row: dict, path: str) -> None:
    g = row["grouped"]
    sizes = g["sizes"]
    if not (
        g["groups"] >= 1
        and len(sizes) == g["groups"]
        and all(_is_instance(s, int) and s >= 0 for s in sizes)
        and sum(sizes) == row["m"]
    ):
        raise RecordError(
            f"{path}.grouped: expected {g['groups']} sizes >= 0 (the groups) summing to m"
        )
    if g.get("pass", "forward") not in _GROUPED_PASSES:
        raise RecordError(f"{path}.grouped.pass: expected one of {', '.join(_GROUPED_PASSES)}")


def _check_result(row: dict, path: str) -> None:
    if "grouped" in row:
        _check_grouped(row, path)
    status = row["status"]
    if status not in STATUSES:
        raise RecordError(f"{path}.status: expected one of {STATUSES}, got {status!r}")
    if status == "ok":
        for key in ("median_ms", "tflops"):
            value = row[key]
            if value is None or not math.isfinite(value) or value <= 0:
                raise RecordError(f"{path}.{key}: an ok result needs a positive number")
        if not row["round_ms"]:
            raise RecordError(f"{path}.round_ms: an ok result needs its per-round times")
    else:
        if row["median_ms"] is not None or row["tflops"] is not None or row["round_ms"]:
            raise RecordError(f"{path}: a {status} result carries no timing")
        if not row["note"]:
            raise RecordError(f"{path}.note: a {status} result says why")
        if row["tbps"] is not None or row["pct_of_hbm"] is not None:
            raise RecordError(f"{path}: a {status} result carries no bandwidth")
    if status == "wrong" and row["error"] is None:
        raise RecordError(f"{path}.error: a wrong result carries its errors")
    ratio = row["ratio_to_cublas"]
    if ratio is not None and not ratio["min"] <= ratio["median"] <= ratio["max"]:
        raise RecordError(f"{path}.ratio_to_cublas: expected min <= median <= max")


def _check_fields(obj, spec: dict, path: str) -> None:
    if not isinstance(obj, dict):
        raise RecordError(f"{path}: expected an object")
    missing = [key for key in spec if key not in obj]
    if missing:
        raise RecordError(f"{path}: missing {', '.join(missing)}")
    for key, expected in spec.items():
        _check_value(obj[key], expected, f"{path}.{key}")


def _check_value(value, expected, path: str) -> None:
    alternatives = expected if isinstance(expected, tuple) else (expected,)
    for alt in alternatives:
        if isinstance(alt, dict):
            if isinstance(value, dict):
                _check_fields(value, alt, path)
                return
        elif _is_instance(value, alt):
            return
    names = ", ".join("object" if isinstance(a, dict) else _type_name(a) for a in alternatives)
    raise RecordError(f"{path}: expected {names}, got {type(value).__name__}")


def _is_instance(value, kind) -> bool:
    # JSON has no bool/int distinction worth keeping: True is not a count.
    if isinstance(value, bool) and kind in (int, float):
        return False
    return isinstance(value, kind)


def _type_name(kind) -> str:
    return "null" if kind is type(None) else kind.__name__


def write_json(rec: dict, path) -> None:
    validate(rec)
    Path(path).write_text(json.dumps(rec, indent=1, allow_nan=False) + "\n")


def load(path) -> dict:
    """Read and validate a record; RecordError for anything but a readable file that follows
    the schema (OSError when it cannot be read at all)."""
    data = Path(path).read_bytes()
    try:
        rec = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise RecordError(f"{path}: JSON nested too deeply to be a record") from None
    rec = upgrade(rec)
    validate(rec)
    return rec


def csv_rows(rec: dict) -> list[dict]:
    rows = []
    for r in rec["results"]:
        ratio = r["ratio_to_cublas"] or {}
        error = r["error"] or {}
        grouped = r.get("grouped") or {}
        sizes = grouped.get("sizes")
        row = {key: r.get(key) for key in CSV_COLUMNS if key in r}
        row.update(
            ratio_median=ratio.get("median"),
            ratio_min=ratio.get("min"),
            ratio_max=ratio.get("max"),
            rel_err=error.get("rel"),
            peak_err=error.get("peak"),
            tol_rel=error.get("tol_rel"),
            tol_peak=error.get("tol_peak"),
            groups=grouped.get("groups"),
            routing=grouped.get("routing"),
            tokens_per_expert=grouped.get("tokens_per_expert"),
            empty_groups=None if sizes is None else sizes.count(0),
            max_group=max(sizes) if sizes else None,
        )
        rows.append({key: ("" if row.get(key) is None else row[key]) for key in CSV_COLUMNS})
    return rows


def write_csv(rec: dict, path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(rec))
