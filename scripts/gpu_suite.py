"""The whole GPU suite (``pytest -m gpu``) in one call of the lent GPU: shards run side by side.

One pytest process runs the suite in about four 560 s calls (``gpu_session.sh suite1..4``),
most of it compiling kernel variants one at a time on one core. Here the collected tests are
cut into ``--shards`` runs of neighbouring tests (in collection order, so a parametrized test's
cases mostly land in one shard and share their compiles), ``--jobs`` of them at a time on the
same GPU (more shards than jobs: a slow shard does not hold the others' cores); the host's cores
compile in parallel and the disk cache serves a variant two shards need. The tests assert
results, not times, so sharing the GPU changes no verdict. The shards' logs end up in one file,
``--out``/shards.log (``--junit``: a JUnit XML per shard beside it); the summary line counts
them all. A collection error stops it before any test runs.

Each shard reports its tests' times (pytest's ``--durations``); the run writes them all to
``--out``/durations.json. Given such a file from an earlier run (``--plan``), the shards are cut
to about equal time instead of equal counts (still runs of neighbours; a test the file lacks
counts the median) and the longest start first, so no slow shard starts last and is cut at the
timeout (docs/perf.md entry 113: three of 32 equal-count shards were).

    python scripts/gpu_suite.py --out DIR [--jobs 8] [--shards 32] [--timeout 540] [--junit]
        [--plan DURATIONS.json] [selection ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
#: A line of pytest's ``--durations`` report: "12.34s call     tests/gpu/test_x.py::test_y[a]"
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+::\S+)\s*$", re.M)


def collect(selection: list[str]) -> list[str]:
    """The node ids ``pytest -m gpu`` collects from ``selection``, in collection order."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--co", "-q", "-p", "no:cacheprovider",
         *selection],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    ids = [line for line in done.stdout.splitlines() if "::" in line and " " not in line]
    if done.returncode != 0 or not ids:  # (a module that fails to import: its tests lost)
        raise SystemExit(f"collection failed (rc {done.returncode}):\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    return ids


def shards(ids: list[str], count: int, seconds: dict[str, float] | None = None) -> list[list[str]]:
    """``ids`` cut into ``count`` runs of neighbours: as equal in number as the count allows, or,
    with ``seconds`` (node id -> seconds of an earlier run; an id it lacks counts the median),
    as equal in time, no run empty."""
    if not seconds:
        size = -(-len(ids) // count)
        return [ids[i : i + size] for i in range(0, len(ids), size)]
    count = max(1, min(count, len(ids)))
    cost = estimates(ids, seconds)
    target = sum(cost) / count
    parts: list[list[str]] = [[]]
    spent = 0.0
    for at, (i, c) in enumerate(zip(ids, cost, strict=True)):
        left_ids, left_parts = len(ids) - at, count - len(parts)
        # close the run once it holds its share, or when the remaining ids are only enough for
        # one each of the runs still to come
        if parts[-1] and left_parts > 0 and (spent + c / 2 > target * len(parts)
                                             or left_ids <= left_parts):  # fmt: skip
            parts.append([])
        parts[-1].append(i)
        spent += c
    return parts


def durations(text: str) -> dict[str, float]:
    """Seconds per node id (setup, call and teardown summed) from pytest's ``--durations``
    report in ``text``."""
    out: dict[str, float] = {}
    for secs, node in DURATION.findall(text):
        out[node] = out.get(node, 0.0) + float(secs)
    return out


def estimates(ids: list[str], seconds: dict[str, float]) -> list[float]:
    """Each id's seconds in ``seconds`` (an earlier run's), the median where it has none."""
    typical = statistics.median(seconds.values())
    return [seconds.get(i, typical) for i in ids]


def start_order(parts: list[list[str]], seconds: dict[str, float] | None) -> list[int]:
    """The shards' indices, the longest expected first (collection order without a plan)."""
    if not seconds:
        return list(range(len(parts)))
    return sorted(range(len(parts)), key=lambda i: -sum(estimates(parts[i], seconds)))


def _report(i: int, part: list[str], proc, text: str, out: Path, totals: dict) -> None:
    """One finished (or cut) shard: its log appended to ``out``/shards.log, its summary line
    and failures printed, its counts added to ``totals``."""
    with open(out / "shards.log", "a") as whole:
        whole.write(f"===== shard {i}: {len(part)} tests\n{text}\n")
    tail = text.strip().splitlines()[-1:] or [""]
    print(f"shard {i} rc={proc.returncode}: {tail[0][:200]}", flush=True)
    for line in text.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            print("  " + line[:300], flush=True)
    for n, what in COUNTS.findall(tail[0]):
        what = "errors" if what == "error" else what
        totals[what] = totals.get(what, 0) + int(n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=8, help="shards running at once")
    p.add_argument("--shards", type=int, default=0, help="shards in all (0: 4 a job)")
    p.add_argument("--timeout", type=int, default=540, help="seconds for every shard together")
    p.add_argument("--junit", action="store_true", help="a JUnit XML per shard")
    p.add_argument("--plan", help="durations.json of an earlier run: shards of equal time")
    p.add_argument("selection", nargs="*", default=["tests/"])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards.log").unlink(missing_ok=True)  # (this run's logs only)
    start = time.monotonic()
    deadline = start + args.timeout
    ids = collect(args.selection)
    plan = json.loads(Path(args.plan).read_text()) if args.plan else None
    parts = shards(ids, args.shards or 4 * args.jobs, plan)
    print(f"{len(ids)} GPU tests in {len(parts)} shards, {args.jobs} at once", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    waiting = start_order(parts, plan)
    running: dict[int, tuple] = {}
    totals: dict[str, int] = {}
    times: dict[str, float] = {}
    rc = 0
    while waiting or running:
        while waiting and len(running) < args.jobs and time.monotonic() < deadline:
            i = waiting.pop(0)
            log = open(logs / f"shard{i}.log", "w")  # noqa: SIM115 (closed when it ends)
            junit = [f"--junitxml={out / f'shard{i}.xml'}"] if args.junit else []
            cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--no-header", "-rfE",
                   "-p", "no:cacheprovider", "--durations=0", "--durations-min=0.05", *junit,
                   *parts[i]]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            running[i] = (proc, log, time.monotonic())
        if time.monotonic() >= deadline and (running or waiting):
            rc = rc or 1  # some tests did not run to the end
            for i, (proc, _, _) in running.items():
                proc.kill()
                print(f"shard {i}: cut at the timeout", flush=True)
            for i in waiting:
                print(f"shard {i}: not started ({len(parts[i])} tests)", flush=True)
            waiting = []
        for i in [i for i, (proc, _, _) in running.items() if proc.poll() is not None or
                  time.monotonic() >= deadline]:  # fmt: skip
            proc, log, began = running.pop(i)
            proc.wait()
            log.close()
            rc = rc or proc.returncode
            text = (logs / f"shard{i}.log").read_text(errors="replace")
            _report(i, parts[i], proc, text, out, totals)
            times.update(durations(text))
            # a test the report leaves out ran each phase under --durations-min (0.05 s): ~0;
            # a cut shard prints no report: its tests get at least their share of its time
            share = (time.monotonic() - began) / len(parts[i]) if proc.returncode < 0 else 0.0
            for t in parts[i]:
                times.setdefault(t, share)
        time.sleep(0.5)
    took = time.monotonic() - start
    (out / "durations.json").write_text(json.dumps(times, indent=0, sort_keys=True))
    print(f"all shards: {totals} in {took:.0f} s (rc {rc})", flush=True)
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
