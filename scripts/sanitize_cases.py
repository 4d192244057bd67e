"""Small cases for compute-sanitizer (memcheck, racecheck): one aligned and one ragged problem per
backend, each checked against torch. Run as
``compute-sanitizer --tool memcheck python scripts/sanitize_cases.py [backend ...]``."""

import sys

import torch

import wsgemm


def main(backends: list[str]) -> int:
    bad = 0
    for backend in backends or wsgemm.available_backends():
        for m, n, k in ((256, 256, 128), (131, 67, 45)):
            a = torch.randn(m, k, dtype=torch.float16, device="cuda")
            b = torch.randn(k, n, dtype=torch.float16, device="cuda")
            got = wsgemm.matmul(a, b, backend=backend)
            ref = torch.matmul(a.float(), b.float())
            err = (got.float() - ref).abs().max().item()
            ok = err < 1e-2 * ref.abs().max().item() + 1e-2
            bad += not ok
            print(f"{backend} {m}x{n}x{k}: max error {err:.3g} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
