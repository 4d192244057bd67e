"""Traced calls on the GPU (issue #13): the product is still right, and the recording is
consistent (``wsgemm.tracing.check``: no overflow at the planned capacity, every output
tile fetched by its consumers exactly once, no stage released twice without a fill between, no
wait on a full barrier ending before the loads of its k-tile were issued, in the CTA and in
its multicast peers).

Tolerance: the suite's rule (``operands.assert_within_torch_error``: twice PyTorch's own error
plus eps); outputs are poisoned with NaN first.
"""

import pytest
import torch
from operands import assert_within_torch_error, make

import wsgemm
from wsgemm import tracing
from wsgemm.trace_format import Event, RawTrace
from wsgemm.tracing.record import record

pytestmark = pytest.mark.gpu

BACKENDS = [
    "sm90",
    "sm90-pingpong",
    "sm80",
    "sm80-multistage",
]
# large, decode (M = 16 and M = 1) and ragged
SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (1, 4096, 4096), (1031, 2053, 777)]


def _needs(backend):
    if backend not in wsgemm.available_backends():
        pytest.skip(f"{backend} does not run on this GPU")


def _traced(backend, shape, **kwargs):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m + n + k)  # operands.make draws on the CPU
    a = make((m, k), torch.float16, "cuda", gen=gen)
    b = make((k, n), torch.float16, "cuda", gen=gen)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    raw = record(a, b, backend=backend, out=out, **kwargs)
    return a, b, out, raw


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_call_is_correct_and_its_events_consistent(backend, shape):
    _needs(backend)
    a, b, out, raw = _traced(backend, shape, measure=False)
    assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
    assert_within_torch_error(out, torch.matmul(a.double(), b.double()), torch.matmul(a, b))
    assert raw.meta["backend"] == backend and raw.meta["overflow"] == 0
    assert (raw.buffer[:, 0] > 0).sum() > 0, "no recorder wrote"
    assert tracing.check(raw) == []


@pytest.mark.parametrize(
    "name, shape, split",
    [
        ("swap-pingpong-64x16x128-c1x1", (1, 4096, 14336), 2),  # swap-AB, K split unevenly below
        ("cooperative-128x128-c1x2", (256, 1024, 4160), 3),  # 65 k-tiles in 3 splits
        ("pingpong-64x128-c1x2", (77, 640, 1000), 4),  # ragged everywhere
    ],
)
def test_a_split_k_call_traces_its_units_and_fix_ups(name, shape, split):
    import dataclasses

    from wsgemm.host import choosing

    _needs("sm90")
    e = choosing.entry(name)
    config = dataclasses.replace(e.variant_config(split=True), split_k=split)
    a, b, out, raw = _traced(e.backend, shape, config=config, split_k=True)
    assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
    assert_within_torch_error(out, torch.matmul(a.double(), b.double()), torch.matmul(a, b))
    assert raw.meta["split"] > 1 and raw.meta["policy_split"] == split
    assert raw.meta["overflow"] == 0 and tracing.check(raw) == []
    decoded = tracing.decode(raw)
    assert (decoded.events["kind"] == Event.FIXUP_BEGIN).sum() > 0
    assert raw.meta["traced_us"] > 0 and raw.meta["untraced_us"] > 0


