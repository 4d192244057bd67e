"""``scripts/prediction_error.py``: the cost model's error on a bench record's ``auto`` rows
(issue #24), computed on the CPU from a record."""

import json

import pytest
from script_modules import load

from wsgemm.host.choosing import cost, rules

prediction_error = load("prediction_error")


def _record(rows, digest=None):
    header = {"sm_count": 132, "compute_capability": "9.0"}
    if digest is not None:
        header["source_digest"] = digest
    return {"header": header, "results": rows}


def _row(m, n, k, ms, backend="wsgemm:auto", status="ok"):
    return dict(label=f"{m}x{n}x{k}", m=m, n=n, k=k, dtype="fp16", accumulate="fp32",
                backend=backend, status=status, median_ms=ms)  # fmt: skip


def test_each_auto_row_is_priced_on_the_policy_s_pick():
    """Predicted over measured per ok ``wsgemm:auto`` row (others skipped), the pick replayed
    by the policy and priced by the shipped model; a row measured at exactly its prediction
    has ratio 1, one at twice it 0.5."""
    model = cost.cost_model_for(132, (9, 0))
    shapes = [(8, 4096, 4096), (512, 8192, 2048), (4096, 4096, 4096)]
    predicted = []
    for m, n, k in shapes:
        c = rules.choose(m, n, k, 1, "float16", "float16", "float32", 132, (9, 0),
                         batch_invariant=False)  # fmt: skip
        f = cost.features(c.menu_entry, c.split, m, n, k, 1, 132, 2, 2)
        predicted.append(cost.predict(model, c.menu_entry, f).us)
    rows = [_row(*s, p / 1e3) for s, p in zip(shapes, predicted, strict=True)]
    rows[2]["median_ms"] *= 2
    rows += [_row(8, 4096, 4096, 1.0, backend="cublas"), _row(8, 4096, 4096, None, status="wrong")]
    got = prediction_error.rows_of(_record(rows))
    assert [r["label"] for r in got] == [r["label"] for r in rows[:3]]
    assert [round(r["ratio"], 9) for r in got] == [1.0, 1.0, 0.5]
    assert [r["band"] for r in got] == ["1-16", "129-1024", ">1024"]
    s = prediction_error.summary(got)
    assert s["all"]["rows"] == 3 and s["all"]["median_error"] == pytest.approx(0.0)
    assert s["band >1024"]["median_error"] == pytest.approx(0.5)


def test_the_script_says_when_the_record_ran_other_code(tmp_path, capsys):
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(_record([_row(8, 4096, 4096, 0.02)], digest="0" * 64)))
    out = tmp_path / "err.json"
    assert prediction_error.main([str(path), "--json", str(out)]) == 0
    assert "ran other code" in capsys.readouterr().out
    assert json.loads(out.read_text())["summary"]["all"]["rows"] == 1
    path.write_text(json.dumps(_record([_row(8, 4096, 4096, 0.02, backend="cublas")])))
    assert prediction_error.main([str(path)]) == 1
