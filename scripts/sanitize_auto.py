"""``backend="auto"`` cases for compute-sanitizer: the shape policy's menu entries and its split-K
choices (decode, prefill and ragged shapes; fresh and given ``out``, each twice, so the
second call runs the launcher bound to its signature; ring stages reused across calls), then
split-K forced on each split variant (K not divisible by the split, K shorter than splits x
tile_k, ragged N, batched; every call twice, so the workspace and the semaphores a
previous launch reset are reused), each checked against torch. Run as
``compute-sanitizer --tool memcheck|initcheck|racecheck python scripts/sanitize_auto.py``
(scripts/gpu_session.sh). With ``--stream-k``: only the stream-K cases (the dropped ``sk-``
entries: partial waves, ragged, batched; each call three times, so the workspace and the
semaphores are reused). With ``--gated``: only the gated kernels (``gated_cases``: both row
tiles, the swap-AB decode tile switched on for its calls, the preact forward and the dgated
backward; ragged I and rows, each call twice so a kept launcher runs). With ``--plain-mlp``:
only a plain MLP's training kernels (``plain_mlp_cases``: dact, the plain preact). With
``--cluster-split``: only the cluster split (``cluster_split_cases``).

With ``--initcheck`` the same calls run but nothing reads an output back (no reference, no
check): initcheck does not count a TMA store as a write, so a torch kernel reading our output
(the check's copy, its subtraction) is reported though every element was stored; so is
anything torch wrote if its kernels are excluded. Such reads are the library's own too: a C
the kernel cannot store in place (N = 4100: rows not 16-byte aligned) is stored to a temporary
and copied into the caller's, and an unfused activation (``--plain-mlp``'s ping-pong product)
runs on what the kernel stored, so torch's elementwise kernels are excluded (they only read our
TMA stores). What remains is what initcheck is for: a read, by our kernels, of the split
workspace or the semaphores before anything wrote them. ``compute-sanitizer --tool initcheck
--kernel-name-exclude kns=elementwise_kernel python scripts/sanitize_auto.py --initcheck
[MODE]`` (scripts/gpu_session.sh's ``sanitize_run``).
Correctness is the other runs' job (and the GPU tests')."""

import dataclasses
import sys

import torch
import tune_menu  # scripts/ is sys.path[0]; the menu's entries and the dropped ones

import wsgemm
from wsgemm import api

SHAPES = (
    (16, 4096, 14336),
    (1, 8192, 8192),
    (128, 4096, 14336),
    (131, 520, 200),
    (300, 6144, 4096),
)
# (entry with a split variant, M, N, K, batch, split)
SPLIT = (
    ("pingpong-64x128-c1x2", 16, 4096, 1021, 1, 3),
    ("pingpong-64x128-c1x2", 1, 1000, 100, 1, 4),  # 2 k-tiles: runs 2 ways
    ("pingpong-64x256-c1x1", 7, 1000, 2048, 3, 8),
    ("cooperative-128x128-c1x2", 131, 520, 777, 1, 2),
    ("swap-pingpong-64x16x128-c1x1", 7, 1000, 2048, 1, 3),  # swap-AB with split-K
    ("swap-pingpong-64x16x128-c1x1", 16, 4096, 1021, 1, 2),
    ("cooperative-128x128-c1x2", 64, 4100, 4096, 1, 4),
)


READ_BACK = "--initcheck" not in sys.argv


