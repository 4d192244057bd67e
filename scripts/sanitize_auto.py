"""``backend="auto"`` cases for compute-sanitizer: the shape policy's menu entries and the host
split-K (decode, prefill and ragged shapes; fresh and given ``out``; ring stages and the split
workspace reused across calls), each checked against torch. Run as
``compute-sanitizer --tool memcheck python scripts/sanitize_auto.py`` (scripts/gpu_session.sh)."""

import sys

import torch

import wsgemm

SHAPES = (
    (16, 4096, 14336),
    (1, 8192, 8192),
    (128, 4096, 14336),
    (131, 520, 200),
    (300, 6144, 4096),
)

bad = 0
for m, n, k in SHAPES:
    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    w = torch.randn(n, k, dtype=torch.float16, device="cuda")
    ref = a.float() @ w.float().T
    route = wsgemm.explain(a, w.T).splitlines()[1]
    for given in (False, True):
        out = None
        if given:
            out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        got = wsgemm.matmul(a, w.T, out=out)
        err = (got.float() - ref).abs().max().item()
        ok = err < 1e-2 * ref.abs().max().item() + 1e-2
        bad += not ok
        print(f"auto {m}x{n}x{k} out={given}: {route} err {err:.3g} {'ok' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
