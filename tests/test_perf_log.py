"""Every measured speed ratio in ``docs/perf.md``'s history either points to its record or says it
has none (the issue "docs/perf.md's history marks its unrecorded numbers").

**What is checked**: the "Where we stand" part (its ``## `` heading up to the next ``## ``
heading) and each log entry (a ``### `` heading up to the next ``## `` or ``### `` heading). A
part that states a ratio (``RATIO``, the regex of ``tests/test_docs_claims.py``: ``0.947x``,
``1.02-1.11x``, ``0.94–1.11x``) must do one of these:

- **cite a record**: a path token, found as ``tests/test_docs_paths.py`` finds them (``PATH``),
  that starts ``docs/data/`` (or ``data/``, the docs' own spelling) and exists under
  ``docs/data/``. Braces, globs and ``<placeholder>`` resolve as they do there, and a folder
  counts (``docs/data/gpu-2026-12-05c/``);
- **say it has no record**: the first line under its heading is one parenthesised marker line
  (``MARKER``; case counts):

  - ``(Numbers unrecorded: WHY.)``: measured on a GPU, but the run's output was lost with the
    machine or never kept; WHY says which, where the entry tells;
  - ``(CPU only: ...; no record of its own.)``: written on the CPU; its ratios are predictions
    or quote the entries it names, and those entries hold the records.

The word "unrecorded" elsewhere in an entry (a single number marked *unrecorded*) does not
excuse the entry: the marker line must sit right under the title.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_claims import RATIO
from test_docs_paths import PATH, _resolves

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "docs" / "perf.md"
HEADING = re.compile(r"^(#{2,3}) (.*)$", re.M)
MARKER = re.compile(r"\((?:Numbers unrecorded: .+|CPU only: .+; no record of its own\.?)\)")


def parts(text: str):
    """``(title, line, body)`` of the "Where we stand" part and of each log entry; ``body`` is
    the text after the heading's line, up to the next heading."""
    heads = list(HEADING.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        if m.group(1) == "###" or m.group(2).startswith("Where we stand"):
            yield m.group(2), text.count("\n", 0, m.start()) + 1, text[m.end() : end]


def records(body: str) -> list[str]:
    """The paths under ``docs/data/`` that ``body`` cites and that exist."""
    found = []
    for token in PATH.findall(body):
        if token.startswith(("docs/data/", "data/")):
            # a glob names a run's files only inside a named folder or beside a named stem
            # (``gpu-2026-12-05c/epilogue-*.log``), not any record (``docs/data/*.json``)
            under = token.removeprefix("docs/").removeprefix("data/")
            if under.startswith(("*", "{", "<")):
                continue
            if _resolves(token.removeprefix("docs/"), ("docs/",)):
                found.append(token)
    return found


def marked(body: str) -> bool:
    """Whether the first paragraph under the heading is a marker line (wrapped or not)."""
    first = " ".join(body.lstrip("\n").split("\n\n", 1)[0].split())
    return MARKER.fullmatch(first) is not None


def test_every_part_with_a_ratio_cites_a_record_or_says_it_has_none():
    bare = []
    for title, line, body in parts(PERF.read_text()):
        if RATIO.search(body) and not records(body) and not marked(body):
            bare.append(f"docs/perf.md:{line}: {title}")
    assert not bare, (
        "entries whose ratios neither cite a record under docs/data/ nor say they have none "
        "(see tests/test_perf_log.py's docstring):\n" + "\n".join(bare)
    )


def test_the_log_is_read_as_parts():
    """The scan sees the "Where we stand" part and the numbered entries, in order."""
    found = list(parts(PERF.read_text()))
    assert found[0][0].startswith("Where we stand")
    unnumbered = [title for title, _, _ in found[1:] if not re.match(r"\d+\. ", title)]
    assert not unnumbered, f"log entries without a number: {unnumbered}"
    numbers = [int(re.match(r"(\d+)\. ", title).group(1)) for title, _, _ in found[1:]]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) > 60


def test_the_rules_catch_what_they_should():
    """The rules on made-up text."""
    assert records("record `docs/data/sm90.json` and `docs/data/gpu-2026-12-05c/`.")
    assert records("logs `docs/data/gpu-2026-12-05c/epilogue-tests-*.log`")
    assert records("records `docs/data/tune_sm80_{fp32,fp16}.json`")
    assert not records("`docs/data/gone.json` (lost with the machine)")
    assert not records("every record: `docs/data/*.json`")
    assert not records("`data/sm90_h200.json`")  # wsgemm/host/choosing/data/, not a record
    assert not records("`docs/perf.md`, `wsgemm/host/choosing/data/sm90_h200.json`")
    assert marked("\n(Numbers unrecorded: printed, not kept.)\n\n- Measured: 1.01x")
    assert marked("\n(CPU only: its ratios are predictions; no record of its own.)\n")
    assert not marked("\n(CPU only: its ratios are predictions.)\n")
    assert marked("\n(Numbers unrecorded: the H200's files were\nlost with the machine.)\n\n- 1.0x")
    assert not marked("\n- Measured: 1.01x.\n(Numbers unrecorded: printed, not kept.)\n")
    assert not marked("\n- Measured: 1.01x *(unrecorded)*.\n")
    assert RATIO.search("0.947x") and RATIO.search("1.02-1.11x") and not RATIO.search("1.5 us")
