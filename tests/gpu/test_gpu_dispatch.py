"""The call path on a GPU: prebuilt launchers against fresh calls, the copy path for a pointer
that loses its alignment, calls captured in a CUDA graph (no allocation outside torch's
caching allocator, no host synchronization), with ``out`` inside an input's buffer, and
``auto``'s split-K route on LLM shapes."""

import pytest
import torch
from operands import assert_within_torch_error

import wsgemm
from wsgemm.api import DISPATCHER, Dispatcher, dispatch
from wsgemm.host import choosing

pytestmark = pytest.mark.gpu

F16, F32 = torch.float16, torch.float32


def assert_matches_torch(got, a, b):
    """The suite's tolerance (operands.assert_within_torch_error): within twice torch's own error
    against an fp64 reference, plus eps."""
    ref = torch.matmul(a.double(), b.double())
    theirs = torch.matmul(a, b).to(got.dtype)
    assert_within_torch_error(got, ref, theirs)


class RecordingCache:
    """The process's compile cache, with the A pointer of every launch written down."""

    def __init__(self):
        self.a_pointers = []

    def get(self, variant):
        fn = DISPATCHER.cache.get(variant)

        def recorded(a, b, c, clusters):
            self.a_pointers.append(a.data_ptr())
            return fn(a, b, c, clusters)

        return recorded


def call(d, a, b, out=None):
    return dispatch.call(d, a, b, out, None, F32, "auto", None)


@pytest.mark.parametrize("use_out", [False, True])
def test_a_cached_launcher_gives_what_a_fresh_call_gives(use_out):
    gen = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randn(4 * 96 * 64 + 64, generator=gen, device="cuda").half()
    b = torch.randn(64, 80, generator=gen, device="cuda").half()
    d = Dispatcher()
    for offset in (0, 8, 64, 3, 11, 24):  # elements; 16-byte classes 0, 0, 0, 6, 6, 0
        a = buf[offset : offset + 96 * 64].view(96, 64)
        out = torch.full((96, 80), float("nan"), device="cuda", dtype=F16) if use_out else None
        got = call(d, a, b, out)
        fresh = call(Dispatcher(), a, b)  # no launcher yet: validates, plans, launches
        assert torch.equal(got, fresh), f"offset {offset}: cached launcher differs from fresh"
        assert not torch.isnan(got).any()
        assert_matches_torch(got, a, b)
    assert len(d.launchers) == 2  # one per alignment class


def test_a_pointer_that_loses_its_alignment_gets_the_copy_path():
    d = Dispatcher(RecordingCache())
    buf = torch.randn(2 * 128 * 64, device="cuda").half()
    b = torch.randn(64, 128, device="cuda").half()
    aligned = buf[: 128 * 64].view(128, 64)
    call(d, aligned, b)
    call(d, aligned, b)
    assert d.cache.a_pointers == [aligned.data_ptr()] * 2  # a view, no copy
    shifted = buf[1 : 1 + 128 * 64].view(128, 64)  # same shape and strides, 2 bytes on
    got = call(d, shifted, b)
    assert d.cache.a_pointers[-1] != shifted.data_ptr()  # copied into an aligned buffer
    assert_matches_torch(got, shifted, b)
    torch.testing.assert_close(call(d, shifted, b), got, rtol=0, atol=0)


def test_out_overlapping_an_input_is_refused_on_a_known_signature():
    buf = torch.randn(64, 128, device="cuda").half()
    b = torch.randn(64, 64, device="cuda").half()
    wsgemm.matmul(buf[:, :64], b, out=buf[:, 64:])  # column blocks: allowed
    with pytest.raises(ValueError, match="out overlaps a"):
        wsgemm.matmul(buf[:, :64], b, out=buf[:, 32:96])  # 16-byte aligned, same strides


def test_calls_captured_in_a_cuda_graph_replay_with_new_data():
    """A fused layout (a in the left half of a buffer, out in the right half), an operand that
    needs a copy (K = 45: unaligned rows) and an allocating call, captured and replayed."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    buf = torch.zeros(128, 256, device="cuda", dtype=F16)
    a, out = buf[:, :128], buf[:, 128:]
    b = torch.zeros(128, 128, device="cuda", dtype=F16)
    odd_a = torch.zeros(64, 45, device="cuda", dtype=F16)
    odd_b = torch.zeros(45, 72, device="cuda", dtype=F16)

    def step():
        wsgemm.matmul(a, b, out=out)
        return wsgemm.matmul(odd_a, odd_b)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, fills the launcher memo) off the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        made = step()
    for _ in range(2):  # new data in the captured tensors, then replay
        a.copy_(torch.randn(a.shape, generator=gen, device="cuda"))
        b.copy_(torch.randn(b.shape, generator=gen, device="cuda"))
        odd_a.copy_(torch.randn(odd_a.shape, generator=gen, device="cuda"))
        odd_b.copy_(torch.randn(odd_b.shape, generator=gen, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        assert_matches_torch(out, a, b)
        assert_matches_torch(made, odd_a, odd_b)
    assert torch.equal(buf[:, :128], a)  # the left half is still the operand


def test_calls_on_a_side_stream_follow_its_order():
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(256, 128, generator=gen, device="cuda").half()
    b = torch.randn(128, 192, generator=gen, device="cuda").half()
    wsgemm.matmul(a, b)  # compile outside the timed order
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = a * 2  # written on the side stream just before the product reads it
        got = wsgemm.matmul(x, b)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_matches_torch(got, x, b)


class VariantsCache:
    """The process's compile cache, with every variant asked for written down."""

    def __init__(self):
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)
        return DISPATCHER.cache.get(variant)


