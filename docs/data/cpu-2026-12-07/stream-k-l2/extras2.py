"""(iii) with the launch capped to a multiple of the cluster rows (809: 4 rows -> 64 clusters),
and a D > 0 band shape (1000x14336x4096: 224 cluster tiles, two whole waves data-parallel)."""
from run import evaluate
from sched import Problem, existing, aligned_stream_k, even_tail, dp_plus_sk_tail, check

def show(p, lays, title):
    print(f"\n### {title}: cluster tiles {p.W} on {p.P} clusters\n")
    print("| layout | steps | DRAM MB 50/25 | B x 50/25 | A x 50/25 | partials (max parts) | est us 50/25 | event us |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cl in lays.items():
        check(p, cl)
        r = evaluate(p, name, cl)
        print(f"| {name} | {r['steps']} | {r['dram50']:.0f} / {r['dram25']:.0f} | {r['bx50']:.2f} / {r['bx25']:.2f} | "
              f"{r['ax50']:.2f} / {r['ax25']:.2f} | {r['partials']} ({r['max_parts']}) | {r['est50']:.1f} / {r['est25']:.1f} | {r['event']:.1f} |", flush=True)

p = Problem(809, 5120, 4096, sms=128)
show(p, {"SK (kernel, group 16), 64 clusters": existing(p, stream_k=True),
         "(iii) SK group=cluster_m, 64 clusters": existing(p, group_mtiles=2, stream_k=True)},
     "809x5120x4096 launched on 64 clusters (128 SMs)")
p = Problem(1000, 14336, 4096)
show(p, {"DP (kernel, group 16)": existing(p), "SK (kernel, group 16)": existing(p, stream_k=True),
         "(iii) SK group=cluster_m": existing(p, group_mtiles=2, stream_k=True),
         "(ii) SK teams, k-aligned": aligned_stream_k(p),
         "(i) DP + tail split s=2": even_tail(p, 2), "(i) DP + tail split s=3": even_tail(p, 3),
         "(i') DP-1wave + tail s=2": even_tail(p, 2, dp_waves=p.W // p.P - 1)},
     "1000x14336x4096 (D > 0)")
