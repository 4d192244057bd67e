"""Run the L2 simulation over shapes and layouts; writes results.json and prints tables."""

from __future__ import annotations

import json
import statistics
import sys

from sched import Problem, aligned_stream_k, check, dp_plus_sk_tail, even_tail, existing
from sim import simulate

STEP_US = 0.76  # a 128x256x64 k-tile on the H100 (brief; entry 104's DP: 95.5 us / 128 k-tiles)
BW = 3.0e12  # DRAM bytes/s
FIX_US = 5.0  # per stored partial, spread over the SMs that share (brief)
# event model: fix-up costs in steps on the critical path (store 3 steps = 2.3 us; the
# finisher 4 steps = 3.0 us per partial it reads; entry 104 measured 9.66 us per shared tile,
# the finisher's share 6.13 us, under a DRAM-bound run), and +-5% cluster speed jitter
W_STEPS, F_STEPS, JITTER = 3.0, 4.0, 0.05
MB = 1e6

SHAPES = [(615, 8192, 4096), (809, 5120, 4096), (450, 5120, 4352), (157, 4096, 4096)]


def layouts(p):
    out = {
        "DP (kernel, group 16)": existing(p),
        "SK (kernel, group 16)": existing(p, stream_k=True),
        "(iii) SK, group = cluster_m": existing(p, group_mtiles=p.cluster_m, stream_k=True),
        "(ii) SK teams, k-aligned": aligned_stream_k(p),
        "(iv) DP waves + SK tail rowmaj": dp_plus_sk_tail(p, row_major_tail=True),
    }
    for s in ((2, 3, 4) if p.W > p.P else (2, 3, 5, 8)):
        out[f"(i) DP + tail split s={s}"] = even_tail(p, s)
    if p.W > p.P:  # also: the last whole wave and the partial one split together
        for s in (2, 3):
            out[f"(i') DP-1wave + tail s={s}"] = even_tail(p, s, dp_waves=p.W // p.P - 1)
    return out


def evaluate(p, name, clusters):
    row = dict(shape=str(p), layout=name)
    for cap in (50, 25):
        r = simulate(p, clusters, cap * 1024 * 1024)
        dram = r["dram_read"] + r["dram_write"]
        row[f"dram{cap}"] = dram / MB
        row[f"read{cap}"] = r["dram_read"] / MB
        row[f"write{cap}"] = r["dram_write"] / MB
        row[f"bx{cap}"] = r["b_miss"] / r["b_slices"]
        row[f"ax{cap}"] = r["a_miss"] / r["a_slices"]
        row[f"mem{cap}"] = dram / BW * 1e6
        if cap == 50:
            base = r
    r = base
    row.update(
        steps=r["max_ktiles"],
        ws8=r["ws"][8][0],
        rd_per_slice8=r["ws"][8][1],
        ws32=r["ws"][32][0],
        gap_med=statistics.median(r["gaps"]) if r["gaps"] else 0.0,
        partials=r["partials"],
        max_parts=r["max_parts"],
        sms=r["sms_shared"],
        compute=r["max_ktiles"] * STEP_US,
    )
    row["fix"] = r["partials"] * FIX_US / max(r["sms_shared"], 1)
    for cap in (50, 25):
        row[f"est{cap}"] = max(row["compute"], row[f"mem{cap}"]) + row["fix"]
    ev = simulate(p, clusters, 50 * 1024 * 1024, w=W_STEPS, f=F_STEPS, jitter=JITTER)
    row["event"] = ev["makespan"] * STEP_US
    row["est_ev25"] = max(row["event"], row["mem25"])
    return row


def main():
    shapes = SHAPES if len(sys.argv) < 2 else [tuple(map(int, a.split("x"))) for a in sys.argv[1:]]
    rows = []
    for shape in shapes:
        p = Problem(*shape)
        print(f"\n### {p}: m-tiles {p.num_m}, n-tiles {p.num_n}, k-tiles {p.T}, cluster rows "
              f"{p.cms}, cluster tiles {p.W} on {p.P} clusters; B {p.N*p.K*2/MB:.1f} MB, "
              f"A {p.M*p.K*2/MB:.1f} MB, C {p.M*p.N*2/MB:.1f} MB\n")
        print("| layout | steps | DRAM MB 50/25 | B reads from DRAM x 50/25 | B slices/8 steps | "
              "reads/slice | B gap med | partials (max parts) | SMs | compute us | mem us 50/25 | "
              "fix us | est us 50/25 | event us | max(event, mem25) |")
        print("|" + "---|" * 15)
        for name, clusters in layouts(p).items():
            check(p, clusters)
            r = evaluate(p, name, clusters)
            rows.append(r)
            print(f"| {name} | {r['steps']} | {r['dram50']:.0f} / {r['dram25']:.0f} | "
                  f"{r['bx50']:.2f} / {r['bx25']:.2f} | {r['ws8']:.0f} | {r['rd_per_slice8']:.2f} | "
                  f"{r['gap_med']:.0f} | {r['partials']} ({r['max_parts']}) | {r['sms']} | "
                  f"{r['compute']:.1f} | {r['mem50']:.1f} / {r['mem25']:.1f} | {r['fix']:.1f} | "
                  f"{r['est50']:.1f} / {r['est25']:.1f} | {r['event']:.1f} | {r['est_ev25']:.1f} |",
                  flush=True)
    with open("results.json", "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
