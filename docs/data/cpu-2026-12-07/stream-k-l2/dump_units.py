"""Per-cluster unit lists (cluster c's CTAs run m = 2*cm and 2*cm+1) for 615x8192x4096 on the
kernel's replayed schedules and the alternatives: units_615.txt."""
from sched import Problem, existing, aligned_stream_k, even_tail
p = Problem(615, 8192, 4096)
with open("units_615.txt", "w") as fh:
    for name, cl in {"DP": existing(p), "SK": existing(p, stream_k=True),
                     "SK raster_group=2": existing(p, group_mtiles=2, stream_k=True),
                     "SK teams": aligned_stream_k(p), "DP + tail s=2": even_tail(p, 2)}.items():
        fh.write(f"== {name}: (cluster row cm, n, [k0,k1), part/parts) per unit\n")
        for c, units in enumerate(cl):
            fh.write(f"{c:2d}: " + "  ".join(f"({u.cm},{u.n},[{u.k0},{u.k1}),{u.part}/{u.parts})" for u in units) + "\n")
