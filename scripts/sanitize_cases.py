"""Small cases for compute-sanitizer (memcheck, racecheck): an aligned and two ragged problems per
backend, each checked against torch. Run as
``compute-sanitizer --tool memcheck python scripts/sanitize_cases.py [backend ...]``; a backend may
carry config overrides in the benchmark's syntax, e.g. ``'sm80{tile_m=96,ctas_per_sm=2}'``."""

import dataclasses
import sys

import torch

import wsgemm
from wsgemm import api, host
from wsgemm.bench.backends import parse_candidate


def main(specs: list[str]) -> int:
    bad = 0
    for spec in specs or wsgemm.available_backends():
        backend, overrides = parse_candidate(spec)
        config = dataclasses.replace(host.BACKENDS[backend].config(), **overrides)
        for m, n, k in ((256, 256, 128), (131, 67, 45), (300, 520, 200)):
            a = torch.randn(m, k, dtype=torch.float16, device="cuda")
            b = torch.randn(k, n, dtype=torch.float16, device="cuda")
            out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            got = api.matmul(a, b, out=out, backend=backend, config=config)
            ref = torch.matmul(a.float(), b.float())
            err = (got.float() - ref).abs().max().item()
            ok = err < 1e-2 * ref.abs().max().item() + 1e-2
            bad += not ok
            print(f"{spec} {m}x{n}x{k}: max error {err:.3g} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
