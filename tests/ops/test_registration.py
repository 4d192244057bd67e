"""``torch.ops.wsgemm.*`` exist after ``import wsgemm``, whichever of torch and wsgemm is
imported first, so that ``torch.export.load`` of a saved program that uses wsgemm works in a
process that only imported wsgemm; ``import wsgemm`` alone still imports neither torch nor the
DSL. Each order runs in a fresh interpreter: this process imported both long ago."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import wsgemm

REPO = Path(__file__).resolve().parents[2]
F16 = torch.float16

# What each child prints: the op resolves, the DSL stayed out, the import hook is gone and
# torch kept its own loader (the hook hands it back before torch runs).
REPORT = (
    "import sys, importlib.machinery as machinery\n"
    "print(torch.ops.wsgemm.matmul.default._schema.name, torch.ops.wsgemm.matmul_out.default)\n"
    "print('cutlass' in sys.modules, [type(f).__name__ for f in sys.meta_path"
    " if type(f).__name__ == '_AfterTorch'],"
    " type(torch.__loader__) is machinery.SourceFileLoader is type(torch.__spec__.loader))\n"
)


def _child(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip


def _lines(child: subprocess.Popen) -> list[str]:
    """A child's stdout lines; it must exit cleanly, with no registration warning."""
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert "RuntimeWarning" not in err, err
    return out.splitlines()


def python(code: str) -> list[str]:
    """``code``'s stdout lines in a fresh interpreter that imports this checkout's wsgemm."""
    return _lines(_child(code))


REGISTERED = ["wsgemm::matmul wsgemm.matmul_out.default", "False [] True"]


def test_the_ops_resolve_whatever_the_import_order():
    """The children run side by side (each imports torch: seconds)."""
    orders = {
        # torch first: `import wsgemm` registers the ops at once
        "torch first": "import torch, wsgemm\n",
        # wsgemm first: nothing loaded, the hook waiting; it registers after torch's import
        "wsgemm first": (
            "import sys, wsgemm\n"
            "print(sorted(m for m in ('torch', 'cutlass', 'wsgemm.ops') if m in sys.modules),"
            " type(sys.meta_path[0]).__name__)\n"
            "import torch\n"
        ),
        # a wsgemm module imports torch half-way through its own import: the ops register when
        # it is done (wsgemm.ops imports it), not while it is half-made
        "a wsgemm module imports torch": "import wsgemm.host.dispatch\nimport torch\n",
    }
    children = {name: _child(code + REPORT) for name, code in orders.items()}
    got = {name: _lines(child) for name, child in children.items()}
    assert got == {
        "torch first": REGISTERED,
        "wsgemm first": ["[] _AfterTorch", *REGISTERED],
        "a wsgemm module imports torch": REGISTERED,
    }


class _TwoProducts(torch.nn.Module):
    def forward(self, x, w):
        return wsgemm.matmul(wsgemm.matmul(x, w).relu(), w.mT)


def test_an_exported_program_loads_after_import_wsgemm(tmp_path):
    """Export on meta tensors (no GPU, no data), save, and load in a process that imported
    wsgemm, then torch, and never touched the API; the loaded program still holds the ops and
    takes another token count."""
    x = torch.empty(2, 8, 64, device="meta", dtype=F16)
    w = torch.empty(64, 32, device="meta", dtype=F16)
    tokens = torch.export.Dim("tokens", min=2, max=4096)
    ep = torch.export.export(_TwoProducts(), (x, w), dynamic_shapes=({1: tokens}, None))
    path = tmp_path / "program.pt2"
    torch.export.save(ep, str(path))
    code = (
        "import wsgemm\nimport torch\n"
        f"ep = torch.export.load({str(path)!r})\n"
        "ops = [str(n.target) for n in ep.graph.nodes if n.op == 'call_function']\n"
        "print(ops.count('wsgemm.matmul.default'))\n"
        "x = torch.empty(2, 100, 64, device='meta', dtype=torch.float16)\n"
        "w = torch.empty(64, 32, device='meta', dtype=torch.float16)\n"
        "out = ep.module()(x, w)\n"
        "print(tuple(out.shape), out.dtype)\n"
    )
    assert python(code) == ["2", "(2, 100, 64) torch.float16"]