@pytest.mark.parametrize(
    "backend, fields, shape",
    [
        # 1.6 waves of 128x256 tiles: the partial wave and the whole one before it shared
        ("sm90", dict(tile_m=128, tile_n=256, cluster_m=2), (2888, 2072, 1504)),
        # 3.1 waves of 128x128 tiles (two run whole, the rest shared), ragged M, N and K
        ("sm90-pingpong", dict(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong"),
         (2891, 2070, 1021)),
    ],
)  # fmt: skip
def test_a_stream_k_call_traces_its_parts_and_fix_ups(backend, fields, shape):
    """``wsgemm trace --stream-k``'s recording (the dropped sk-* entries' tiles): the traced
    call writes the untraced one's bits (each tile's parts summed in K order, traced or not),
    and the recording is consistent (every tile's parts cover its k-tiles once, one epilogue
    a tile, fix-ups on the shared tiles). Prints the fix-up time per shared tile (no
    assertion on time)."""
    from operands import run_into_poisoned

    from wsgemm.kernels.sm90.config import Sm90Config

    _needs("sm90")
    config = Sm90Config(stream_k=True, **fields)
    a, b, out, raw = _traced(backend, shape, config=config, split_k=True)
    assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
    untraced = run_into_poisoned(a, b, backend, config)
    assert torch.equal(out, untraced), "the traced stream-K call's result differs from the untraced"
    assert_within_torch_error(out, torch.matmul(a.double(), b.double()), torch.matmul(a, b))
    assert raw.meta["stream_k"] is True and raw.meta["split"] == 1
    assert raw.meta["overflow"] == 0 and tracing.check(raw) == []
    kinds = tracing.decode(raw).events["kind"]
    assert (kinds == Event.UNIT_RANGE).sum() > 0 and (kinds == Event.FIXUP_BEGIN).sum() > 0
    fixup = tracing.Timeline(raw).summary()["fixup"]
    assert fixup["shared_tiles"] > 0 and fixup["per_tile_us"]["max"] > 0
    print(f"{backend} stream-K {shape}: fix-up {fixup['per_tile_us']['mean']:.2f} us a shared "
          f"tile over {fixup['shared_tiles']} tiles")  # fmt: skip


def test_the_whole_sm80_grid_can_be_traced():
    _needs("sm80")
    _, _, out, raw = _traced("sm80", (1031, 2053, 777), max_ctas=10**6, measure=False)
    assert raw.meta["ctas_traced"] == raw.meta["ctas_launched"]
    assert tracing.check(raw) == []


def test_a_small_capacity_overflows_without_writing_past_it():
    _needs("sm80")
    _, _, out, raw = _traced("sm80", (1024, 1024, 4096), capacity=16, measure=False)
    assert not torch.isnan(out).any()
    assert raw.meta["capacity"] == 16 and raw.meta["overflow"] > 0
    assert raw.buffer.shape[1] == 16 + 16 * 8


def test_overhead_is_measured_and_the_recording_saves(tmp_path):
    """Reports traced and untraced time (no assertion on speed: docs/perf.md holds numbers)."""
    backend = "sm90" if "sm90" in wsgemm.available_backends() else "sm80"
    _needs(backend)
    _, _, _, raw = _traced(backend, (4096, 4096, 4096))
    assert raw.meta["traced_us"] > 0 and raw.meta["untraced_us"] > 0
    print(
        f"{backend} 4096^3: traced {raw.meta['traced_us']:.1f} us, untraced "
        f"{raw.meta['untraced_us']:.1f} us"
    )
    back = RawTrace.load(raw.save(tmp_path / "trace.npz"))
    assert (back.buffer == raw.buffer).all() and back.meta["backend"] == backend


def test_auto_traces_the_kernel_the_policy_picks():
    _, _, out, raw = _traced("auto", (2048, 2048, 1024), measure=False)
    assert raw.meta["backend"] in wsgemm.available_backends()
    assert tracing.check(raw) == []


def test_bad_arguments_raise_typed_errors():
    a = torch.zeros(64, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="not a wsgemm backend"):
        record(a, a, backend="nope")
    with pytest.raises(ValueError, match="capacity"):
        record(a, a, backend="sm80", capacity=0)
    with pytest.raises(TypeError, match="capacity"):
        record(a, a, backend="sm80", capacity=2.5)
    with pytest.raises(ValueError, match="nothing to trace"):
        record(a[:, :0], a[:0], backend="sm80")


@pytest.mark.parametrize("sizes", [[100, 0, 300, 1], [512], [3] * 40])
def test_a_grouped_call_traces_which_tile_ran_which_group(sizes):
    """``trace_grouped``: the traced kernel (its grouped epilogue: predicated stores past a
    group's end) writes ``grouped_mm``'s rows bit for bit and leaves the rest of a poisoned
    ``out`` alone; a consistent recording (every group's own m-tiles fetched once, an empty
    group none), each fetch naming its group."""
    m, n, k = 512, 256, 128
    gen = torch.Generator().manual_seed(len(sizes))
    a = make((m, k), torch.float16, "cuda", gen=gen)
    b = make((len(sizes), k, n), torch.float16, "cuda", gen=gen)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    t = tracing.trace_grouped(a, b, offs, measure=False, out=out)
    rows = sum(sizes)
    assert torch.equal(out[:rows], wsgemm.grouped_mm(a, b, offs)[:rows])
    assert out[rows:].isnan().all()
    assert t.check() == []
    ev = t.events
    fetched = ev["tile_l"][(ev["kind"] == Event.TILE_FETCH) & (ev["tile_m"] >= 0)]
    assert set(fetched.tolist()) == {g for g, s in enumerate(sizes) if s > 0}
    assert t.raw.meta["groups"] == offs.tolist()


@pytest.mark.parametrize("rows", [200, 2048])  # the ping-pong tile's, the cooperative one's
def test_a_dgated_call_traces_consistently(rows, monkeypatch):
    """``trace_gated_grad``: the dh GEMM with the unit's gradient fused, traced: it writes
    ``gated_grad``'s result bit for bit (into a poisoned tensor), the recording is consistent
    (each of the product's tiles fetched once), the overhead measured."""
    from wsgemm.host import registry

    # (on on main; switched on here so that the test runs whatever main says)
    monkeypatch.setattr(registry, "DGATED_FAMILIES", registry.EPILOGUE_FAMILIES)
    gen = torch.Generator().manual_seed(rows)
    dy = make((rows, 1024), torch.bfloat16, "cuda", gen=gen)
    w_down = make((1024, 1536), torch.bfloat16, "cuda", gen=gen)
    preact = make((rows, 2 * 1536), torch.bfloat16, "cuda", gen=gen)
    out = torch.full((rows, 2 * 1536), float("nan"), dtype=torch.bfloat16, device="cuda")
    t = tracing.trace_gated_grad(dy, w_down, preact, "silu", out=out)
    from wsgemm.api import gated as gated_core

    assert torch.equal(out, gated_core.gated_grad(dy, w_down, preact, "silu"))
    assert t.check() == []
    assert t.meta["epilogue"] == "dgated+silu"
    assert t.meta["traced_us"] > 0 and t.meta["untraced_us"] > 0
