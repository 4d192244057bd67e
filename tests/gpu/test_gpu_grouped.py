"""GPU correctness of ``wsgemm.grouped_mm`` (issue #26, step 1) against a float64 reference per
group, within the suite's tolerance (``assert_within_torch_error``: twice the error of torch's
own per-group product in the same dtypes, plus the fp32 accumulation bound for fp32 results).

The 2D x 3D form on the grouped kernel: ragged groups (empty ones, one row, tile multiples and
one past them, primes, everything in one group, rows left past ``offs[-1]``), both majors of A
and B, offset views, a K not a multiple of 8 (a copy), narrow N (padded rows), fp16 and bf16
with their own or an fp32 result, each schedule (``auto`` and the named backends), ``out=``
poisoned with NaN (the groups' rows overwritten, the rest kept), offsets that decrease or run
past the rows (clamped: no fault); a CUDA graph replayed with new offsets in place (nothing
read on the host); torch.compile(fullgraph=True); gradients; the other forms' roads.
"""

import random

import pytest
import torch
from operands import assert_within_torch_error, fp32_accumulation_bound, make

import wsgemm

pytestmark = pytest.mark.gpu

CASES = 48


def _sizes(rng: random.Random, groups: int, kind: str) -> list[int]:
    if kind == "balanced":
        per = rng.choice([1, 8, 64, 128, 129, 300])
        return [per] * groups
    if kind == "one":
        sizes = [0] * groups
        sizes[rng.randrange(groups)] = rng.choice([1, 127, 1000])
        return sizes
    return [rng.choice([0, 0, 1, 5, 63, 64, 65, 128, 129, 257, 997]) for _ in range(groups)]


def _cases(seed: int):
    rng = random.Random(seed)
    out = []
    for i in range(CASES):
        groups = rng.choice([1, 3, 8, 64] if i % 8 else [256, 257])
        kind = ("balanced", "one", "ragged", "ragged")[i % 4]
        sizes = _sizes(rng, groups, kind)
        if groups > 100:
            sizes = [rng.choice([0, 1, 3, 8, 17]) for _ in range(groups)]
        out.append(dict(
            sizes=sizes, tail=rng.choice([0, 0, 5]),
            k=rng.choice([8, 64, 200, 1000, 4096] if i % 6 else [21, 100]),
            n=rng.choice([8, 13, 128, 1000, 4096] if groups < 100 else [256, 512]),
            ab=(torch.float16, torch.bfloat16)[i % 2],
            out_dtype=None if i % 5 else torch.float32,
            a_layout=rng.choice(["row", "row", "col", "offset"]),
            b_kmajor=rng.random() < 0.6,
            backend=("auto", "auto", "sm90", "sm90-pingpong")[i % 4],
            use_out=i % 3 == 0,
        ))  # fmt: skip
    return out


def _operands(c, gen):
    m = sum(c["sizes"]) + c["tail"]
    k, n, groups, ab = c["k"], c["n"], len(c["sizes"]), c["ab"]
    if c["a_layout"] == "col":
        a = make((m, k), ab, "cuda", col_major=True, gen=gen)
    else:
        a = make((m, k), ab, "cuda", offset=8 if c["a_layout"] == "offset" else 0, gen=gen)
    w = torch.randn(groups, n, k, generator=gen).to(ab).cuda()  # expert weights (G, N, K)
    b = w.transpose(1, 2) if c["b_kmajor"] else w.transpose(1, 2).contiguous()
    ends = torch.tensor(c["sizes"]).cumsum(0).to(torch.int32).cuda()
    return a, b, ends


def _check_groups(out, a, b, ends, c_dtype, what):
    e = [0, *ends.tolist()]
    for g in range(len(e) - 1):
        lo, hi = e[g], e[g + 1]
        if hi == lo:
            continue
        ref = a[lo:hi].double() @ b[g].double()
        theirs = (a[lo:hi] @ b[g]).to(c_dtype)
        slack = fp32_accumulation_bound(a[lo:hi], b[g]) if c_dtype == torch.float32 else 0.0
        assert_within_torch_error(out[lo:hi], ref, theirs, f"{what} group {g}", slack)


