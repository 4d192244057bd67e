"""pyproject.toml's package discovery and package-data cover every file under ``wsgemm/``, checked
without building a wheel (scripts/wheel_smoke.sh builds one in CI). A new subpackage the discovery
does not find, or a data file no package-data pattern names, would install fine from the checkout
(editable) and be missing from the wheel; this test fails instead."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from setuptools.discovery import PackageFinder, PEP420PackageFinder

try:
    import tomllib
except ImportError:  # Python 3.10 (requires-python allows it): tomllib came in 3.11
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
# Files under the package that are never shipped and never tracked (.gitignore's build outputs).
NOT_SHIPPED_SUFFIXES = (".pyc", ".cubin", ".ptx", ".sass")


def _setuptools_config(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_files(root: Path) -> list[str]:
    """The files under ``wsgemm/`` a wheel built from ``root`` should hold, as posix paths relative
    to ``root``: git's tracked and untracked-not-ignored files (what scripts/wheel_smoke.sh copies
    and builds from), or, outside a git checkout, every file but caches and build outputs."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "wsgemm"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = [line for line in out.splitlines() if (root / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [
            p.relative_to(root).as_posix()
            for p in (root / "wsgemm").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return sorted(f for f in files if not f.endswith(NOT_SHIPPED_SUFFIXES))


def uncovered(root: Path) -> tuple[list[str], list[str]]:
    """(files the wheel would miss, package-data patterns that match nothing) for the project at
    ``root``, using setuptools' own discovery with pyproject's settings, as the wheel build does.

    A ``.py`` file ships when its directory is a discovered package; any other file when a
    package-data pattern of a discovered package (or the ``""``/``"*"`` wildcard entry) matches it,
    with patterns globbed from the package's directory as setuptools does."""
    config = _setuptools_config(root)
    find = config.get("packages", {}).get("find")
    assert find is not None, "pyproject.toml no longer uses [tool.setuptools.packages.find]"
    # pyproject-based configuration turns namespace packages on unless it says otherwise.
    finder = PEP420PackageFinder if find.get("namespaces", True) else PackageFinder
    packages: set[str] = set()
    for where in find.get("where", ["."]):
        found = finder.find(
            str(root / where), include=find.get("include", ("*",)), exclude=find.get("exclude", ())
        )
        packages.update(found)
    package_data = config.get("package-data", {})
    shipped_data: set[str] = set()
    empty_patterns = []
    for package in packages:
        directory = root.joinpath(*package.split("."))
        for key in (package, "", "*"):
            for pattern in package_data.get(key, ()):
                matched = [p for p in directory.glob(pattern) if p.is_file()]
                shipped_data.update(p.relative_to(root).as_posix() for p in matched)
    for package, patterns in package_data.items():
        if package in ("", "*"):
            continue
        directory = root.joinpath(*package.split("."))
        for pattern in patterns:
            if package not in packages or not any(p.is_file() for p in directory.glob(pattern)):
                empty_patterns.append(f"{package}: {pattern}")
    missed = []
    for name in _package_files(root):
        path = Path(name)
        if path.suffix == ".py":
            if ".".join(path.parent.parts) not in packages:
                missed.append(name)
        elif name not in shipped_data:
            missed.append(name)
    return missed, sorted(empty_patterns)


def test_every_package_file_is_in_the_wheel():
    missed, _ = uncovered(REPO)
    assert not missed, (
        f"pyproject.toml's package discovery or package-data misses {missed}: a wheel would not "
        "ship them (add the directory's __init__.py or a package-data pattern)"
    )


def test_every_package_data_pattern_matches_a_file():
    """A pattern that matches nothing means the data moved and its new place is not listed."""
    _, empty = uncovered(REPO)
    assert not empty, f"pyproject.toml's package-data patterns match no file: {empty}"


def test_the_check_sees_a_missed_file(tmp_path):
    """The check itself, on a small project: with namespace packages off, a directory without
    ``__init__.py`` is missed; so is a data file no pattern names; and a stale pattern shows."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.setuptools.packages.find]\n"
        'include = ["wsgemm*"]\n'
        "namespaces = false\n"
        "[tool.setuptools.package-data]\n"
        '"wsgemm.host.choosing" = ["data/*.json", "data/cost/*.json"]\n'
    )
    files = {
        "wsgemm/__init__.py": "",
        "wsgemm/host/__init__.py": "",
        "wsgemm/host/choosing/__init__.py": "",
        "wsgemm/host/choosing/data/sm90_h200.json": "{}",
        "wsgemm/host/choosing/notes.txt": "not listed",
        "wsgemm/kernels/epilogue/fused.py": "",
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    missed, empty = uncovered(tmp_path)
    assert missed == ["wsgemm/host/choosing/notes.txt", "wsgemm/kernels/epilogue/fused.py"]
    assert empty == ["wsgemm.host.choosing: data/cost/*.json"]
