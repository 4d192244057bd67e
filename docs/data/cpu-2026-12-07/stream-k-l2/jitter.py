"""Robustness: DRAM MB when clusters drift (per-cluster speed uniform in [1-j, 1+j], plus a
per-k-tile noise of +-j/2), 615x8192x4096 and 809x5120x4096, L2 50 / 25 MB."""
from sched import Problem, existing, aligned_stream_k, even_tail
from sim import simulate
for shape in ((615, 8192, 4096), (809, 5120, 4096)):
    p = Problem(*shape)
    lays = {"DP": existing(p), "SK (kernel)": existing(p, stream_k=True),
            "(iii) SK group=cluster_m": existing(p, group_mtiles=2, stream_k=True),
            "(ii) SK teams": aligned_stream_k(p), "(i) DP + tail s=2": even_tail(p, 2)}
    print(f"\n### {p}: DRAM MB at L2 50 / 25 MB (mean of 3 seeds)\n")
    js = (0.0, 0.05, 0.1, 0.2)
    print("| layout | " + " | ".join(f"jitter {j}" for j in js) + " |")
    print("|---|" + "---|" * len(js))
    for name, cl in lays.items():
        cells = []
        for j in js:
            vals = {}
            for cap in (50, 25):
                tot = 0
                for seed in range(3):
                    r = simulate(p, cl, cap * 1024 * 1024, jitter=j, seed=seed)
                    tot += (r["dram_read"] + r["dram_write"]) / 1e6
                vals[cap] = tot / 3
            cells.append(f"{vals[50]:.0f} / {vals[25]:.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