def reference(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    return a.float() @ w.float().transpose(-1, -2) if READ_BACK else None


def report(label: str, got: torch.Tensor, ref: torch.Tensor | None) -> bool:
    if ref is None:  # --initcheck: the output is left unread
        torch.cuda.synchronize()
        print(f"{label} ran")
        return True
    err = (got.float() - ref).abs().max().item()
    ok = err < 1e-2 * ref.abs().max().item() + 1e-2
    print(f"{label} err {err:.3g} {'ok' if ok else 'WRONG'}")
    return ok


# (stream-K entry, M, N, K, batch): a partial wave shared, all shared, one k-tile, batched
STREAM_K = (
    ("sk-pingpong-128x128-c2x1", 2888, 2072, 1504, 1),
    ("sk-pingpong-128x128-c2x1", 1128, 1968, 1021, 1),
    ("sk-cooperative-128x256-c2x1", 1000, 520, 64, 1),
    ("sk-cooperative-128x256-c2x1", 300, 1000, 777, 3),
)


def forced(label: str, backend: str, config, m: int, n: int, k: int, batch: int) -> int:
    """``config`` forced on a batched TN problem, fresh and given ``out`` (given twice: the
    workspace and the semaphores a launch reset are reused); how many results were wrong."""
    a = torch.randn(batch, m, k, dtype=torch.float16, device="cuda")
    w = torch.randn(batch, n, k, dtype=torch.float16, device="cuda")
    ref = reference(a, w)
    wrong = 0
    for given in (False, True, True):
        out = None
        if given:
            out = torch.full((batch, m, n), float("nan"), dtype=torch.float16, device="cuda")
        got = api.matmul(a, w.transpose(-1, -2), out=out, backend=backend, config=config)
        wrong += not report(f"{label} {batch}x{m}x{n}x{k} out={given}:", got, ref)
    return wrong


def stream_k_cases() -> int:
    wrong = 0
    for name, m, n, k, batch in STREAM_K:
        e = tune_menu.entry(name)
        wrong += forced(name, e.backend, e.variant_config(), m, n, k, batch)
    return wrong


# (rows, I, K): the swap-AB decode tile's widths (8, 16, 32: one of them a ragged I), the
# ping-pong row tile (a K off every tile_k, x's rows still 16 bytes), the cooperative row tile
# (ragged rows and I)
GATED = ((1, 64, 64), (5, 200, 1000), (16, 1024, 2048), (32, 704, 512), (100, 1000, 776),
         (300, 520, 1024))  # fmt: skip


def gated_cases() -> int:
    """Every gated kernel through the API with its road forced onto the kernel (a dispatcher
    whose cost model never prefers the unfused road), the swap-AB tile switched on; each
    signature twice (the second call runs its kept launcher); the dgated kernel on a
    pre-activation with a row stride of its own; how many results were wrong."""
    from wsgemm.api import epilogue as epi
    from wsgemm.api import gated as gated_core
    from wsgemm.host import registry

    class KernelOnly(api.Dispatcher):
        def gated_unfused(self, *args):
            return None

    registry.GATED_SWAP_FAMILIES = registry.EPILOGUE_FAMILIES  # (on on main since entry 85)
    d, wrong = KernelOnly(), 0
    for m, half, k in GATED:
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        w = torch.randn(2 * half, k, dtype=torch.float16, device="cuda") / k**0.5
        y = reference(x, w)
        ref = None if y is None else epi.gated_unit("silu", y)
        for _ in range(2):
            got = gated_core.gated_linear(x, w, "silu", dispatcher=d)
            wrong += not report(f"gated {m}x{half}x{k}:", got, ref)
        h, preact = gated_core.gated_linear_preact(x, w, "silu", dispatcher=d)
        wrong += not report(f"gated preact {m}x{half}x{k}:", h, ref)
        dy = torch.randn(m, 256, dtype=torch.float16, device="cuda")
        w_down = torch.randn(256, half, dtype=torch.float16, device="cuda") / half**0.5
        wide = torch.randn(m, 2 * half + 8, dtype=torch.float16, device="cuda")
        pre = wide[:, : 2 * half]  # a row stride of its own
        want = None
        if READ_BACK:
            want = epi.gated_unit_grad("silu", dy.float() @ w_down.float(), pre.float())
        got = gated_core.gated_grad(dy, w_down, pre, "silu", dispatcher=d)
        wrong += not report(f"dgated {m}x{half}x{k}:", got, want)
    return wrong


# (rows, I, K): act_grad on a swap-AB decode tile, a wide swap-AB tile, a ping-pong tile (I off
# its width), cooperative row tiles (ragged rows); linear_preact where the route is a
# cooperative row tile (the others take the product, then torch's activation)
PLAIN_MLP = ((1, 256, 64), (300, 4096, 1024), (37, 1000, 200), (1024, 2048, 512),
             (2047, 3000, 2048))  # fmt: skip


def plain_mlp_cases() -> int:
    """A plain MLP's training kernels (``DACT_FAMILIES`` switched on for the run): the dact
    GEMM on the policy's tiles, a pre-activation with a row stride of its own; the up
    projection storing its pre-activation (with a bias); each call twice; how many results
    were wrong."""
    from wsgemm.api import act_grad as act_grad_core
    from wsgemm.api import epilogue as epi
    from wsgemm.host import registry

    registry.DACT_FAMILIES = registry.EPILOGUE_FAMILIES
    wrong = 0
    for m, ffn, k in PLAIN_MLP:
        dy = torch.randn(m, k, dtype=torch.float16, device="cuda")
        w_down = torch.randn(k, ffn, dtype=torch.float16, device="cuda") / k**0.5
        pre = torch.randn(m, ffn + 8, dtype=torch.float16, device="cuda")[:, :ffn]
        want = None
        if READ_BACK:
            want = (dy.float() @ w_down.float()) * epi.activation_grad("gelu", pre)
        for _ in range(2):
            got = act_grad_core.act_grad(dy, w_down, pre, "gelu")
            wrong += not report(f"dact {m}x{ffn}x{k}:", got, want)
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        w_up = torch.randn(ffn, k, dtype=torch.float16, device="cuda") / k**0.5
        bias = torch.randn(ffn, dtype=torch.float16, device="cuda")
        y = reference(x, w_up)
        for _ in range(2):
            h, p = act_grad_core.linear_preact(x, w_up, "gelu_tanh", bias=bias)
            wrong += not report(f"plain preact {m}x{ffn}x{k}:", p, None if y is None else
                                y + bias.float())  # fmt: skip
            wrong += not report(f"plain preact h {m}x{ffn}x{k}:", h, None if y is None else
                                epi.torch_activation("gelu_tanh", y + bias.float()))  # fmt: skip
    return wrong


#: (M, N, K) for the cluster split, each tile at 2 and 4 ways: decode, ragged N and K, a K of
#: exactly ``ways`` k-tiles, several tiles per cluster
CLUSTER_SPLIT = ((1, 2048, 4096), (7, 1000, 1021), (16, 520, 512), (16, 8192, 1024))
CLUSTER_SPLIT_TILES = (
    ("sm90-pingpong", dict(tile_m=64, tile_n=16, tile_k=128, schedule="pingpong", swap_ab=True)),
    ("sm90-pingpong", dict(tile_m=64, tile_n=8, tile_k=128, schedule="pingpong", swap_ab=True)),
    ("sm90", dict(tile_m=128, tile_n=64)),
)


def cluster_split_cases() -> int:
    """The cluster split (``Sm90Config.cluster_split``; docs/perf.md entry 94) forced on the
    decode swap-AB tiles and a cooperative one at 2 and 4 ways, each call three times (its
    mbarriers' phases go on across tiles and calls); how many results were wrong. Rank 0's
    receive buffers are written by the other CTAs' ``st.async``, which racecheck sees as
    remote shared-memory traffic."""
    from wsgemm.kernels.sm90.config import Sm90Config

    wrong = 0
    for backend, fields in CLUSTER_SPLIT_TILES:
        for ways in (2, 4):
            config = Sm90Config(**fields, cluster_split=ways)
            for m, n, k in CLUSTER_SPLIT:
                a = torch.randn(m, k, dtype=torch.float16, device="cuda")
                w = torch.randn(n, k, dtype=torch.float16, device="cuda")
                y = reference(a, w)
                for _ in range(3):
                    got = api.matmul(a, w.t(), backend=backend, config=config)
                    wrong += not report(f"cluster split {ways} {backend} {fields['tile_n']} "
                                        f"{m}x{n}x{k}:", got, y)  # fmt: skip
    return wrong


if "--stream-k" in sys.argv:
    sys.exit(1 if stream_k_cases() else 0)
if "--cluster-split" in sys.argv:
    sys.exit(1 if cluster_split_cases() else 0)
if "--plain-mlp" in sys.argv:
    sys.exit(1 if plain_mlp_cases() else 0)
if "--gated" in sys.argv:
    sys.exit(1 if gated_cases() else 0)

bad = 0
for m, n, k in SHAPES:
    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    w = torch.randn(n, k, dtype=torch.float16, device="cuda")
    ref = reference(a, w)
    route = wsgemm.explain(a, w.T).splitlines()[1]
    for given in (False, False, True, True):  # each signature twice: the bound launcher runs
        out = None
        if given:
            out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        got = wsgemm.matmul(a, w.T, out=out)
        bad += not report(f"auto {m}x{n}x{k} out={given}: {route}", got, ref)

for name, m, n, k, batch, split in SPLIT:
    e = tune_menu.entry(name)
    config = dataclasses.replace(e.variant_config(split=True), split_k=split)
    bad += forced(f"{name} split {split}", e.backend, config, m, n, k, batch)
sys.exit(1 if bad else 0)