def _split_choice(monkeypatch, m, n, k):
    """The policy's choice for an fp16 problem on this GPU; if it does not split, the same entry
    (or, without a split variant, the decode entry) with split 2, forced (so the split path is
    what the test runs)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cc = torch.cuda.get_device_capability()
    choice = choosing.choose(m, n, k, 1, "float16", "float16", "float32", sms, cc)
    if not choice.menu_entry.splits:
        choice = choosing.Choice(choosing.entry("pingpong-64x128-c1x2"), 1, "", "test")
    if choice.split == 1:
        choice = choosing.Choice(choice.menu_entry, 2, "forced by the test", "test")
        monkeypatch.setattr(choosing, "choose", lambda *args, **kw: choice)
    return choice


@pytest.mark.parametrize("m", [1, 16, 128])
def test_auto_splits_llm_shapes_correctly_into_any_out(m, monkeypatch):
    """Decode and prefill of a down projection (N 4096, K 14336, a linear layer's weight: TN):
    the split route against the fp64 reference, fresh and into a given ``out`` (contiguous,
    column-major, a column slice), every result bitwise the same as the first."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 menu runs on sm_90 only")
    n, k = 4096, 14336
    choice = _split_choice(monkeypatch, m, n, k)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").half()
    w = torch.randn(n, k, generator=gen, device="cuda").half().t()  # (K, N), K-major
    d = Dispatcher(VariantsCache())
    first = call(d, x, w)
    assert_matches_torch(first, x, w)
    e = choice.menu_entry
    # the split's variant: the workspace split's, or a cluster split's where one runs
    route = Dispatcher.choice_route(choice, k, "float16")
    assert route.config != e.variant_config(split=False)
    assert {(v.backend, v.c_dtype, v.config) for v in d.cache.variants} == {
        (e.backend, "float16", route.config)
    }, "a split runs the chosen entry's split variant (the workspace's or the cluster's)"
    assert torch.equal(call(d, x, w), first)  # the launcher, a second run: the same bits
    wide = torch.full((m, n + 8), float("nan"), device="cuda", dtype=F16)
    outs = {
        "contiguous": torch.full((m, n), float("nan"), device="cuda", dtype=F16),
        "column-major": torch.full((n, m), float("nan"), device="cuda", dtype=F16).t(),
        "column slice": wide[:, 8:],
    }
    for name, out in outs.items():
        for _ in range(2):  # the first call of the signature, then its launcher
            out.fill_(float("nan"))
            assert call(d, x, w, out) is out
            assert torch.equal(out, first), f"out {name} differs from the fresh result"
    assert torch.isnan(wide[:, :8]).all(), "wrote outside out"
    text = wsgemm.api.explain(x, w)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert f"{sms} SMs" in text and f"kernel: {e.name}" in text


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 64, 128), (128, 256)),
                                              ((2, 1, 64, 128), (3, 128, 256)),
                                              ((128,), (4, 128, 256))])  # fmt: skip
def test_explain_of_an_nd_call_names_the_kernel_the_call_runs(a_shape, b_shape):
    """``wsgemm.explain`` of CUDA N-D operands (a fold that copies is explained on meta
    stand-ins of this GPU's capability and SM count) names the kernel of the equivalent
    folded call on this GPU, allocates no device memory, and the call itself is right."""
    a = torch.randn(a_shape, device="cuda", dtype=F16)
    b = torch.randn(b_shape, device="cuda", dtype=F16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    text = wsgemm.explain(a, b)
    assert torch.cuda.memory_allocated() == before
    assert text.startswith("N-D: ")
    kernel = next(line for line in text.splitlines() if line.startswith("kernel:"))
    batch = torch.broadcast_shapes(a.shape[:-2] if a.dim() > 1 else (), b.shape[:-2])
    a3 = (a.unsqueeze(0) if a.dim() == 1 else a).expand(*batch, *a.shape[-2:] if a.dim() > 1
                                                         else (1, a.shape[0]))  # fmt: skip
    b3 = b.expand(*batch, *b.shape[-2:])
    folded = wsgemm.explain(a3.reshape(-1, *a3.shape[-2:]).contiguous(),
                            b3.reshape(-1, *b3.shape[-2:]).contiguous())  # fmt: skip
    assert kernel in folded.splitlines()
    got = wsgemm.matmul(a, b)
    assert_matches_torch(got, a, b)
