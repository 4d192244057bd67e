"""``python -m wsgemm cache info`` says whether the cache is used, and when it is refused (a
folder not private to the user, not a directory), why: the words ``DiskCache.open`` warns
with. It creates nothing."""

from __future__ import annotations

import pytest

from wsgemm import cli
from wsgemm.host.compiling import disk, fingerprint

FP = "0123456789abcdef"


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A cache root in tmp_path (not created), a fixed fingerprint and toolchain."""
    for name in ("WSGEMM_DISK_CACHE", "WSGEMM_CACHE_SHARED"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "cache"
    monkeypatch.setenv("WSGEMM_CACHE_DIR", str(path))
    monkeypatch.setattr(fingerprint, "fingerprint", lambda: FP)
    monkeypatch.setattr(fingerprint, "toolchain", lambda: {
        "cutlass_dsl": "4.8.1", "dsl_flavour": "cu13", "dsl_cuda": "13.4", "tvm_ffi": "0.1.15",
        "python": "3.11", "dsl_settings": {},
    })  # fmt: skip
    return path


def info(capsys) -> str:
    assert cli.main(["cache", "info"]) == 0
    return capsys.readouterr().out


def status(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("status")]
    return line.removeprefix("status").strip()


def test_a_private_cache_is_in_use(root, capsys):
    (root / FP).mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    assert status(info(capsys)) == "in use"


def test_a_missing_cache_is_in_use_and_not_created(root, capsys):
    assert status(info(capsys)) == "in use" and not root.exists()


@pytest.mark.parametrize("where", ["root", "fingerprint folder"])
def test_a_group_writable_cache_is_refused_with_the_reason(root, capsys, monkeypatch, where):
    (root / FP).mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    folder = root if where == "root" else root / FP
    folder.chmod(0o770)
    said = status(info(capsys))
    assert said.startswith("refused, compiling in memory: ")
    assert f"not loading code from {folder}: it is writable by group or others " in said
    assert "(mode drwxrwx---)" in said
    assert "set WSGEMM_CACHE_SHARED=1" in said
    # the same words the compile path warns with when it opens the folder
    opening = disk.DiskCache(root, FP)._prepare()
    assert said.removeprefix("refused, compiling in memory: ") == opening
    monkeypatch.setenv("WSGEMM_CACHE_SHARED", "1")
    out = info(capsys)
    assert status(out) == "in use" and "(shared: WSGEMM_CACHE_SHARED)" in out


def test_a_file_in_place_of_the_root_is_refused(root, capsys):
    root.parent.mkdir(exist_ok=True)
    root.write_text("not a folder")
    assert status(info(capsys)) == f"refused, compiling in memory: {root} is not a directory"
