"""``scripts/rerun_below.py``: the shapes of a bench record below the floor, which issue #24's
acceptance run re-runs in a fresh process (``scripts/gpu_session.sh heldout``)."""

import json

import pytest
from script_modules import load

rerun_below = load("rerun_below")


def _row(m, n, k, ratio, backend="wsgemm:auto", status="ok", layout="TN", dtype="fp16"):
    ratio = None if ratio is None else {"median": ratio}
    return dict(m=m, n=n, k=k, backend=backend, status=status, layout=layout, dtype=dtype,
                accumulate="fp32", ratio_to_cublas=ratio)  # fmt: skip


RECORD = {
    "header": {},
    "results": [
        _row(79, 4096, 5504, 0.908),
        _row(79, 4096, 5504, 1.0, backend="cublas"),
        _row(2048, 4096, 4096, 0.92),  # at the floor: not below it
        _row(913, 2048, 1024, 0.816),
        _row(913, 2048, 1024, 0.5, backend="wsgemm:sm90"),  # another backend
        _row(17, 512, 512, None, status="wrong"),
        _row(266, 5120, 17920, 0.83, layout="NN"),
        _row(913, 2048, 1024, 0.85),  # the same problem again: named once
    ],
}


def test_the_auto_rows_below_the_floor_by_layout_in_order():
    assert rerun_below.below(RECORD, 0.92) == {
        ("TN", "fp16", "fp32"): [(79, 4096, 5504), (913, 2048, 1024)],
        ("NN", "fp16", "fp32"): [(266, 5120, 17920)],
    }
    assert rerun_below.below(RECORD, 0.8) == {}
    assert rerun_below.below(RECORD, 0.6, backend="wsgemm:sm90") == {
        ("TN", "fp16", "fp32"): [(913, 2048, 1024)]
    }
    with pytest.raises(ValueError, match="floor"):
        rerun_below.below(RECORD, 0.0)


def test_the_command_prints_bench_shapes(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(RECORD))
    rerun_below.main([str(path)])
    assert capsys.readouterr().out.splitlines() == [
        "TN fp16 fp32 79,4096,5504;913,2048,1024",
        "NN fp16 fp32 266,5120,17920",
    ]
    rerun_below.main([str(path), "--floor", "0.5"])
    assert capsys.readouterr().out == ""
