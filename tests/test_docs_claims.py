"""Every speed ratio of the README, and each other doc's number listed, traces to a record in
``docs/data/`` (issue #27): each is a claim in ``docs/claims.json`` that names the record and
how the number is computed from it; this test recomputes it and checks the doc prints it (to
the digits it shows). A number whose record was lost is a claim marked ``unrecorded``, and its
paragraph must say so. And no ratio in the docs of ``CHECKED_DOCS`` goes without a claim."""

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CLAIMS = json.loads((ROOT / "docs" / "claims.json").read_text())["claims"]
#: A ratio the README states: 1.015x, 0.94–1.11x, 0.64-1.08x
RATIO = re.compile(r"\d+\.\d+(?:[–-]\d+\.\d+)?x")
NUMBER = re.compile(r"\d+\.\d+")


def _doc(name: str) -> str:
    return (ROOT / name).read_text()


def _record(path: str) -> dict:
    if path.endswith(".npz"):  # a trace recording (wsgemm.trace_format): its meta
        import numpy as np

        with np.load(ROOT / path) as z:
            return {"meta": json.loads(str(z["meta"]))}
    return json.loads((ROOT / path).read_text())


def _get(row: dict, dotted: str):
    for part in dotted.split("."):
        row = row[int(part)] if isinstance(row, list) else row[part]
    return row


def _matches(row: dict, where: dict) -> bool:
    for key, allowed in where.items():
        if key == "ratio_below":
            if not row["ratio_to_cublas"]["median"] < allowed:
                return False
        elif key == "m_range":
            if not allowed[0] <= row["m"] <= allowed[1]:
                return False
        elif _get(row, key) not in allowed:
            return False
    return True


def _ratios(rec: dict, backend: str, where: dict) -> list[float]:
    rows = [r for r in rec["results"] if r["backend"] == backend and r["status"] == "ok"]
    out = [r["ratio_to_cublas"]["median"] for r in rows if _matches(r, where or {})]
    assert out, f"no ok rows of {backend} match {where}"
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def values(claim: dict) -> list[float]:
    """The numbers ``claim`` says, computed from its record, in the order it says them."""
    v = claim["value"]
    kind = v["kind"]
    if kind == "csv_best_geomeans":  # a CSV, not a JSON record
        return [_best_geomean(claim["record"], extra) for extra in v["sets"]]
    if kind == "csv_ones":  # a CSV: per `where` in `of`, its single matching row's ratio
        return [_one(_csv_ratios(claim["record"], where)) for where in v["of"]]
    if kind == "csv_bests":  # a CSV: per `where` in `of`, the best ratio of its matching rows
        return [max(_csv_ratios(claim["record"], where)) for where in v["of"]]
    if kind == "csv_best_ranges":  # per `where`: min-max over its labels of each label's best
        out = []
        for where in v["of"]:
            best = _csv_bests_by_label(claim["record"], where)
            out += [min(best), max(best)]
        return out
    if kind == "csv_speedup_range":  # min-max over `labels` of time(`than`) / time(`faster`)
        t = _csv_times(claim["record"], v["labels"])
        r = [t[label, v["than"]] / t[label, v["faster"]] for label in v["labels"]]
        return [min(r), max(r)]
    rec = _record(claim["record"])
    if kind == "geomean":
        return [_geomean(_ratios(rec, v["backend"], v.get("where")))]
    if kind == "range":
        r = _ratios(rec, v["backend"], v.get("where"))
        return [min(r), max(r)]
    if kind == "one":
        [r] = _ratios(rec, v["backend"], v.get("where"))
        return [r]
    if kind == "ones":  # the single matching row of each backend, in the order listed
        return [_one(_ratios(rec, b, v.get("where"))) for b in v["backends"]]
    if kind == "geomean_and_range":
        r = _ratios(rec, v["backend"], v.get("where"))
        return [_geomean(r), min(r), max(r)]
    if kind == "geomeans_range":
        g = [_geomean(_ratios(_record(o["record"]) if "record" in o else rec, o["backend"],
                              o.get("where"))) for o in v["of"]]  # fmt: skip
        return [min(g), max(g)]
    if kind == "json":
        return [float(_get(rec, v["path"]))]
    if kind == "npz_trace_overhead":  # a trace recording's own times: traced, untraced (us)
        meta = rec["meta"]
        return [meta["traced_us"], meta["untraced_us"]]
    if kind == "json_range":  # min-max of `field` over the mapping at `path` (its `keys`)
        rows = _get(rec, v["path"])
        r = [rows[key][v["field"]] for key in v.get("keys", rows)]
        return [min(r), max(r)]
    if kind == "rows_range":
        r = [row[v["field"]] for row in _get(rec, v["rows"]) if _matches(row, v.get("where", {}))]
        assert r, f"no rows match {v.get('where')}"
        return [min(r), max(r)]
    if kind == "rows_quotient_range":  # min-max of `num` / `den` over the matching rows
        r = [_get(row, v["num"]) / _get(row, v["den"]) for row in _get(rec, v["rows"])
             if _matches(row, v.get("where", {}))]  # fmt: skip
        assert r, f"no rows match {v.get('where')}"
        return [min(r), max(r)]
    if kind == "rows_quotient_geomean":  # the geomean of `num` / `den` over the matching rows
        r = [_get(row, v["num"]) / _get(row, v["den"]) for row in _get(rec, v["rows"])
             if _matches(row, v.get("where", {}))]  # fmt: skip
        assert r, f"no rows match {v.get('where')}"
        return [_geomean(r)]
    raise AssertionError(f"unknown value kind {kind!r}")


