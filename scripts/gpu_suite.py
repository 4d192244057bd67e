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

    python scripts/gpu_suite.py --out DIR [--jobs 8] [--shards 32] [--timeout 540] [--junit]
        [selection ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


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


def shards(ids: list[str], count: int) -> list[list[str]]:
    """``ids`` cut into ``count`` runs of neighbours, as equal as the count allows."""
    size = -(-len(ids) // count)
    return [ids[i : i + size] for i in range(0, len(ids), size)]


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
    p.add_argument("selection", nargs="*", default=["tests/"])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards.log").unlink(missing_ok=True)  # (this run's logs only)
    start = time.monotonic()
    deadline = start + args.timeout
    ids = collect(args.selection)
    parts = shards(ids, args.shards or 4 * args.jobs)
    print(f"{len(ids)} GPU tests in {len(parts)} shards, {args.jobs} at once", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    waiting = list(range(len(parts)))
    running: dict[int, tuple] = {}
    totals: dict[str, int] = {}
    rc = 0
    while waiting or running:
        while waiting and len(running) < args.jobs and time.monotonic() < deadline:
            i = waiting.pop(0)
            log = open(logs / f"shard{i}.log", "w")  # noqa: SIM115 (closed when it ends)
            junit = [f"--junitxml={out / f'shard{i}.xml'}"] if args.junit else []
            cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--no-header", "-rfE",
                   "-p", "no:cacheprovider", *junit, *parts[i]]  # fmt: skip
            running[i] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
        if time.monotonic() >= deadline and (running or waiting):
            rc = rc or 1  # some tests did not run to the end
            for i, (proc, _) in running.items():
                proc.kill()
                print(f"shard {i}: cut at the timeout", flush=True)
            for i in waiting:
                print(f"shard {i}: not started ({len(parts[i])} tests)", flush=True)
            waiting = []
        for i in [i for i, (proc, _) in running.items() if proc.poll() is not None or
                  time.monotonic() >= deadline]:  # fmt: skip
            proc, log = running.pop(i)
            proc.wait()
            log.close()
            rc = rc or proc.returncode
            _report(i, parts[i], proc, (logs / f"shard{i}.log").read_text(errors="replace"), out,
                    totals)  # fmt: skip
        time.sleep(0.5)
    took = time.monotonic() - start
    print(f"all shards: {totals} in {took:.0f} s (rc {rc})", flush=True)
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
