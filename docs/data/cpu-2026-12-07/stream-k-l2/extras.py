"""Side runs for 615x8192x4096: (a) the shipped 128x256 tile without the 2x1 cluster (no padded
m-tile, no multicast), (b) the menu's best tile, swap-AB 128x160 c2x1 (C^T = B A^T: the
weights are the 'A' operand here, the 615 tokens 'B'), and (c) stream-K's DRAM bytes against
L2 size (where its re-reads would start to hit)."""
import run
from run import evaluate
from sched import Problem, existing, aligned_stream_k, even_tail, check
from sim import simulate

def table(p, lays, step_us, title):
    run.STEP_US = step_us
    print(f"\n### {title}: m-tiles {p.num_m}, n-tiles {p.num_n}, cluster tiles {p.W} on {p.P} clusters, step {step_us} us\n")
    print("| layout | steps | DRAM MB 50/25 | B x 50/25 | A x 50/25 | partials (max parts) | compute us | mem us 25 | fix us | est us 25 | event us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, cl in lays.items():
        check(p, cl)
        r = evaluate(p, name, cl)
        print(f"| {name} | {r['steps']} | {r['dram50']:.0f} / {r['dram25']:.0f} | {r['bx50']:.2f} / {r['bx25']:.2f} | {r['ax50']:.2f} / {r['ax25']:.2f} | "
              f"{r['partials']} ({r['max_parts']}) | {r['compute']:.1f} | {r['mem25']:.1f} | {r['fix']:.1f} | {r['est25']:.1f} | {r['event']:.1f} |")

p1 = Problem(615, 8192, 4096, cluster_m=1)
table(p1, {"DP (group 16)": existing(p1), "SK (kernel, group 16)": existing(p1, stream_k=True),
           "(iii) SK, group 1": existing(p1, group_mtiles=1, stream_k=True),
           "(ii) SK teams": aligned_stream_k(p1)}, 0.76, "615x8192x4096, 128x256 tile, cluster 1x1")
ps = Problem(8192, 615, 4096, tile=(128, 160, 64))
table(ps, {"DP (group 16)": existing(ps), "SK (kernel, group 16)": existing(ps, stream_k=True),
           "(ii) SK teams (share A)": aligned_stream_k(ps, share="A"), "(i) DP + tail split s=2": even_tail(ps, 2)},
      65.9 / 128, "615x8192x4096 swap-AB 128x160 c2x1 (8192x615 C^T)")

p = Problem(615, 8192, 4096)
sk = existing(p, stream_k=True)
print("\n### SK (kernel) 615x8192x4096: DRAM MB against L2 size\n")
print("| L2 MB | DRAM MB | B reads from DRAM x |\n|---|---|---|")
for cap in (25, 50, 75, 100, 125, 150, 200):
    r = simulate(p, sk, cap * 1024 * 1024)
    print(f"| {cap} | {(r['dram_read'] + r['dram_write']) / 1e6:.0f} | {r['b_miss'] / r['b_slices']:.2f} |")

# (d) the menu's cooperative-128x256-c1x2 (clusters along N, A multicast), as its transposed
# stand-in: C^T = B A^T with 256x128 tiles, clusters 2x1 along the weights; the sim's 'A' is the
# weights here (shared by the 5 token tiles), its 'B' the tokens (multicast).
pt = Problem(8192, 615, 4096, tile=(256, 128, 64))
table(pt, {"DP (group 16)": existing(pt), "SK (kernel, group 16)": existing(pt, stream_k=True),
           "(ii) SK teams (share weights)": aligned_stream_k(pt, share="A"),
           "(i) DP + tail split s=2": even_tail(pt, 2), "(i) DP + tail split s=3": even_tail(pt, 3)},
      0.76, "615x8192x4096 on 128x256 c1x2 (transposed stand-in: 8192x615, 256x128 tiles, c2x1)")
