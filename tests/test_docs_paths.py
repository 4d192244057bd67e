"""Every repository path the README and ``docs/*.md`` cite exists in the working tree, or the
text says, right after it, why it does not (the docs-drift item of the docs issue).

**What counts as a cited path** (in running text, backticks and code blocks alike):

- a Markdown link's target, ``[text](target)``, resolved from the doc's own folder (URLs and
  ``#anchor`` links are skipped, an ``#anchor`` suffix is dropped);
- a token that starts at a word boundary (not after ``/``, ``.``, ``-`` or a word character)
  with one of the ``ROOTS`` below and a ``/``: repository folders (``docs/``, ``wsgemm/``,
  ``scripts/``, ``tests/``, ``.ci/``; the gitignored ``.gpu/`` and ``scratch/``) and the
  package's own folders that the docs write relative to ``wsgemm/`` (``kernels/``, ``host/``,
  ``api/``, ``tracing/``, ``common/``, ``choosing/``, ...) or to ``docs/`` (``figures/``,
  ``data/``; a token under one of these package roots counts only where it looks like a path:
  a file name with an extension, or two folders deep, so prose such as "sm80/sm90 kernels" or
  "host/device" does not). Such a token resolves if it exists under any of ``BASES`` (the
  repository root, ``docs/``, ``wsgemm/``, ``wsgemm/host/``, ``wsgemm/host/choosing/``,
  ``wsgemm/kernels/``);
- a backticked bare file name ending ``.py`` or ``.sh`` (``policy.py``): it resolves if some
  file of that name is under ``wsgemm/``, ``scripts/``, ``tests/`` or ``.ci/``.

**Normalising a token** before the look-up: a ``::name`` suffix (a test or a function) and a
``:line`` or ``:from-to`` suffix are dropped (the file part counts); trailing ``/``, ``.``, ``,``
go; a ``<placeholder>`` (``sm90_<gpu>.json``) and ``*`` are globs; ``{a,b}`` braces expand, and
every expansion must match at least one path.

**What excuses a dead path**: one of the markers below after the cited token, before the
paragraph ends (a blank line), matched without regard to case: a lost or removed marker within
``MARKER_WINDOW`` (40) characters (right after the path, so that "the launcher is not kept"
further on excuses nothing), a renaming within ``WINDOW`` (160):

- lost, for data or code that was never committed or is gone with its machine:
  ``not kept``, ``not committed``, ``never committed``, ``lost with`` (``lost with the
  machine``), ``(lost)``;
- removed, for a historical file a dated entry describes that the code no longer has:
  ``since removed``;
- renamed, for one whose code now lives elsewhere: ``since renamed: NEW``, ``since moved to
  NEW``, ``since split into NEW``, with ``NEW`` a backticked path that itself exists.

A ``::name`` whose file exists must also name a ``def`` or ``class`` in it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROOTS = (
    ".ci|.gpu|docs|wsgemm|scripts|tests|scratch"  # the repository's own folders
    "|kernels|host|api|bench|tracing|common|choosing|compiling|epilogue|sm80|sm90"  # wsgemm/'s
    "|figures|data"  # docs/'s (and wsgemm/host/choosing/data)
)
BASES = ("", "docs/", "wsgemm/", "wsgemm/host/", "wsgemm/host/choosing/", "wsgemm/kernels/")
#: A path token: a root folder, a slash, then path characters (braces, globs and
#: placeholders included), ending on one that cannot end a sentence.
PATH = re.compile(r"(?<![\w./-])((?:" + ROOTS.replace(".", r"\.") + r")/[\w./{},*<>:-]*[\w*}>])")
LINK = re.compile(r"\]\(([^)\s]+)\)")
BARE = re.compile(r"`([A-Za-z_][\w-]*\.(?:py|sh))`")
WINDOW = 160  # a renaming's new path may come later in the sentence
MARKER_WINDOW = 40  # a lost or removed marker comes right after the path
#: Roots the docs write relative to ``wsgemm/`` or ``docs/``: a token under one is a path only
#: where it looks like one (``_file_like``), since the same words pair up in prose.
PACKAGE_ROOTS = set(
    "kernels host api bench tracing common choosing compiling epilogue sm80 sm90 figures data"
    .split()
)  # fmt: skip


def _file_like(token: str) -> bool:
    """A file name with an extension, or two or more folders deep."""
    path = SUFFIX.sub("", token).rstrip("/.,")
    return bool(re.search(r"\.\w+$", path)) or path.count("/") >= 2


LOST = r"not kept|not committed|never committed|lost with|\(lost\)"
REMOVED = r"since removed"
RENAMED = re.compile(r"since (?:renamed:|moved to|split into)\s+`([^`]+)`", re.I)
SUFFIX = re.compile(r"(::[\w.\[\]-]+|:\d+(?:-\d+)?)$")
CODE_DIRS = ("wsgemm", "scripts", "tests", ".ci")


def _braces(s: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    return [y for x in m.group(1).split(",") for y in _braces(s[: m.start()] + x + s[m.end() :])]


def _resolves(token: str, bases=BASES, here: Path = ROOT) -> bool:
    path = SUFFIX.sub("", token).rstrip("/.,")
    path = re.sub(r"<[^<>]*>", "*", path)
    for one in _braces(path):
        if not any(
            (any(here.glob(base + one)) if "*" in one else (here / (base + one)).exists())
            for base in bases
        ):
            return False
    return True


def _code_names() -> set[str]:
    return {p.name for d in CODE_DIRS for p in (ROOT / d).rglob("*") if p.is_file()}


def _excused(text: str, end: int) -> bool:
    after = text[end : end + WINDOW].split("\n\n", 1)[0]
    # the marker right after the path (not, say, "the launcher is not kept" further on)
    if re.search(LOST + "|" + REMOVED, after[:MARKER_WINDOW], re.I):
        return True
    return any(_resolves(m.group(1)) for m in RENAMED.finditer(after))


def cited(doc: Path):
    """``(token, resolves, end)`` for every path ``doc`` cites, ``end`` where the token ends."""
    text = doc.read_text()
    for m in LINK.finditer(text):
        target = m.group(1).split("#", 1)[0]
        if not target or re.match(r"[a-z]+:", target):
            continue
        yield target, _resolves(target, ("",), doc.parent), m.end()
    for m in PATH.finditer(text):
        token = m.group(1)
        if token.split("/", 1)[0] in PACKAGE_ROOTS and not _file_like(token):
            continue  # prose such as "sm80/sm90 kernels" or "host/device", not a path
        yield token, _resolves(token), m.end()
    names = _code_names()
    for m in BARE.finditer(text):
        yield m.group(1), m.group(1) in names, m.end()


def test_every_cited_path_exists_or_is_marked_lost_renamed_or_removed():
    dead = []
    for doc in DOCS:
        text = doc.read_text()
        for token, ok, end in cited(doc):
            if not ok and not _excused(text, end):
                line = text.count("\n", 0, end) + 1
                dead.append(f"{doc.relative_to(ROOT)}:{line}: {token}")
    assert not dead, "cited paths that neither exist nor say why:\n" + "\n".join(dead)


def test_a_cited_test_or_function_is_in_its_file():
    missing = []
    for doc in DOCS:
        for token, ok, _ in cited(doc):
            m = re.fullmatch(r"(.+\.py)::(\w+)", token)
            if ok and m:
                source = (ROOT / m.group(1)).read_text()
                if not re.search(rf"^\s*(?:def|class) {m.group(2)}\b", source, re.M):
                    missing.append(token)
    assert not missing, f"cited names missing from their files: {missing}"


def test_the_rules_catch_what_they_should():
    """The scanner on made-up text: a dead path fails unless a marker follows it closely."""
    assert _resolves("wsgemm/kernels/sm90/kernel.py:120")
    assert _resolves("tests/host/test_policy.py::test_gpu_every_menu_entry_gives_the_same_bits")
    assert _resolves("docs/data/gpu-2026-12-05c/fixup-{before,after}.*")
    assert _resolves("wsgemm/host/choosing/data/sm90_<gpu>.json")
    assert _resolves("kernels/sm90/kernel.py") and _resolves("figures/trace_sm80_2048.png")
    assert not _resolves("docs/data/{auto,nothing_here}.json")
    assert not _resolves("wsgemm/host/policy.py")
    text = "the old `wsgemm/host/policy.py` (since renamed: `wsgemm/host/choosing/rules.py`)"
    assert _excused(text, text.index(".py`") + 4)
    text = "the old `wsgemm/host/policy.py` (since renamed: `wsgemm/host/nowhere.py`)"
    assert not _excused(text, text.index(".py`") + 4)
    far = "the log `docs/data/x.log`" + " and so on" * 20 + " (not kept)"
    assert not _excused(far, far.index(".log`") + 5)
    parted = "the log `docs/data/x.log`.\n\nAnother paragraph, not kept."
    assert not _excused(parted, parted.index(".log`") + 5)
    assert PATH.findall("see `docs/data/x.json`, sha/docs/y, and host/compile.py.") == [
        "docs/data/x.json",
        "host/compile.py",
    ]
