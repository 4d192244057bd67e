"""The package's floors, as docs/architecture.md draws them ("Floors"), hold for every import in
``wsgemm/``, the lazy ones inside functions included: nothing imports a room on a higher floor
or a neighbour on its own floor, no two modules import each other (directly or round a circle),
``api/`` imports no kernel family and reaches ``host/`` only through its public names,
``kernels/`` imports nothing above the leaves, and ``bench/`` only the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "wsgemm"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _floors() -> dict[str, int]:
    """room (a dotted module prefix) -> floor, from the ```floors block of architecture.md."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"```floors\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```floors block"
    floors = {}
    for line in block.group(1).splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        floor, rooms = int(words[0]), words[1:]
        for room in rooms:
            assert room not in floors, f"{room} is on two floors"
            floors[room] = floor
    return floors


FLOORS = _floors()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(importer: str, path: Path, node: ast.AST) -> list[str]:
    """The wsgemm modules an import statement reaches (a package's name, or its submodule
    where ``from package import name`` names one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "wsgemm"]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = importer.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "wsgemm":
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in MODULES else target)
    return out


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = edges.setdefault(name, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets.update(t for t in _resolve(name, path, node) if t != name)
    return edges


EDGES = _edges()


def room(module: str) -> str:
    """The longest room prefix of ``module``."""
    best = ""
    for r in FLOORS:
        if (module == r or module.startswith(r + ".")) and len(r) > len(best):
            best = r
    assert best, f"{module} is in no room of docs/architecture.md's floors"
    return best


def _arrows():
    for source, targets in sorted(EDGES.items()):
        if source == "wsgemm":  # the package's lazy public names (``wsgemm.__getattr__``)
            continue
        for target in sorted(targets):
            yield source, target


def test_every_folder_of_the_package_is_a_package():
    """A folder without ``__init__.py`` would be a namespace package: no room docstring, and
    its modules' names would not resolve as this test reads them."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert sorted(str(f) for f in folders if not (f / "__init__.py").exists()) == []


def test_every_module_is_in_a_room():
    assert [m for m in MODULES if m != "wsgemm" and not room(m)] == []


def test_nothing_imports_upward_or_sideways():
    bad = [
        f"{s} ({room(s)}, floor {FLOORS[room(s)]}) -> {t} ({room(t)}, floor {FLOORS[room(t)]})"
        for s, t in _arrows()
        if t != "wsgemm" and room(s) != room(t) and FLOORS[room(t)] >= FLOORS[room(s)]
    ]
    assert not bad, "imports that run up or sideways:\n" + "\n".join(bad)


def test_no_import_circle():
    """Tarjan's strongly connected components over every import arrow."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in EDGES.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(EDGES):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize(
    "rooms, allowed, why",
    [
        (
            ("wsgemm.api",),
            ("wsgemm.api", "wsgemm.host", "wsgemm.host.dispatch", "wsgemm.host.workspace",
             "wsgemm.host.registry", "wsgemm.support"),
            "api/ reaches host/ through its public names and the dispatcher core only, and "
            "imports no kernel family",
        ),
        (
            ("wsgemm.kernels",),
            ("wsgemm.kernels", "wsgemm.support", "wsgemm.trace_format"),
            "kernels/ import nothing but each other and the leaves",
        ),
        (
            ("wsgemm.bench",),
            ("wsgemm", "wsgemm.bench", "wsgemm.api", "wsgemm.support"),
            "bench/ measures through the public API",
        ),
    ],
)  # fmt: skip
def test_a_room_reaches_only_what_it_may(rooms, allowed, why):
    bad = [
        f"{s} -> {t}"
        for s, t in _arrows()
        if any(s == r or s.startswith(r + ".") for r in rooms)
        and not any(t == a or (t.startswith(a + ".") and a in rooms) for a in allowed)
    ]
    assert not bad, f"{why}:\n" + "\n".join(bad)


def test_the_floor_plan_knows_every_room_it_names():
    """A room named in the plan that no module is in is a stale plan."""
    stale = [r for r in FLOORS if not any(m == r or m.startswith(r + ".") for m in MODULES)]
    assert not stale, f"docs/architecture.md names rooms that do not exist: {stale}"
