"""Event-driven L2 simulation of a persistent GEMM schedule.

Each cluster walks its units; a k-tile takes `1 * speed` steps (0.76 us a step). Per k-tile the
cluster reads its B slice once (multicast) and each CTA its A slice (none past M: TMA zero-fill).
After a shared unit: a non-finisher stores its partial (fp32, rows inside M) and pays `w` steps;
the last to arrive finishes, waits for the stored partials, reads them (`f` steps each). All
accesses go through an LRU of `cap` bytes (lines: A/B k-slices, partials, C tiles). DRAM bytes
are the misses (reads) and the dirty lines written back (C tiles, partials; those left dirty at
the end are counted as written too: the L2 writes them back some time).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict


class LRU:
    def __init__(self, cap):
        self.cap = cap
        self.d = OrderedDict()  # key -> (size, dirty)
        self.used = 0
        self.read_miss = 0
        self.read_bytes = 0
        self.writeback = 0

    def read(self, key, size):
        self.read_bytes += size
        if key in self.d:
            self.d.move_to_end(key)
            return True
        self.read_miss += size
        self._insert(key, size, False)
        return False

    def write(self, key, size):
        if key in self.d:
            old, _ = self.d.pop(key)
            self.used -= old
        self._insert(key, size, True)

    def _insert(self, key, size, dirty):
        self.d[key] = (size, dirty)
        self.used += size
        while self.used > self.cap:
            _, (s, dty) = self.d.popitem(last=False)
            self.used -= s
            if dty:
                self.writeback += s

    def flush(self):
        return sum(s for s, dty in self.d.values() if dty)


def simulate(p, clusters, cap_bytes, w=0.0, f=0.0, jitter=0.0, seed=0, windows=(1, 8, 32)):
    """Returns a dict of results. w, f: fix-up costs in steps (store, read per partial).
    jitter: per-cluster speed spread (each cluster's k-tile time uniform in [1-j, 1+j] x a
    per-k-tile +-j/2 noise)."""
    rng = random.Random(seed)
    tm, tn, tk = p.tm, p.tn, p.tk
    a_rows = [min(tm, p.M - m * tm) for m in range(p.num_m)]
    b_bytes = tn * tk * 2
    cache = LRU(cap_bytes)
    speed = [1.0 + rng.uniform(-jitter, jitter) for _ in clusters]
    # state per cluster: unit index, k within unit, clock
    pos = [[0, None] for _ in clusters]
    heap = [(0.0, c) for c, units in enumerate(clusters) if units]
    heapq.heapify(heap)
    arrived = {}  # tile -> list of (time stored, part)
    finish = [0.0] * len(clusters)
    ktiles = [0] * len(clusters)
    b_access_times = {}  # (n,k) -> list of times
    b_reads = 0
    a_seen = set()
    b_miss = 0
    a_reads = a_miss = 0
    part_reads = part_miss = 0
    fixups = 0  # partials stored (= sum over CTA tiles inside M of parts-1)
    shared_tiles = set()
    max_parts = max((u.parts for us in clusters for u in us), default=1)
    sms_shared = set()
    while heap:
        t, c = heapq.heappop(heap)
        ui, k = pos[c]
        u = clusters[c][ui]
        if k is None:
            k = u.k0
        # one k-tile
        key_b = ("B", u.n, k)
        hit = cache.read(key_b, b_bytes)
        b_reads += 1
        b_miss += not hit
        b_access_times.setdefault((u.n, k), []).append(t)
        for r in range(p.cluster_m):
            m = u.cm * p.cluster_m + r
            if m < p.num_m:
                a_reads += 1
                a_seen.add((m, k))
                a_miss += not cache.read(("A", m, k), a_rows[m] * tk * 2)
        dt = speed[c] * (1.0 + (rng.uniform(-jitter / 2, jitter / 2) if jitter else 0.0))
        t += dt
        ktiles[c] += 1
        k += 1
        if k == u.k1:  # unit done
            rows_in = [
                (u.cm * p.cluster_m + r, a_rows[u.cm * p.cluster_m + r])
                for r in range(p.cluster_m)
                if u.cm * p.cluster_m + r < p.num_m
            ]
            if u.parts > 1:
                shared_tiles.add(u.tile)
                sms_shared.add(c)
                lst = arrived.setdefault(u.tile, [])
                if len(lst) < u.parts - 1:  # not last to arrive: store
                    if rows_in:
                        t += w
                    for m, rows in rows_in:
                        cache.write(("P", m, u.n, u.part), rows * tn * 4)
                        fixups += 1
                    lst.append((t, u.part))
                else:  # finisher: wait for the stores, read them
                    t = max([t] + [s for s, _ in lst])
                    for _, part in lst:
                        if rows_in:
                            t += f
                        for m, rows in rows_in:
                            part_reads += 1
                            part_miss += not cache.read(("P", m, u.n, part), rows * tn * 4)
                    for m, rows in rows_in:
                        cache.write(("C", m, u.n), rows * tn * 2)
            else:
                for m, rows in rows_in:
                    cache.write(("C", m, u.n), rows * tn * 2)
            ui += 1
            k = None
        pos[c] = [ui, k]
        if ui < len(clusters[c]):
            heapq.heappush(heap, (t, c))
        else:
            finish[c] = t
    dram_read = cache.read_miss
    dram_write = cache.writeback + cache.flush()
    # B reuse: reads per distinct slice, and the gap between the first and later reads
    gaps = []
    for times in b_access_times.values():
        times.sort()
        gaps += [x - times[0] for x in times[1:]]
    res = dict(
        makespan=max(finish),
        max_ktiles=max(ktiles),
        dram_read=dram_read,
        dram_write=dram_write,
        b_reads=b_reads,
        b_miss=b_miss,
        b_slices=len(b_access_times),
        a_reads=a_reads,
        a_miss=a_miss,
        a_slices=len(a_seen),
        part_reads=part_reads,
        part_miss=part_miss,
        partials=fixups,
        shared_tiles=len(shared_tiles),
        max_parts=max_parts,
        sms_shared=len(sms_shared) * p.cluster_m,
        gaps=gaps,
    )
    # working set: distinct B slices touched within windows of W steps (lockstep times)
    ws = {}
    events = sorted((tt, key) for key, times in b_access_times.items() for tt in times)
    horizon = max(finish)
    for W in windows:
        vals, reads = [], []
        start = 0.0
        while start < horizon:
            sel = [key for tt, key in events if start <= tt < start + W]
            if sel:
                vals.append(len(set(sel)))
                reads.append(len(sel))
            start += W
        ws[W] = (sum(vals) / len(vals), sum(reads) / max(sum(vals), 1))
    res["ws"] = ws
    return res
