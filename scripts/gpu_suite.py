"""The whole GPU suite (``pytest -m gpu``) in one call of the lent GPU: shards run side by side.

One pytest process runs the suite in about four 560 s calls (``gpu_session.sh suite1..4``),
most of it compiling kernel variants one at a time on one core. Here the collected tests are cut
into ``--shards`` runs of neighbouring tests (a parametrized test's cases stay together, so
they share their compiles), run at once on the same GPU; the host's cores compile in parallel
and the disk cache serves a variant two shards need. The tests assert results, not times, so
sharing the GPU changes no verdict. The shards' logs end up in one file, ``--out``/shards.log
(``--junit``: a JUnit XML per shard beside it); the summary line counts them all.

    python scripts/gpu_suite.py --out DIR [--shards 6] [--timeout 540] [--junit] [selection ...]
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

COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed|deselected)")


def collect(selection: list[str]) -> list[str]:
    """The node ids ``pytest -m gpu`` collects from ``selection``, in collection order."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--co", "-q", "-p", "no:cacheprovider",
         *selection],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    ids = [line for line in done.stdout.splitlines() if "::" in line and " " not in line]
    if not ids:
        raise SystemExit(f"collected nothing:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return ids


def shards(ids: list[str], count: int) -> list[list[str]]:
    """``ids`` cut into ``count`` runs of neighbours, as equal as the count allows."""
    size = -(-len(ids) // count)
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--timeout", type=int, default=540, help="seconds for every shard together")
    p.add_argument("--junit", action="store_true", help="a JUnit XML per shard")
    p.add_argument("selection", nargs="*", default=["tests/"])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    ids = collect(args.selection)
    parts = shards(ids, args.shards)
    print(f"{len(ids)} GPU tests in {len(parts)} shards", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    procs = []
    for i, part in enumerate(parts):
        log = open(logs / f"shard{i}.log", "w")  # noqa: SIM115 (closed below)
        junit = [f"--junitxml={out / f'shard{i}.xml'}"] if args.junit else []
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--no-header", "-rf",
               "-p", "no:cacheprovider", *junit, *part]  # fmt: skip
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = start + args.timeout
    totals: dict[str, int] = {}
    rc = 0
    for i, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"shard {i}: cut at the timeout", flush=True)
        log.close()
        rc = rc or proc.returncode
        text = (logs / f"shard{i}.log").read_text(errors="replace")
        with open(out / "shards.log", "a") as whole:
            whole.write(f"===== shard {i}: {len(parts[i])} tests\n{text}\n")
        tail = text.strip().splitlines()[-1:] or [""]
        print(f"shard {i} rc={proc.returncode}: {tail[0][:200]}", flush=True)
        for line in text.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print("  " + line[:300], flush=True)
        for n, what in COUNTS.findall(tail[0]):
            totals[what] = totals.get(what, 0) + int(n)
    took = time.monotonic() - start
    print(f"all shards: {totals} in {took:.0f} s (rc {rc})", flush=True)
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
