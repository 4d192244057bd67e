"""What ``choose`` costs a new call signature on this CPU (issue #24's <= 5 us), the quick path
(``rules._Plan``) against the full pricing (``rules._full``) it stands in for.

Per layer shape (N, K), a seeded draw of token counts log-uniform in 1..16384 (the ``models``
suite's range), one from each ``M_QUANTUM`` block the draw hits (so each is a new signature):

* ``first``: the shape's first signature (the full pricing: the plan of the menu's M-free
  terms is built at the second, so a shape asked at one M costs no more);
* ``cold``: the mean over the draw from no plan at all (plan and windows built on the way);
* ``warm``: the median and mean over the draw with the plan and its windows already built
  and only the signature memo cleared: what a serving process pays for a new token count;
* ``full``: the median of the full pricing on the same signatures (what ``choose`` cost
  before the quick path, docs/perf.md entry 114).

Rounds are interleaved (every shape once a round); the medians over rounds are printed.
Timings on a shared CPU move by tens of percent between processes: compare within one run.

    python scripts/bench_choose.py [--rounds 5] [--count 400] [--seed 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import statistics
import sys
import time

from wsgemm.host import registry
from wsgemm.host.choosing import rules
from wsgemm.host.choosing.menu import m_block

#: (N, K) of layers of several models: square, up/gate, down, a vocabulary head, short K
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096), (5120, 8192), (896, 4864))
PROBLEM = ("float16", "float16", "float32", 132, (9, 0))


def draw(count: int, seed: int) -> list[int]:
    """``count`` token counts, log-uniform in 1..16384, the first of each block kept in order."""
    rng = random.Random(seed)
    tokens = [max(1, round(math.exp(rng.uniform(0.0, math.log(16384))))) for _ in range(count)]
    return list({m_block(m): m for m in reversed(tokens)}.values())[::-1]


def _time(calls) -> list[float]:
    """Microseconds of each call, in order."""
    out = []
    for call in calls:
        start = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def one_round(tokens: list[int]) -> dict[tuple[int, int], dict[str, float]]:
    found = {}
    for n, k in SHAPES:
        asks = [functools.partial(rules.choose, m, n, k, 1, *PROBLEM) for m in tokens]
        rules.forget()
        cold = _time(asks)
        rules._choose.cache_clear()
        warm = _time(asks)
        table = rules._environment()[1]
        clusters = registry.CLUSTER_SPLIT_FAMILIES
        full = _time(
            [functools.partial(rules._full, m_block(m), n, k, 1, *PROBLEM, False, table, clusters)
             for m in tokens]
        )  # fmt: skip
        found[(n, k)] = {
            "first": cold[0],
            "cold_mean": statistics.mean(cold),
            "warm_median": statistics.median(warm),
            "warm_mean": statistics.mean(warm),
            "full_median": statistics.median(full),
        }
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=1000, help="token counts drawn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args(argv)
    tokens = draw(args.count, args.seed)
    rules.choose(64, 64, 64, 1, *PROBLEM)  # load the cost model and the table once
    rounds = [one_round(tokens) for _ in range(args.rounds)]
    columns = ("first", "cold_mean", "warm_median", "warm_mean", "full_median")
    print(f"us per new signature, median of {args.rounds} rounds; {len(tokens)} token counts "
          f"(blocks of {args.count} drawn, seed {args.seed})")  # fmt: skip
    print(f"{'N x K':>14}" + "".join(f"{c:>13}" for c in columns))
    medians = {}
    for shape in SHAPES:
        row = {c: statistics.median(r[shape][c] for r in rounds) for c in columns}
        medians[f"{shape[0]}x{shape[1]}"] = row
        print(f"{shape[0]:>7}x{shape[1]:<6}" + "".join(f"{row[c]:>13.1f}" for c in columns))
    overall = {c: statistics.median(r[c] for r in medians.values()) for c in columns}
    print(f"{'median':>14}" + "".join(f"{overall[c]:>13.1f}" for c in columns))
    if args.json:
        record = {"python": sys.version.split()[0], "seed": args.seed, "count": args.count,
                  "rounds": args.rounds, "shapes": medians, "median": overall}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
