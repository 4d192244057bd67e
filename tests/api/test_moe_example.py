"""docs/torch.md's mixture-of-experts block runs as written: its code block, executed on the CPU
with the grouped kernel's float64 stand-in (tests/api/test_grouped.py's dispatcher), against
a per-token float64 loop over each token's chosen experts, forward and every gradient (the
router's through ``row_scale``)."""

import pathlib
import re

import torch
from test_grouped import dispatcher

from wsgemm.api import grouped as core
from wsgemm.host import registry

DOC = pathlib.Path(__file__).parents[2] / "docs" / "torch.md"


def _example() -> dict:
    text = DOC.read_text()
    code = re.search(r"```python\n(import torch\nimport wsgemm\n\n\nclass MoeExperts.*?)```",
                     text, re.S)  # fmt: skip
    assert code, "docs/torch.md has no MoeExperts block"
    namespace: dict = {}
    exec(compile(code.group(1), str(DOC), "exec"), namespace)  # noqa: S102
    return namespace


def _float64_layer(block, x64, params, chosen):
    """Each token's sum over its chosen experts of weight * down(silu(gate) * up), in float64
    (``chosen``: the block's own top-k, so near-ties route the same way)."""
    probs = (x64 @ params["router.weight"].T).softmax(-1)
    weights = probs.gather(1, chosen)
    ffn = params["down"].shape[2]
    rows = []
    for t in range(x64.shape[0]):
        acc = 0
        for j in range(chosen.shape[1]):
            e = int(chosen[t, j])
            gu = params["gate_up"][e] @ x64[t]
            h = torch.nn.functional.silu(gu[:ffn]) * gu[ffn:]
            acc = acc + weights[t, j] * (params["down"][e] @ h)
        rows.append(acc)
    return torch.stack(rows)


def test_the_docs_moe_block_matches_a_per_token_loop(monkeypatch):
    monkeypatch.setattr(core, "host_dispatcher", lambda: dispatcher())
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES)
    torch.manual_seed(0)
    block = _example()["MoeExperts"](experts=4, hidden=16, ffn=8, top_k=2, device="cpu")
    x = torch.randn(11, 16, dtype=torch.bfloat16, requires_grad=True)
    out = block(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    chosen = block.router(x.detach()).float().softmax(-1).topk(block.top_k, dim=-1).indices
    params = {n: p.detach().double().requires_grad_() for n, p in block.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    ref = _float64_layer(block, x64, params, chosen)
    ref.backward(grad.double())
    err = (out.double() - ref.detach()).abs().max().item()
    assert out.shape == x.shape and err <= 0.05 * ref.abs().max().item(), err
    for name, p in [*block.named_parameters(), ("x", x)]:
        want = x64.grad if name == "x" else params[name].grad
        assert p.grad is not None, f"{name} got no gradient"
        err = (p.grad.double() - want).abs().max().item()
        assert err <= 0.08 * max(want.abs().max().item(), 1e-3), (name, err)