def _one(ratios: list[float]) -> float:
    [r] = ratios
    return r


def _csv_rows(path: str, where: dict) -> list[dict]:
    """A ``scripts/tune_menu.py`` CSV's timed rows matching ``where`` (a column equal to one of
    the values listed, as the CSV writes them)."""
    import csv

    with open(ROOT / path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok" and r["ratio"]]
    out = [r for r in rows if _matches(r, where)]
    assert out, f"{path}: no timed row matches {where}"
    return out


def _csv_ratios(path: str, where: dict) -> list[float]:
    """The timed ratios to cuBLAS of a ``scripts/tune_menu.py`` CSV's rows matching ``where``."""
    return [float(r["ratio"]) for r in _csv_rows(path, where)]


def _csv_bests_by_label(path: str, where: dict) -> list[float]:
    """Per problem (label) of the rows matching ``where``: the best of their ratios."""
    best: dict[str, float] = {}
    for r in _csv_rows(path, where):
        best[r["label"]] = max(best.get(r["label"], 0.0), float(r["ratio"]))
    return list(best.values())


def _csv_times(path: str, labels: list[str]) -> dict[tuple[str, str], float]:
    """The unsplit candidates' median times (us) on ``labels``, by (label, entry)."""
    rows = _csv_rows(path, {"label": labels, "split": ["1"]})
    return {(r["label"], r["entry"]): float(r["median_us"]) for r in rows}


def _best_geomean(path: str, extra: list[str]) -> float:
    """A ``scripts/tune_menu.py`` CSV: the geomean over its problems of the best timed ratio to
    cuBLAS among the entries on the menu when it was measured and those in ``extra``."""
    import csv

    best: dict[str, float] = {}
    with open(ROOT / path, newline="") as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok" or r["entry"] == "cublas" or not r["ratio"]:
                continue
            if r["on_menu"] == "True" or r["entry"] in extra:
                best[r["label"]] = max(best.get(r["label"], 0.0), float(r["ratio"]))
    assert best, f"{path}: no timed candidate"
    return _geomean(list(best.values()))


def _paragraph(text: str, at: int) -> str:
    start = text.rfind("\n\n", 0, at)
    end = text.find("\n\n", at)
    return text[start + 2 if start >= 0 else 0 : end if end >= 0 else len(text)]


RECORDED = [c for c in CLAIMS if "record" in c]


@pytest.mark.parametrize("claim", RECORDED, ids=lambda c: f"{c['doc']}:{c['says']!r}")
def test_a_recorded_number_is_what_its_record_gives(claim):
    assert claim["says"] in _doc(claim["doc"]), f"{claim['doc']} no longer says {claim['says']!r}"
    shown = NUMBER.findall(claim["says"])
    got = values(claim)
    assert len(shown) == len(got), f"{claim['says']!r} shows {shown}, the record gives {got}"
    for text, value in zip(shown, got, strict=True):
        digits = len(text.split(".")[1])
        # within half a unit of the last digit shown (a tie, 1.0125 as 1.013, rounds either way)
        assert abs(value - float(text)) <= 10**-digits / 2 + 1e-9, (
            f"{claim['says']!r}: the record gives {value:.4f}, printed {text}"
        )


def test_every_claim_has_a_record_or_says_its_record_was_lost():
    """A claim names its record, or is marked ``unrecorded`` and its paragraph says so."""
    for claim in CLAIMS:
        assert ("record" in claim) != ("unrecorded" in claim), claim
        if "unrecorded" in claim:
            text = _doc(claim["doc"])
            at = text.find(claim["says"])
            assert at >= 0, f"{claim['doc']} no longer says {claim['says']!r}"
            assert re.search(r"\blost\b|unrecorded", _paragraph(text, at)), claim["says"]


#: The docs whose every ratio is a claim (or inside a rendered record, checked below)
CHECKED_DOCS = ["README.md", "docs/benchmarking.md", "docs/policy.md", "docs/torch.md"]
#: The docs whose every overhead percentage ("+36%", "+39-44%") is a claim
PERCENT_DOCS = ["docs/trace.md"]
PERCENT = re.compile(r"\+\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?%")
RENDERED = re.compile(
    r"<!-- rendered from (\S+) -->\n(.*?)\n<!-- end of the rendered record -->", flags=re.S
)


def _unclaimed(doc: str, pattern: re.Pattern, also: re.Pattern | None = None) -> list[str]:
    """The matches of ``pattern`` in ``doc`` that no claim's text (nor a match of ``also``)
    covers."""
    text = _doc(doc)
    covered = set()
    spans = [m.span() for c in CLAIMS if c["doc"] == doc
             for m in re.finditer(re.escape(c["says"]), text)]  # fmt: skip
    if also is not None:
        spans += [m.span() for m in also.finditer(text)]
    for start, end in spans:
        covered.update(range(start, end))
    return [m.group() for m in pattern.finditer(text) if m.start() not in covered]


@pytest.mark.parametrize("doc", CHECKED_DOCS)
def test_every_ratio_in_the_doc_has_a_claim(doc):
    loose = _unclaimed(doc, RATIO, also=RENDERED)
    assert not loose, f"{doc} ratios with no claim in docs/claims.json: {loose}"


@pytest.mark.parametrize("doc", PERCENT_DOCS)
def test_every_overhead_percentage_in_the_doc_has_a_claim(doc):
    loose = _unclaimed(doc, PERCENT)
    assert not loose, f"{doc} percentages with no claim in docs/claims.json: {loose}"


def test_the_benchmarking_results_are_their_record_rendered():
    """docs/benchmarking.md's Results tables are what ``bench --from-json RECORD --markdown``
    renders from the record they name: regenerated, never retyped."""
    from wsgemm.bench import report

    text = _doc("docs/benchmarking.md")
    blocks = RENDERED.findall(text)
    assert blocks, "docs/benchmarking.md has no rendered record"
    for path, shown in blocks:
        assert shown == report.markdown(_record(path)).rstrip("\n"), f"{path} renders otherwise"


def test_the_policy_docs_constants_are_the_shipped_cost_model():
    """docs/policy.md's table of the cost model's constants is what ``scripts/fit_cost_model.py
    --markdown`` renders from the shipped ``data/cost/sm90_h200.json``: regenerated, never
    retyped (issue #24 item 5)."""
    from script_modules import load

    shipped = ROOT / "wsgemm" / "host" / "choosing" / "data" / "cost" / "sm90_h200.json"
    table = load("fit_cost_model").markdown(json.loads(shipped.read_text()))
    assert table in _doc("docs/policy.md"), "docs/policy.md's constants differ from the model's"
