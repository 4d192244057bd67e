"""``torch.ops.wsgemm.*`` exist after ``import wsgemm``, whichever of torch and wsgemm is
imported first, so that ``torch.export.load`` of a saved program that uses wsgemm works in a
process that only imported wsgemm; ``import wsgemm`` alone still imports neither torch nor the
DSL; a first use of ``wsgemm.matmul`` inside ``torch.compile`` compiles. Each order runs in a
fresh interpreter: this process imported both long ago."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
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


def _finish(child: subprocess.Popen) -> tuple[int, str, str]:
    out, err = child.communicate(timeout=600)
    return child.returncode, out, err


def _lines(finished: tuple[int, str, str]) -> list[str]:
    """A child's stdout lines; it must have exited cleanly, with no registration warning."""
    code, out, err = finished
    assert code == 0, err
    assert "RuntimeWarning" not in err, err
    return out.splitlines()


REGISTERED = ["wsgemm::matmul wsgemm.matmul_out.default", "False [] True"]


class _TwoProducts(torch.nn.Module):
    def forward(self, x, w):
        return wsgemm.matmul(wsgemm.matmul(x, w).relu(), w.mT)


def _save_program(folder: Path) -> Path:
    """``_TwoProducts`` exported on meta tensors (no GPU, no data), with a dynamic token count,
    and saved in ``folder``."""
    x = torch.empty(2, 8, 64, device="meta", dtype=F16)
    w = torch.empty(64, 32, device="meta", dtype=F16)
    tokens = torch.export.Dim("tokens", min=2, max=4096)
    ep = torch.export.export(_TwoProducts(), (x, w), dynamic_shapes=({1: tokens}, None))
    path = folder / "program.pt2"
    torch.export.save(ep, str(path))
    return path


# What the "wsgemm first" child does right after its import of torch, before anything touched
# the API or the ops: load the saved program, count its ops and run it at another token count.
LOAD_PROGRAM = (
    "ep = torch.export.load({path!r})\n"
    "ops = [str(n.target) for n in ep.graph.nodes if n.op == 'call_function']\n"
    "print(ops.count('wsgemm.matmul.default'))\n"
    "x = torch.empty(2, 100, 64, device='meta', dtype=torch.float16)\n"
    "w = torch.empty(64, 32, device='meta', dtype=torch.float16)\n"
    "out = ep.module()(x, w)\n"
    "print(tuple(out.shape), out.dtype)\n"
)


# A program whose first touch of wsgemm.matmul is inside a compiled function.
FIRST_USE_IN_COMPILE = (
    "from torch._subclasses.fake_tensor import FakeTensorMode\n"
    "f = torch.compile(lambda a, b: wsgemm.matmul(a, b) + 1, backend='eager', fullgraph=True)\n"
    "with FakeTensorMode():\n"
    "    a = torch.empty(8, 16, device='cuda', dtype=torch.float16)\n"
    "    print(tuple(f(a, a.mT).shape))\n"
)


@pytest.fixture(scope="module")
def orders(tmp_path_factory):
    """``{import order: (exit code, stdout, stderr)}`` of a fresh interpreter per order, run
    side by side (each imports torch: seconds), each printing ``REPORT``. The "wsgemm first"
    one is also the process ``test_an_exported_program_loads_after_import_wsgemm`` needs (it
    imported wsgemm, then torch, and never touched the API): it loads the saved program first
    (exported here while the other two start). The "torch first" one, its report printed, is
    the program ``test_first_use_inside_torch_compile`` needs (nothing touched
    ``wsgemm.matmul`` yet)."""
    codes = {
        # torch first: `import wsgemm` registers the ops at once; then the process
        # `test_first_use_inside_torch_compile` needs
        "torch first": "import torch, wsgemm\n" + REPORT + FIRST_USE_IN_COMPILE,
        # a wsgemm module imports torch half-way through its own import: the ops register when
        # it is done (wsgemm.ops imports it), not while it is half-made
        "a wsgemm module imports torch": "import wsgemm.host.dispatch\nimport torch\n" + REPORT,
    }
    children = {name: _child(code) for name, code in codes.items()}
    try:
        program = _save_program(tmp_path_factory.mktemp("export"))
        # wsgemm first: nothing loaded, the hook waiting; it registers after torch's import
        children["wsgemm first"] = _child(
            "import sys, wsgemm\n"
            "print(sorted(m for m in ('torch', 'cutlass', 'wsgemm.ops') if m in sys.modules),"
            " type(sys.meta_path[0]).__name__)\n"
            "import torch\n" + LOAD_PROGRAM.format(path=str(program)) + REPORT
        )
        yield {name: _finish(child) for name, child in children.items()}
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.communicate()


def test_the_ops_resolve_whatever_the_import_order(orders):
    got = {name: _lines(finished) for name, finished in orders.items()}
    del got["wsgemm first"][1:3]  # the loaded program's two lines (the test below)
    del got["torch first"][2:]  # the compiled program's line (the last test)
    assert got == {
        "torch first": REGISTERED,
        "wsgemm first": ["[] _AfterTorch", *REGISTERED],
        "a wsgemm module imports torch": REGISTERED,
    }


def test_an_exported_program_loads_after_import_wsgemm(orders):
    """Export on meta tensors (no GPU, no data), save, and load in a process that imported
    wsgemm, then torch, and never touched the API (``orders``' "wsgemm first"); the loaded
    program still holds the ops and takes another token count."""
    assert _lines(orders["wsgemm first"])[1:3] == ["2", "(2, 100, 64) torch.float16"]


def test_first_use_inside_torch_compile(orders):
    """A program whose first touch of wsgemm.matmul is inside a compiled function (the public
    names load lazily) still compiles with fullgraph (``orders``' "torch first")."""
    assert _lines(orders["torch first"])[2:] == ["(8, 8)"]
