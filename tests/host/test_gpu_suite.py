"""``scripts/gpu_suite.py``'s plan (CPU): the shards it cuts, the times it reads back from pytest's
``--durations`` report, and the order it starts them in."""

import random

from script_modules import load

suite = load("gpu_suite")


def _ids(n: int) -> list[str]:
    return [f"tests/gpu/test_x.py::test_{i:04d}" for i in range(n)]


def test_without_a_plan_the_shards_are_equal_runs_of_neighbours():
    ids = _ids(103)
    parts = suite.shards(ids, 8)
    assert [t for p in parts for t in p] == ids
    assert max(map(len, parts)) - min(map(len, parts)) <= len(parts)
    assert suite.start_order(parts, None) == list(range(len(parts)))


def test_with_a_plan_the_shards_are_runs_of_about_equal_time():
    rng = random.Random(7)
    for trial in range(40):
        ids = _ids(rng.randint(1, 400))
        count = rng.randint(1, 40)
        # a suite as the GPU's: mostly quick tests, with runs of slow ones (a compile sweep)
        seconds = {t: (rng.uniform(5, 30) if (k // 17) % 5 == 0 else rng.uniform(0.1, 1))
                   for k, t in enumerate(ids)}  # fmt: skip
        parts = suite.shards(ids, count, seconds)
        assert [t for p in parts for t in p] == ids, trial  # every test once, in order
        assert all(parts), trial
        assert len(parts) == min(count, len(ids)), trial
        times = [sum(seconds[t] for t in p) for p in parts]
        # no shard longer than its share plus the longest single test
        assert max(times) <= sum(times) / len(parts) + max(seconds.values()) + 1e-9, trial


def test_a_test_the_plan_lacks_counts_the_median():
    ids = _ids(10)
    seconds = {ids[0]: 100.0, ids[1]: 1.0, ids[2]: 1.0}  # median 1: the other seven count 1
    parts = suite.shards(ids, 2, seconds)
    assert parts == [ids[:1], ids[1:]]


def test_the_longest_shard_starts_first():
    ids = _ids(6)
    seconds = dict(zip(ids, [1, 1, 50, 50, 2, 2], strict=True))
    parts = [ids[0:2], ids[2:4], ids[4:6]]
    assert suite.start_order(parts, seconds) == [1, 2, 0]


def test_durations_sums_setup_call_and_teardown_per_test():
    text = """........                                                   [100%]
============================= slowest durations ==============================
12.34s call     tests/gpu/test_a.py::test_one[fp16-4096]
2.00s setup    tests/gpu/test_a.py::test_one[fp16-4096]
0.50s teardown tests/gpu/test_a.py::test_one[fp16-4096]
1.25s call     tests/gpu/test_b.py::test_two
8 passed in 20.00s
"""
    assert suite.durations(text) == {"tests/gpu/test_a.py::test_one[fp16-4096]": 14.84,
                                      "tests/gpu/test_b.py::test_two": 1.25}  # fmt: skip