@pytest.mark.parametrize("case", range(CASES))
def test_grouped_2d_x_3d_matches_float64_per_group(case):
    c = _cases(2611)[case]
    gen = torch.Generator().manual_seed(case)
    a, b, ends = _operands(c, gen)
    c_dtype = c["out_dtype"] or c["ab"]
    kw = dict(out_dtype=c["out_dtype"], backend=c["backend"])
    if c["use_out"]:
        out = torch.full((a.shape[0], b.shape[2]), float("nan"), dtype=c_dtype, device="cuda")
        assert wsgemm.grouped_mm(a, b, ends, out=out, **kw) is out
        written = int(ends[-1])
        assert out[written:].isnan().all(), "rows past offs[-1] were written"
    else:
        out = wsgemm.grouped_mm(a, b, ends, **kw)
    assert out.shape == (a.shape[0], b.shape[2]) and out.dtype == c_dtype
    _check_groups(out, a, b, ends, c_dtype, str(c))


def test_a_second_call_with_other_offsets_reads_them_afresh():
    gen = torch.Generator().manual_seed(5)
    a = make((300, 64), torch.float16, "cuda", gen=gen)
    b = torch.randn(4, 64, 96, generator=gen).half().cuda()
    for sizes in ([100, 0, 150, 50], [1, 1, 1, 297], [0, 0, 0, 0], [300, 0, 0, 0]):
        ends = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
        _check_groups(wsgemm.grouped_mm(a, b, ends), a, b, ends, torch.float16, str(sizes))


def test_offsets_that_decrease_or_overrun_are_clamped_without_a_fault():
    a = torch.randn(200, 64, device="cuda").half()
    b = torch.randn(3, 64, 128, device="cuda").half()
    ends = torch.tensor([120, 40, 10_000], dtype=torch.int32, device="cuda")
    out = wsgemm.grouped_mm(a, b, ends)
    torch.cuda.synchronize()  # a fault would surface here
    clamped = torch.tensor([120, 120, 200], dtype=torch.int32, device="cuda")
    _check_groups(out, a, b, clamped, torch.float16, "clamped")


