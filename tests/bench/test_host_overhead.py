"""The host-overhead benchmark without a GPU: its stand-in road times the core's Python path
through public names only (``wsgemm.api.stand_in``, ``matmul(..., dispatcher=)``), and a tuning
candidate's config comes from ``wsgemm.api.shipped_config``."""

import dataclasses

import pytest
import torch

from wsgemm import api, host
from wsgemm.bench import host_overhead
from wsgemm.bench.backends import Workload, wsgemm_candidate

F16 = torch.float16


def test_a_stand_in_dispatcher_runs_the_whole_call_path_on_the_cpu():
    """The first call of a signature validates, routes and keeps a launcher; later calls take
    it. The kernel does nothing, so only the result's shape and dtype are the product's."""
    d = api.stand_in()
    process_launchers = len(api.DISPATCHER.launchers)
    a, b = torch.randn(64, 32).half(), torch.randn(32, 48).half()
    for _ in range(3):
        c = api.matmul(a, b, out_dtype=torch.float32, dispatcher=d)
        assert c.shape == (64, 48) and c.dtype == torch.float32 and c.device == a.device
    out = torch.empty(64, 48, dtype=F16)
    assert api.matmul(a, b, out=out, dispatcher=d) is out
    assert len(d.launchers) == 2  # one per signature, on this dispatcher only
    assert len(api.DISPATCHER.launchers) == process_launchers
    with pytest.raises(ValueError, match="inner dimensions differ"):  # validate, as ever
        api.matmul(a, a, dispatcher=d)


def test_a_stand_in_dispatcher_poses_as_the_gpu_it_is_given():
    """An sm_80 stand-in runs ``auto`` on the sm80 kernel and refuses the sm90 ones."""
    a, b = torch.randn(16, 16).half(), torch.randn(16, 16).half()
    d = api.stand_in(capability=(8, 0), sm_count=108)
    api.matmul(a, b, dispatcher=d)
    with pytest.raises(ValueError, match=r"runs on sm_90 \(H100, H200, GH200\); .* is sm_80"):
        api.matmul(a, b, backend="sm90", dispatcher=d)


def test_the_stand_in_measurement_reports_each_contender():
    rows = host_overhead.stand_in(rounds=2, calls=20)
    assert [r.name for r in rows] == [
        "wsgemm (no-op kernel)",
        "wsgemm (no-op kernel), out=",
        "gated_linear, 8 rows (no-op)",
    ]
    for r in rows:
        assert 0 < r.host_min_us <= r.host_us <= r.synced_us
    table = host_overhead.render(rows, "title").splitlines()
    assert table[0] == "title" and len(table) == 2 + len(rows)


def test_the_stand_in_command_prints_its_table(capsys):
    assert host_overhead.main(["--stand-in", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU stand-in" in out and "wsgemm (no-op kernel), out=" in out


@pytest.mark.parametrize("accumulate, acc_name", [(torch.float32, "float32"), (F16, "float16")])
@pytest.mark.parametrize("backend", sorted(host.BACKENDS))
def test_shipped_config_is_what_a_named_backend_runs(backend, accumulate, acc_name):
    assert api.shipped_config(backend, accumulate) == host.BACKENDS[backend].config(acc_name)


@pytest.mark.parametrize(
    "args, words",
    [
        (("auto",), "name a backend"),
        (("cublas",), "backend='cublas' is not a wsgemm backend"),
        (("sm90", torch.bfloat16), "accumulate=torch.bfloat16 is not allowed; allowed"),
    ],
)
def test_shipped_config_refuses_what_has_none(args, words):
    with pytest.raises(ValueError, match=words):
        api.shipped_config(*args)


@pytest.mark.parametrize(
    "args, words",
    [
        ((None,), "backend must be a str, got NoneType"),
        (("sm90", "fp32"), "accumulate must be a torch.dtype, got str"),
    ],
)
def test_shipped_config_refuses_wrong_kinds_as_matmul_does(args, words):
    with pytest.raises(TypeError, match=words):
        api.shipped_config(*args)


def test_a_tuning_candidate_runs_the_shipped_config_with_its_changes(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "matmul", lambda *args, **kw: calls.append(kw))
    a, b = torch.zeros(8, 8, dtype=F16), torch.zeros(8, 8, dtype=F16)
    problem = Workload(a, b, torch.float32, "fp32")
    wsgemm_candidate("sm90{cluster_m=1,tile_n=128}").make(problem, None)()
    (kw,) = calls
    shipped = api.shipped_config("sm90")
    assert kw["backend"] == "sm90" and kw["accumulate"] == torch.float32
    assert kw["config"] == dataclasses.replace(shipped, cluster_m=1, tile_n=128) != shipped
    with pytest.raises(ValueError, match="raster_group not fields of Sm90Config"):
        wsgemm_candidate("sm90{raster_group=4}").make(problem, None)