def test_a_cuda_graph_replays_with_new_offsets():
    """The offsets are read on the GPU: a warm call makes no host sync, and a captured call
    follows offsets changed in place."""
    gen = torch.Generator().manual_seed(7)
    a = make((512, 128), torch.bfloat16, "cuda", gen=gen)
    b = torch.randn(8, 128, 256, generator=gen).bfloat16().cuda()
    ends = torch.tensor([64] * 8).cumsum(0).to(torch.int32).cuda()
    out = torch.zeros(512, 256, dtype=torch.bfloat16, device="cuda")
    wsgemm.grouped_mm(a, b, ends, out=out)  # compile and warm outside the capture
    torch.cuda.set_sync_debug_mode("error")  # a warm call reads no offset back to the host
    try:
        wsgemm.grouped_mm(a, b, ends, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        wsgemm.grouped_mm(a, b, ends, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    for sizes in ([10, 0, 300, 2, 0, 100, 50, 50], [512, 0, 0, 0, 0, 0, 0, 0]):
        ends.copy_(torch.tensor(sizes).cumsum(0).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _check_groups(out, a, b, ends, torch.bfloat16, f"replay {sizes}")


def test_torch_compile_fullgraph():
    a = torch.randn(256, 64, device="cuda").half()
    b = torch.randn(4, 64, 128, device="cuda").half()
    ends = torch.tensor([30, 100, 100, 256], dtype=torch.int32, device="cuda")

    @torch.compile(fullgraph=True)
    def f(x, w, offs):
        y = wsgemm.grouped_mm(x, w, offs)
        return y, torch.nn.functional.silu(y)

    got, got_silu = f(a, b, ends)
    want = wsgemm.grouped_mm(a, b, ends)
    assert torch.equal(got, want)  # the same kernel, compiled or eager
    # Inductor's fused silu may round differently from eager's (an ulp of float16)
    torch.testing.assert_close(got_silu, torch.nn.functional.silu(want))


@pytest.mark.parametrize("form", ["2d3d", "3d3d"])
def test_gradients_match_float64(form):
    gen = torch.Generator().manual_seed(11)
    if form == "2d3d":
        a = torch.randn(200, 64, generator=gen).bfloat16().cuda().requires_grad_()
        b = torch.randn(4, 64, 96, generator=gen).bfloat16().cuda().requires_grad_()
        ends = torch.tensor([50, 50, 120, 190], dtype=torch.int32, device="cuda")
    else:
        a = torch.randn(4, 50, 64, generator=gen).bfloat16().cuda().requires_grad_()
        b = torch.randn(4, 64, 96, generator=gen).bfloat16().cuda().requires_grad_()
        ends = None
    out = wsgemm.grouped_mm(a, b, ends)
    grad = torch.randn(out.shape, generator=gen).bfloat16().cuda()
    out.backward(grad)
    a64, b64 = a.detach().double(), b.detach().double()
    g64 = grad.double()
    if form == "2d3d":
        e = [0, *ends.tolist()]
        ga = torch.zeros_like(a64)
        gb = torch.zeros_like(b64)
        for g in range(4):
            lo, hi = e[g], e[g + 1]
            ga[lo:hi] = g64[lo:hi] @ b64[g].T
            gb[g] = a64[lo:hi].T @ g64[lo:hi]
    else:
        ga, gb = g64 @ b64.transpose(1, 2), a64.transpose(1, 2) @ g64
    for got, want, name in ((a.grad, ga, "dA"), (b.grad, gb, "dB")):
        err = (got.double() - want).abs().max().item()
        assert err <= 2**-6 * want.abs().max().item() + 1e-3, f"{name}: {err}"


@pytest.mark.parametrize("form", ["3d3d", "2d2d", "3d2d"])
def test_the_other_forms(form):
    gen = torch.Generator().manual_seed(13)
    dt = torch.bfloat16
    if form == "3d3d":
        a, b, offs = (torch.randn(5, 40, 64, generator=gen).to(dt).cuda(),
                      torch.randn(5, 64, 72, generator=gen).to(dt).cuda(), None)  # fmt: skip
        ref = a.double() @ b.double()
        theirs = a @ b
    elif form == "2d2d":
        a = torch.randn(40, 96, generator=gen).to(dt).cuda()
        b = torch.randn(96, 72, generator=gen).to(dt).cuda()
        offs = torch.tensor([32, 32, 96], dtype=torch.int32, device="cuda")
        e = [0, 32, 32, 96]
        ref = torch.stack([a[:, e[g]:e[g + 1]].double() @ b[e[g]:e[g + 1]].double()
                           for g in range(3)])  # fmt: skip
        theirs = torch.stack([a[:, e[g] : e[g + 1]] @ b[e[g] : e[g + 1]] for g in range(3)])
    else:
        a = torch.randn(3, 40, 64, generator=gen).to(dt).cuda()
        b = torch.randn(64, 96, generator=gen).to(dt).cuda()
        offs = torch.tensor([32, 32, 96], dtype=torch.int32, device="cuda")
        e = [0, 32, 32, 96]
        ref = torch.cat([a[g].double() @ b[:, e[g] : e[g + 1]].double() for g in range(3)], 1)
        theirs = torch.cat([a[g] @ b[:, e[g] : e[g + 1]] for g in range(3)], 1)
    out = wsgemm.grouped_mm(a, b, offs)
    assert_within_torch_error(out, ref, theirs, form)


@pytest.mark.parametrize("backend", ["auto", "sm90"])
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b_kmajor", [False, True])
def test_3d2d_on_the_transposed_kernel(dt, b_kmajor, backend):
    """3D x 2D on the grouped kernel on the transposed problem, under auto too (float16: torch
    loops; bfloat16: torch's fused kernel asserts on these column groups, which are not whole
    16 bytes); ragged column groups, one empty, columns past offs[-1] kept in ``out``; and
    inside a CUDA graph (no sync: the loop could not be)."""
    gen = torch.Generator().manual_seed(17)
    g, m, k, n = 5, 77, 200, 1000
    a = torch.randn(g, m, k, generator=gen).to(dt).cuda()
    b = torch.randn(k, n, generator=gen).to(dt).cuda()
    if b_kmajor:
        b = b.t().contiguous().t()
    sizes = [130, 0, 1, 257, 600]  # 988 of 1000 columns
    e = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    offs = torch.tensor(e[1:], dtype=torch.int32, device="cuda")
    ref = torch.cat([a[i].double() @ b[:, e[i] : e[i + 1]].double() for i in range(g)], 1)
    theirs = torch.cat([a[i] @ b[:, e[i] : e[i + 1]] for i in range(g)], 1)
    out = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
    wsgemm.grouped_mm(a, b, offs, out=out, backend=backend)
    assert out[:, e[-1] :].isnan().all()
    assert_within_torch_error(out[:, : e[-1]], ref, theirs, "3d2d")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        wsgemm.grouped_mm(a, b, offs, out=out, backend=backend)
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_within_torch_error(out[:, : e[-1]], ref, theirs, "3d2d replayed")


@pytest.fixture
def fusing(monkeypatch):
    """The fused epilogues switched on (``FUSING_FAMILIES``: off on main until their GPU tests
    pass)."""
    from wsgemm.host import registry

    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("sizes", [[8] * 64, [0, 300, 1, 129, 64], [1000]])
def test_a_gated_moe_fc1_matches_float64(fusing, act, sizes):
    """``act(x @ w_gate[e].T) * (x @ w_up[e].T)`` per expert in the grouped kernel's epilogue."""
    gen = torch.Generator().manual_seed(len(sizes))
    k, half = 256, 192
    a = make((sum(sizes) + 2, k), torch.bfloat16, "cuda", gen=gen)
    w = (torch.randn(len(sizes), 2 * half, k, generator=gen) / k**0.5).bfloat16().cuda()
    b = w.transpose(1, 2)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    out = wsgemm.grouped_mm(a, b, ends, activation=act, gated=True)
    assert out.shape == (a.shape[0], half)
    e = [0, *ends.tolist()]
    from wsgemm.api.epilogue import torch_activation

    for g in range(len(sizes)):
        lo, hi = e[g], e[g + 1]
        if hi == lo:
            continue
        y64 = a[lo:hi].double() @ b[g].double()
        ref = torch_activation(act, y64[:, :half]) * y64[:, half:]
        y = (a[lo:hi] @ b[g]).float()
        theirs = (torch_activation(act, y[:, :half]) * y[:, half:]).bfloat16()
        assert_within_torch_error(out[lo:hi], ref, theirs, f"{act} group {g}")


# ----------------------------------------------------------------------------- the row scale
# ``grouped_mm(row_scale=)``: each row times its factor, last (a router weight on the down
# projection), in the grouped kernel's epilogue once ``ROW_SCALE_FAMILIES`` holds its family.


@pytest.fixture
def scaling(monkeypatch):
    from wsgemm.host import registry

    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "ROW_SCALE_FAMILIES", registry.EPILOGUE_FAMILIES)


ROW_SCALE_CASES = [
    # sizes, ab, scale dtype, epilogue, backend, out=
    ([8] * 64, torch.bfloat16, torch.float32, None, "auto", False),
    ([0, 300, 1, 129, 64], torch.bfloat16, torch.bfloat16, None, "sm90", True),
    ([0, 300, 1, 129, 64], torch.float16, torch.float32, None, "sm90-pingpong", False),
    ([1000], torch.float16, torch.float16, None, "sm90", False),
    ([5, 0, 257, 63, 997], torch.bfloat16, torch.float32, "gelu_tanh", "auto", True),
    ([0, 300, 1, 129, 64], torch.bfloat16, torch.float32, "gated", "auto", False),
    ([17] * 200, torch.bfloat16, torch.float32, "gated", "sm90-pingpong", True),
]


@pytest.mark.parametrize("case", range(len(ROW_SCALE_CASES)))
def test_a_row_scale_matches_float64_per_group(scaling, case):
    """``act(x @ w[e].T) * s`` per expert row (or the gated unit's, times ``s``), rows past the
    groups kept (``out=`` poisoned with NaN)."""
    sizes, ab, sdt, epi, backend, use_out = ROW_SCALE_CASES[case]
    gen = torch.Generator().manual_seed(100 + case)
    k, n = 256, 384
    m = sum(sizes) + 3
    a = make((m, k), ab, "cuda", gen=gen)
    b = (torch.randn(len(sizes), n, k, generator=gen) / k**0.5).to(ab).cuda().transpose(1, 2)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    scale = torch.rand(m, generator=gen).to(sdt).cuda()
    kw = dict(backend=backend, row_scale=scale)
    if epi == "gated":
        kw.update(activation="silu", gated=True)
    elif epi is not None:
        kw.update(activation=epi)
    width = n // 2 if epi == "gated" else n
    if use_out:
        out = torch.full((m, width), float("nan"), dtype=ab, device="cuda")
        assert wsgemm.grouped_mm(a, b, ends, out=out, **kw) is out
        assert out[int(ends[-1]) :].isnan().all(), "rows past offs[-1] were written"
    else:
        out = wsgemm.grouped_mm(a, b, ends, **kw)
    assert out.shape == (m, width)
    from wsgemm.api.epilogue import torch_activation

    def epilogue(y, s):
        if epi == "gated":
            y = torch_activation("silu", y[:, :width]) * y[:, width:]
        elif epi is not None:
            y = torch_activation(epi, y)
        return y * s[:, None]

    e = [0, *ends.tolist()]
    for g in range(len(sizes)):
        lo, hi = e[g], e[g + 1]
        if hi == lo:
            continue
        ref = epilogue(a[lo:hi].double() @ b[g].double(), scale[lo:hi].double())
        theirs = epilogue((a[lo:hi] @ b[g]).float(), scale[lo:hi].float()).to(ab)
        assert_within_torch_error(out[lo:hi], ref, theirs, f"case {case} group {g}")


def test_a_row_scale_in_a_cuda_graph_with_new_offsets_and_scales(scaling):
    gen = torch.Generator().manual_seed(7)
    a = make((400, 128), torch.bfloat16, "cuda", gen=gen)
    b = (torch.randn(4, 256, 128, generator=gen) / 128**0.5).bfloat16().cuda().transpose(1, 2)
    ends = torch.tensor([100, 100, 250, 390], dtype=torch.int32, device="cuda")
    scale = torch.rand(400, generator=gen).cuda()
    out = torch.empty(400, 256, dtype=torch.bfloat16, device="cuda")
    wsgemm.grouped_mm(a, b, ends, out=out, row_scale=scale)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wsgemm.grouped_mm(a, b, ends, out=out, row_scale=scale)
    ends.copy_(torch.tensor([10, 200, 200, 400], dtype=torch.int32))
    scale.copy_(torch.rand(400, generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    e = [0, *ends.tolist()]
    for g in range(4):
        lo, hi = e[g], e[g + 1]
        if hi == lo:
            continue
        ref = (a[lo:hi].double() @ b[g].double()) * scale[lo:hi, None].double()
        theirs = ((a[lo:hi] @ b[g]).float() * scale[lo:hi, None]).bfloat16()
        assert_within_torch_error(out[lo:hi], ref, theirs, f"graph group {g}")


# ----------------------------------------------------------------------------- 2D x 2D, ragged K
# The ragged-K grouped kernel (``backend="sm90"``/``"sm90-pingpong"``; ``auto`` takes it once
# host.RAGGED_K_FAMILIES holds its family): a weight gradient's form, K split by offs.

RAGGED_K_CASES = 32


def _ragged_k_cases(seed: int):
    rng = random.Random(seed)
    out = []
    for i in range(RAGGED_K_CASES):
        groups = rng.choice([1, 2, 8, 33] if i % 8 else [128, 256])
        kind = ("balanced", "one", "ragged", "ragged")[i % 4]
        sizes = _sizes(rng, groups, kind)
        if groups > 100:
            sizes = [rng.choice([0, 1, 8, 17, 64]) for _ in range(groups)]
        out.append(dict(
            sizes=sizes, tail=rng.choice([0, 0, 7]),
            m=rng.choice([8, 64, 200, 768] if groups < 100 else [64, 256]),
            n=rng.choice([8, 24, 128, 1000, 2048] if groups < 100 else [128, 256]),
            ab=(torch.float16, torch.bfloat16)[i % 2],
            out_dtype=None if i % 5 else torch.float32,
            a_layout=rng.choice(["dyT", "dyT", "row"]),  # dY^T (M-major) read in place, or a copy
            b_layout=rng.choice(["x", "x", "col"]),  # X (N-major) read in place, or a copy
            backend=("sm90", "sm90-pingpong")[i % 2],
            use_out=i % 3 == 0,
        ))  # fmt: skip
    return out


def _ragged_k_operands(c, gen):
    k = sum(c["sizes"]) + c["tail"]
    m, n, ab = c["m"], c["n"], c["ab"]
    dy = torch.randn(k, m, generator=gen).to(ab).cuda()  # the output gradient, tokens x M
    a = dy.t() if c["a_layout"] == "dyT" else dy.t().contiguous()
    x = torch.randn(k, n, generator=gen).to(ab).cuda()  # the layer's input, tokens x N
    b = x if c["b_layout"] == "x" else x.t().contiguous().t()
    if c["tail"]:  # K past offs[-1] is in no group: NaN there must never reach a product
        a[:, -c["tail"] :] = float("nan")
        b[-c["tail"] :] = float("nan")
    ends = torch.tensor(c["sizes"]).cumsum(0).to(torch.int32).cuda()
    return a, b, ends


def _check_ragged_k(out, a, b, ends, c_dtype, what):
    e = [0, *ends.tolist()]
    for g in range(len(e) - 1):
        lo, hi = e[g], e[g + 1]
        if hi == lo:
            assert (out[g] == 0).all(), f"{what} group {g}: an empty K slice is not zero"
            continue
        x, y = a[:, lo:hi], b[lo:hi]
        ref = x.double() @ y.double()
        theirs = (x @ y).to(c_dtype)
        slack = fp32_accumulation_bound(x, y) if c_dtype == torch.float32 else 0.0
        assert_within_torch_error(out[g], ref, theirs, f"{what} group {g}", slack)


@pytest.mark.parametrize("case", range(RAGGED_K_CASES))
def test_ragged_k_2d_x_2d_matches_float64_per_group(case):
    """Each group's product over its own K slice, the neighbours' K (and NaN past offs[-1])
    never in it: a group's last k-tile reads zeros past its end in both operands."""
    c = _ragged_k_cases(7043)[case]
    gen = torch.Generator().manual_seed(100 + case)
    a, b, ends = _ragged_k_operands(c, gen)
    c_dtype = c["out_dtype"] or c["ab"]
    groups, m, n = len(c["sizes"]), c["m"], c["n"]
    kw = dict(out_dtype=c["out_dtype"], backend=c["backend"])
    if c["use_out"]:
        out = torch.full((groups, m, n), float("nan"), dtype=c_dtype, device="cuda")
        assert wsgemm.grouped_mm(a, b, ends, out=out, **kw) is out
    else:
        out = wsgemm.grouped_mm(a, b, ends, **kw)
    assert out.shape == (groups, m, n) and out.dtype == c_dtype
    _check_ragged_k(out, a, b, ends, c_dtype, str(c))


def test_ragged_k_offsets_that_decrease_or_overrun_are_clamped_without_a_fault():
    a = torch.randn(200, 64, device="cuda").half().t()
    b = torch.randn(200, 128, device="cuda").half()
    a, b = a[:, :150], b[:150]  # K = 150 inside larger allocations
    ends = torch.tensor([120, 40, 10_000], dtype=torch.int32, device="cuda")
    out = wsgemm.grouped_mm(a, b, ends, backend="sm90")
    torch.cuda.synchronize()  # a fault would surface here
    # each end read on its own, clamped into [previous end, K]
    _check_ragged_k(out[:2], a, b, torch.tensor([120, 120], device="cuda"), torch.float16, "bad")
    ref = a[:, 40:150].double() @ b[40:150].double()
    assert_within_torch_error(out[2], ref, (a[:, 40:150] @ b[40:150]), "bad group 2", 0.0)


def test_ragged_k_a_cuda_graph_replays_with_new_offsets_and_no_sync():
    gen = torch.Generator().manual_seed(11)
    k, m, n = 600, 256, 384
    a = torch.randn(k, m, generator=gen).bfloat16().cuda().t()
    b = torch.randn(k, n, generator=gen).bfloat16().cuda()
    ends = torch.tensor([75] * 8).cumsum(0).to(torch.int32).cuda()
    out = torch.zeros(8, m, n, dtype=torch.bfloat16, device="cuda")
    wsgemm.grouped_mm(a, b, ends, out=out, backend="sm90")  # compile outside the capture
    torch.cuda.set_sync_debug_mode("error")
    try:
        wsgemm.grouped_mm(a, b, ends, out=out, backend="sm90")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            wsgemm.grouped_mm(a, b, ends, out=out, backend="sm90")
        torch.cuda.current_stream().wait_stream(stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for sizes in ([10, 0, 300, 2, 0, 100, 50, 138], [600, 0, 0, 0, 0, 0, 0, 0]):
        ends.copy_(torch.tensor(sizes).cumsum(0).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _check_ragged_k(out, a, b, ends, torch.bfloat16, f"replay {sizes}")


@pytest.mark.parametrize("backend", ["auto", "sm90", "sm90-pingpong"])
def test_ragged_k_descriptor_rewrite_stress(backend):
    """Each CTA rewrites its descriptors' K extent when its group changes, right after issuing
    the previous group's last loads (docs/perf.md entry 54). Many small groups of sizes that
    are not multiples of a k-tile, few tiles a group (every CTA changes group at every unit),
    and neighbouring groups of very different magnitudes: a load that read the next group's
    extent would add part of the next group's K to a group's last tile, far beyond the
    tolerance of a float32 result. ``auto`` takes the kernel for float16 (torch loops there)."""
    gen = torch.Generator().manual_seed(23)
    groups, m, n = 256, 256, 256
    sizes = [int(s) for s in torch.randint(1, 200, (groups,), generator=gen)]
    sizes[::7] = [0] * len(sizes[::7])
    k = sum(sizes)
    scale = torch.tensor([1.0, 1e3, 1e-3])[torch.arange(k) % 3]  # by token, so groups differ
    dy = (torch.randn(k, m, generator=gen) * scale[:, None]).half().cuda()
    x = torch.randn(k, n, generator=gen).half().cuda()
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    for _ in range(3):  # the same call again: the descriptors start from the launch's each time
        out = wsgemm.grouped_mm(dy.t(), x, ends, out_dtype=torch.float32, backend=backend)
        _check_ragged_k(out, dy.t(), x, ends, torch.float32, f"stress {backend}")


def test_float16_2d_x_3d_gradients_take_the_ragged_k_kernel():
    """fp16 training: the 2D x 3D form's dB is a 2D x 2D product, on the ragged-K kernel."""
    gen = torch.Generator().manual_seed(12)
    a = torch.randn(300, 64, generator=gen).half().cuda().requires_grad_()
    b = torch.randn(5, 64, 96, generator=gen).half().cuda().requires_grad_()
    ends = torch.tensor([50, 50, 120, 190, 300], dtype=torch.int32, device="cuda")
    out = wsgemm.grouped_mm(a, b, ends)
    grad = torch.randn(out.shape, generator=gen).half().cuda()
    out.backward(grad)
    a64, b64, g64 = a.detach().double(), b.detach().double(), grad.double()
    e = [0, *ends.tolist()]
    for g in range(5):
        lo, hi = e[g], e[g + 1]
        want = a64[lo:hi].T @ g64[lo:hi]
        err = (b.grad[g].double() - want).abs().max().item()
        assert err <= 2**-8 * want.abs().max().item() + 1e-3, f"dB group {g}: {err}"
        if hi == lo:  # an empty group has no rows of dA
            continue
        want = g64[lo:hi] @ b64[g].T
        err = (a.grad[lo:hi].double() - want).abs().max().item()
        assert err <= 2**-8 * max(want.abs().max().item(), 1.0) + 1e-3, f"dA group {g}: {err}"


@pytest.mark.parametrize("a_colmajor", [False, True])
def test_bf16_2d2d_with_ragged_k_groups_under_auto(a_colmajor):
    """bfloat16 2D x 2D under auto with K groups that are not whole 16 bytes (torch's fused
    kernel asserts on them where a is row-major; wsgemm takes the ragged-K kernel there, and
    keeps torch's only where a is column-major, which needs no aligned groups)."""
    gen = torch.Generator().manual_seed(29)
    dt, m, n = torch.bfloat16, 48, 40
    sizes = [13, 0, 1, 50, 37]
    k = sum(sizes)
    a = torch.randn(m, k, generator=gen).to(dt).cuda()
    if a_colmajor:
        a = a.t().contiguous().t()
    b = torch.randn(k, n, generator=gen).to(dt).cuda()
    e = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    offs = torch.tensor(e[1:], dtype=torch.int32, device="cuda")
    out = wsgemm.grouped_mm(a, b, offs)
    torch.cuda.synchronize()
    for g in range(len(sizes)):
        ref = a[:, e[g] : e[g + 1]].double() @ b[e[g] : e[g + 1]].double()
        theirs = (a[:, e[g] : e[g + 1]].float() @ b[e[g] : e[g + 1]].float()).to(dt)
        assert_within_torch_error(out[g], ref, theirs, f"group {g}")
